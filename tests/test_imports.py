"""The package's imports: light at the top (heavy libraries load where they are used), the public names re-exported
lazily by annotated_transformer/__init__.py, and no module reaching into another's private names."""

import ast
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
