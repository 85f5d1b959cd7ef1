"""Training machinery (book/06_training.ipynb): batches, schedule, loss, accumulation, checkpoints, resume, copy task."""

import dataclasses
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from annotated_transformer import make_model
from annotated_transformer.charts import plot_metrics
from annotated_transformer.checkpoints import (
    CheckpointError,
    TrainingState,
    list_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from annotated_transformer.distributed import rng_state
from annotated_transformer.recipes import RECIPES, TASKS, Task, load_task, registered
from annotated_transformer.runs import RunDir
from annotated_transformer.training import (
    BOS,
    EOS,
    PAD,
    LabelSmoothing,
    accumulate_gradients,
    batches_of,
    copy_task,
    greedy_decode,
    make_optimizer,
    pad_sequences,
    padding_fraction,
    rate,
    token_batches,
    train,
)


def batch_of(pairs):
    return batches_of(pairs, range(len(pairs)))


# Batches and masks


def test_batch_shifts_targets_and_builds_masks():
    b = batch_of([([5, 6, 7, EOS], [BOS, 5, 6, 7, EOS]), ([8, EOS], [BOS, 8, EOS])])
    assert b.tgt_in.tolist() == [[BOS, 5, 6, 7], [BOS, 8, EOS, PAD]]
    assert b.tgt_y.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert b.src_mask.shape == (2, 1, 4) and b.src_mask[1, 0].tolist() == [True, True, False, False]
    assert b.tgt_mask.shape == (2, 4, 4) and b.tgt_mask.dtype == torch.bool
    assert b.tgt_mask[1].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert b.ntokens == 6


def test_padded_positions_do_not_reach_the_loss():
    criterion = LabelSmoothing(12, PAD, 0.1)
    b = batch_of([([5, 6, EOS], [BOS, 5, 6, 7, 8, EOS]), ([8, EOS], [BOS, 8, EOS])])
    log_probs = torch.randn(2, 5, 12).log_softmax(-1)
    changed = log_probs.clone()
    changed[1, 2:] = torch.randn(3, 12).log_softmax(-1)  # predictions at sentence 2's padded positions
    loss = criterion(log_probs.reshape(-1, 12), b.tgt_y.reshape(-1))
    torch.testing.assert_close(criterion(changed.reshape(-1, 12), b.tgt_y.reshape(-1)), loss, rtol=0, atol=0)


# Batching by length


def test_token_batches_use_every_sentence_once_within_the_budget():
    data = copy_task(3000, seed=1)
    src, tgt = [len(s) for s, _ in data], [len(t) - 1 for _, t in data]
    batches = token_batches(src, tgt, max_tokens=200, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(3000))
    for b in batches:
        assert len(b) * max(src[i] for i in b) <= 200 and len(b) * max(tgt[i] for i in b) <= 200
    assert token_batches(src, tgt, 200, seed=3) == batches
    assert token_batches(src, tgt, 200, seed=4) != batches
    shuffled = list(range(3000))
    size = round(3000 / len(batches))
    random_batches = [shuffled[i : i + size] for i in range(0, 3000, size)]
    assert padding_fraction(batches, src) < 0.05 < padding_fraction(random_batches, src)


def test_token_batches_errors():
    with pytest.raises(ValueError, match="does not fit"):
        token_batches([3, 50], [3, 4], max_tokens=20, seed=0)
    with pytest.raises(ValueError, match="target lengths"):
        token_batches([3, 4], [3], max_tokens=20, seed=0)


# Schedule


def test_rate_is_equation_3():
    assert rate(0, 512) == 0.0
    assert rate(100, 512, 1.0, 4000) == pytest.approx(512**-0.5 * 100 * 4000**-1.5)
    assert rate(10_000, 512, 2.0, 4000) == pytest.approx(2 * 512**-0.5 * 10_000**-0.5)
    rates = [rate(s, 512, 1.0, 4000) for s in range(1, 8001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000


def test_the_scheduler_gives_update_k_the_rate_of_step_k():
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = make_optimizer(model, d_model=64, factor=0.5, warmup=10)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    for k in range(1, 25):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(rate(k, 64, 0.5, 10))
        optimizer.step()
        scheduler.step()


# Label smoothing


def test_smoothed_targets():
    t = LabelSmoothing(10, PAD, 0.2).smoothed_targets(torch.tensor([3, PAD, 9]))
    torch.testing.assert_close(t[[0, 2]].sum(-1), torch.ones(2))
    assert t[0, 3].item() == pytest.approx(0.8) and t[0, 5].item() == pytest.approx(0.2 / 8)
    assert torch.all(t[:, PAD] == 0) and torch.all(t[1] == 0)


def test_relation_to_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64)
    target = torch.tensor([1, 4, PAD, 10, 3, PAD, 7])
    smooth = LabelSmoothing(11, PAD, 0.1)
    t = smooth.smoothed_targets(target).double()
    entropy = -torch.where(t > 0, t * t.log(), 0.0).sum()
    # ours = cross-entropy against our smoothed distribution, minus its entropy (a KL divergence)
    torch.testing.assert_close(
        smooth(logits.log_softmax(-1), target).double(), F.cross_entropy(logits, t, reduction="sum") - entropy
    )
    # without smoothing, ours is the plain cross-entropy that ignores padding
    torch.testing.assert_close(
        LabelSmoothing(11, PAD, 0.0)(logits.log_softmax(-1), target).double(),
        F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum"),
    )
    # PyTorch's built-in smoothing spreads epsilon over all V entries, the target and padding included
    keep = target != PAD
    theirs = (1 - 0.1) * F.one_hot(target[keep], 11).double() + 0.1 / 11
    builtin = F.cross_entropy(logits, target, label_smoothing=0.1, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(builtin, F.cross_entropy(logits[keep], theirs, reduction="sum"))
    # so the two differ exactly by where the target puts its mass, and by our entropy term
    log_p = logits.log_softmax(-1)[keep]
    ours = smooth(logits.log_softmax(-1), target).double()
    torch.testing.assert_close(ours, builtin + ((theirs - t[keep]) * log_p).sum() - entropy)


def test_label_smoothing_stays_finite_and_is_zero_at_the_target():
    smooth = LabelSmoothing(6, PAD, 0.1)
    target = torch.tensor([2, 5, PAD])
    log_probs = torch.randn(3, 6).log_softmax(-1)
    log_probs[:, PAD] = float("-inf")  # the model gives padding no probability at all
    log_probs.requires_grad_()
    loss = smooth(log_probs, target)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()
    # no probability at all on a right token: the divergence is infinite (not NaN)
    assert smooth(log_probs.detach(), torch.tensor([PAD, 5, PAD])).item() < float("inf")
    assert smooth(log_probs.detach(), torch.tensor([PAD, 5, 3])).item() < float("inf")
    hopeless = log_probs.detach().clone()
    hopeless[1, 5] = float("-inf")
    assert smooth(hopeless, torch.tensor([2, 5, PAD])).item() == float("inf")
    perfect = smooth.smoothed_targets(target[:2]).log()  # -inf where the target is 0
    assert smooth(perfect, target[:2]).item() == pytest.approx(0.0, abs=1e-6)


def test_label_smoothing_errors():
    with pytest.raises(ValueError, match="expected log-probabilities"):
        LabelSmoothing(6, PAD)(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least 3"):
        LabelSmoothing(2, PAD)


# Gradient accumulation


def test_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    model = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0)
    criterion = LabelSmoothing(13, PAD, 0.1)
    pairs = copy_task(20, seed=9)
    accumulate_gradients(model, [batch_of(pairs)], criterion)
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    accumulate_gradients(model, [batch_of(pairs[:3]), batch_of(pairs[3:11]), batch_of(pairs[11:])], criterion)
    for p, g in zip(model.parameters(), whole):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)


# Greedy decoding


class Scripted:
    "A stand-in model whose generator emits a fixed script per sentence (then repeats its last token)."

    def __init__(self, scripts, vocab=10):
        self.scripts, self.vocab = scripts, vocab

    def encode(self, src, src_mask):
        return torch.zeros(src.size(0), 1, 1)

    def decode(self, memory, src_mask, ys, tgt_mask):
        assert torch.all(ys[:, 0] == BOS), "decoding must start from <s>"
        self.position = ys.size(1) - 1
        return torch.zeros(ys.size(0), ys.size(1), 1)

    def generator(self, states):
        tokens = [s[min(self.position, len(s) - 1)] for s in self.scripts]
        return F.one_hot(torch.tensor(tokens), self.vocab).float().log()


def test_greedy_decode_stops_each_sentence_at_eos_and_respects_max_len():
    model = Scripted([[5, 6, EOS], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7], [EOS]])
    src = torch.ones(3, 4, dtype=torch.long)
    out = greedy_decode(model, src, torch.ones(3, 1, 4, dtype=torch.bool), max_len=6)
    assert out == [[5, 6], [7] * 6, []]


# Checkpoints


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "c.pt", {"config": {}, "model": {}, "step": 1})
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"config": {}, "model": {}, "step": 2})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_a_checkpoint_from_a_stranger_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"format": 1, "config": {}, "model": Payload(), "step": 0}, protocol=2))
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert not marker.exists()
    message = str(refused.value)  # the package's own words, naming the file and what the file asked for
    assert message.startswith(f"{path}: not a readable checkpoint: it holds something other than tensors and plain")
    assert "refuses to run code" in message and re.search(r"\(it asks for \S*mkdir\)", message)
    # PyTorch's own advice (load it with weights_only=False) is neither repeated nor chained to the error
    assert "weights_only" not in message and "can still be loaded" not in message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_broken_or_foreign_checkpoints_get_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="cut.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save({"format": 99, "model": {}}, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match="format 99"):
        load_checkpoint(tmp_path / "future.pt")
    torch.save({"format": 1, "model": {}}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match="missing config, src_vocab, step, tgt_vocab"):
        load_checkpoint(tmp_path / "partial.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "empty.pt")
    base = {"config": {"N": 1, "d_model": 16, "d_ff": 32, "h": 2}, "src_vocab": 10, "tgt_vocab": 10, "step": 1}
    save_checkpoint(tmp_path / "odd.pt", {**base, "config": {"N": 1, "colour": "red"}, "model": {}})
    with pytest.raises(CheckpointError, match="odd.pt: the stored configuration is not usable"):
        model_from_checkpoint(tmp_path / "odd.pt")
    save_checkpoint(
        tmp_path / "misfit.pt", {**base, "model": make_model(10, 10, N=1, d_model=32, d_ff=32, h=2).state_dict()}
    )
    with pytest.raises(CheckpointError, match="misfit.pt: the weights do not fit"):
        model_from_checkpoint(tmp_path / "misfit.pt")


# The training loop

TINY = RECIPES["copy"].replace(N=1, d_model=32, d_ff=64, steps=24, warmup=10, eval_every=8, checkpoint_every=8)


def final_weights(run_dir):
    return load_checkpoint(sorted((run_dir / "checkpoints").glob("*.pt"))[-1])["model"]


@pytest.mark.parametrize(
    "recipe, stop",
    [
        (TINY.replace(dropout=0.1), 13),  # mid-epoch
        (TINY.replace(dropout=0.1, max_tokens=8000, accum_steps=3), 13),  # accumulation, past an epoch boundary
    ],
)
def test_an_interrupted_run_resumes_bit_identically(tmp_path, recipe, stop):
    straight = train(recipe, tmp_path / "straight", device="cpu", progress=False)
    interrupted = train(recipe, tmp_path / "resumed", device="cpu", progress=False, stop_after=stop)
    assert interrupted["steps"] == stop and not interrupted["finished"] and "exact_match" not in interrupted
    # as after a crash: an evaluation line written after the last checkpoint, which the resumed run redoes
    with open(tmp_path / "resumed" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": stop + 1, "train_loss": 0.0}) + "\n")
    resumed = train(recipe, tmp_path / "resumed", device="cpu", progress=False, resume=True)
    assert resumed["steps"] == straight["steps"] == 24 and resumed["finished"]
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    read = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    keep = ("step", "epoch", "train_loss", "valid_loss", "valid_ppl", "lr")
    assert [{k: m[k] for k in keep} for m in read("resumed")] == [{k: m[k] for k in keep} for m in read("straight")]
    if recipe.accum_steps == 3:
        assert read("straight")[-1]["epoch"] >= 2  # the run crossed epoch boundaries


def test_training_state_crosses_an_epoch_boundary_and_sums_the_window():
    state, seen = TrainingState(), []
    for batches in (2, 2, 1, 2):  # an epoch of 5 batches, 2 per update: the third update takes the one left
        state.advance(batches, 5, loss=3.0, tokens=10)
        seen.append((state.step, state.epoch, state.position))
    assert seen == [(1, 0, 2), (2, 0, 4), (3, 1, 0), (4, 1, 2)]
    assert (state.window_loss, state.window_tokens) == (12.0, 40)


def test_list_checkpoints_finds_only_the_runs_own_in_step_order(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in (
        "step-000100.pt",
        "step-000020.pt",
        "step-1000000.pt",
        "step-best.pt",
        "step-3.pt",
        "step-000040.pt.bak",
        ".step-000060.pt.4242.tmp",
        "notes.txt",
        "step-000080.pth",
    ):
        (folder / name).write_bytes(b"")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000020.pt", "step-000100.pt", "step-1000000.pt"]
    assert list_checkpoints(tmp_path / "nothing-here") == []


def test_run_dir_refuses_a_folder_that_holds_a_run(tmp_path):
    cpu = torch.device("cpu")
    with_metrics, with_checkpoint = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    with_metrics.path.mkdir()
    with_metrics.metrics.write_text('{"step": 8}\n')
    save_checkpoint(with_checkpoint.path / "checkpoints" / "step-000008.pt", {"config": {}, "model": {}, "step": 8})
    for run in (with_metrics, with_checkpoint):
        with pytest.raises(FileExistsError, match="already holds a run"):
            run.start(TINY, cpu, 1, 1, resume=False)
        assert not (run.path / "config.json").exists()
        run.start(TINY, cpu, 1, 1, resume=True)  # continuing the run in it is allowed
        assert json.loads((run.path / "config.json").read_text())["recipe"] == TINY.to_dict()
    RunDir(tmp_path / "c", writer=False).start(TINY, cpu, 2, 1, resume=False)  # only the writer writes
    assert not (tmp_path / "c").exists()


def test_resume_restores_the_newest_checkpoint_and_forgets_metrics_logged_after_it(tmp_path):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = make_model(13, 13, TINY.model)
    optimizer, scheduler = make_optimizer(model, TINY.model.d_model, TINY.factor, TINY.warmup)
    run = RunDir(tmp_path / "run")
    run.start(TINY, cpu, 1, 1, resume=False)
    for step in (8, 16, 24):
        run.log({"step": step, "train_loss": 1.0})
    state = {
        "config": TINY.to_dict()["model"],
        "recipe": TINY.to_dict(),
        "src_vocab": 13,
        "tgt_vocab": 13,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": 1,
        "position": 3,
        "elapsed_s": 2.5,
        "window": (4.0, 20),
        "rng": rng_state(cpu),
    }
    run.save({**state, "step": 8}, keep=5)
    expected_draw = torch.rand(3)  # what dropout would draw next, at the newest checkpoint
    run.save({**state, "step": 16}, keep=5)
    (run.path / "checkpoints" / "step-best.pt").write_bytes(b"not the run's own")

    torch.manual_seed(1)
    fresh = make_model(13, 13, TINY.model)
    fresh_optimizer, fresh_scheduler = make_optimizer(fresh, TINY.model.d_model, TINY.factor, TINY.warmup)
    reader = RunDir(run.path, writer=False)
    reader.resume(TINY, fresh, fresh_optimizer, fresh_scheduler, cpu)
    assert len(run.metrics.read_text().splitlines()) == 3  # only the writer rewrites the metrics
    restored = RunDir(run.path).resume(TINY, fresh, fresh_optimizer, fresh_scheduler, cpu)
    assert restored == TrainingState(
        step=16,
        epoch=1,
        position=3,
        elapsed_s=2.5,
        window_loss=4.0,
        window_tokens=20,
        last={"step": 16, "train_loss": 1.0},
    )  # the newest evaluation kept
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [8, 16]
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    assert torch.equal(torch.rand(3), expected_draw)
    with pytest.raises(
        ValueError,
        match=r"step-000016.pt: a resumed run keeps its settings, and these differ: "
        r"dropout=0.2 \(the run has 0.0\), seed=5 \(the run has 0\)",
    ):
        run.resume(TINY.replace(seed=5, dropout=0.2), fresh, fresh_optimizer, fresh_scheduler, cpu)
    with pytest.raises(ValueError, match="at update 16 already, past steps=10"):
        run.resume(TINY.replace(steps=10), fresh, fresh_optimizer, fresh_scheduler, cpu)
    with pytest.raises(CheckpointError, match=r"written by 1 process\(es\); resume with as many \(now 2\)"):
        run.resume(TINY, fresh, fresh_optimizer, fresh_scheduler, cpu, rank=0, world_size=2)


def test_run_directory_contents_and_guards(tmp_path):
    run = tmp_path / "run"
    summary = train(TINY.replace(keep_checkpoints=2), run, device="cpu", progress=False)
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock",
        "checkpoints",
        "config.json",
        "metrics.jsonl",
        "summary.json",
    ]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000016.pt", "step-000024.pt"]
    assert load_checkpoint(run / "checkpoints" / "step-000024.pt")["vocab"]["eos"] == EOS
    assert json.loads((run / "config.json").read_text())["recipe"] == TINY.replace(keep_checkpoints=2).to_dict()
    assert json.loads((run / "summary.json").read_text()) == summary
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert set(line) == {"step", "epoch", "train_loss", "valid_loss", "valid_ppl", "lr", "tokens_per_s", "elapsed_s"}
    assert {"recipe", "device", "steps", "wall_time_s", "final", "exact_match"} <= set(summary)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(TINY, run, device="cpu", progress=False)
    with pytest.raises(
        ValueError,
        match=r"config.json: a resumed run keeps its settings, .* keep_checkpoints=5 "
        r"\(the run has 2\)",
    ):
        train(TINY, run, device="cpu", progress=False, resume=True)
    with pytest.raises(ValueError, match="factor must be a positive number"):
        TINY.replace(factor=float("nan"))
    with pytest.raises(ValueError, match="clip_norm must be a positive number"):
        TINY.replace(clip_norm=True)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(TINY, tmp_path / "empty", device="cpu", progress=False, resume=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' is not available here"):
            train(TINY, tmp_path / "gpu", device="cuda", progress=False)
    import matplotlib

    matplotlib.use("Agg")
    assert len(plot_metrics(run).get_lines()) == 2


@pytest.mark.slow
def test_the_copy_recipe_from_the_command_line_learns_and_scores_its_checkpoint(tmp_path, single_threaded_env):
    """The copy task, end to end: the console script, its run directory, its summary's score measured on the
    checkpoint it wrote, and greedy copies. A third of the recipe's updates (the training chapter trains all of it and
    asserts 99% copied exactly)."""
    run, steps = tmp_path / "copy", 400
    cli = Path(sys.executable).with_name("annotated-transformer")
    result = subprocess.run(
        [cli, "train", "copy", "--out", run, "--quiet", "--device", "cpu", f"steps={steps}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=single_threaded_env,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == steps
    model, state = model_from_checkpoint(sorted((run / "checkpoints").glob("*.pt"))[-1])
    task = load_task(RECIPES["copy"])
    assert state["step"] == steps and task.evaluate(model, "cpu") == {"exact_match": summary["exact_match"]}
    # Sequences of its own, decoded here: most are copied exactly (the summary says 90% on this project's CPU).
    held_out = copy_task(300, seed=424242, exclude=task.train)
    src = pad_sequences([s for s, _ in held_out])
    out = greedy_decode(model, src, (src != PAD)[:, None, :], max_len=src.size(1) + 5)
    assert sum(o == s[:-1] for o, (s, _) in zip(out, held_out)) >= 0.5 * len(held_out)


def test_settings_may_come_before_or_after_the_options(tmp_path, capsys):
    from annotated_transformer.cli import main

    out = str(tmp_path / "run")
    for argv in (
        ["train", "copy", "--out", out, "steps=0"],
        ["train", "copy", "steps=0", "--out", out],
        ["train", "--quiet", "copy", "steps=0"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert (
            err
            == "annotated-transformer: error: steps must be a positive integer, got 0 (see annotated-transformer train --help)\n"
        )
    assert main(["train", "copy", "--out", out, "--bogus"]) == 2
    assert "unrecognized argument '--bogus'" in capsys.readouterr().err


def test_held_out_and_validation_data_are_never_trained_on():
    task = load_task(RECIPES["copy"])
    trained = {tuple(s) for s, _ in task.train}
    assert not any(tuple(s) in trained for s, _ in task.valid)
    assert not any(tuple(s) in trained for s, _ in copy_task(500, seed=2, exclude=task.train))


def test_command_line_errors_are_one_line(tmp_path):
    for args, message, code in (
        (["train", "copy", "d_model=65"], "divisible", 2),
        (["train", "kopy"], "unknown recipe", 2),
        (["train"], "required: recipe", 2),
        (["train", "copy", "--resume", "--out", str(tmp_path / "none")], "nothing to resume", 1),
    ):
        result = subprocess.run([sys.executable, "-m", "annotated_transformer", *args], capture_output=True, text=True)
        assert result.returncode == code
        assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_gradient_clipping_is_applied_once_per_update_when_set(tmp_path, monkeypatch):
    calls = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils, "clip_grad_norm_", lambda params, norm: calls.append(norm) or real(params, norm)
    )
    train(
        TINY.replace(steps=5, eval_every=5, checkpoint_every=5, clip_norm=0.5),
        tmp_path / "clipped",
        device="cpu",
        progress=False,
    )
    assert calls == [0.5] * 5
    calls.clear()
    train(TINY.replace(steps=5, eval_every=5, checkpoint_every=5), tmp_path / "plain", device="cpu", progress=False)
    assert calls == []


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_closed_form_equals_the_kl_divergence_from_the_full_target(smoothing, dtype):
    torch.manual_seed(3)
    smooth = LabelSmoothing(9, PAD, smoothing)
    target = torch.tensor([4, PAD, 8, 1, 2, PAD, 3])
    log_probs = torch.randn(7, 9, dtype=torch.float64).log_softmax(-1)
    t = smooth.smoothed_targets(target).double()
    explicit = torch.where(t > 0, t * (torch.where(t > 0, t, 1.0).log() - log_probs), 0.0).sum()
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    torch.testing.assert_close(smooth(log_probs.to(dtype), target).double(), explicit, **tolerance)
    # and the gradients too
    lp = log_probs.to(dtype).requires_grad_()
    smooth(lp, target).backward()
    torch.testing.assert_close(lp.grad.double(), torch.where(target[:, None] != PAD, -t, 0.0), **tolerance)


def test_tasks_are_looked_up_by_name_and_data_settings_are_checked():
    assert registered(TASKS, "copy").__name__ == "copy_data" and set(TASKS) == {"copy", "multi30k", "tatoeba", "wmt14"}
    task = load_task(RECIPES["copy"])
    assert isinstance(task, Task) and task.src_vocab == task.tgt_vocab == 13 and len(task.train) == 20_000
    with pytest.raises(ValueError, match="unknown name 'nope'; the registered ones are copy, multi30k, tatoeba, wmt14"):
        registered(TASKS, "nope")
    with pytest.raises(ValueError, match="unknown task 'nope'; the tasks are .*copy"):
        load_task(dataclasses.replace(RECIPES["copy"], task="nope"))
    with pytest.raises(ValueError, match="direction must look like 'de-en'"):
        RECIPES["copy"].replace(direction="german")
    with pytest.raises(ValueError, match="average_checkpoints .* cannot exceed keep_checkpoints"):
        RECIPES["copy"].replace(average_checkpoints=9, keep_checkpoints=3)
    with pytest.raises(ValueError, match="min_freq must be a positive integer"):
        RECIPES["copy"].replace(min_freq=0)
    with pytest.raises(ValueError, match=r"accum_steps \(4\) and tokens_per_update \(2000\) both set"):
        RECIPES["copy"].replace(tokens_per_update=2000, accum_steps=4)
    assert RECIPES["copy"].replace(tokens_per_update=2000).tokens_per_update == 2000
