"""pytest settings shared by the package tests and nbval's notebook tests (`pytest tests book --nbval`)."""
import os
from pathlib import Path

# Data sets come from the local mirror beside the project when there is one (no network needed), as in CI;
# set before any notebook kernel starts, so the notebooks see it too.
_MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"
if "AT_MIRROR" not in os.environ and _MIRROR.is_dir():
    os.environ["AT_MIRROR"] = str(_MIRROR)


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
