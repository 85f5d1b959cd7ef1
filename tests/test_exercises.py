"""Every paper chapter ends with exercises, just before its summary, in the one format the whole book uses.

The section opens with a Markdown cell `## Exercises` (a sentence or two of introduction), followed by 3 to 5
exercises. Each exercise is a Markdown cell whose first line is `### Exercise N: <short title>`, numbered from 1.
A thinking exercise unfolds its solution from a MyST dropdown in the same cell:

    :::{admonition} Solution
    :class: dropdown
    The answer.
    :::

A coding exercise's solution is the code cell right after the question, tagged `hide-cell` (Jupyter Book folds it
behind a button) and `solution`; it ends with `assert` statements that check the solution does what the question
asked. nbval runs every notebook cell by cell (`make test`), so those asserts are the test of each coding solution;
this file checks that they are there, and the format. Every chapter has at least one coding exercise.
"""

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
# The first part of the book, one chapter per section of the paper: book/NN_name.ipynb.
PAPER_CHAPTERS = sorted(p for p in (ROOT / "book").glob("*.ipynb") if re.fullmatch(r"\d\d_\w+", p.stem))

SECTION = re.compile(r"\A## Exercises[ \t]*\n(?P<intro>.*)\Z", flags=re.S)
SUMMARY = re.compile(r"^#{2,6} Summary\s*$", flags=re.M)
EXERCISE = re.compile(r"\A### Exercise (?P<number>\d+): (?P<title>\S[^\n]*)(?P<body>.*)\Z", flags=re.S)
# The fence may be longer than three colons, if the solution itself holds a fenced directive; it closes alike.
DROPDOWN = re.compile(
    r"^(?P<fence>:{3,})\{admonition\} Solution[ \t]*\n:class: dropdown[ \t]*\n(?P<answer>.*?)^(?P=fence)[ \t]*$",
    flags=re.S | re.M,
)
MIN_EXERCISES, MAX_EXERCISES = 3, 5


def executed_asserts(source: str) -> int:
    """The `assert` statements a cell runs when executed top to bottom: those at its top level or in its loops,
    `with` and `if` blocks, not those in a function or class it only defines (nor in comments or strings)."""
    # IPython's magics and shell escapes are not Python; they hold no assert.
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    count, todo = 0, list(ast.parse(code).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Assert):
            count += 1
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return count


def is_solution_cell(cell) -> bool:
    return cell.cell_type == "code" and "solution" in cell.metadata.get("tags", [])


def exercise_problems(cells) -> tuple[list[str], int]:
    """What is wrong with a chapter's Exercises section, and how many coding exercises it has.

    An empty list of problems means: one `## Exercises` section, right before the `## Summary` cell, with 3 to 5
    numbered exercises, each with a solution (a dropdown, or a folded `solution` code cell with asserts right after
    it), and nothing else in the section.
    """
    summaries = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and SUMMARY.search(c.source)]
    starts = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and SECTION.match(c.source)]
    if not summaries:
        return ["no '## Summary' cell"], 0
    if len(starts) != 1:
        return [f"{len(starts)} Markdown cells open with '## Exercises': the chapter needs exactly one"], 0
    start, summary = starts[0], summaries[-1]
    if start > summary:
        return ["the '## Exercises' section comes after the '## Summary' cell: it goes right before it"], 0

    problems = []
    if not SUMMARY.match(cells[summary].source):
        problems.append(
            "the '## Summary' heading must open its cell: move the prose before it into a cell of its own, "
            "ahead of the '## Exercises' section"
        )
    if not SECTION.match(cells[start].source).group("intro").strip():
        problems.append("the '## Exercises' cell needs a sentence or two of introduction")
    if "### Exercise" in cells[start].source:
        problems.append("the '## Exercises' cell holds only the introduction: each exercise gets its own cell")
    numbers, coding = [], 0
    section = cells[start + 1 : summary]
    for offset, cell in enumerate(section):
        where = f"cell {start + 1 + offset}"
        previous = section[offset - 1] if offset else cells[start]
        if cell.cell_type == "code":
            if not (is_solution_cell(cell) and previous.cell_type == "markdown" and EXERCISE.match(previous.source)):
                problems.append(
                    f"{where}: a code cell in the Exercises section must be a solution (tagged 'solution') "
                    "right after its exercise's Markdown cell"
                )
                continue
            coding += 1
            if "hide-cell" not in cell.metadata.get("tags", []):
                problems.append(f"{where}: tag the solution 'hide-cell' too, so that the book folds it")
            if re.search(r"^#\|\s*export", cell.source, flags=re.M):
                problems.append(f"{where}: a solution is not part of the package: no '#| export'")
            if not executed_asserts(cell.source):
                problems.append(f"{where}: the solution must end with asserts that check it (none runs here)")
            continue
        match = EXERCISE.match(cell.source) if cell.cell_type == "markdown" else None
        if not match:
            problems.append(f"{where}: the Exercises section holds only exercises ('### Exercise N: title' cells)")
            continue
        numbers.append(int(match.group("number")))
        body = match.group("body")
        dropdowns = list(DROPDOWN.finditer(body))
        question = DROPDOWN.sub("", body).strip()
        if not question:
            problems.append(f"{where}: exercise {match.group('number')} asks no question")
        if any(not d.group("answer").strip() for d in dropdowns):
            problems.append(f"{where}: exercise {match.group('number')} has an empty solution")
        following = section[offset + 1] if offset + 1 < len(section) else None
        if not dropdowns and not (following is not None and is_solution_cell(following)):
            problems.append(
                f"{where}: exercise {match.group('number')} has no solution: a ':::{{admonition}} Solution' dropdown "
                "in its cell, or a 'solution' code cell right after it"
            )
    if not MIN_EXERCISES <= len(numbers) <= MAX_EXERCISES:
        problems.append(f"{len(numbers)} exercises: a chapter has {MIN_EXERCISES} to {MAX_EXERCISES}")
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"the exercises are numbered {numbers}: number them 1, 2, 3, ... in order")
    if not coding:
        problems.append("no coding exercise: at least one exercise is solved by a 'solution' code cell")
    return problems, coding


@pytest.mark.parametrize("path", PAPER_CHAPTERS, ids=lambda p: p.stem)
def test_paper_chapter_ends_with_exercises(path):
    problems, _ = exercise_problems(nbformat.read(path, as_version=4).cells)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_there_are_paper_chapters():
    assert len(PAPER_CHAPTERS) >= 10


# ---- The checker itself, on small made-up chapters ------------------------------------------------------------

md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
SOLUTION_TAGS = {"tags": ["hide-cell", "solution"]}


def thinking(n: int, answer: str = "Because it does.") -> nbformat.NotebookNode:
    return md(f"### Exercise {n}: Why?\n\nWhy does it?\n\n:::{{admonition}} Solution\n:class: dropdown\n{answer}\n:::")


def coding(n: int, source: str = "x = 2 + 2\nprint(x)\nassert x == 4", tags=SOLUTION_TAGS):
    return [md(f"### Exercise {n}: Build it\n\nCompute 2 + 2."), code(source, metadata=dict(tags))]


def chapter(*exercises, intro: str = "Try these.") -> list:
    "A made-up chapter: a title, some code, the Exercises section with `exercises`, the summary."
    cells = [md("# A chapter"), code("y = 1")]
    cells += [md(f"## Exercises\n\n{intro}")] if intro is not None else []
    for e in exercises:
        cells += e if isinstance(e, list) else [e]
    return cells + [md("## Summary\n\n- Done.")]


def problems_of(cells) -> list[str]:
    return exercise_problems(cells)[0]


def test_a_well_formed_section_passes():
    problems, coding_count = exercise_problems(chapter(thinking(1), coding(2), thinking(3), coding(4)))
    assert problems == [] and coding_count == 2
    # A longer fence around a solution that holds a fenced block of its own.
    long_fence = md(
        "### Exercise 3: Deep\n\nQ?\n\n::::{admonition} Solution\n:class: dropdown\nA\n:::{note}\nB\n:::\n::::"
    )
    assert problems_of(chapter(thinking(1), coding(2), long_fence)) == []


@pytest.mark.parametrize(
    "cells, expected",
    [
        (chapter(thinking(1), coding(2), thinking(3), intro=None)[:-1] + [md("## Summary")], "'## Exercises'"),
        (
            [md("# A chapter"), md("## Summary"), md("## Exercises\n\nHi."), *coding(1), thinking(2), thinking(3)],
            "comes after the '## Summary'",
        ),
        (chapter(thinking(1), coding(2), thinking(3))[:-1], "no '## Summary'"),
        (chapter(thinking(1), coding(2), thinking(3), intro=""), "introduction"),
        (chapter(thinking(1), coding(2)), "2 exercises"),
        (chapter(thinking(1), coding(2), thinking(3), thinking(4), thinking(5), thinking(6)), "6 exercises"),
        (chapter(thinking(1), coding(2), thinking(4)), "numbered [1, 2, 4]"),
        (chapter(thinking(1), thinking(2), thinking(3)), "no coding exercise"),
        (chapter(thinking(1), coding(2), md("### Exercise 3: Open\n\nWhat now?")), "exercise 3 has no solution"),
        (chapter(thinking(1), coding(2), thinking(3, answer="")), "empty solution"),
        (
            chapter(thinking(1), coding(2), md("### Exercise 3: Mute\n\n" + thinking(3).source.split("\n\n", 2)[2])),
            "asks no question",
        ),
        (
            chapter(thinking(1), coding(2), thinking(3))[:-1] + [md("Closing prose.\n\n## Summary\n\n- Done.")],
            "must open its cell",
        ),
        (chapter(thinking(1), coding(2, tags={"tags": ["solution"]}), thinking(3)), "'hide-cell'"),
        (chapter(thinking(1), coding(2, tags={"tags": ["hide-cell"]}), thinking(3)), "must be a solution"),
        (chapter(thinking(1), coding(2, source="x = 4\n# assert x == 4\ns = 'assert'"), thinking(3)), "asserts"),
        (chapter(thinking(1), coding(2, source="def check():\n    assert True"), thinking(3)), "asserts"),
        (chapter(thinking(1), coding(2, source="#| export\nassert True"), thinking(3)), "'#| export'"),
        (chapter(thinking(1), coding(2), md("Some more prose."), thinking(3)), "only exercises"),
        (chapter(thinking(1), coding(2), md("### Exercise 3:\n\nNo title.")), "only exercises"),
        (
            chapter(md("### Exercise 1: Loose\n\nQ?\n\n:::{admonition} Solution\nA\n:::"), coding(2), thinking(3)),
            "no solution",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_malformed_section_is_refused(cells, expected):
    problems = problems_of(cells)
    assert any(expected in p for p in problems), problems


def test_asserts_that_run_are_counted():
    source = "%time x = 1\nfor i in range(3):\n    assert i < 3\nwith open('f') as f:\n    assert f\nassert x == 1"
    assert executed_asserts(source) == 3
    assert executed_asserts("class T:\n    def f(self):\n        assert False\nx = 'assert'") == 0
