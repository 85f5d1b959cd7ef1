"""The trainer (`annotated_transformer.lib.trainer`): exact resumes, recipes from the command line, clipping,
tasks by name."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer.lib.checkpoints import load_checkpoint, model_from_checkpoint
from annotated_transformer.lib.recipes import RECIPES, Task
from annotated_transformer.lib.tasks import TASKS, load_task
from annotated_transformer.lib.trainer import train
from annotated_transformer.training import PAD, copy_task, greedy_decode, pad_sequences

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


def test_tasks_are_looked_up_by_name_and_data_settings_are_checked():
    assert TASKS["copy"].__name__ == "copy_data" and set(TASKS) == {"copy", "multi30k", "tatoeba", "wmt14"}
    task = load_task(RECIPES["copy"])
    assert isinstance(task, Task) and task.src_vocab == task.tgt_vocab == 13 and len(task.train) == 20_000
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


def test_the_trainer_takes_the_steps_of_the_training_chapter_s_loop(tmp_path):
    "`train` adds runs, resume and processes around `train_model`'s updates: the same weights after the same updates."
    from annotated_transformer import make_model
    from annotated_transformer.training import train_model

    recipe = RECIPES["copy"].replace(
        N=1,
        d_model=32,
        d_ff=64,
        dropout=0.1,
        steps=30,
        warmup=10,
        eval_every=10,
        checkpoint_every=30,
        accum_steps=2,
        clip_norm=1.0,
    )
    train(recipe, tmp_path / "run", device="cpu", progress=False, bf16=False)
    task = load_task(recipe)
    torch.manual_seed(recipe.seed)
    model = make_model(task.src_vocab, task.tgt_vocab, recipe.model)
    history = train_model(
        model,
        task.train,
        task.valid,
        steps=30,
        max_tokens=recipe.max_tokens,
        factor=recipe.factor,
        warmup=recipe.warmup,
        accum_steps=2,
        clip_norm=1.0,
        label_smoothing=recipe.model.label_smoothing,
        seed=recipe.seed,
        eval_every=10,
    )
    trained = load_checkpoint(tmp_path / "run" / "checkpoints" / "step-000030.pt")["model"]
    assert trained.keys() == model.state_dict().keys()
    assert all(torch.equal(trained[name], weight) for name, weight in model.state_dict().items())
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(h["step"], h["valid_loss"]) for h in history] == [(m["step"], m["valid_loss"]) for m in logged]
