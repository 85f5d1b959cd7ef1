"""The package's imports: light at the top (heavy libraries load where they are used), the public names re-exported
lazily by annotated_transformer/__init__.py, and no module reaching into another's private names."""

import ast
import json
import re
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

import annotated_transformer

PACKAGE = Path(annotated_transformer.__file__).parent
HEAVY = ("altair", "matplotlib", "spacy", "sacrebleu", "sentencepiece", "annotated_transformer.bench")


def imported_modules(code: str) -> set[str]:
    """The modules a fresh Python imports to run `code`: its `-X importtime` report, and `sys.modules` at the end
    (the report leaves out a module imported by `importlib.import_module`, as the package's lazy names are)."""
    code += "\nimport sys\nprint(*sys.modules, sep='\\n')"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    reported = {line.rsplit("|", 1)[1].strip() for line in lines[1:]}  # the first line is the header
    return reported | set(done.stdout.split())


def test_importing_the_package_loads_no_heavy_library():
    modules = imported_modules("import annotated_transformer")
    assert "annotated_transformer" in modules  # the report is read correctly
    loaded = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not loaded, f"import annotated_transformer loads {loaded}"


def test_the_command_line_loads_the_benchmark_only_to_run_it():
    modules = imported_modules("import annotated_transformer.cli")
    assert "annotated_transformer.cli" in modules
    assert not {"annotated_transformer.bench", "annotated_transformer.training", "altair"} & modules


def test_a_public_name_loads_its_module_and_nothing_heavier():
    modules = imported_modules("from annotated_transformer import make_model")
    assert "annotated_transformer.model" in modules and "annotated_transformer.training" not in modules


@pytest.mark.parametrize("name", annotated_transformer.__all__)
def test_every_public_name_resolves(name):
    value = getattr(annotated_transformer, name)
    assert not isinstance(value, types.ModuleType), f"annotated_transformer.{name} is a module"
    assert name in dir(annotated_transformer)


def test_the_names_come_from_their_modules_and_unknown_names_are_errors():
    from annotated_transformer import Translator, attention, attention_explorer, make_model

    importlib.import_module("annotated_transformer.multi_head")  # binds the submodule `attention` on the package...
    assert annotated_transformer.attention is attention and callable(attention)  # ...which must not hide the function
    assert attention is importlib.import_module("annotated_transformer.attention").attention
    assert make_model is importlib.import_module("annotated_transformer.model").make_model
    assert Translator is importlib.import_module("annotated_transformer.translation").Translator
    assert attention_explorer is importlib.import_module("annotated_transformer.viz").attention_explorer
    with pytest.raises(AttributeError, match="no attribute 'make_modle'"):
        annotated_transformer.make_modle
    with pytest.raises(ImportError):
        from annotated_transformer import make_modle  # noqa: F401


def private_imports(source: str) -> list[str]:
    "`from <a module of the package> import _name` anywhere in `source` (module level or inside functions)."
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").startswith("annotated_transformer")
        ):
            found += [
                f"line {node.lineno}: {alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.endswith("__")
            ]  # __version__ is public
    return found


@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py")))
def test_no_module_imports_a_private_name_of_another(module):
    assert private_imports((PACKAGE / module).read_text(encoding="utf-8")) == []


def test_the_private_import_check_finds_them():
    assert private_imports("from .runs import RECIPES, _helper") == ["line 1: _helper"]
    assert private_imports("def f():\n    from annotated_transformer.data import _sha256") == ["line 2: _sha256"]
    assert private_imports("from . import __version__\nfrom os import _exit") == []


# ---- The import graph: no cycles, and the book's reading order -------------------------------------------------

BOOK = PACKAGE.parent / "book"
MODEL_CORE = {"attention", "multi_head", "layers", "encoding", "model"}  # the model, which any page may import


def package_imports(source: str) -> set[str]:
    "The package's modules that `source` imports, at module level or inside functions (`from .x import`, `import annotated_transformer.x`)."
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:  # from . import x
                found |= {alias.name for alias in node.names}
            elif (node.module or "").startswith("annotated_transformer."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("annotated_transformer.")}
    return found


def import_graph() -> dict[str, set[str]]:
    "Each generated module of the package -> the package's modules it imports (the hand-written __init__ aside)."
    modules = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    return {m: package_imports((PACKAGE / f"{m}.py").read_text(encoding="utf-8")) & modules - {m} for m in modules}


def notebook_of_module() -> dict[str, str]:
    "Module -> the notebook that writes it (its `#| default_exp`)."
    homes = {}
    for path in BOOK.glob("*.ipynb"):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            match = cell["cell_type"] == "code" and re.search(r"^#\| default_exp (\w+)", "".join(cell["source"]), re.M)
            if match:
                homes[match.group(1)] = path.stem
    return homes


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    "The import cycles of `graph`, each as a path that ends where it starts."
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_import_graph_reader_finds_imports_and_cycles():
    assert package_imports(
        "from .runs import x\ndef f():\n    from annotated_transformer.wmt import y\n"
        "import annotated_transformer.data\nfrom . import cli"
    ) == {"runs", "wmt", "data", "cli"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_modules_import_only_what_a_reader_has_met():
    """A paper chapter's module imports the modules of earlier chapters and of the pages under the hood; a module of
    a page under the hood imports only other such modules and the model. The two that start the training loop of the
    paper's chapters, the command line and the run cache, may import anything."""
    homes = notebook_of_module()
    graph = import_graph()
    assert set(graph) == set(homes), "every module is written by one notebook"
    wrong = []
    for module, imported in graph.items():
        if module in ("cli", "model_commands", "cache"):
            continue
        for other in imported:
            if homes[module][0].isdigit():  # a paper chapter: earlier chapters, or under the hood
                ok = homes[other] < homes[module] or not homes[other][0].isdigit()
            else:  # under the hood: under the hood, or the model
                ok = not homes[other][0].isdigit() or other in MODEL_CORE
            if not ok:
                wrong.append(f"{module} ({homes[module]}) imports {other} ({homes[other]})")
    assert wrong == []


def test_every_module_has_a_test_file_of_its_own():
    "Tests are found by module: `tests/test_<module>.py` for every module of the package."
    package = Path(annotated_transformer.__file__).parent
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert sorted(m for m in modules if not (Path(__file__).parent / f"test_{m}.py").is_file()) == []
