"""Run directories (`annotated_transformer.runs`, book/a2_runs.ipynb): results files whose names come from files,
damaged run files, and the commit recorded with a result."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import annotated_transformer
from annotated_transformer.recipes import RECIPES
from annotated_transformer.runs import record_result


# Results files: names read from files, damaged files


def run_folder(tmp_path, name="multi30k-tiny"):
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    recipe = {**RECIPES["multi30k-tiny"].to_dict(), "name": name}
    (run_dir / "config.json").write_text(json.dumps({"recipe": recipe, "device": "cpu"}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "train_loss": 3.0, "valid_loss": 3.5}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": 10, "wall_time_s": 2.0}))
    return run_dir


def evaluation(**changes):
    return {"split": "test", "direction": "de-en", "bleu": 20.0, "hypotheses": ["A dog."], "variant": "", **changes}


def files_in(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_results_file_name_from_a_file_is_never_a_path(tmp_path):
    run_dir = run_folder(tmp_path, name="../../escaped")
    results = tmp_path / "a" / "b" / "results"
    before = files_in(tmp_path)
    with pytest.raises(ValueError, match=r"run/config\.json: the recipe name '\.\./\.\./escaped' is not a plain name"):
        record_result(run_dir, evaluation(), results)
    assert files_in(tmp_path) == before  # nothing written, inside the results folder or out of it
    run_dir = run_folder(tmp_path / "plain")
    for change, setting in (
        ({"direction": "../de-en"}, "direction"),
        ({"split": "/tmp/x"}, "split"),
        ({"variant": "/../../x"}, "variant"),
    ):
        with pytest.raises(ValueError, match=f"the evaluation: the {setting} "):
            record_result(run_dir, evaluation(**change), results)
    assert record_result(run_dir, evaluation(), results) == results / "multi30k-tiny-de-en-test.json"


@pytest.mark.parametrize("damaged", ["config.json", "summary.json", "metrics.jsonl"])
def test_a_damaged_run_file_is_named(tmp_path, damaged):
    "Cut short; for the log, a line before its last (a torn last line is what a crash leaves, and is dropped)."
    run_dir = run_folder(tmp_path)
    (run_dir / damaged).write_bytes(b'{"recipe": {"na' + (b'\n{"step": 1}\n' if damaged == "metrics.jsonl" else b""))
    reason = "line 1: not valid JSON; the file is damaged" if damaged == "metrics.jsonl" else "damaged, not valid JSON"
    with pytest.raises(ValueError, match=rf"run/{damaged}(: |, ){reason}"):
        record_result(run_dir, evaluation(), tmp_path / "results")


# The commit recorded with a result


def commit_seen_from(package_parent: Path) -> str:
    "What `commit()` returns in a fresh Python whose `annotated_transformer` is the copy in `package_parent`."
    shutil.copytree(
        Path(annotated_transformer.__file__).parent,
        package_parent / "annotated_transformer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(package_parent), "OMP_NUM_THREADS": "1"}
    script = "import annotated_transformer.runs as r; print(r.__file__); print(r.commit())"
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=package_parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    where, found = out.stdout.split()
    assert Path(where).parent == package_parent / "annotated_transformer"  # the copy, not this checkout
    return found


def git_repository(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("someone else's project\n")
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    return folder


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_is_recorded_only_from_this_projects_checkout(tmp_path):
    other = git_repository(tmp_path / "other")
    assert commit_seen_from(other / "venv" / "site-packages") == "None"  # installed inside someone's repository
    assert commit_seen_from(other) == "None"  # at the top of a repository that is not this project
    ours = git_repository(tmp_path / "ours")
    (ours / "book").mkdir()
    (ours / "book" / "a2_runs.ipynb").write_text("{}\n")
    (ours / "pyproject.toml").write_text('[project]\nname = "annotated-transformer"\n')
    subprocess.run(["git", "-C", str(ours), "add", "-A"], check=True)
    git = ["git", "-C", str(ours), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "commit", "-qm", "the project"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert commit_seen_from(ours) == head  # the project's checkout (the package's copy is not tracked: not dirty)


# A start that fails


def test_a_start_that_fails_before_writing_anything_leaves_no_folder(tmp_path, monkeypatch):
    "Not a folder holding only `.lock`: the folders the run made go again; one that was there stays."
    from annotated_transformer import training
    from annotated_transformer.runs import RunDir

    def no_data(recipe):
        raise RuntimeError("the data could not be read")

    monkeypatch.setattr(training, "load_task", no_data)
    with pytest.raises(RuntimeError, match="the data could not be read"):
        training.train(RECIPES["copy"], tmp_path / "runs" / "copy", device="cpu", progress=False)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError), RunDir(tmp_path / "mine"):
        raise RuntimeError("a start that failed")
    assert list(tmp_path.iterdir()) == [tmp_path / "mine"] and list((tmp_path / "mine").iterdir()) == []
    with RunDir(tmp_path / "new") as run:  # a run that wrote something keeps its folder
        (run.path / "config.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [".lock", "config.json"]
