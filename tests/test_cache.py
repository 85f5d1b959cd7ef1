"""The run cache (`annotated_transformer.cache`): one training per recipe and code, resumed when interrupted."""

import json

import pytest

from annotated_transformer import cache as run_cache
from annotated_transformer.recipes import RECIPES
from annotated_transformer.training import train


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
    in_key = {p.stem for p in run_cache.run_modules()}
    assert {"model", "training", "runs", "distributed", "data", "text", "translation", "wmt"} <= in_key
    assert not in_key & {
        "cli",
        "charts",
        "viz",
        "bench",
        "measure",
        "cache",
        "__init__",
    }  # they only show or measure runs
    # A module added to the package later is in the key without anyone listing it.
    package = tmp_path / "annotated_transformer"
    package.mkdir()
    for name in ("training.py", "cli.py", "new_idea.py"):
        (package / name).write_text("")
    assert [p.name for p in run_cache.run_modules(package)] == ["new_idea.py", "training.py"]


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
