"""Writing files whole: a file is replaced only once its new content is on disk, and JSON is read with an error that
names the file."""

import contextlib
import json
import os
import re
from pathlib import Path

# The temporary file `atomic_file` writes in, beside its target and named after the writing process (its group 1).
TEMPORARY = re.compile(r"\..+\.(\d+)\.tmp")


@contextlib.contextmanager
def atomic_file(path):
    """Write the file `path` atomically: the block writes into a temporary file in the same folder (opened for
    binary writing), which is flushed to disk and renamed over `path` only when the block completes. An
    interruption leaves the previous file (or none), never a truncated one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk or a read-only folder: say which file could not be written
        if err.errno is not None and err.filename in (None, str(tmp)):
            err.filename = str(path)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path, data) -> None:
    "Write JSON atomically (temporary file flushed to disk, then renamed); NaN or infinity is refused."
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"  # before opening: a refused value leaves no file
    with atomic_file(path) as f:
        f.write(text.encode())


def read_json(path, lines: bool = False):
    """The JSON in the file `path` (with `lines`: a list, a value per non-empty line, as in metrics.jsonl). A
    damaged file raises ValueError naming it; a missing one, FileNotFoundError."""
    path = Path(path)
    try:
        text = path.read_bytes().decode()
        return [json.loads(line) for line in text.splitlines() if line] if lines else json.loads(text)
    except ValueError as err:  # not UTF-8, or not JSON
        raise ValueError(f"{path}: damaged, not valid JSON ({err}); restore the file, or make it again with what wrote it") from None
