"""Notebook hygiene: the notebooks in book/ are stored clean, so diffs stay readable and nbval can compare."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
NBDEV_CLEAN = Path(sys.executable).with_name("nbdev-clean")


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_clean(path, tmp_path):
    "Unchanged by nbdev's cleaner (no execution counts, no stray metadata; cell tags are kept)."
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    # run from the project root so that the cleaner reads [tool.nbdev] (nbdev 3.3's --stdin mode is broken)
    subprocess.run([NBDEV_CLEAN, "--fname", copy], cwd=ROOT, check=True, capture_output=True)
    assert copy.read_bytes() == path.read_bytes(), f"run `make export` to clean {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_machine_specific_output(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    outputs = json.dumps([c.get("outputs", []) for c in nb["cells"]])
    for pattern in (r"/(?:work|home|root|tmp|Users)/", r"\bfile://", r"0x[0-9a-fA-F]{8,}", r"[A-Z]:\\\\"):
        assert not re.search(pattern, outputs), f"{path.name}: an output contains {pattern!r}"
    assert not any(o.get("output_type") == "error" for c in nb["cells"] for o in c.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_tags_survive_and_chapters_open_with_a_title(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    # The title comes first, after the hidden cell that installs the package on Colab (tests/test_book.py).
    cells = [
        c for c in nb["cells"] if not (c["cell_type"] == "code" and "remove-cell" in c["metadata"].get("tags", []))
    ]
    assert cells[0]["cell_type"] == "markdown" and cells[0]["source"][0].startswith("# ")
    allowed = {"tags"}
    for cell in nb["cells"]:
        assert set(cell.get("metadata", {})) <= allowed


TOC = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
MARKDOWN_PAGES = ["book/api", "book/bibliography", "book/glossary"]  # of the Reference part: Markdown, not notebooks


def test_every_notebook_is_in_the_table_of_contents_in_file_name_order():
    "File-name order is reading order: a reader who lists book/ sees the chapters as the book shows them."
    listed = [c["file"] for part in TOC["parts"] for c in part["chapters"]]
    notebooks = [f"book/{p.stem}" for p in NOTEBOOKS]
    assert [f for f in listed if f not in MARKDOWN_PAGES] == notebooks, (
        "_toc.yml must list every notebook of book/, sorted by name"
    )
    assert TOC["root"] == "book/index"


def test_the_table_of_contents_has_the_paper_then_the_library_then_the_reference():
    """Part one is the paper's chapters (NN_name, one number each), part two the library's pages (aNN_name), part
    three the reference (results pages rNN_name, then the Markdown pages)."""
    parts = TOC["parts"]
    assert [p["caption"] for p in parts] == ["The paper", "The library", "Reference"]
    paper, library, reference = ([c["file"] for c in p["chapters"]] for p in parts)
    assert paper == [f"book/{p.stem}" for p in NOTEBOOKS if re.fullmatch(r"\d\d_\w+", p.stem)] and paper
    assert library == [f"book/{p.stem}" for p in NOTEBOOKS if re.fullmatch(r"a\d\d_\w+", p.stem)] and library
    assert reference == [f"book/{p.stem}" for p in NOTEBOOKS if re.fullmatch(r"r\d\d_\w+", p.stem)] + MARKDOWN_PAGES
    assert all((ROOT / f"{page}.md").is_file() for page in MARKDOWN_PAGES)


def test_no_two_notebooks_share_a_number_within_their_part():
    numbers = [re.match(r"([a-z]?)(\d+)_", p.stem).groups() for p in NOTEBOOKS]
    assert len(set(numbers)) == len(numbers), sorted(numbers)


def test_make_tests_processes_keep_the_files_that_share_a_trained_run_together():
    """`make test`'s scheduler (tests/conftest.py): the notebooks that read the run cache run in one process, and so do
    the test files that use the session's tiny runs; every other file is a group of its own."""
    from conftest import RUN_CACHE_GROUP, TINY_RUNS_GROUP, xdist_group_of

    readers = ("07_decoding", "10_variations", "11_attention_heads", "12_speed")
    assert {xdist_group_of(ROOT / "book" / f"{name}.ipynb") for name in readers} == {RUN_CACHE_GROUP}
    assert {xdist_group_of(ROOT / "tests" / name) for name in ("test_cli_studies.py", "test_translate.py")} == {
        TINY_RUNS_GROUP
    }
    alone = (ROOT / "book" / "01_attention.ipynb", ROOT / "tests" / "test_model.py")
    assert [xdist_group_of(path) for path in alone] == [str(path) for path in alone]
