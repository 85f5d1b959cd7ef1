"""How the chapters get trained models without training them on every reading: `cached_run` trains a recipe once,
keyed on its settings and on the code that trains it, and hands the same run to every chapter that asks; and the
book's live run, with the stand-in that `make test` trains in its place (`AT_SMALL_MODELS=1`).

Book tooling, not part of the installed package: the chapters import it as `_ext.run_cache`."""

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

from filelock import FileLock

import annotated_transformer
from annotated_transformer.lib.artifacts import RunFiles, read_artifact
from annotated_transformer.lib.checkpoints import list_checkpoints
from annotated_transformer.lib.downloads import data_dir
from annotated_transformer.lib.recipes import RECIPES, Recipe
from annotated_transformer.lib.trainer import train


# The package's files that only show, measure or compare runs, or start them from a shell: a change to them leaves the
# cached runs as they are (paths inside the package).
_NOT_IN_RUNS = {
    "__init__.py",
    "__main__.py",
    "_modidx.py",
    "lib/viz.py",
    "lib/bench.py",
    "lib/measure.py",
    "lib/variations.py",
}


def run_modules(package: Path | None = None) -> list[Path]:
    """The source files of the package (its folder `package`, by default the installed one's) whose change makes
    `cached_run` train anew: all but the command line and those that only show, measure or compare runs."""
    package = package or Path(annotated_transformer.__file__).resolve().parent
    return sorted(
        p
        for p in package.rglob("*.py")
        if p.relative_to(package).as_posix() not in _NOT_IN_RUNS and p.relative_to(package).parts[0] != "cli"
    )


def cached_run(recipe: Recipe, *, device=None, progress: bool = True) -> Path:
    """The run directory of `recipe` trained to its last update, from the run cache `data_dir()/runs`.

    The folder is named after the recipe and a hash of its settings and of `run_modules()`. A finished run is
    returned as it is (a process that is training it is waited for); an interrupted one is resumed from its newest
    checkpoint; otherwise the recipe is trained (with `train`) into it, in float32 on every device (no bf16
    autocast), so that what a chapter prints does not depend on whether the reader's processor has bfloat16
    arithmetic. (The chapters' own small demonstrations of `train` ask for float32 too.)"""
    key = hashlib.sha256(json.dumps(recipe.to_dict(), sort_keys=True).encode())
    for module in run_modules():
        key.update(module.read_bytes())
    run_dir = data_dir() / "runs" / f"{recipe.name}-{key.hexdigest()[:12]}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(run_dir.with_name(run_dir.name + ".lock")):  # another process training it: wait for it, then use it
        summary = RunFiles(run_dir).summary
        if summary.exists() and read_artifact(summary, "summary").get("finished"):
            return run_dir
        resume = bool(list_checkpoints(run_dir))
        if not resume and run_dir.exists():  # stopped before its first checkpoint: nothing in it can be resumed
            shutil.rmtree(run_dir)
        train(recipe, run_dir, device=device, resume=resume, progress=progress, bf16=False)
    return run_dir


LIVE_RECIPE = "multi30k-tiny"  # the book's live run


def live_recipe(small: bool | None = None) -> Recipe:
    """The recipe of the book's live run, which the decoding chapter trains through `cached_run` and the variations,
    speed and attention chapters read: `RECIPES[LIVE_RECIPE]`. With `small` (by default: the environment variable
    `AT_SMALL_MODELS` is "1", as `make test` sets it), a stand-in named LIVE_RECIPE + "-stand-in" with half the
    updates: 250, with a warm-up of 100 and the learning-rate factor 0.5, a checkpoint every 25 updates and the last 3
    averaged, and vocabularies of the words seen at least 5 times. The architecture and the corpus are the recipe's."""
    if small is None:
        small = os.environ.get("AT_SMALL_MODELS") == "1"
    recipe = RECIPES[LIVE_RECIPE]
    if small:
        recipe = dataclasses.replace(recipe, name=f"{LIVE_RECIPE}-stand-in").replace(
            steps=250,
            warmup=100,
            factor=0.5,
            checkpoint_every=25,
            keep_checkpoints=3,
            average_checkpoints=3,
            min_freq=5,
        )
    return recipe
