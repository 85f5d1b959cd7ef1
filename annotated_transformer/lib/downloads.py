"""Downloads of data files: from their canonical place or a mirror (`AT_MIRROR`), checked against a known sha256,
resumed when cut short, cached in `data_dir()` (`AT_DATA_DIR`), never left half-written."""

import contextlib
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from filelock import FileLock

from .progress import with_progress


class DataError(RuntimeError):
    "A data set could not be obtained or read; the message says what to do about it."


def data_dir() -> Path:
    """Where downloaded and prepared data sets are kept: `$AT_DATA_DIR`, by default `~/.cache/annotated_transformer`. The folder is made if needed; one that cannot be made is a `DataError` that
    says to point `AT_DATA_DIR` elsewhere (a folder that may only be read, say a shared one, serves what it holds)."""
    chosen = os.environ.get("AT_DATA_DIR")
    path = Path(chosen or Path.home() / ".cache" / "annotated_transformer")
    where = f"AT_DATA_DIR={chosen}" if chosen else f"the data folder {path} (AT_DATA_DIR is not set)"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, or a parent folder that cannot be written
        problem = "is a file, not a folder" if path.is_file() else f"cannot be made ({err.strerror or err})"
        raise DataError(f"{where}: {problem}; set AT_DATA_DIR to a folder you can write to") from None
    return path


def file_sha256(path: Path, opener=open) -> str:
    "The sha256 of a file's bytes, read with `opener` (`gzip.open`: of the text a .gz file holds)."
    digest = hashlib.sha256()
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _open_source(source: str, start: int = 0):
    """A readable binary stream for a URL (http, https, file) or a local path, positioned at byte `start` where the
    source allows it (an HTTP server that honours ranges, a local file). Returns (stream, position, size or None)."""
    if source.startswith(("http://", "https://")):
        request = urllib.request.Request(source, headers={"Range": f"bytes={start}-"} if start else {})
        try:
            response = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as err:
            if err.code != 416 or not start:  # 416: the range starts at the end; download the file again
                raise
            response = urllib.request.urlopen(source, timeout=60)
        position = start if response.status == 206 else 0  # 200: the server sends the whole file
        length = response.headers.get("Content-Length")
        return response, position, position + int(length) if length else None
    if source.startswith("file:"):
        return urllib.request.urlopen(source, timeout=60), 0, None
    stream = open(source, "rb")
    size = os.fstat(stream.fileno()).st_size
    stream.seek(min(start, size))
    return stream, min(start, size), size


@contextlib.contextmanager
def _taking_turns(folder: Path):
    "Hold a lock file in `folder`, so that processes fetching into it at once take turns."
    lock = FileLock(folder / ".lock")
    try:
        lock.acquire()
    except OSError:  # a file system that cannot lock (some network ones): go on; the checksum still guards the file
        yield
        return
    try:
        yield
    finally:
        lock.release()


_terms_shown: set[str] = set()


def show_terms(dataset: str, terms: str | None) -> None:
    "Print a data set's conditions of use on stderr, the first time this process downloads any of its files."
    if terms and dataset not in _terms_shown:
        print(terms, file=sys.stderr)
        _terms_shown.add(dataset)


def fetch(dataset: str, name: str, sha256: str, url: str, terms: str | None = None) -> Path:
    """The path of a verified copy of the data file `name` of `dataset`, downloaded on first use.

    The file is kept at `data_dir()/dataset/name`. It comes from `url/name`, or from `$AT_MIRROR/dataset/name`
    when `$AT_MIRROR` names a folder or a URL base. It is written to `.name.part` and renamed only once its
    sha256 matches, so the cache never holds a partial or wrong file under its real name; a download cut short
    leaves the `.part` file, and the next call continues it where it stopped. A cached copy that no longer matches
    is fetched again. Large files show a progress bar. `terms` (the data set's conditions of use) are printed the
    first time a file of the data set is fetched.
    """
    target = data_dir() / dataset / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with _taking_turns(target.parent):
        if target.is_file():
            if file_sha256(target) == sha256:
                return target
            target.unlink()  # damaged or outdated: fetch it again
        mirror = os.environ.get("AT_MIRROR")
        source = f"{mirror.rstrip('/')}/{dataset}/{name}" if mirror else f"{url}/{name}"
        show_terms(dataset, terms)
        partial = target.with_name(f".{name}.part")
        for attempt in ("resume", "restart"):
            found, resumed = _download(source, partial, name)
            if found == sha256:
                break
            partial.unlink(missing_ok=True)
            if attempt == "restart" or not resumed:
                raise DataError(f"{source} is not the expected file (sha256 {found}, expected {sha256}); it was not "
                                f"kept. Check AT_MIRROR, or the network, and try again")
        os.replace(partial, target)
    return target


def _download(source: str, partial: Path, name: str) -> tuple[str, bool]:
    """Download `source` into `partial`, continuing what `partial` already holds; returns the sha256 of the whole
    and whether an earlier part was continued (if that part was bad, starting over may help)."""
    try:
        stream, start, size = _open_source(source, partial.stat().st_size if partial.exists() else 0)
        digest = hashlib.sha256()
        with stream, open(partial, "r+b" if partial.exists() else "wb") as dst:
            while start and (chunk := dst.read(min(1 << 20, start - dst.tell()))):  # the part already here
                digest.update(chunk)
            dst.seek(start)
            dst.truncate()
            with with_progress(None, name, "B", shown=bool(size) and size >= 1 << 25, total=size, initial=start,
                               unit_scale=True) as bar:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
            dst.flush()
            os.fsync(dst.fileno())
    except (OSError, ValueError, http.client.HTTPException) as err:  # unreachable, refused, cut short, bad address
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
        kept = "; run it again to continue the download" if partial.exists() and partial.stat().st_size else ""
        raise DataError(f"could not get {source} ({reason}{kept}). Without network access, put {name} into "
                        f"{partial.parent}, or set AT_MIRROR to a folder that holds {partial.parent.name}/{name}") from None
    return digest.hexdigest(), bool(start)
