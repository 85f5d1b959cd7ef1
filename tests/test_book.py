"""The book is complete to read: citations, the bibliography, the API reference, chapter openings and summaries,
and notebooks that run on Colab.

The first tests read the sources and need no build. The last ones read the book built into _build/html
(`make book-stored`, which `make test` runs first); without it they are skipped, except under CI=true, where
they fail, as in tests/test_browser.py.
"""
import os
import re
from pathlib import Path

import nbformat
import pytest
import yaml
from pybtex.database import parse_file
from sphinxcontrib.bibtex.citation_target import parse_citation_targets

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
HTML = ROOT / "_build" / "html"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
TOC = [c["file"] for part in yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"] for c in part["chapters"]]
CHAPTERS = [f for f in TOC if (ROOT / f"{f}.ipynb").is_file()]  # the other entries are Markdown pages
MODULES = sorted(p.stem for p in (ROOT / "annotated_transformer").glob("*.py")
                 if p.stem not in {"_modidx", "__init__", "__main__"})
API = (BOOK / "api.md").read_text(encoding="utf-8")

_pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
PACKAGE = re.search(r'^name = "([^"]+)"', _pyproject, flags=re.M).group(1)
REPOSITORY = re.search(r'^Repository = "([^"]+)"', _pyproject, flags=re.M).group(1)
# The first cell of every notebook: on Colab or Binder the package is missing, so it is installed from GitHub.
INSTALL_CELL = f'''# On Colab or Binder, install the package this book is the source of (locally it is installed already).
try:
    import annotated_transformer
except ImportError:
    %pip install --quiet "{PACKAGE} @ git+{REPOSITORY}"'''

# {cite}`key`, {cite:t}`a,b`, {cite:p}`{see}key{§6.1}`: one role, one or more keys, each with optional pre/post-text.
CITE_ROLE = re.compile(r"\{cite(?::[a-z]+)*\}`([^`]+)`")


def markdown_sources():
    "(name, text) of every Markdown source of the book: the Markdown cells of the notebooks and the .md pages."
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                yield f"{path.name}, cell {i}", cell.source
    for path in sorted(BOOK.glob("*.md")):
        yield path.name, path.read_text(encoding="utf-8")


def cited_keys(text: str) -> list[str]:
    "The keys cited in `text`, read as sphinxcontrib-bibtex reads them."
    return [target.key for targets in CITE_ROLE.findall(text) for target in parse_citation_targets(targets)]


def bibliography():
    return parse_file(str(ROOT / CONFIG["bibtex_bibfiles"][0]), bib_format="bibtex").entries


def exported_module(path: Path) -> str | None:
    "The module a notebook writes (its `#| default_exp` line), if any."
    for cell in nbformat.read(path, as_version=4).cells:
        match = cell.cell_type == "code" and re.search(r"^#\| default_exp (\w+)", cell.source, flags=re.M)
        if match:
            return match.group(1)
    return None


# ---- Sources ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_the_install_cell(path):
    "So that a notebook opened on Colab or Binder runs as it does locally; the book does not show the cell."
    cell = nbformat.read(path, as_version=4).cells[0]
    assert cell.cell_type == "code" and cell.source == INSTALL_CELL, f"{path.name}: the first cell must be\n{INSTALL_CELL}"
    assert "remove-cell" in cell.metadata.get("tags", [])
    assert cell.outputs == [] and cell.execution_count is None


def test_the_bibliography_is_the_one_the_book_reads():
    assert CONFIG["bibtex_bibfiles"] == ["book/references.bib"]
    entries = bibliography()
    for key, entry in entries.items():
        assert entry.persons.get("author"), f"{key}: no authors"
        assert {"title", "year"} <= set(entry.fields), f"{key}: no title or year"
        assert "url" in entry.fields or "doi" in entry.fields, f"{key}: neither a URL nor a DOI"


def test_every_citation_is_in_the_bibliography():
    known = set(bibliography())
    cited = {}
    for name, text in markdown_sources():
        for key in cited_keys(text):
            cited.setdefault(key, name)
    assert cited, "the book cites nothing"
    unknown = {key: where for key, where in cited.items() if key not in known}
    assert not unknown, f"cited but not in book/references.bib: {unknown}"


def test_citation_syntax():
    "The parser above reads the forms the book uses."
    assert cited_keys("see {cite:t}`a2017x` and {cite:p}`b,c` or {cite}`d`, {cite:p}`{see}e2020y{§6.1}`") == \
        ["a2017x", "b", "c", "d", "e2020y"]


def test_every_module_is_in_the_api_reference():
    documented = re.findall(r"^\.\. automodule:: annotated_transformer\.(\w+)\s*$", API, flags=re.M)
    assert sorted(documented) == MODULES, "book/api.md needs one automodule section per module, and no other"
    assert len(documented) == len(set(documented))


def test_api_sections_link_to_their_chapters():
    "Each section of book/api.md links to the chapter that writes its module (the chapter's `#| default_exp`)."
    exports = {exported_module(path): path.stem for path in NOTEBOOKS}
    sections = re.split(r"^\(api-[\w-]+\)=\n", API, flags=re.M)[1:]
    for section in sections:
        module = re.search(r"automodule:: annotated_transformer\.(\w+)", section).group(1)
        assert f"{{doc}}`{exports[module]}`" in section, f"the API section of {module} must link to {exports[module]}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_links_to_its_api_section(chapter):
    "A chapter that exports a module says so, with a link to the module's section of the API reference."
    module = exported_module(ROOT / f"{chapter}.ipynb")
    if module is None:
        pytest.skip("exports no module")
    labels = {m: label for label, m in re.findall(r"^\((api-[\w-]+)\)=\n## .*`annotated_transformer\.(\w+)`", API, flags=re.M)}
    label = labels[module]
    nb = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert f"](#{label})" in text, f"{chapter}: link to the API reference with [API reference](#{label})"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_opens_with_its_section_and_closes_with_a_summary(chapter):
    nb = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4)
    title = next(c for c in nb.cells if c.cell_type == "markdown")
    # "*Section 3.2.1 of ...*", "*Sections 4 and 5.2 of ...*", or, for the pages around the paper, "*No section ...*"
    assert re.search(r"^\*(Sections? \d|No section)", title.source, flags=re.M), \
        f"{chapter}: the first cell names the section of the paper it annotates, in an italic line"
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and re.search(r"^#{2,6} Summary\s*$", last.source, flags=re.M), \
        f"{chapter}: the last cell is a Markdown cell with a '## Summary' heading"


# ---- The built book --------------------------------------------------------------------------------------------

def unavailable(reason: str):
    "Skip with a visible reason on a user's machine; under CI the built book must be checked."
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI=true: the built book must be checked)")
    pytest.skip(reason)


def built(page: str) -> str:
    path = HTML / page
    if not (HTML / "index.html").is_file():
        unavailable("the book is not built: run `make book-stored` or `make test` first")
    assert path.is_file(), f"{page} is missing from the built book"
    return path.read_text(encoding="utf-8")


def test_bibliography_page_lists_every_entry():
    html = built("book/bibliography.html")
    entries = bibliography()
    assert html.count('role="doc-biblioentry"') == len(entries)
    for key, entry in entries.items():
        link = entry.fields.get("url") or f"https://doi.org/{entry.fields['doi']}"
        assert f'href="{link}"' in html, f"{key} is not in the bibliography"
    assert "Vaswani et al., 2017" in html  # labelled as the citations read


@pytest.mark.parametrize("page", ["book/index.html", *[f"{c}.html" for c in CHAPTERS]])
def test_citations_are_rendered(page):
    html = built(page)
    assert "{cite" not in html, f"{page}: a citation role was not rendered"
    sources = (ROOT / page.replace(".html", ".md")).read_text(encoding="utf-8") if page.endswith("index.html") \
        else (ROOT / page.replace(".html", ".ipynb")).read_text(encoding="utf-8")
    if "{cite" in sources:
        assert 'href="bibliography.html#' in html, f"{page}: citations do not link to the bibliography"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page_has_a_colab_launch_link(chapter):
    html = built(f"{chapter}.html")
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    colab = f'{CONFIG["launch_buttons"]["colab_url"]}/github/{repo}/blob/{CONFIG["repository"]["branch"]}/{chapter}.ipynb'
    assert f'href="{colab}"' in html
    binder = f'{CONFIG["launch_buttons"]["binderhub_url"]}/v2/gh/{repo}/{CONFIG["repository"]["branch"]}?urlpath=lab/tree/{chapter}.ipynb'
    assert f'href="{binder}"' in html
    assert "On Colab or Binder, install" not in html, "the install cell is hidden in the book"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_tables_that_cells_print_are_tables_on_the_page(chapter):
    "A Markdown table in a cell's output (IPython's Markdown) is rendered as an HTML table, not as text with bars."
    cells = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells
    printed = sum(bool(re.search(r"^\|(\s*:?-+:?\s*\|)+\s*$", o.get("data", {}).get("text/markdown", ""), re.M))
                  for c in cells if c.cell_type == "code" for o in c.get("outputs", []))
    html = built(f"{chapter}.html")
    assert html.count("<table") >= printed, f"{chapter}: {printed} printed table(s), {html.count('<table')} on the page"
    text = re.sub(r"<pre.*?</pre>", "", html, flags=re.S)  # code may well contain "|---|"
    assert not re.search(r"\|\s*-{3,}\s*\|", text), f"{chapter}: a table's separator row shows as text"

def test_api_page_documents_the_package():
    html = built("book/api.html")
    for module in MODULES:
        assert f'id="module-annotated_transformer.{module}"' in html
    for name in ("model.make_model", "model.TransformerConfig", "translation.beam_search", "attention.attention",
                 "multi_head.MultiHeadedAttention", "training.train", "cli.main"):
        assert f'id="annotated_transformer.{name}"' in html, f"{name} is not documented"
    # The sections link back to the chapters.
    assert 'href="05_model.html"' in html and 'href="07_results.html"' in html


@pytest.mark.parametrize("chapter, following", list(zip(CHAPTERS, CHAPTERS[1:])))
def test_each_chapter_links_on_to_the_next_one(chapter, following):
    "The book can be read front to back: every chapter's Markdown links to the one after it in the table of contents."
    cells = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    target = Path(following).name + ".ipynb"
    assert f"]({target}" in text, f"{chapter} does not link to {target}, the next chapter"
