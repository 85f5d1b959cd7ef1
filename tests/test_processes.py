"""One model, many processes (`annotated_transformer.lib.processes`): every process's share of an update, the
exchange of gradients, resumes of runs of two processes."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from annotated_transformer.lib.checkpoints import list_checkpoints, load_checkpoint
from annotated_transformer.lib.devices import rng_state
from annotated_transformer.lib.processes import (
    Processes,
    accumulation_steps,
    rank_and_world_size,
    split_for_processes,
    torchrun_command,
)
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.tasks import load_task
from annotated_transformer.training import pair_lengths, token_batches


def test_with_one_process_the_distributed_helpers_change_nothing():
    cpu = torch.device("cpu")
    model = torch.nn.Linear(2, 2)
    assert rank_and_world_size() == (0, 1)
    torch.manual_seed(5)
    processes = Processes(model, cpu, seed=0, data=(1, 2, 3))  # one process keeps the stream that made the weights
    after = torch.rand(2)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(2))
    assert (processes.rank, processes.world) == (0, 1) and processes.learner is model
    assert processes.share([[0, 1], [2]], [4, 5, 6]) == ([[0, 1], [2]], None)  # accumulate_gradients counts itself
    assert processes.total(3.5, 7, True) == (3.5, 7, True)
    rng = rng_state(cpu)
    assert processes.random_states(rng, 1) == (rng, {})  # the checkpoint stores this process's state as it is


def test_every_sentence_lands_on_exactly_one_process_per_epoch():
    lengths = [3 + (i * 7919) % 40 for i in range(3001)]
    for world in (1, 2, 3, 8):
        order = split_for_processes(token_batches(lengths, lengths, 300, seed=4), world)
        assert len(order) % world == 0
        accum = 2
        seen = Counter()
        for position in range(0, len(order), world * accum):  # the loop's share: update[rank::world]
            update = order[position : position + world * accum]
            shares = [update[rank::world] for rank in range(world)]
            assert len({len(share) for share in shares}) == 1  # the same number of batches for every process
            seen.update(i for share in shares for batch in share for i in batch)
        assert seen == Counter(range(3001))


def test_the_accumulation_comes_from_the_number_of_processes():
    base = RECIPES["wmt14-base"]
    assert [accumulation_steps(base, world) for world in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert accumulation_steps(RECIPES["copy"], 8) == RECIPES["copy"].accum_steps  # no tokens_per_update: as set


def _torchrun(nproc, *args, env=None, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        torchrun_command(nproc, *args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def _children(pid: int) -> list[int]:
    "The processes whose parent is `pid` (Linux: read from /proc)."
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # the process ended while being read
            continue
        if int(fields.get("PPid", "0")) == pid:
            found.append(int(status.parent.name))
    return found


def _running(pid: int) -> bool:
    "Whether `pid` is a process that has not yet ended (a zombie has ended: it holds no files)."
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


COPY = ["train", "copy", "--device", "cpu", "--quiet", "dropout=0.0", "max_tokens=390", "eval_every=1000"]


def _weights(run):
    return load_checkpoint(list_checkpoints(run)[-1])


@pytest.mark.slow
def test_two_processes_make_the_same_updates_as_one_process_on_both_shares(tmp_path):
    # the same 2 batches per update: 2 processes x 1 batch, or 1 process accumulating 2 batches
    steps = ["steps=12", "tokens_per_update=780", "checkpoint_every=6"]
    lengths = pair_lengths(load_task(RECIPES["copy"]).train)
    assert len(token_batches(*lengths, 390, seed=0)) % 2 == 0  # no batch is split for 2 processes
    two = _torchrun(2, *COPY, *steps, "--out", str(tmp_path / "two"))
    one = subprocess.run(
        [sys.executable, "-m", "annotated_transformer", *COPY, *steps, "--out", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    out, err = two.communicate(timeout=600)
    assert two.returncode == 0, err[-2000:]
    assert one.returncode == 0, one.stderr[-2000:]
    a, b = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert a["step"] == b["step"] == 12 and a["world_size"] == 2 and "world_size" not in b
    worst = max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])
    assert worst < 1e-4, worst  # the same updates, up to the order in which float sums were taken
    assert out.count('"finished": true') == 1  # one process speaks for both


@pytest.mark.slow
def test_a_two_process_run_killed_and_resumed_makes_the_same_updates(tmp_path):
    # The hard paths at once: an odd number of batches (one is split for 2 processes), an epoch boundary inside
    # the run with a short last update, checkpoints by the clock (one after every update here), dropout.
    settings = [
        "max_tokens=400",
        "tokens_per_update=1600",
        "steps=110",
        "dropout=0.1",
        "checkpoint_every=1000",
        "checkpoint_minutes=1e-9",
        "keep_checkpoints=3",
    ]
    lengths = pair_lengths(load_task(RECIPES["copy"]).train)
    batches = len(token_batches(*lengths, 400, seed=0))
    assert batches % 2 == 1 and (batches + 1) // 4 < 110  # split once; the first epoch ends within the run
    whole = _torchrun(2, *COPY, *settings, "--out", str(tmp_path / "whole"))
    cut = _torchrun(2, *COPY, *settings, "--out", str(tmp_path / "cut"))
    checkpoints = tmp_path / "cut" / "checkpoints"
    deadline = time.time() + 600
    while not any(int(p.stem[5:]) >= 60 for p in checkpoints.glob("step-*.pt")):
        assert time.time() < deadline and cut.poll() is None, cut.stderr.read()[-2000:] if cut.poll() else "timeout"
        time.sleep(0.02)
    workers = _children(cut.pid)  # torchrun starts each worker in a session of its own
    assert len(workers) == 2
    for pid in (cut.pid, *workers):  # torchrun and both workers, at once, as a lost machine would
        os.kill(pid, signal.SIGKILL)
    cut.wait()
    while any(_running(pid) for pid in workers):  # until they are gone, and their lock with them
        time.sleep(0.02)
    assert max(int(p.stem[5:]) for p in checkpoints.glob("step-*.pt")) < 110
    single = subprocess.run(
        [sys.executable, "-m", "annotated_transformer", *COPY, *settings, "--out", str(tmp_path / "cut"), "--resume"],
        capture_output=True,
        text=True,
    )
    assert single.returncode == 1 and "written by 2 process(es); resume with as many (now 1)" in single.stderr
    resumed = _torchrun(2, *COPY, *settings, "--out", str(tmp_path / "cut"), "--resume")
    for proc in (whole, resumed):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert a["step"] == b["step"] == 110 and a["epoch"] == 1
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert len(list((tmp_path / "whole" / "checkpoints").glob("step-*.pt"))) == 3  # timed ones, the newest kept


_GRADIENTS = """
import sys, torch, torch.distributed as dist
from annotated_transformer import make_model
from annotated_transformer.lib.processes import Processes, split_for_processes
from annotated_transformer.training import (LabelSmoothing, accumulate_gradients, batches_of, copy_task, pair_lengths,
                                            token_batches)
world = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0)
pairs = copy_task(200, seed=3)
lengths = pair_lengths(pairs)
update = split_for_processes(token_batches(*lengths, 120, seed=0), 2)[:6]  # 3 batches a process
processes = Processes(model, torch.device("cpu"), seed=0, data=(len(pairs),))
mine, normalizer = processes.share(update, lengths[1])  # the training loop's own share and normalizer
accumulate_gradients(processes.learner, [batches_of(pairs, b) for b in mine], LabelSmoothing(13, 0, 0.1), normalizer=normalizer)
torch.save([p.grad for p in model.parameters()], f"{sys.argv[1]}/{dist.get_rank() if world > 1 else 'one'}.pt")
"""


@pytest.mark.slow
def test_two_processes_compute_the_gradient_of_the_whole_update(tmp_path):
    # Adam hides a wrong gradient scale (it divides it out), so the scale is checked on the gradients themselves.
    script = tmp_path / "gradients.py"
    script.write_text(_GRADIENTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in (
        [sys.executable, str(script), str(tmp_path)],
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            str(tmp_path),
            "2",
        ],
    ):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    one = torch.load(tmp_path / "one.pt")
    for rank in (0, 1):
        grads = torch.load(tmp_path / f"{rank}.pt")
        assert all(torch.allclose(g, h, atol=1e-6, rtol=1e-5) for g, h in zip(grads, one))
    assert max(g.abs().max().item() for g in one) > 1e-3  # gradients worth comparing


def test_the_rank_torchrun_gives_is_read_in_one_place(monkeypatch):
    from annotated_transformer.lib.processes import torchrun_rank

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "3")  # RANK alone: not a process torchrun started
    assert torchrun_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert torchrun_rank() == 3
