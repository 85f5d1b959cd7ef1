"""The CUDA paths of training, run only where a GPU is: bf16 autocast, fused Adam, the CUDA random state kept in
checkpoints and restored on resume, NCCL under torchrun, and a real torch.compile. CI has no GPU and skips them;
on a machine with one, `pytest tests/test_cuda.py` runs them."""

import json

import pytest
import torch

from annotated_transformer import make_model
from annotated_transformer.lib.checkpoints import list_checkpoints, load_checkpoint
from annotated_transformer.lib.processes import launch
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.trainer import train
from annotated_transformer.training import (
    PAD,
    LabelSmoothing,
    accumulate_gradients,
    batches_of,
    copy_task,
    make_optimizer,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# The copy recipe with dropout on, so that the random state decides what a resumed run computes.
SHORT = RECIPES["copy"].replace(steps=40, eval_every=20, checkpoint_every=20, dropout=0.1)


def weights(run_dir) -> dict:
    return load_checkpoint(list_checkpoints(run_dir)[-1])["model"]


def test_adam_is_fused_on_cuda_and_bf16_autocast_computes_the_same_loss():
    torch.manual_seed(0)
    model = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).cuda()
    assert make_optimizer(model, 32)[0].defaults["fused"] is True
    assert torch.cuda.is_bf16_supported()
    pairs, criterion = copy_task(40, seed=0), LabelSmoothing(13, PAD, 0.1)
    batch = batches_of(pairs, range(40)).to("cuda")
    full, _ = accumulate_gradients(model, [batch], criterion, autocast=False)
    model.zero_grad()
    half, _ = accumulate_gradients(model, [batch], criterion, autocast=True)
    assert half != full and abs(half - full) < 0.02 * full  # bf16 ran, and to bf16's precision agrees


def test_a_cuda_run_keeps_its_random_state_and_resumes_to_the_same_weights(tmp_path):
    train(SHORT, tmp_path / "whole", device="cuda", progress=False)
    train(SHORT, tmp_path / "cut", device="cuda", progress=False, stop_after=20)
    state = load_checkpoint(list_checkpoints(tmp_path / "cut")[-1])
    assert isinstance(state["rng"]["cuda"], torch.Tensor)  # the GPU's dropout stream is in the checkpoint
    train(SHORT, tmp_path / "cut", device="cuda", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    gap = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    print(f"largest weight difference, resumed against uninterrupted: {gap:.1e}")
    # GPU kernels may add in any order (the embedding's backward adds atomically), so the last bits may differ;
    # a resumed run with other dropout masks would differ by far more.
    assert gap < 1e-4


def test_torch_compile_trains_on_cuda_as_the_eager_model_does(tmp_path):
    recipe = SHORT.replace(steps=20, eval_every=20, dropout=0.0)
    eager = train(recipe, tmp_path / "eager", device="cuda", progress=False)["final"]["valid_loss"]
    compiled = train(recipe, tmp_path / "compiled", device="cuda", progress=False, compile=True)["final"]["valid_loss"]
    print(f"validation loss after 20 updates: eager {eager:.4f}, compiled {compiled:.4f}")
    assert abs(compiled - eager) < 0.02 * eager  # the same computation, up to the order of float operations


def train_copy_under_torchrun(processes: int, out) -> str:
    "20 updates of the copy recipe in `processes` processes on GPUs, through NCCL; what the command printed."
    return launch(
        processes,
        "train",
        "copy",
        "--out",
        str(out),
        "--device",
        "cuda",
        "--quiet",
        "steps=20",
        "eval_every=20",
        "checkpoint_every=20",
        timeout=300,
    )


def test_torchrun_starts_an_nccl_process_group_and_trains(tmp_path):
    "One GPU, one process: NCCL is set up and the run goes through it (exchanging gradients needs two GPUs)."
    output = train_copy_under_torchrun(1, tmp_path / "nccl")
    assert json.loads(output)["finished"]
    assert json.loads((tmp_path / "nccl" / "config.json").read_text())["device"].startswith("cuda")


def test_fused_adam_takes_the_same_steps_as_the_unfused_one():
    "Fused Adam (one kernel for all tensors) computes the paper's update as the per-tensor implementation does."
    torch.manual_seed(0)
    first = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).cuda()
    second = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).cuda()
    second.load_state_dict(first.state_dict())
    initial = {k: v.clone() for k, v in first.state_dict().items()}
    fused, unfused = make_optimizer(first, 32, warmup=10), make_optimizer(second, 32, warmup=10)
    assert fused[0].defaults["fused"] is True
    for group in unfused[0].param_groups:
        group["fused"], group["foreach"] = False, False  # the plain loop over tensors, one at a time
    pairs, criterion = copy_task(40, seed=0), LabelSmoothing(13, PAD, 0.1)
    batch = batches_of(pairs, range(40)).to("cuda")
    for _ in range(5):
        # One gradient for both: near-zero gradients differ between two backward passes (CUDA adds some atomically,
        # in any order), and Adam, dividing by their root mean square, turns such noise into full-size steps.
        accumulate_gradients(first, [batch], criterion, autocast=False)
        for mine, theirs in zip(second.parameters(), first.parameters()):
            mine.grad = theirs.grad.clone()
        for optimizer, scheduler in (fused, unfused):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    a, b = first.state_dict(), second.state_dict()
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - initial[k]).abs().max().item() for k in a)
    print(f"after 5 updates: weights moved by up to {moved:.1e}; fused and unfused apart by {gap:.1e}")
    assert moved > 1e-3  # the updates did something
    assert gap < 1e-5  # and the same thing, up to float32 rounding in another order


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_nccl_processes_train_as_one(tmp_path):
    "Two processes on two GPUs exchange gradients through NCCL and end with the same weights in every process."
    output = train_copy_under_torchrun(2, tmp_path / "two")
    assert json.loads(output)["finished"]
    state = load_checkpoint(list_checkpoints(tmp_path / "two")[-1])
    assert state["world_size"] == 2 and len(state["rng"]["processes"]) == 2


def test_the_fast_path_computes_the_straightforward_loss_on_cuda():
    "PyTorch's attention kernel on the GPU: the function of the book's explicit path."
    import contextlib

    from annotated_transformer import explicit_attention

    torch.manual_seed(0)
    model = make_model(13, 13, N=2, d_model=64, d_ff=128, h=4, dropout=0.0).cuda()
    pairs, criterion = copy_task(40, seed=0), LabelSmoothing(13, PAD, 0.1)
    batch = batches_of(pairs, range(40)).to("cuda")
    losses = {}
    for fast in (False, True):
        model.zero_grad()
        with contextlib.nullcontext() if fast else explicit_attention():
            losses[fast], _ = accumulate_gradients(model, [batch], criterion, autocast=False)
    print(f"loss: straightforward {losses[False]:.6f}, fast {losses[True]:.6f}")
    assert abs(losses[True] - losses[False]) < 1e-4 * losses[False]
