"""What pip installs: the wheel and the sdist hold the package and nothing of the repository's other folders, and
the declared dependency bounds are the versions the tests run with."""

import configparser
import email
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "annotated_transformer"
MODULES = sorted(p.relative_to(ROOT / PACKAGE).as_posix() for p in (ROOT / PACKAGE).rglob("*.py"))
# The repository's folders that are not the package: none of them belongs in a wheel or an sdist.
NOT_SHIPPED = ("tests/", "book/", "results/", "runs/", ".venv/", "_build/", ".ci/", ".git/")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The sdist and the wheel, built as `make dist` builds them (the wheel from the sdist), with no network."""
    out = tmp_path_factory.mktemp("dist")
    egg_info = ROOT / f"{PACKAGE}.egg-info"
    had_egg_info = egg_info.exists()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        if not had_egg_info:  # the sdist step writes it beside pyproject.toml; it is a by-product, not ours to keep
            shutil.rmtree(egg_info, ignore_errors=True)
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_wheel_holds_every_module_and_nothing_else(dists):
    _, wheel = dists
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
        metadata = email.message_from_bytes(z.read(f"{dist_info}/METADATA"))
    assert {"_modidx.py", "cli/__init__.py", "lib/__init__.py", "lib/trainer.py"} <= set(MODULES)
    missing = [m for m in MODULES if f"{PACKAGE}/{m}" not in names]
    assert not missing, f"the wheel lacks {missing}"
    stray = sorted(n for n in names if not n.startswith((f"{PACKAGE}/", f"{dist_info}/")))
    assert not stray, f"the wheel holds files outside the package: {stray}"
    assert not [n for n in names if n.startswith(NOT_SHIPPED) or n.endswith((".ipynb", ".pyc"))]
    assert f"{PACKAGE}/__main__.py" in names  # python -m annotated_transformer

    scripts = configparser.ConfigParser()
    scripts.read_string(entry_points)
    assert dict(scripts["console_scripts"]) == {"annotated-transformer": "annotated_transformer.cli:main"}

    assert metadata["Requires-Python"] == PYPROJECT["project"]["requires-python"]
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    core = {r.name: r for r in requires if r.marker is None}
    assert str(core["torch"].specifier) == str(
        Requirement(next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))).specifier
    )
    # CUDA comes with the PyTorch build the user chooses, never from this package's metadata.
    assert not [r.name for r in requires if r.name.startswith(("nvidia", "cuda", "triton"))]
    assert {"book", "test", "dev", "tensorboard"} <= set(metadata.get_all("Provides-Extra"))


def test_sdist_holds_the_package_and_its_metadata_without_the_tests(dists):
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
    top = {n.split("/")[0] for n in names}
    assert len(top) == 1, f"the sdist has more than one top folder: {top}"
    files = {n.split("/", 1)[1] for n in names}
    for required in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO", *(f"{PACKAGE}/{m}" for m in MODULES)):
        assert required in files, f"the sdist lacks {required}"
    # The tests read the book and its configuration, which the sdist does not hold: MANIFEST.in leaves them out.
    assert not [f for f in files if f.startswith(NOT_SHIPPED) or f.endswith(".ipynb")], sorted(files)
    assert "_config.yml" not in files
    allowed = {f"{PACKAGE}/", f"{PACKAGE}.egg-info/", "pyproject.toml", "README.md", "LICENSE", "PKG-INFO"}
    allowed |= {"MANIFEST.in", "setup.cfg"}  # setup.cfg: setuptools' own egg_info settings
    stray = sorted(f for f in files if not f.startswith(tuple(allowed)))
    assert not stray, f"the sdist holds files beyond the package and its metadata: {stray}"


def _pins():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith(("#", " ")):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_lower_bounds_are_the_tested_versions():
    """Every dependency's lower bound is the release requirements.txt pins (to the bound's precision): an older one
    was never tested. When make requirements moves a pin past a bound, raise the bound in pyproject.toml."""
    pins = _pins()
    declared = list(PYPROJECT["project"]["dependencies"])
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        declared += extra
    wrong = []
    for text in declared:
        req = Requirement(text)
        (lower,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
        pin = pins[canonicalize_name(req.name)]
        precision = len(lower.release)
        if pin.release[:precision] != lower.release:
            wrong.append(f"{req.name}: bound >={lower}, tested {pin}")
    assert not wrong, "pyproject.toml allows untested versions or excludes the tested one: " + "; ".join(wrong)


def test_requirements_hold_no_cuda_libraries():
    """requirements.txt installs on a machine without a GPU: torch's CUDA libraries come with a CUDA build only."""
    cuda = [name for name in _pins() if name.startswith(("nvidia", "cuda", "triton"))]
    assert not cuda, f"requirements.txt pins CUDA packages {cuda}: add them to TORCH_CUDA in the Makefile"
    assert "tensorboard" in _pins() and "matplotlib" in _pins()  # the test extra's optional paths
