"""The book is complete to read: citations, the bibliography, the API reference, chapter openings and summaries,
cross-references that lead somewhere, paper chapters that read as prose with short code, and notebooks that run on
Colab.

The first tests read the sources and need no build. The last ones read the book built into _build/html
(`make book-stored`, which `make test` runs first); without it they are skipped, except under CI=true, where
they fail, as in tests/test_browser.py.
"""

import json
import os
import re
from pathlib import Path

import nbformat
import pytest
import yaml
from pybtex.database import parse_file
from sphinxcontrib.bibtex.citation_target import parse_citation_targets

from annotated_transformer.lib.evaluate import repeats_a_word

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
HTML = ROOT / "_build" / "html"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
TOC = [c["file"] for part in yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"] for c in part["chapters"]]
CHAPTERS = [f for f in TOC if (ROOT / f"{f}.ipynb").is_file()]  # the other entries are Markdown pages
# The first part of the book, one chapter per section of the paper (NN_name); the second, "The library", is aNN_name,
# a page per module; the third, "Reference", rNN_name (results pages) and the Markdown pages.
PAPER_CHAPTERS = [f for f in CHAPTERS if re.fullmatch(r"book/\d\d_\w+", f)]
LIBRARY_PAGES = [f for f in CHAPTERS if re.fullmatch(r"book/a\d\d_\w+", f)]
PACKAGE_FOLDER = ROOT / "annotated_transformer"


def dotted(path: Path) -> str:
    "annotated_transformer/lib/runs.py -> lib.runs; a package's __init__.py: the package ('' for the top)."
    parts = path.relative_to(PACKAGE_FOLDER).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Every module of the package with a section in the API reference (the lazy index, nbdev's and `lib`'s docstring aside).
MODULES = sorted(
    dotted(p)
    for p in PACKAGE_FOLDER.rglob("*.py")
    if p.name not in ("_modidx.py", "__main__.py") and dotted(p) not in ("", "lib")
)
API = (BOOK / "api.md").read_text(encoding="utf-8")

_pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
PACKAGE = re.search(r'^name = "([^"]+)"', _pyproject, flags=re.M).group(1)
REPOSITORY = re.search(r'^Repository = "([^"]+)"', _pyproject, flags=re.M).group(1)
# The first cell of every notebook: Colab opens a notebook alone, so the book is cloned beside it (its tools are in
# book/_ext); on Colab or Binder the package is missing, so it is installed from the clone.
INSTALL_CELL = f"""# Colab opens a notebook alone, and Binder a clone without the package installed: get what the chapter needs, the
# book's tools (book/_ext, beside the notebooks) and the package the book is the source of. Locally both are there.
import os

if not os.path.isdir("_ext"):
    if not os.path.isdir(os.path.expanduser("~/{REPOSITORY.rsplit("/", 1)[1]}")):  # cloned already for another notebook
        !git clone --quiet --depth 1 {REPOSITORY} ~/{REPOSITORY.rsplit("/", 1)[1]}
    %cd ~/{REPOSITORY.rsplit("/", 1)[1]}/book
try:
    import annotated_transformer
except ImportError:
    %pip install --quiet .."""

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
    assert cell.cell_type == "code" and cell.source == INSTALL_CELL, (
        f"{path.name}: the first cell must be\n{INSTALL_CELL}"
    )
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
    assert cited_keys("see {cite:t}`a2017x` and {cite:p}`b,c` or {cite}`d`, {cite:p}`{see}e2020y{§6.1}`") == [
        "a2017x",
        "b",
        "c",
        "d",
        "e2020y",
    ]


def test_every_module_is_in_the_api_reference():
    documented = re.findall(r"^\.\. automodule:: annotated_transformer\.([\w.]+)\s*$", API, flags=re.M)
    assert sorted(documented) == MODULES, "book/api.md needs one automodule section per module, and no other"
    assert len(documented) == len(set(documented))


def test_api_sections_link_to_their_chapters():
    """Each section of book/api.md links to the page that explains its module: the chapter that writes it (its
    `#| default_exp`) for the paper's modules, a page that names it for the library's and the command line's."""
    exports = {exported_module(path): path.stem for path in NOTEBOOKS}
    sections = re.split(r"^\(api-[\w-]+\)=\n", API, flags=re.M)[1:]
    assert sections
    for section in sections:
        module = re.search(r"automodule:: annotated_transformer\.([\w.]+)", section).group(1)
        if module in exports:
            assert f"{{doc}}`{exports[module]}`" in section, (
                f"the API section of {module} must link to {exports[module]}"
            )
        else:
            page = re.search(r"\{doc\}`(\w+)`", section).group(1)
            text = (BOOK / f"{page}.ipynb").read_text(encoding="utf-8")
            assert module.rsplit(".", 1)[-1] in text, (
                f"{page} links to from the API section of {module}, but names it not"
            )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_links_to_its_api_section(chapter):
    "A chapter that exports a module says so, with a link to the module's section of the API reference."
    module = exported_module(ROOT / f"{chapter}.ipynb")
    if module is None:
        pytest.skip("exports no module")
    labels = {
        m: label
        for label, m in re.findall(r"^\((api-[\w-]+)\)=\n###? .*`annotated_transformer\.(\w+)`", API, flags=re.M)
    }
    label = labels[module]
    nb = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert f"](#{label})" in text, f"{chapter}: link to the API reference with [API reference](#{label})"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_opens_with_its_section_and_closes_with_a_summary(chapter):
    nb = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4)
    title = next(c for c in nb.cells if c.cell_type == "markdown")
    # "*Section 3.2.1 of ...*", "*Sections 4 and 5.2 of ...*"; "*The library: no section ...*", "*Reference: no ...*"
    opening = r"^\*Sections? \d" if chapter in PAPER_CHAPTERS else r"^\*(The library|Reference): no section"
    assert re.search(opening, title.source, flags=re.M), (
        f"{chapter}: the first cell names the section of the paper it annotates, in an italic line"
    )
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and re.search(r"^#{2,6} Summary\s*$", last.source, flags=re.M), (
        f"{chapter}: the last cell is a Markdown cell with a '## Summary' heading"
    )


def is_exported(cell) -> bool:
    "A code cell that nbdev writes into the package (`#| export`, `#| exporti`, `#| exports`)."
    return bool(re.search(r"^#\|\s*export[is]?\b", cell.source, flags=re.M))


def test_exported_cells_are_recognised():
    cell = nbformat.v4.new_code_cell
    assert is_exported(cell("#| export\ndef f(): pass")) and is_exported(cell("#| exporti\nx = 1"))
    assert not is_exported(cell("#| default_exp model")) and not is_exported(cell("# export the model"))


@pytest.mark.parametrize("chapter", PAPER_CHAPTERS)
def test_paper_chapters_show_their_code_in_short_cells(chapter):
    "A paper chapter shows the paper's code a class or a function at a time; the machinery is the library's."
    cells = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells
    long = {
        i: len(c.source.splitlines())
        for i, c in enumerate(cells)
        if c.cell_type == "code" and is_exported(c) and len(c.source.splitlines()) > 80
    }
    assert not long, f"{chapter}: exported cells over 80 lines ({{cell index: lines}}): {long}"


@pytest.mark.parametrize("chapter", PAPER_CHAPTERS)
def test_paper_chapters_are_at_most_60000_characters(chapter):
    "A chapter a reader finishes: at most 60,000 characters of prose and code (outputs aside)."
    cells = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells
    assert sum(len(c.source) for c in cells if c.cell_type in ("markdown", "code")) <= 60_000


@pytest.mark.parametrize("chapter", PAPER_CHAPTERS)
def test_paper_chapters_are_read_as_prose(chapter):
    "At least 35% of a paper chapter's characters are prose (its Markdown cells), the rest code."
    cells = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells
    prose = sum(len(c.source) for c in cells if c.cell_type == "markdown")
    code = sum(len(c.source) for c in cells if c.cell_type == "code")
    assert prose / (prose + code) >= 0.35, f"{chapter}: prose is {prose / (prose + code):.0%} of the characters"


# "chapter 7", "Chapter 9", "chapters 6 and 7": a reader cannot follow these; a title with a link they can.
CHAPTER_BY_NUMBER = re.compile(r"\bchapters?\s+\d", flags=re.I)
NOTEBOOK_NAME = re.compile(r"\b[\w-]+\.ipynb\b")
PAGE_LINK = re.compile(r"\]\(([\w-]+\.md)(?:#[^)]*)?\)")
DOC_ROLE = re.compile(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`")


def broken_references(text: str) -> list[str]:
    "What in a Markdown text refers to another chapter by number, or to a notebook or page that book/ lacks."
    problems = [f"by number: {m.group(0)!r}" for m in CHAPTER_BY_NUMBER.finditer(text)]
    problems += [f"no such notebook: {name}" for name in NOTEBOOK_NAME.findall(text) if not (BOOK / name).is_file()]
    problems += [f"no such page: {name}" for name in PAGE_LINK.findall(text) if not (BOOK / name).is_file()]
    problems += [
        f"no such document: {{doc}}`{name}`"
        for name in DOC_ROLE.findall(text)
        if not any((BOOK / f"{name}{suffix}").is_file() for suffix in (".ipynb", ".md"))
    ]
    return problems


def test_broken_references_are_found():
    text = (
        "See chapter 7, Chapters 6 and 9, [it](08_attention_visualization.ipynb), `90_command_line.ipynb`, "
        "[x](nowhere.md), {doc}`00_charts` and {doc}`the tools <a9_tools>`; fine: [the model](05_model.ipynb), "
        "[API](api.md#api-model), {doc}`01_attention`, {doc}`the API <api>`, Table 3, §6.1."
    )
    assert broken_references(text) == [
        "by number: 'chapter 7'",
        "by number: 'Chapters 6'",
        "no such notebook: 08_attention_visualization.ipynb",
        "no such notebook: 90_command_line.ipynb",
        "no such page: nowhere.md",
        "no such document: {doc}`00_charts`",
        "no such document: {doc}`a9_tools`",
    ]


def test_cross_references_name_chapters_that_exist():
    "Chapters refer to each other by title, with a link (`[the training chapter](06_training.ipynb)`), never by number."
    problems = [f"{where}: {problem}" for where, text in markdown_sources() for problem in broken_references(text)]
    assert not problems, "\n".join(problems)


def test_the_landing_page_maps_every_chapter_in_order():
    "book/index.md links every chapter of the table of contents, first in the reading map, in the TOC's order."
    linked = re.findall(r"\]\(([\w-]+)\.ipynb\)", (BOOK / "index.md").read_text(encoding="utf-8"))
    assert list(dict.fromkeys(linked)) == [Path(c).name for c in CHAPTERS]


@pytest.mark.parametrize("module", ["training", "decoding"])
def test_the_paper_modules_stay_readable(module):
    "The modules of the training and decoding chapters hold the paper's code; the machinery is the library's."
    lines = len((ROOT / "annotated_transformer" / f"{module}.py").read_text(encoding="utf-8").splitlines())
    assert lines < 500, f"annotated_transformer/{module}.py has {lines} lines"


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
    sources = (
        (ROOT / page.replace(".html", ".md")).read_text(encoding="utf-8")
        if page.endswith("index.html")
        else (ROOT / page.replace(".html", ".ipynb")).read_text(encoding="utf-8")
    )
    if "{cite" in sources:
        assert 'href="bibliography.html#' in html, f"{page}: citations do not link to the bibliography"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page_has_a_colab_launch_link(chapter):
    html = built(f"{chapter}.html")
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    colab = (
        f"{CONFIG['launch_buttons']['colab_url']}/github/{repo}/blob/{CONFIG['repository']['branch']}/{chapter}.ipynb"
    )
    assert f'href="{colab}"' in html
    binder = f"{CONFIG['launch_buttons']['binderhub_url']}/v2/gh/{repo}/{CONFIG['repository']['branch']}?urlpath=lab/tree/{chapter}.ipynb"
    assert f'href="{binder}"' in html
    assert "On Colab or Binder, install" not in html, "the install cell is hidden in the book"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_tables_that_cells_print_are_tables_on_the_page(chapter):
    "A Markdown table in a cell's output (IPython's Markdown) is rendered as an HTML table, not as text with bars."
    cells = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells
    printed = sum(
        bool(re.search(r"^\|(\s*:?-+:?\s*\|)+\s*$", o.get("data", {}).get("text/markdown", ""), re.M))
        for c in cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    html = built(f"{chapter}.html")
    assert html.count("<table") >= printed, f"{chapter}: {printed} printed table(s), {html.count('<table')} on the page"
    text = re.sub(r"<pre.*?</pre>", "", html, flags=re.S)  # code may well contain "|---|"
    assert not re.search(r"\|\s*-{3,}\s*\|", text), f"{chapter}: a table's separator row shows as text"


@pytest.mark.parametrize("edition", ["", "zh_CN/"], ids=["en", "zh_CN"])
def test_api_page_documents_the_package(edition):
    html = built(f"{edition}book/api.html")
    for module in MODULES:
        assert f'id="module-annotated_transformer.{module}"' in html
    # The docstrings' special tokens, <s> and </s>, are shown as text in both editions (not swallowed as HTML).
    english = built("book/api.html")
    assert html.count("&lt;/s&gt;") == english.count("&lt;/s&gt;") > 0
    for name in (
        "model.make_model",
        "model.TransformerConfig",
        "decoding.beam_search",
        "attention.attention",
        "multi_head.MultiHeadedAttention",
        "training.train_model",
        "lib.trainer.train",
        "lib.pretrained.Transformer",
        "lib.translate.Translator",
        "cli.main",
    ):
        assert f'id="annotated_transformer.{name}"' in html, f"{name} is not documented"
    # The sections link back to the chapters, of both parts.
    for chapter in (
        "05_model",
        "07_decoding",
        "11_attention_heads",
        "13_scaling_wmt",
        "a05_runs",
        "a10_book_tools",
        "a02_tokenizers",
    ):
        assert f'href="{chapter}.html"' in html, f"the API reference does not link to {chapter}"


@pytest.mark.parametrize("chapter, following", list(zip(CHAPTERS, CHAPTERS[1:])))
def test_each_chapter_links_on_to_the_next_one(chapter, following):
    "The book can be read front to back: the summary of every chapter ends with a link to the next in the TOC."
    last = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4).cells[-1]
    # The last paragraph: one line as the reader sees it, however the source wraps it.
    line = re.split(r"\n\s*\n", last.source.strip())[-1] if last.cell_type == "markdown" else ""
    target = Path(following).name + ".ipynb"
    assert f"]({target}" in line, f"{chapter}: the summary's last line must link to {target}, the next chapter"


def stored_texts(notebook: Path):
    "The text a reader sees in a notebook's stored outputs: printed text, and plain or Markdown results."
    for cell in nbformat.read(notebook, as_version=4).cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            yield cell.id, "".join(output.get("text", "")) + data.get("text/plain", "") + data.get("text/markdown", "")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_shows_a_degenerate_translation(notebook):
    "No output shows a decoder's loop (`repeats_a_word`)."
    found = [f"{cell}: {text[:200]!r}" for cell, text in stored_texts(notebook) if repeats_a_word(text)]
    assert found == []


# ---- The Chinese edition (_build/html/zh_CN, built from the catalogues in locales/) --------------------------------

EDITION_LINKS = re.compile(r'<p class="edition-links">(.*?)</p>', re.S)
CJK = re.compile(r"[\u3400-\u9fff]")
LATIN = re.compile(r"[A-Za-z]")


def prose_text(html: str) -> str:
    "The text of a page's article that a translator translates: no code, cell outputs, API signatures or references."
    from bs4 import BeautifulSoup

    article = BeautifulSoup(html, "html.parser").find("article")
    # Bibliography entries name English works, as they are cited in both editions.
    skipped = "pre, code, .cell_output, dt, .math, script, style, .edition-links, [role=doc-biblioentry]"
    for node in article.select(skipped):
        node.decompose()
    return article.get_text(" ")


@pytest.mark.parametrize("page", ["book/index", *TOC])
def test_every_page_links_to_itself_in_the_other_edition(page):
    english, chinese = HTML / f"{page}.html", HTML / "zh_CN" / f"{page}.html"
    built(f"{page}.html")
    assert chinese.is_file(), f"{page} is missing from the Chinese edition (_build/html/zh_CN)"
    for source, other in ((english, chinese), (chinese, english)):
        links = EDITION_LINKS.findall(source.read_text(encoding="utf-8"))
        assert len(links) == 1, f"{source}: one line of links to the other edition"
        href = re.search(r'href="([^"]+)"', links[0]).group(1)
        assert (source.parent / href).resolve() == other.resolve(), f"{source} links to {href}"


@pytest.mark.parametrize("page", ["book/index", *TOC])
def test_chinese_pages_are_mostly_chinese(page):
    "Of the letters of the page's prose, most are Chinese characters (code, outputs and product names stay English)."
    built(f"{page}.html")
    html = (HTML / "zh_CN" / f"{page}.html").read_text(encoding="utf-8")
    assert '<html lang="zh-CN"' in html
    text = prose_text(html)
    chinese, latin = len(CJK.findall(text)), len(LATIN.findall(text))
    assert chinese > latin, f"{page}: {chinese} Chinese characters, {latin} Latin letters in its prose"


def test_the_chinese_edition_speaks_chinese_around_the_text():
    "The theme's words (the search box, the navigation) and the book's title are Chinese too."
    built("book/01_attention.html")
    html = (HTML / "zh_CN" / "book" / "01_attention.html").read_text(encoding="utf-8")
    assert 'placeholder="搜索本书……"' in html
    assert "中文版" in re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    assert "下一页" in html and "上一页" in html
    assert "代码仓库" in html and "颜色模式" in html and "Repository" not in html and "Color mode" not in html
    training = (HTML / "zh_CN" / "book" / "06_training.html").read_text(encoding="utf-8")
    assert "显示代码单元格" in training and "Show code cell" not in training
    captions = re.findall(r'<p aria-level="2" class="caption" role="heading"><span class="caption-text">([^<]*)', html)
    assert len(captions) == 3 and all(CJK.search(c) for c in captions), f"the parts of the contents: {captions}"
    script = (HTML / "zh_CN" / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(script.removeprefix("Search.setIndex(").removesuffix(")"))
    assert {"注意力", "位置编码"} <= set(index["terms"]), "the search index holds Chinese words (jieba splits the text)"
