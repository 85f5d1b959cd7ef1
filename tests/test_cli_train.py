"""`train` from the command line (`annotated_transformer.cli.train`): recipes and their help, settings before or
after the options, runs started from another's settings, resumed with their own, and what a failed start leaves."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from annotated_transformer.cli import main
from annotated_transformer.lib import trainer as training
from annotated_transformer.lib.recipes import RECIPE_DESCRIPTIONS, RECIPES, Recipe
from annotated_transformer.lib.trainer import train as real_train
from annotated_transformer.model import TransformerConfig

SMALL = ["N=1", "d_model=16", "d_ff=32", "h=2", "warmup=2", "eval_every=2", "checkpoint_every=2", "--quiet"]


def test_resume_reads_the_recipe_from_the_run_it_continues(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "copy", "--out", str(run), "--device", "cpu", "steps=4", *SMALL]) == 0
    assert main(["train", "--out", str(run), "--resume", "steps=6", "--quiet"]) == 0  # no recipe named: the run's own
    summary = json.loads((run / "summary.json").read_text())
    assert summary["recipe"] == "copy" and summary["steps"] == 6
    assert json.loads((run / "config.json").read_text())["recipe"]["model"]["d_model"] == 16
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "empty"), "--resume"]) == 1
    assert "nothing to resume in --out" in capsys.readouterr().err


def test_a_failed_start_leaves_no_folder_behind_and_a_run_it_did_not_make_untouched(tmp_path, monkeypatch, capsys):
    from annotated_transformer.lib import trainer as training
    from annotated_transformer.lib.downloads import DataError

    def no_data(recipe):
        raise DataError("no network, no mirror")

    monkeypatch.setattr(training, "load_task", no_data)
    fresh = tmp_path / "runs" / "fresh"
    assert main(["train", "copy", "--out", str(fresh), "--quiet"]) == 1
    assert "no network, no mirror" in capsys.readouterr().err
    assert not fresh.exists()  # nor its .lock: the run never began
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main(["train", "copy", "--out", str(kept), "--quiet"]) == 1
    assert (kept / "notes.txt").read_text() == "mine"  # a folder the user made stays, whatever is in it


def test_an_out_that_holds_a_run_is_refused_before_anything_is_read(tmp_path, monkeypatch, capsys):
    from annotated_transformer.lib import trainer as training

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 2}\n')
    monkeypatch.setattr(training, "train", lambda *a, **k: pytest.fail("train was called"))
    assert main(["train", "copy", "--out", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(run)!r} already holds a run: continue it with --resume, or choose another --out" in err
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]  # and nothing else written


@pytest.mark.parametrize("name", ["../../escaped", "/abs/escaped", "a/b"])
def test_a_recipe_name_from_a_file_never_makes_a_path(name, tmp_path, monkeypatch, capsys):
    "A config.json whose recipe is named like a path: refused before anything is made, here or anywhere else."
    from annotated_transformer.lib.recipes import RECIPES

    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"recipe": {**RECIPES["copy"].to_dict(), "name": name}}))
    monkeypatch.chdir(work)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["train", "--config", str(config), "--quiet", "steps=2"]) == 2
    assert (
        f"name must be a plain name (letters, digits, '.', '_', '-'; no path), got {name!r}" in capsys.readouterr().err
    )
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_the_command_to_continue_an_interrupted_run_keeps_its_threads(tmp_path, monkeypatch, capsys):
    from annotated_transformer.lib import trainer as training

    def interrupted(recipe, run_dir, **options):
        (run_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    out = tmp_path / "run"
    assert main(["train", "copy", "--out", str(out), "--threads", "1", "--quiet"]) == 130
    assert capsys.readouterr().err.strip().endswith(f"--out {out} --resume --threads 1")


TINY = ["N=1", "d_model=32", "d_ff=64", "steps=24", "warmup=10", "eval_every=8", "checkpoint_every=8"]


TINY_RECIPE = RECIPES["copy"].replace(
    N=1, d_model=32, d_ff=64, steps=24, warmup=10, eval_every=8, checkpoint_every=8, seed=3
)


@pytest.fixture
def trained(monkeypatch):
    "`training.train` replaced by a stand-in that records how the command called it, and trains nothing."
    calls = []

    def stand_in(recipe, run_dir, **options):
        calls.append({"recipe": recipe, "run_dir": Path(run_dir), "threads": torch.get_num_threads(), **options})
        return {"finished": True, "steps": recipe.steps}

    monkeypatch.setattr(training, "train", stand_in)
    monkeypatch.delenv("AT_DEBUG", raising=False)
    return calls


def test_threads_set_pytorchs_threads_for_the_command_and_are_restored(trained, tmp_path, capsys):
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    assert main(["train", "copy", "--out", str(tmp_path / "a"), "--threads", str(wanted), *TINY]) == 0
    assert trained[-1]["threads"] == wanted and torch.get_num_threads() == before
    assert main(["train", "copy", "--out", str(tmp_path / "b"), *TINY]) == 0
    assert trained[-1]["threads"] == before  # not given: PyTorch's own choice
    assert main(["train", "copy", "--threads", "0"]) == 2
    assert "argument --threads: expected a positive whole number" in capsys.readouterr().err


@pytest.fixture
def stored_run(tmp_path):
    "A run directory as `train` leaves it, as far as --from reads it: its config.json."
    run = tmp_path / "stored"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"recipe": TINY_RECIPE.to_dict(), "device": "cpu"}))
    return run


def test_every_recipe_has_a_description_with_its_time():
    assert set(RECIPE_DESCRIPTIONS) == set(RECIPES)
    assert all("CPU" in text or "GPU" in text for text in RECIPE_DESCRIPTIONS.values())


def test_train_help_lists_the_recipes_their_settings_and_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setitem(RECIPES, "copy", RECIPES["copy"].replace(steps=1234))  # the help is made from the table
    assert main(["train", "--help"]) == 0
    help_text = capsys.readouterr().out
    flat = " ".join(help_text.split())  # as wrapped, words are separated by line breaks too
    for name, description in RECIPE_DESCRIPTIONS.items():
        assert f"{name} {description}" in flat
    assert "under a minute on a 2-core CPU" in flat and "about 24 minutes on 2 CPU cores with bf16" in flat
    assert "steps=1234" in flat and "steps=1200" not in flat
    assert "d_model=64" in flat and "direction=de-en" in flat  # the recipes' own values
    for field in dataclasses.fields(Recipe):
        if field.name not in ("name", "task", "model"):
            assert field.name in flat
    for field in dataclasses.fields(TransformerConfig):  # the model's settings with their defaults, as KEY=VALUE
        default = field.default if isinstance(field.default, str) else json.dumps(field.default)
        assert f"{field.name}={default}" in flat
    assert "factor=1.0" in flat and "clip_norm=null" in flat and "equation (3)" in flat
    for name in ("AT_DATA_DIR", "~/.cache/annotated_transformer", "AT_MIRROR", "AT_DEBUG=1", "OMP_NUM_THREADS"):
        assert name in flat
    for option in ("--config FILE", "--from RUN_DIR", "--threads N", "--tensorboard", "--debug"):
        assert option in help_text
    assert max(len(line) for line in help_text.splitlines()) <= 100


@pytest.mark.parametrize("word", ["lr=0.001", "learning_rate=1e-3"])
def test_a_learning_rate_is_refused_with_a_hint_at_the_schedule(word, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "copy", word]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("annotated-transformer: error: unknown setting(s)")
    assert "equation (3)" in err and "factor" in err and "warmup" in err
    assert main(["train", "copy", "bogus=1"]) == 2
    assert "equation (3)" not in capsys.readouterr().err  # the hint is for the learning rate only


def test_steps_below_warmup_are_warned_about_in_one_line(trained, tmp_path, capsys):
    assert main(["train", "copy", "--out", str(tmp_path / "short"), *TINY, "steps=5"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("annotated-transformer: warning: steps=5 is below warmup=10: the learning rate")
    assert trained[-1]["recipe"].steps == 5  # a warning: the run goes ahead
    assert main(["train", "copy", "--out", str(tmp_path / "even"), *TINY, "steps=10"]) == 0
    assert capsys.readouterr().err == ""


def test_tensorboard_reaches_train(trained, tmp_path):
    assert main(["train", "copy", "--out", str(tmp_path / "a"), "--tensorboard", *TINY]) == 0
    assert trained[-1]["tensorboard"] is True
    assert main(["train", "copy", "--out", str(tmp_path / "b"), *TINY]) == 0
    assert trained[-1]["tensorboard"] is False


def test_bf16_and_no_bf16_reach_train_and_neither_leaves_the_choice_to_it(trained, tmp_path):
    for option, bf16 in [("--bf16", True), ("--no-bf16", False), (None, None)]:
        assert main(["train", "copy", "--out", str(tmp_path / str(option)), *TINY, *filter(None, [option])]) == 0
        assert trained[-1]["bf16"] is bf16


def test_from_and_config_start_a_new_run_with_a_trained_runs_settings(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "first"
    real_train(TINY_RECIPE, first, device="cpu", progress=False)  # a real run, with the config.json train writes
    assert main(["train", "--from", str(first), "--quiet"]) == 0
    assert trained[-1]["recipe"] == TINY_RECIPE and trained[-1]["run_dir"] == Path("runs/copy")
    assert trained[-1]["resume"] is False
    second = tmp_path / "second"
    assert main(["train", "--config", str(first / "config.json"), "--out", str(second), "steps=32", "d_model=64"]) == 0
    assert trained[-1]["recipe"] == TINY_RECIPE.replace(steps=32, d_model=64) and trained[-1]["run_dir"] == second
    assert main(["train", "seed=5", "--from", str(first), "--out", str(second)]) == 0  # a setting first, too
    assert trained[-1]["recipe"] == TINY_RECIPE.replace(seed=5)


def test_config_may_be_a_file_holding_only_a_recipe(trained, tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(TINY_RECIPE.replace(h=2).to_dict()))
    assert main(["train", "--config", str(mine), "--out", str(tmp_path / "run")]) == 0
    assert trained[-1]["recipe"] == TINY_RECIPE.replace(h=2)


@pytest.mark.parametrize(
    "words, message",
    [
        ([], "the following arguments are required: recipe"),
        (["copy", "--from", "{run}"], "give a recipe's name or --from, not both"),
        (["--from", "{run}", "--resume"], "give one of the two"),
        (["--from", "{run}", "--config", "{run}/config.json"], "argument --config: not allowed with argument --from"),
        (["--from", "{tmp}/nothing"], "nothing/config.json is not a file"),
        (["--config", "{tmp}/damaged.json"], "damaged, not valid JSON"),
        (["--config", "{tmp}/list.json"], "holds no recipe"),
        (["--config", "{tmp}/other.json"], "not a recipe of this version"),
        (["--from", "{run}", "--out", "{run}"], "give the new run another --out"),
        (["--from", "{run}", "d_model=65"], "d_model (65) must be divisible by h (4)"),
    ],
)
def test_from_and_config_mistakes_are_usage_errors(words, message, trained, stored_run, tmp_path, capsys):
    (tmp_path / "damaged.json").write_text('{"recipe": ')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"recipe": {"name": "copy", "colour": "blue"}}))
    argv = ["train", *(w.format(run=stored_run, tmp=tmp_path) for w in words)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not trained


def test_an_interrupted_run_started_from_another_is_told_how_to_continue(stored_run, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AT_DEBUG", raising=False)

    def interrupted(recipe, run_dir, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    out = tmp_path / "new"
    assert main(["train", "--from", str(stored_run), "--out", str(out)]) == 130
    assert capsys.readouterr().err == (
        "annotated-transformer: interrupted; nothing was trained yet: run the same command again\n"
    )
    assert not out.exists()  # stopped before the run began: no folder, and no --resume to offer
    assert main(["--debug", "train", "--from", str(stored_run), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.endswith("run the same command again\n")

    def interrupted_after_it_began(recipe, run_dir, **options):
        (run_dir / "config.json").write_text("{}")  # what RunDir writes when the run begins
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted_after_it_began)
    assert main(["train", "--from", str(stored_run), "--out", str(out)]) == 130
    assert capsys.readouterr().err == (
        f"annotated-transformer: interrupted; continue with: annotated-transformer train --out {out} --resume\n"
    )


def test_a_refused_device_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "copy", "--device", "tpu"]) == 2
    assert "--device 'tpu' is not a device name" in capsys.readouterr().err and not (tmp_path / "runs").exists()
