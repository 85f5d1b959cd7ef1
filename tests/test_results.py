"""Results files (`annotated_transformer.lib.results`): names that come from files are never paths, the run's
summary and its results file stay in step, and the commit is recorded only from this project's checkout."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import annotated_transformer
from annotated_transformer.lib.evaluate import decoding_variant
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.results import record_result


def test_record_result_names_the_results_file_with_the_decoding_variant(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"recipe": RECIPES["multi30k-tiny"].to_dict(), "device": "cpu"}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "train_loss": 3.0, "valid_loss": 3.5}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": 10, "wall_time_s": 2.0, "finished": True}))

    def evaluation(beam_size, alpha, extra_len, bleu):
        return {
            "dataset": "multi30k",
            "split": "test",
            "direction": "de-en",
            "beam_size": beam_size,
            "alpha": alpha,
            "extra_len": extra_len,
            "bleu": bleu,
            "hypotheses": ["A dog."],
            "variant": decoding_variant(beam_size, alpha, extra_len),
        }

    papers = record_result(run_dir, evaluation(4, 0.6, 50, 20.0), tmp_path / "results")
    greedy = record_result(run_dir, evaluation(1, 0.6, 50, 15.0), tmp_path / "results")
    assert papers.name == "multi30k-tiny-de-en-test.json"
    assert greedy.name == "multi30k-tiny-de-en-test-beam1-alpha0.6-extra50.json"
    stored = {path.name: json.loads(path.read_text()) for path in (papers, greedy)}
    assert [r["bleu"] for r in stored.values()] == [20.0, 15.0]  # the second did not overwrite the first
    result = stored[greedy.name]
    assert result["recipe"] == "multi30k-tiny" and result["beam_size"] == 1 and result["steps"] == 10
    assert result["metrics"] == [{"step": 10, "train_loss": 3.0, "valid_loss": 3.5}]
    assert "hypotheses" not in result and "variant" not in result


RECORDED = sorted((Path(__file__).parent.parent / "results").glob("multi30k-*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_recorded_results_come_from_the_recipe_as_it_is(path):
    "A recipe changed after its result was recorded leaves the book and the README quoting another recipe's scores."
    result = json.loads(path.read_text())
    recipe = RECIPES[result["recipe"]].replace(direction=result["direction"])
    assert recipe.trains_differently(result["recipe_settings"]) == [], f"{path.name}: record it again with the recipe"


def test_recorded_results_are_found():
    assert {json.loads(p.read_text())["direction"] for p in RECORDED} == {"de-en", "en-de"}


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


@pytest.mark.parametrize("damaged", ["config.json", "summary.json", "metrics.jsonl"])
def test_a_damaged_run_file_is_named(tmp_path, damaged):
    "Cut short; for the log, a line before its last (a torn last line is what a crash leaves, and is dropped)."
    run_dir = run_folder(tmp_path)
    (run_dir / damaged).write_bytes(b'{"recipe": {"na' + (b'\n{"step": 1}\n' if damaged == "metrics.jsonl" else b""))
    reason = "line 1: not valid JSON; the file is damaged" if damaged == "metrics.jsonl" else "damaged, not valid JSON"
    with pytest.raises(ValueError, match=rf"run/{damaged}(: |, ){reason}"):
        record_result(run_dir, evaluation(), tmp_path / "results")


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


def commit_seen_from(package_parent: Path) -> str:
    "What `commit()` returns in a fresh Python whose `annotated_transformer` is the copy in `package_parent`."
    shutil.copytree(
        Path(annotated_transformer.__file__).parent,
        package_parent / "annotated_transformer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(package_parent), "OMP_NUM_THREADS": "1"}
    script = "import annotated_transformer.lib.results as r; print(r.__file__); print(r.commit())"
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=package_parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    where, found = out.stdout.split()
    assert Path(where).parent == package_parent / "annotated_transformer" / "lib"  # the copy, not this checkout
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
    (ours / "_toc.yml").write_text("format: jb-book\n")  # the book's table of contents, beside the package
    (ours / "pyproject.toml").write_text('[project]\nname = "annotated-transformer"\n')
    subprocess.run(["git", "-C", str(ours), "add", "-A"], check=True)
    git = ["git", "-C", str(ours), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "commit", "-qm", "the project"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert commit_seen_from(ours) == head  # the project's checkout (the package's copy is not tracked: not dirty)
