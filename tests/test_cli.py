"""The command line (`annotated_transformer.cli`, book/a4_command_line.ipynb): resuming a run by its folder alone,
and the hint every mistake in the arguments ends with."""

import json

import pytest

from annotated_transformer.cli import main

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


@pytest.mark.parametrize(
    "argv, hint",
    [
        ([], "(see annotated-transformer --help)"),
        (["--frobnicate"], "(see annotated-transformer --help)"),
        (["train", "kopy"], "(see annotated-transformer train --help)"),
        (["translate"], "(see annotated-transformer translate --help)"),
    ],
)
def test_every_usage_error_says_where_the_help_is(argv, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("annotated-transformer: error: ") and err.endswith(f" {hint}\n") and err.count("\n") == 1


def test_a_failed_start_leaves_no_folder_behind_and_a_run_it_did_not_make_untouched(tmp_path, monkeypatch, capsys):
    from annotated_transformer import training
    from annotated_transformer.data import DataError

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
    from annotated_transformer import training

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
    from annotated_transformer.recipes import RECIPES

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
    from annotated_transformer import training

    def interrupted(recipe, run_dir, **options):
        (run_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    out = tmp_path / "run"
    assert main(["train", "copy", "--out", str(out), "--threads", "1", "--quiet"]) == 130
    assert capsys.readouterr().err.strip().endswith(f"--out {out} --resume --threads 1")
