"""Two small Sphinx additions for this book, loaded through `sphinx: local_extensions` in _config.yml.

Docstrings. The package's docstrings are written like the notebooks' prose: `name` for code (which the
`default_role: code` setting renders as code) and formulas in plain text, such as lp(Y) = ((5 + |Y|) / 6)^alpha.
reStructuredText, which autodoc parses them as, reads |Y| as a substitution; `escape_bars` escapes the bars
outside code, so the API page shows the docstrings as written. A module constant is shown with its value
unless the value is long (the checksums of `JS_ASSETS`): that one would only run off the page.

Editions. The book is built in English and in Chinese from the same notebooks, the Chinese prose coming from the
gettext catalogues under locales/ (see the page on the book's tools). Program output is not translated: the messages
of a notebook's outputs (the Markdown tables its cells print, for one) are left out of the catalogues, which would
otherwise have to follow every re-run, and so are displayed equations. Each page links to the same page of the
other edition, which lives in the folder of its language (`zh_CN/`) beside the English one. The Chinese search
knows the glossary's terms as words, and the theme's words that its own translation lacks come from the book.

Citations. sphinxcontrib-bibtex's author-year style puts square brackets around citations; the book's prose
uses round ones, "Vaswani et al. (2017)" and "(Vaswani et al., 2017; Xiong et al., 2020)". `author_year_round` is
that style. The bibliography labels its entries the same way, [Vaswani et al., 2017], instead of pybtex's
[VSP+17]: the formatting style `plain_author_year` is pybtex's `plain` (sorted by author, year and title) with
those labels.
"""

import dataclasses
import re
import string
from collections import Counter
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from docutils import nodes
from pybtex.plugin import register_plugin as register_pybtex_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx import addnodes
from sphinx.ext.autodoc import DataDocumenter
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain
from sphinx.util.inspect import object_description

from sphinxcontrib.bibtex.plugin import register_plugin
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

_CODE = re.compile(r"(``.+?``|`[^`]*`)")


def escape_bars(line: str) -> str:
    "The line with every `|` outside inline code escaped for reStructuredText."
    parts = _CODE.split(line)
    return "".join(p if i % 2 else p.replace("|", r"\|") for i, p in enumerate(parts))


def _escape_docstring(app, what, name, obj, options, lines):
    lines[:] = [escape_bars(line) for line in lines]


class ShortValueDataDocumenter(DataDocumenter):
    "Module constants, with their value only when it fits on a line or two."

    MAX_VALUE = 160

    def should_suppress_value_header(self) -> bool:
        return super().should_suppress_value_header() or len(object_description(self.object)) > self.MAX_VALUE


def _round() -> BracketStyle:
    "(Wang et al., 2019; Xiong et al., 2020): round brackets, several works separated by semicolons."
    return BracketStyle(left="(", right=")", sep="; ")


@dataclasses.dataclass
class RoundAuthorYearReferenceStyle(AuthorYearReferenceStyle):
    "Author-year citations in round brackets: Vaswani et al. (2017), (Vaswani et al., 2017)."

    bracket_textual: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_parenthetical: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_author: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_label: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_year: BracketStyle = dataclasses.field(default_factory=_round)


register_plugin("sphinxcontrib.bibtex.style.referencing", "author_year_round", RoundAuthorYearReferenceStyle)


def _surname(person) -> str:
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")


class AuthorYearLabelStyle(BaseLabelStyle):
    "Labels as the citations read: Post, 2018; Press and Wolf, 2017; Vaswani et al., 2017 (a, b, ... if equal)."

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        counts, seen = Counter(labels), Counter()
        for label in labels:
            if counts[label] > 1:
                seen[label] += 1
                label += string.ascii_lowercase[seen[label] - 1]
            yield label

    def format_label(self, entry) -> str:
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_surname(p) for p in people]
        if not names:
            who = entry.fields.get("title", entry.key)
        elif len(names) == 1:
            who = names[0]
        elif len(names) == 2:
            who = f"{names[0]} and {names[1]}"
        else:
            who = f"{names[0]} et al."
        return f"{who}, {entry.fields.get('year', 'n.d.')}"


class PlainAuthorYearStyle(PlainStyle):
    "pybtex's plain style (entries sorted by author, year, title) with author-year labels."

    default_label_style = AuthorYearLabelStyle


register_pybtex_plugin("pybtex.style.formatting", "plain_author_year", PlainAuthorYearStyle)


class TranslatedTocCaptions(SphinxTransform):
    """Translates the captions of the table of contents ("The paper", ...), which sphinx-external-toc inserts into the
    root page (priority 100) after Sphinx has translated the page (`Locale`, priority 20), from the same catalogue."""

    default_priority = 101

    def apply(self, **kwargs):
        if self.config.language == "en":
            return
        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        dirs = [str(Path(self.env.srcdir) / d) for d in self.config.locale_dirs]
        catalog, found = init_locale(dirs, self.config.language, domain)
        for toctree in self.document.findall(addnodes.toctree) if found else ():
            if toctree.get("caption"):
                toctree["caption"] = catalog.gettext(toctree.get("rawcaption") or toctree["caption"])


# The editions: the language Sphinx builds in, the folder of its pages below the English edition, and its name.
EDITIONS = {"en": ("", "English"), "zh_CN": ("zh_CN/", "中文")}


class UntranslatedOutputs(SphinxTransform):
    """Marks notebook outputs and displayed equations as not to be translated (a formula reads the same in both
    editions), before Sphinx's `Locale` transform (priority 20) replaces the text that is."""

    default_priority = 10

    def apply(self, **kwargs):
        for node in self.document.findall(nodes.math_block):
            node["translatable"] = False
        for output in self.document.findall(nodes.container):
            if "cell_output" in output["classes"]:
                for node in output.findall(lambda n: isinstance(n, (nodes.TextElement, nodes.image))):
                    node["translatable"] = False


def edition_links(pagename: str, language: str) -> dict[str, str]:
    "{language: relative address} of this page in every other edition, seen from this page in the `language` edition."
    up = "../" * (pagename.count("/") + EDITIONS[language][0].count("/"))
    return {lang: f"{up}{folder}{pagename}.html" for lang, (folder, _) in EDITIONS.items() if lang != language}


def _link_editions(app, pagename, templatename, context, doctree):
    "Opens the page's body with a link to the same page in each other edition."
    if doctree is None or app.config.language not in EDITIONS:
        return
    anchors = " · ".join(
        f'<a class="edition-link" href="{href}" hreflang="{lang.replace("_", "-")}">{EDITIONS[lang][1]}</a>'
        for lang, href in edition_links(pagename, app.config.language).items()
    )
    context["body"] = f'<p class="edition-links">{anchors}</p>\n' + context["body"]


def glossary_terms(glossary: str) -> list[tuple[str, str]]:
    "(English term, Chinese term) of each row of the glossary page's table (below its header); the tests read it too."
    table = glossary.split("\n|---|---|---|\n", 1)[1]
    return re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", table, flags=re.M)


def _search_glossary_terms(app, config):
    """Chinese search: jieba, which splits the text into the words of the search index, learns the glossary's terms,
    so that 位置编码 is one word to search for, as well as 位置 and 编码."""
    glossary = Path(app.srcdir) / "book" / "glossary.md"
    if not config.language.startswith("zh") or not glossary.is_file():
        return
    words = Path(app.doctreedir) / "glossary-words.txt"
    words.parent.mkdir(parents=True, exist_ok=True)
    words.write_text("".join(f"{zh}\n" for _, zh in glossary_terms(glossary.read_text(encoding="utf-8"))))
    config.html_search_options = {**config.html_search_options, "dict": str(words)}


def _theme_words(app) -> None:
    """Adds the book's catalogue of sphinx-book-theme's words (locales/<language>/LC_MESSAGES/booktheme.po) to the
    theme's own, for the words the theme's translation lacks. Sphinx compiles the catalogues of the pages and its
    own, not a theme's: this one is compiled here, into the build's folder."""
    source = Path(app.srcdir) / "locales" / app.config.language / "LC_MESSAGES" / "booktheme.po"
    if not source.is_file():
        return
    with source.open("rb") as f:
        catalog = read_po(f)
    compiled = Path(app.doctreedir) / "locales" / app.config.language / "LC_MESSAGES" / "booktheme.mo"
    compiled.parent.mkdir(parents=True, exist_ok=True)
    with compiled.open("wb") as f:
        write_mo(f, catalog)
    app.add_message_catalog("booktheme", str(Path(app.doctreedir) / "locales"))


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.add_autodocumenter(ShortValueDataDocumenter, override=True)
    app.connect("autodoc-process-docstring", _escape_docstring)
    app.add_transform(UntranslatedOutputs)
    app.add_transform(TranslatedTocCaptions)
    app.connect("html-page-context", _link_editions)
    app.connect("config-inited", _search_glossary_terms)
    _theme_words(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
