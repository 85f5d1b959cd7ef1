"""Several processes training one model together, one per GPU, under `torchrun`: each one's share of an update,
the exchange of gradients (DistributedDataParallel), the checks that they agree, and how to start them."""

import contextlib
import math
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn

from .checkpoints import weights_digest


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) of this training process: (0, 1) for a single process; under `torchrun`, once
    `torch.distributed` is initialised (`process_group`), this process's number and the number of processes."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def accumulation_steps(recipe, world_size: int) -> int:
    """Batches each process accumulates per update: `recipe.accum_steps`, or, when the recipe sets
    `tokens_per_update`, enough batches of `max_tokens` for `world_size` processes together to reach it."""
    if recipe.tokens_per_update is None:
        return recipe.accum_steps
    return max(1, math.ceil(recipe.tokens_per_update / (world_size * recipe.max_tokens)))


def split_for_processes(batches: list[list[int]], world_size: int) -> list[list[int]]:
    """`batches` with the largest halved until their number is a multiple of `world_size`, so that in every update
    each process gets the same number of batches (each must take part in every exchange of gradients) and every
    sentence stays in exactly one batch."""
    batches = list(batches)
    while len(batches) % world_size:
        i = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[i]) < 2:
            raise ValueError(f"{sum(map(len, batches))} sentences are too few to share among {world_size} processes")
        half = len(batches[i]) // 2
        batches[i:i + 1] = [batches[i][:half], batches[i][half:]]
    return batches


class Processes:
    """The processes that train one model together, as the training loop sees them: one outside `torchrun`, where
    nothing changes; under it, `world` of them, this one numbered `rank`.

    Made once `model` is made from `seed` (the same weights in every process), it gives each process its own
    dropout stream, checks that every process passes the same `data` (a fingerprint, e.g. counts of pairs and
    tokens), and sets `learner`, the module to train: `model`, or with several processes `model` wrapped to
    average their gradients."""

    def __init__(self, model: nn.Module, device: torch.device, seed: int, data: tuple):
        self.model, self.device = model, device
        self.rank, self.world = rank_and_world_size()
        self.learner = model
        if self.world > 1:
            torch.manual_seed(seed + 1 + self.rank)
            seen = [None] * self.world
            dist.all_gather_object(seen, data)
            if len(set(seen)) > 1:
                raise ValueError(f"the processes read different training data ({seen}); give every machine the "
                                 "same prepared data")
            self.learner = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)

    def share(self, update: list[list[int]], tgt_lengths) -> tuple[list[list[int]], float | None]:
        """This process's batches of an update (every world-th, from its rank) and what their losses are divided
        by: None in a single process (`accumulate_gradients` counts the tokens itself); with several, the update's
        target tokens in all processes divided by their number, since DistributedDataParallel averages the
        gradients."""
        if self.world == 1:
            return update, None
        return update[self.rank::self.world], sum(tgt_lengths[i] for b in update for i in b) / self.world

    def total(self, loss: float, tokens: int, due: bool) -> tuple[float, int, bool]:
        "The update's loss and tokens summed over the processes, and whether process 0 found a checkpoint due."
        if self.world == 1:
            return loss, tokens, due
        totals = torch.tensor([loss, tokens, due and self.rank == 0], dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        return totals[0].item(), int(totals[1].item()), bool(totals[2].item())

    def random_states(self, rng: dict, step: int) -> tuple[dict, dict]:
        """For a checkpoint: this process's random state `rng`, or with several processes all of theirs, and what
        the checkpoint records of the processes (their number). The processes first compare the digests of their
        weights (`weights_digest`, the fingerprint every checkpoint stores), which must
        agree."""
        if self.world == 1:
            return rng, {}
        states = [None] * self.world
        dist.all_gather_object(states, (rng, weights_digest(self.model)))
        if len({d for _, d in states}) > 1:
            raise RuntimeError(f"the processes' copies of the model differ at update {step}; this is a bug")
        return {"processes": [state for state, _ in states]}, {"world_size": self.world}


def under_torchrun() -> bool:
    "Whether this process was started by `torchrun` (which sets RANK, LOCAL_RANK and WORLD_SIZE)."
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def torchrun_rank() -> int:
    """This process's number among those `torchrun` started (its RANK), known before they join a process group:
    0 outside `torchrun`. Process 0 alone writes and speaks for all."""
    return int(os.environ["RANK"]) if under_torchrun() else 0


@contextlib.contextmanager
def process_group(device=None):
    """Inside, this process is one of `torchrun`'s: the default process group is initialised (NCCL for CUDA
    devices, gloo otherwise) and each process has its own GPU, number LOCAL_RANK. Yields the process's device
    (`device`, or by default its GPU, else the CPU). Outside `torchrun`, it does nothing and yields `device`."""
    if not under_torchrun():
        yield device
        return
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        if device.index is not None and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
            raise ValueError(f"--device {device}: under torchrun each process takes the GPU numbered by its LOCAL_RANK;"
                             " pass --device cuda (choose the GPUs with CUDA_VISIBLE_DEVICES)")
        device = torch.device("cuda", local_rank if device.index is None else device.index)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            device_id=device if device.type == "cuda" else None)
    try:
        yield device
    finally:
        dist.destroy_process_group()


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """The command that starts `nproc` processes of `annotated-transformer ARGS...` on this machine, with the
    `torchrun` of this Python (`torch.distributed.run`). Several machines: see the scaling chapter's commands."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "annotated_transformer", *args]


def launch(nproc: int, *args: str, timeout: float | None = None) -> str:
    """Run `annotated-transformer ARGS...` in `nproc` processes under `torchrun` and wait; returns what it printed.
    A failure raises `RuntimeError` with the end of its error output."""
    done = subprocess.run(torchrun_command(nproc, *args), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout
