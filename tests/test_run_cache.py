"""The book's run cache (book/_ext/run_cache.py): one training per recipe and code, resumed when interrupted; the
live run and its stand-in under `make test`."""

import json

import pytest
from _ext import run_cache

from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.trainer import train


def test_cached_run_trains_once_resumes_an_interrupted_run_and_keys_on_the_settings(cache, monkeypatch):
    recipe = RECIPES["copy"].replace(
        N=1, d_model=16, d_ff=32, h=2, steps=12, warmup=4, eval_every=4, checkpoint_every=4
    )
    calls = []

    def interrupted_once(recipe, run_dir, **kwargs):
        calls.append(kwargs["resume"])
        assert kwargs["bf16"] is False  # float32 everywhere: the same outputs on every processor
        if len(calls) == 1:  # the first run is killed after 8 of its 12 updates, as by Ctrl-C or a pre-emption
            train(recipe, run_dir, **kwargs, stop_after=8)
            raise KeyboardInterrupt
        return train(recipe, run_dir, **kwargs)

    monkeypatch.setattr(run_cache, "train", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        run_cache.cached_run(recipe, progress=False)
    run = run_cache.cached_run(recipe, progress=False)
    assert calls == [False, True]  # the second call resumed the interrupted run
    assert run.parent == cache / "runs" and run.name.startswith("copy-")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 12
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [4, 8, 12]
    assert run_cache.cached_run(recipe, progress=False) == run and len(calls) == 2  # finished: not trained again

    # Other settings are another run. One killed before its first checkpoint left a folder with nothing to resume:
    # the next call starts it afresh instead of refusing the folder.
    other = recipe.replace(seed=1)

    def killed_at_once(recipe, run_dir, **kwargs):
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(run_cache, "train", killed_at_once)
    with pytest.raises(KeyboardInterrupt):
        run_cache.cached_run(other, progress=False)
    killed = [p for p in run.parent.iterdir() if p.is_dir() and p != run]
    assert len(killed) == 1 and not list((killed[0]).glob("*.json"))
    monkeypatch.setattr(run_cache, "train", train)
    other_run = run_cache.cached_run(other, progress=False)
    assert other_run == killed[0] and other_run != run  # the same folder, started afresh
    assert json.loads((other_run / "summary.json").read_text())["finished"]


def test_every_module_that_can_change_a_run_is_in_the_key(tmp_path):
    import annotated_transformer

    package = __import__("pathlib").Path(annotated_transformer.__file__).parent
    in_key = {p.relative_to(package).as_posix() for p in run_cache.run_modules()}
    assert {
        "model.py",
        "training.py",
        "lib/runs.py",
        "lib/trainer.py",
        "lib/datasets.py",
        "lib/tokenizers.py",
        "lib/tasks.py",
        "lib/wmt.py",
        "decoding.py",
    } <= in_key
    assert not in_key & {
        "lib/viz.py",
        "lib/bench.py",
        "lib/measure.py",
        "__init__.py",
        "cli/__init__.py",
        "cli/train.py",
    }  # they only show, measure or start runs
    # A module added to the package later is in the key without anyone listing it.
    package = tmp_path / "annotated_transformer"
    (package / "lib").mkdir(parents=True)
    (package / "cli").mkdir()
    for name in ("training.py", "cli/train.py", "lib/new_idea.py", "lib/viz.py"):
        (package / name).write_text("")
    assert [p.relative_to(package).as_posix() for p in run_cache.run_modules(package)] == [
        "lib/new_idea.py",
        "training.py",
    ]


def test_the_live_run_is_its_recipe_and_under_make_test_a_named_stand_in_of_the_same_architecture_and_corpus(
    monkeypatch,
):
    monkeypatch.delenv("AT_SMALL_MODELS", raising=False)
    assert run_cache.live_recipe() is RECIPES[run_cache.LIVE_RECIPE]
    monkeypatch.setenv("AT_SMALL_MODELS", "1")  # as `make test` sets it
    full, stand_in = run_cache.live_recipe(small=False), run_cache.live_recipe()
    assert stand_in == run_cache.live_recipe(small=True) and stand_in.name == f"{run_cache.LIVE_RECIPE}-stand-in"
    assert stand_in.model == full.model and (stand_in.task, stand_in.direction) == (full.task, full.direction)
    assert stand_in.steps < full.steps and stand_in.average_checkpoints <= stand_in.keep_checkpoints
    changed = set(full.differences(stand_in.to_dict()))
    assert changed and changed <= {
        "name",
        "steps",
        "warmup",
        "factor",
        "checkpoint_every",
        "keep_checkpoints",
        "average_checkpoints",
        "min_freq",
    }  # how long and how it trains, and the vocabularies' cut-off; not the architecture, nor the corpus
