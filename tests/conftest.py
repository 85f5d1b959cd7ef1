"""pytest settings shared by the package tests and nbval's notebook tests (`pytest tests book --nbval`)."""

import functools
import os
import re
import sys
from pathlib import Path

import pytest

# The book's tools (book/_ext: its charts, its run cache) are imported as the chapters import them, `_ext.<module>`,
# from the book's folder.
BOOK = Path(__file__).resolve().parents[1] / "book"
if str(BOOK) not in sys.path:
    sys.path.insert(0, str(BOOK))

# Data sets come from the local mirror beside the project when there is one (no network needed), as in CI;
# set before any notebook kernel starts, so the notebooks see it too.
_MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"
if "AT_MIRROR" not in os.environ and _MIRROR.is_dir():
    os.environ["AT_MIRROR"] = str(_MIRROR)


RUN_CACHE_GROUP = "notebooks-reading-the-run-cache"
TINY_RUNS_GROUP = "tests-sharing-the-tiny-runs"


@functools.cache
def xdist_group_of(path: Path) -> str:
    """The group of `path`'s tests, which pytest-xdist runs in one process, one after another: its file, as `--dist
    loadfile` groups (a notebook's cells share one kernel), or one of two groups of files. The notebooks that ask
    the run cache for a trained model (`cached_run`): several ask for the same run (the book's live run), which the
    first trains and the others read, where two processes would train it once and one of them would wait idle on
    the cache's lock meanwhile. And the test files that use the session's tiny runs below, which each process would
    train anew."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if path.suffix == ".ipynb" and "cached_run(" in text:
        return RUN_CACHE_GROUP
    if path.suffix == ".py" and re.search(r"\btiny_(subword_)?run\b", text):
        return TINY_RUNS_GROUP
    return str(path)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, there when it is installed
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (as `make test` runs) with the groups of `xdist_group_of`. (pytest-xdist's `--dist loadgroup`
    would read groups from marks, but under pytest 9 the marks do not reach its scheduler.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:  # the scope of a test, as pytest-xdist 3's schedulers ask it
            return xdist_group_of(config.rootpath / nodeid.split("::", 1)[0])

    return LoadFileGroups(config, log)


def pytest_collection_modifyitems(items):
    """Let nbval compare the outputs of notebooks stored by nbdev's cleaner.

    The cleaner stores every execution count as null, so that rerunning a notebook does not change its diff;
    nbval reads a null count as "this cell was never run" and refuses to compare its stored outputs. Every
    notebook here is stored from a complete top-to-bottom run (the hygiene tests check it has no errors), so
    each code cell gets its position as its count again.
    """
    counts = {}
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and getattr(cell, "cell_type", None) == "code" and cell.get("execution_count") is None:
            counts[item.path] = counts.get(item.path, 0) + 1
            cell["execution_count"] = counts[item.path]


MIRROR = os.environ.get("AT_MIRROR")
# For tests that read the mirrored data sets (Multi30k, the WMT14 files); CI always has them.
needs_mirror = pytest.mark.skipif(not MIRROR, reason="needs AT_MIRROR (the mirrored data sets; CI sets it)")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    "A fresh, empty `$AT_DATA_DIR` for the test: downloads and cached runs land there, not in the user's cache."
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def single_threaded_env():
    """The environment for a subprocess that trains: one thread per process, so that a run beside other CPU-heavy
    work (or a second process of the same run) does not slow to a crawl from oversubscribed cores."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _tiny_multi30k(tmp_path_factory, **settings):
    """`multi30k-cpu` trained for seconds (one layer of width 32, 40 updates, 3 checkpoints kept), with `settings`
    changed. Returns (run directory, summary)."""
    from annotated_transformer.lib.recipes import RECIPES
    from annotated_transformer.lib.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "multi30k-tiny"
    recipe = RECIPES["multi30k-cpu"].replace(
        N=1,
        d_model=32,
        d_ff=64,
        max_len=64,
        steps=40,
        max_tokens=1500,
        warmup=20,
        eval_every=20,
        checkpoint_every=10,
        keep_checkpoints=3,
        average_checkpoints=3,
        **settings,
    )
    summary = train(recipe, run_dir, progress=False)
    return run_dir, summary


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A Multi30k translator of word vocabularies (words seen twice), trained for seconds: the translation tests
    and the model commands' tests share it. Returns (run directory, summary)."""
    return _tiny_multi30k(tmp_path_factory, subwords=None, min_freq=2)


@pytest.fixture(scope="session")
def tiny_subword_run(tmp_path_factory):
    """A Multi30k translator of the CPU recipe's shared subword vocabulary, trained for seconds: the subword and
    benchmark tests share it. Returns (run directory, summary)."""
    return _tiny_multi30k(tmp_path_factory)
