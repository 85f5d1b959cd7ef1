"""One schema for every file the package writes: where a run keeps its files, the kind and version each file
carries, and the one step that reads a file of an earlier version as the current one."""

# Every file says what it is in its `format`, a kind and a version such as "config 1": a run's `config.json`,
# `summary.json` and each line of `metrics.jsonl`, its checkpoints, a shared model's `config.json`, the results files of
# an evaluation, a benchmark or a table of variations. A reader asks for the kind it expects and gets the current
# version: `upgrade` brings an earlier one up to date (files written before versions existed are version 0), and
# refuses another kind, or a version newer than this package knows, with an error that names the file.

import re
from dataclasses import dataclass
from pathlib import Path

from .files import read_json, write_json

# Where the command line puts runs, and records results, unless told otherwise (folders beside the working folder).
RUNS = Path("runs")
RESULTS = Path("results")

# The current version of each kind of file. Earlier versions, and what changed:
# checkpoint: 1 had a digest of the weights alone (or none), 2 one over all it holds, stored as the number 2; 3 the
#   same content, its format written as every other file's.
# model: 1 and 2 were one .safetensors file (2 added a digest of its header); 3 is a folder (`pretrained`).
# config, summary, metrics, results, benchmark, variations (a table), variation (one row of it), prepared (the
#   manifest of a folder of prepared WMT14 data): 0 had no format; 1 says it.
FORMATS = {"checkpoint": 3, "model": 3, "config": 1, "summary": 1, "metrics": 1, "results": 1, "benchmark": 1,
           "variations": 1, "variation": 1, "prepared": 1}
_LEGACY_MODEL = re.compile(r"annotated-transformer model (\d+)")  # a model file of versions 1 and 2


class FormatError(ValueError):
    "A file of another kind than the one expected, or of a version this package does not read."


def stamped(kind: str, data: dict) -> dict:
    "`data` with its `format` first: the kind and its current version, as every file of the package carries it."
    return {"format": f"{kind} {FORMATS[kind]}", **{key: value for key, value in data.items() if key != "format"}}


def format_of(data) -> tuple[str | None, int]:
    """The kind and version a file's content says it is: (None, 0) where it says nothing (a file written before
    versions existed, or not one of the package's); checkpoints of versions 1 and 2, and model files of 1 and 2, as
    they wrote it."""
    found = data.get("format") if isinstance(data, dict) else None
    if isinstance(found, int) and not isinstance(found, bool) and found in (1, 2):
        return "checkpoint", found
    if isinstance(found, str):
        if legacy := _LEGACY_MODEL.fullmatch(found):
            return "model", int(legacy[1])
        kind, _, version = found.partition(" ")
        if kind in FORMATS and version.isdecimal() and len(version) < 6:
            return kind, int(version)
    return None, 0


def kind_of_file(path) -> str | None:
    "The kind of file that the JSON file `path` says it is (`format_of`); None for one that names none or does not read."
    try:
        return format_of(read_json(path))[0]
    except (OSError, ValueError):
        return None


def upgrade(kind: str, data, source) -> dict:
    """The content of a file of `kind`, read from `source`, in the current version of its kind.

    The one upgrade step of every kind: a file of an earlier version gets the current `format`, and what its version
    lacked gets the value that version meant (no field has changed meaning yet, so nothing else is rewritten; a
    checkpoint's digests were checked, as that version wrote them, before this step). A file that names another kind,
    a version newer than this package's, or that is no mapping at all, is a `FormatError` naming `source`."""
    if not isinstance(data, dict):
        raise FormatError(f"{source}: not a {kind} file of this package (it holds a {type(data).__name__})")
    found, version = format_of(data)
    if "format" in data and found is None:
        raise FormatError(f"{source}: its format {str(data['format'])[:40]!r} is none this package writes; expected "
                          f"a {kind} file (format '{kind} {FORMATS[kind]}')")
    if found is not None and found != kind:
        raise FormatError(f"{source}: a {found} file, not a {kind} file")
    if version > FORMATS[kind]:
        raise FormatError(f"{source}: a {kind} file of version {version}, newer than this package reads (up to "
                          f"{FORMATS[kind]}): upgrade the package")
    if version == 0 and kind in ("checkpoint", "model"):
        raise FormatError(f"{source}: not a {kind} file of this package (it names no format)")
    return stamped(kind, data)


def write_artifact(path, kind: str, data: dict) -> None:
    "Write `data` as a JSON file of `kind`, in its current version, atomically."
    write_json(path, stamped(kind, data))


def read_artifact(path, kind: str) -> dict:
    "The JSON file `path`, a file of `kind`, in the current version of its kind (`upgrade`)."
    return upgrade(kind, read_json(path), path)


_CHECKPOINT = re.compile(r"step-(\d{6,})\.pt")


@dataclass(frozen=True)
class RunFiles:
    """Where a run directory keeps what it writes: `config.json` (the recipe and how it runs), `metrics.jsonl` (a line
    per evaluation), `summary.json` (the end, and the evaluations recorded since), `checkpoints/step-NNNNNN.pt`, and
    with TensorBoard `tensorboard/`; `.lock` is held by the process that writes."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        "The recipe and how the run trains (kind `config`)."
        return self.root / "config.json"

    @property
    def metrics(self) -> Path:
        "A line of metrics per evaluation (kind `metrics`)."
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        "How the run ended, and the evaluations recorded since (kind `summary`)."
        return self.root / "summary.json"

    @property
    def checkpoints(self) -> Path:
        "The folder of the run's checkpoints."
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        "TensorBoard's event files, when the run writes them."
        return self.root / "tensorboard"

    @property
    def lock(self) -> Path:
        "The lock file of the process that writes."
        return self.root / ".lock"

    def checkpoint(self, step: int) -> Path:
        "The checkpoint written after update `step`."
        return self.checkpoints / f"step-{step:06d}.pt"

    @staticmethod
    def checkpoint_step(path) -> int | None:
        "The update of a checkpoint's file name (`step-NNNNNN.pt`); None for a name of any other form."
        match = _CHECKPOINT.fullmatch(Path(path).name)
        return int(match[1]) if match else None
