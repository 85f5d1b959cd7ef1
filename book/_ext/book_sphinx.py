"""Two small Sphinx additions for this book, loaded through `sphinx: local_extensions` in _config.yml.

Docstrings. The package's docstrings are written like the notebooks' prose: `name` for code (which the
`default_role: code` setting renders as code) and formulas in plain text, such as lp(Y) = ((5 + |Y|) / 6)^alpha.
reStructuredText, which autodoc parses them as, reads |Y| as a substitution; `escape_bars` escapes the bars
outside code, so the API page shows the docstrings as written. A module constant is shown with its value
unless the value is long (the checksums of `JS_ASSETS`): that one would only run off the page.

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

from pybtex.plugin import register_plugin as register_pybtex_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.ext.autodoc import DataDocumenter
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


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.add_autodocumenter(ShortValueDataDocumenter, override=True)
    app.connect("autodoc-process-docstring", _escape_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
