"""The Chinese edition's catalogues (locales/zh_CN/LC_MESSAGES/book/*.po) are complete, in step with the English
text, keep the markup and the numbers of what they translate, and use the glossary's word for every term.

`make catalogues` brings them in step: it extracts the English text into _build/gettext/ (`make book-stored`, which
`make test` runs first, extracts it too) and updates the catalogues, a changed paragraph keeping its old translation
marked fuzzy. The tests that compare with _build/gettext/ are skipped without it, except under CI=true, where they
fail. The built Chinese edition itself is checked by tests/test_book.py and tests/test_browser.py.
"""

import os
import re
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from book_sphinx import glossary_terms  # noqa: E402  (the book's Sphinx extension, not a package)

ROOT = Path(__file__).resolve().parents[1]
LOCALE = ROOT / "locales" / "zh_CN" / "LC_MESSAGES"
TEMPLATES = ROOT / "_build" / "gettext"
CATALOGUES = sorted((LOCALE / "book").glob("*.po"))  # the pages'; the theme's words are in LOCALE's top folder
GLOSSARY_PAGE = ROOT / "book" / "glossary.md"

# What a translation keeps exactly as the English has it: roles ({doc}`x`, {cite:t}`key`), inline code, math, link
# targets, bare addresses and MyST substitutions. The text around them is translated.
MARKUP = re.compile(
    r"\{[\w:-]+\}`[^`]*`"  # a role
    r"|``.+?``|`[^`]+`"  # inline code
    r"|\$\$.+?\$\$|\$[^$]+\$"  # math
    r"|\]\([^)\s]*\)"  # a link's target
    r"|<https?://[^>]+>|https?://[^\s)>\]]+"  # an address
    r"|\{\{[^}]*\}\}"  # a substitution
)
TITLED_ROLE = re.compile(r"^(\{[\w:-]+\}`)[^`<]*<([^>`]+)>`$")
# A number and the word for its magnitude, if any: "4.5 million" and "450 万" are the same number.
NUMBER = re.compile(r"(\d+(?:[.,]\d+)*)[\s-]*(million|billion|百万|十亿|万|亿)?")
MAGNITUDES = {"million": 10**6, "billion": 10**9, "百万": 10**6, "十亿": 10**9, "万": 10**4, "亿": 10**8}
CJK = re.compile(r"[\u3400-\u9fff]")
RAW_TAG = re.compile(r"(?<!\\)</?[A-Za-z][\w-]*>")
ENGLISH_WORD = re.compile(r"\b[A-Za-z]{2,}\b")
# Words that a term's pattern would take for one of its forms: a heading has nothing to do with a head.
NOT_TERMS = re.compile(r"\bheadings?\b", re.I)
# The paper's title stays English in both editions, "attention" and all.
PAPER_TITLE = re.compile(r"Attention Is All You Need", re.I)


def catalogue(path: Path):
    with path.open("rb") as f:
        return read_po(f)


def messages(path: Path) -> list:
    "The messages of a catalogue or template, without its header."
    return [m for m in catalogue(path) if m.id]


def prose(text: str) -> str:
    "The text with its markup and the paper's title taken out: what a translation translates."
    return PAPER_TITLE.sub(" ", MARKUP.sub(" ", text))


def glossary() -> list[tuple[str, str]]:
    "(English term, Chinese term) of each row of the glossary page's table, read as the book's search reads it."
    return glossary_terms(GLOSSARY_PAGE.read_text(encoding="utf-8"))


def term_pattern(term: str) -> re.Pattern:
    "The English term as a whole word or phrase, with its plural and -ed/-ing forms; a hyphen may be a space."
    *words, last = (re.escape(w).replace("iz", "i[sz]") for w in re.split(r"[\s-]+", term))  # British -ise too
    last = last[:-1] + "(?:y|ies)" if last.endswith("y") else last + "(?:s|es|ed|ing)?"
    return re.compile(r"\b" + r"[\s-]?".join([*words, last]) + r"\b", re.I)


def term_problems(msgid: str, msgstr: str) -> list[str]:
    "The glossary terms that `msgid` uses and `msgstr` does not translate with the glossary's word."
    english = NOT_TERMS.sub(" ", prose(msgid))
    return [f"{en} → {zh}" for en, zh in glossary() if term_pattern(en).search(english) and zh not in msgstr]


def raw_tags(text: str) -> list[str]:
    "What MyST would read as HTML tags in `text`: `<s>` outside code, not escaped."
    return RAW_TAG.findall(MARKUP.sub(" ", text))


def markup(text: str) -> Counter:
    "The markup of `text`; a role's own title ({doc}`the model <05_model>`) is text to translate, its target is not."
    return Counter(TITLED_ROLE.sub(r"\1<\2>`", m) for m in MARKUP.findall(text))


def numbers_in(text: str) -> set[str]:
    "The numbers written in digits in `text`, each with its magnitude word multiplied in (2,000 stays 2,000)."
    found = set()
    for digits, magnitude in NUMBER.findall(text):
        if magnitude:
            value = Decimal(digits.replace(",", "")) * MAGNITUDES[magnitude]
            digits = f"{value.normalize():,f}"
        found.add(digits)
    return found


def markup_problems(msgid: str, msgstr: str) -> list[str]:
    "Markup or numbers of `msgid` that `msgstr` lost, changed or added."
    problems = []
    want, got = markup(msgid), markup(msgstr)
    if want != got:
        problems.append(f"markup: missing {sorted((want - got).elements())}, extra {sorted((got - want).elements())}")
    numbers, translated = numbers_in(prose(msgid)), numbers_in(prose(msgstr))
    if numbers != translated:
        problems.append(f"numbers: missing {sorted(numbers - translated)}, extra {sorted(translated - numbers)}")
    return problems


def needs_templates():
    if not TEMPLATES.is_dir():
        reason = "the English text is not extracted: run `make catalogues` or `make book-stored` first"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI=true: the catalogues must be checked)")
        pytest.skip(reason)


def test_the_patterns_read_what_they_should():
    "The checks below, on examples whose answers are known."
    assert (
        markup_problems(
            "See {doc}`01_attention` and `mask`, $d_k$ = 64.", "见 {doc}`01_attention` 与 `mask`，$d_k$ = 64。"
        )
        == []
    )
    assert markup_problems("The [results](08_results.ipynb) of 36.93.", "[结果](08_results.ipynb)为 36.93。") == []
    assert markup_problems("The {doc}`full model <05_model>`.", "{doc}`完整模型 <05_model>`。") == []
    assert (
        markup_problems("4.5 million pairs, 2.5 billion tokens, 2,000 each", "450 万个句对，25 亿个词元，每批 2,000")
        == []
    )
    assert markup_problems("`mask` is 64.", "掩码为 64。") and markup_problems("It is 36.93.", "它是 36.39。")
    assert raw_tags("以 </s> 结尾") == ["</s>"] and raw_tags("以 \\</s> 结尾，`<s>` 开头") == []
    assert term_pattern("query").search("two queries") and term_pattern("warm-up").search("a warm up of 200 steps")
    assert term_pattern("layer normalization").search("layer normalisation")
    assert term_pattern("mask").search("masked positions") and not term_pattern("head").search("the overhead")
    assert term_problems("Multi-head attention splits the heads.", "多头注意力把头分开。") == []
    assert term_problems("Beam search keeps 4 beams.", "柱搜索保留 4 个候选。") == ["beam search → 束搜索"]
    assert term_problems("Every heading and paragraph.", "每个标题和段落。") == []
    assert term_problems("From *Attention Is All You Need*.", "出自 *Attention Is All You Need*。") == []
    assert term_problems("The `attention` function.", "函数 `attention`。") == []


def test_the_glossary_gives_one_word_per_term():
    terms = glossary()
    assert len(terms) >= 25
    english, chinese = zip(*terms)
    assert len(set(english)) == len(english) and len(set(chinese)) == len(chinese)
    for en, _ in terms:
        assert term_pattern(en).fullmatch(en), en


def test_every_page_has_a_catalogue():
    needs_templates()
    pages = {p.relative_to(TEMPLATES).with_suffix("") for p in TEMPLATES.rglob("*.pot")}
    translated = {p.relative_to(LOCALE).with_suffix("") for p in CATALOGUES}
    assert pages, "no templates in _build/gettext"
    assert translated == pages, (
        f"catalogues missing: {sorted(pages - translated)}; without a page: {sorted(translated - pages)}"
    )


@pytest.mark.parametrize("path", CATALOGUES, ids=lambda p: p.stem)
def test_catalogue_is_in_step_with_the_english_text(path):
    "A paragraph added or changed in English and not in its catalogue fails here: run `make catalogues`, translate."
    needs_templates()
    template = TEMPLATES / path.relative_to(LOCALE).with_suffix(".pot")
    english = {m.id for m in messages(template)}
    translated = {m.id for m in messages(path)}
    assert not english - translated, f"new English text, not in {path.name}: {sorted(english - translated)[:3]}"
    assert not translated - english, (
        f"{path.name} translates text the page no longer has: {sorted(translated - english)[:3]}"
    )


def unfinished(path: Path) -> dict[str, list[str]]:
    "The messages of a catalogue that are not translated, and those that are fuzzy."
    return {
        "untranslated": [m.id for m in messages(path) if not m.string],
        "fuzzy": [m.id for m in messages(path) if m.fuzzy],
    }


def test_unfinished_messages_are_found(tmp_path):
    "A catalogue as `make catalogues` leaves it after an English paragraph was added and another one changed."
    path = tmp_path / "page.po"
    path.write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
        'msgid "Attention."\nmsgstr "注意力。"\n\n'
        'msgid "A new paragraph."\nmsgstr ""\n\n'
        '#, fuzzy\nmsgid "A changed paragraph."\nmsgstr "改动之前的译文。"\n',
        encoding="utf-8",
    )
    assert unfinished(path) == {"untranslated": ["A new paragraph."], "fuzzy": ["A changed paragraph."]}


@pytest.mark.parametrize("path", CATALOGUES, ids=lambda p: p.stem)
def test_catalogue_is_translated(path):
    "No message untranslated or fuzzy (an English paragraph that changed since it was translated)."
    left = unfinished(path)
    for kind, ids in left.items():
        assert not ids, f"{len(ids)} {kind} in {path.name}, the first: {ids[0]!r}"


@pytest.mark.parametrize("path", sorted(LOCALE.glob("*.po")), ids=lambda p: p.stem)
def test_the_theme_words_are_translated(path):
    "The catalogues of the theme's words that its own translation lacks (see book/_ext/book_sphinx.py)."
    assert messages(path) and unfinished(path) == {"untranslated": [], "fuzzy": []}


@pytest.mark.parametrize("path", CATALOGUES, ids=lambda p: p.stem)
def test_translations_hold_no_raw_html(path):
    """The Chinese build parses every translation as MyST, the docstrings of the API page too: there `<s>` outside code
    is an HTML tag that the page would swallow. A translation writes it `\\<s>`."""
    tagged = {m.id[:60]: tags for m in messages(path) if (tags := raw_tags(m.string))}
    assert not tagged, f"{len(tagged)} messages of {path.name}: {tagged}"


@pytest.mark.parametrize("path", CATALOGUES, ids=lambda p: p.stem)
def test_translations_keep_the_markup_and_the_numbers(path):
    problems = {m.id[:60]: p for m in messages(path) if m.string and (p := markup_problems(m.id, m.string))}
    assert not problems, f"{len(problems)} messages of {path.name}: {problems}"


@pytest.mark.parametrize("path", [p for p in CATALOGUES if p.stem != "glossary"], ids=lambda p: p.stem)
def test_glossary_terms_are_translated_the_same_way_everywhere(path):
    "Every English term of the glossary is rendered by its Chinese word (the glossary page itself shows both)."
    problems = {m.id[:60]: p for m in messages(path) if m.string and (p := term_problems(m.id, m.string))}
    assert not problems, f"{len(problems)} messages of {path.name}: {problems}"


@pytest.mark.parametrize("path", [p for p in CATALOGUES if p.stem != "glossary"], ids=lambda p: p.stem)
def test_prose_is_translated_into_chinese(path):
    "A message of three English words or more outside its markup reads in Chinese."
    english = [m.id for m in messages(path) if m.string and len(ENGLISH_WORD.findall(prose(m.id))) >= 3]
    left = [msgid for msgid in english if not CJK.search(prose(catalogue(path)[msgid].string))]
    assert not left, f"{len(left)} messages of {path.name} have no Chinese: {left[:3]}"
