"""The schema of every file the package writes (`annotated_transformer.lib.artifacts`): each file carries its kind
and version, files of every earlier version (kept in tests/data) are read as the current one, and a file of another
kind or of a newer version is refused naming the file."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from annotated_transformer.lib.artifacts import (
    FORMATS,
    FormatError,
    RunFiles,
    format_of,
    kind_of_file,
    read_artifact,
    stamped,
    upgrade,
)
from annotated_transformer.lib.checkpoints import load_checkpoint
from annotated_transformer.lib.recipes import RECIPES, stored_recipe
from annotated_transformer.lib.results import record_result
from annotated_transformer.lib.runs import RunDir
from annotated_transformer.lib.trainer import train

DATA = Path(__file__).parent / "data"


def test_every_file_says_its_kind_and_version_and_the_old_forms_are_read():
    assert stamped("summary", {"steps": 3, "format": "x"}) == {"format": "summary 1", "steps": 3}
    assert format_of({"format": "config 1"}) == ("config", 1) and format_of({"steps": 1}) == (None, 0)
    assert format_of({"format": 2}) == ("checkpoint", 2)  # how checkpoints of versions 1 and 2 said it
    assert format_of({"format": "annotated-transformer model 2"}) == ("model", 2)  # and model files of 1 and 2
    assert format_of({"format": "config 99999999"}) == (None, 0)  # no version this long: not ours
    assert set(FORMATS) == {
        "checkpoint",
        "model",
        "config",
        "summary",
        "metrics",
        "results",
        "benchmark",
        "variations",
        "variation",
        "prepared",
    }


def test_a_file_of_another_kind_or_a_newer_version_is_refused_naming_it():
    with pytest.raises(FormatError, match="x.json: a summary file, not a config file"):
        upgrade("config", {"format": "summary 1"}, "x.json")
    with pytest.raises(FormatError, match="x.json: a config file of version 2, newer than this package reads"):
        upgrade("config", {"format": "config 2"}, "x.json")
    with pytest.raises(FormatError, match="x.json: its format 'yaml 3' is none this package writes"):
        upgrade("config", {"format": "yaml 3"}, "x.json")
    with pytest.raises(FormatError, match="x.json: not a config file of this package \\(it holds a list\\)"):
        upgrade("config", [1, 2], "x.json")
    assert upgrade("config", {"recipe": {}}, "x.json") == {"format": "config 1", "recipe": {}}  # version 0


def test_a_run_of_version_0_reads_as_the_current_one_and_resumes(tmp_path):
    "tests/data/run-version-0: config.json, metrics.jsonl, summary.json and a checkpoint, as the package wrote them."
    run = shutil.copytree(DATA / "run-version-0", tmp_path / "run")
    files = RunFiles(run)
    assert "format" not in json.loads(files.config.read_text())  # as it was written
    assert read_artifact(files.config, "config")["format"] == "config 1"
    assert read_artifact(files.summary, "summary")["steps"] == 2
    assert stored_recipe(files.config)["name"] == "copy"
    assert [m["step"] for m in RunDir(run, writer=False).logged_metrics()] == [2]
    assert load_checkpoint(files.checkpoint(2))["format"] == "checkpoint 3"
    recipe = RECIPES["copy"].replace(
        **{k: v for k, v in stored_recipe(files.config)["model"].items() if k in ("N", "d_model", "d_ff", "h")},
        steps=4,
        warmup=2,
        eval_every=2,
        checkpoint_every=2,
        keep_checkpoints=1,
        average_checkpoints=1,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run trained: a resume keeps the order of float sums
    try:
        summary = train(recipe, run, resume=True, progress=False, device="cpu", bf16=False)
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == 4 and summary["finished"]
    # the resumed run's files are all of the current version now, its earlier metrics rewritten as such
    assert all(json.loads(line)["format"] == "metrics 1" for line in files.metrics.read_text().splitlines())
    assert json.loads(files.config.read_text())["format"] == "config 1"
    assert json.loads(files.summary.read_text())["format"] == "summary 1"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("results-version-0.json", "results"),
        ("benchmark-version-0.json", "benchmark"),
        ("variations-version-0.json", "variations"),
        ("variation-version-0.json", "variation"),
        ("prepared-version-0.json", "prepared"),
    ],
)
def test_results_benchmarks_tables_and_manifests_of_version_0_are_read(name, kind):
    data = json.loads((DATA / name).read_text())
    assert "format" not in data and read_artifact(DATA / name, kind) == {"format": f"{kind} 1", **data}


def test_every_file_a_run_writes_carries_its_version(tmp_path):
    recipe = RECIPES["copy"].replace(
        N=1,
        d_model=8,
        d_ff=16,
        h=2,
        steps=2,
        warmup=2,
        eval_every=2,
        checkpoint_every=2,
        keep_checkpoints=1,
        average_checkpoints=1,
    )
    run = tmp_path / "run"
    train(recipe, run, progress=False, device="cpu", bf16=False)
    files = RunFiles(run)
    evaluation = {"dataset": "copy", "split": "valid", "direction": "src-tgt", "bleu": 1.0, "hypotheses": []}
    results = record_result(run, evaluation, tmp_path / "results")
    kinds = {files.config: "config", files.summary: "summary", results: "results"}
    assert {kind_of_file(path) for path in kinds} == set(kinds.values())
    assert all(kind_of_file(path) == kind for path, kind in kinds.items())
    assert [json.loads(line)["format"] for line in files.metrics.read_text().splitlines()] == ["metrics 1"]
    assert torch.load(files.checkpoint(2), weights_only=True)["format"] == "checkpoint 3"
