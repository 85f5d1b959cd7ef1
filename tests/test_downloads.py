"""Downloads (`annotated_transformer.lib.downloads`): a mirror, checksums, resumed and shared downloads, and a data
folder that cannot be used named with what to do."""

import gzip
import hashlib
import threading
import time
from pathlib import Path

import pytest

from annotated_transformer.lib import downloads
from annotated_transformer.lib.datasets import load_multi30k, read_lines
from annotated_transformer.lib.downloads import DataError, data_dir, fetch


def gz(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_copies_from_a_mirror_verifies_and_prints_the_terms_once(tmp_path, cache, monkeypatch, capsys):
    mirror = tmp_path / "mirror"
    (mirror / "demo").mkdir(parents=True)
    source = gz(mirror / "demo" / "a.gz", ["one", "two"])
    monkeypatch.setenv("AT_MIRROR", str(mirror))
    path = fetch("demo", "a.gz", sha(source), "https://example.invalid", terms="DEMO TERMS")
    assert path == cache / "demo" / "a.gz" and read_lines(path) == ["one", "two"]
    assert fetch("demo", "a.gz", sha(source), "https://example.invalid", terms="DEMO TERMS") == path  # cached
    path.unlink()
    assert fetch("demo", "a.gz", sha(source), "https://example.invalid", terms="DEMO TERMS") == path  # fetched again
    assert capsys.readouterr().err.count("DEMO TERMS") == 1  # the terms, once
    # a damaged cached copy is fetched again
    path.write_bytes(b"damaged")
    assert read_lines(fetch("demo", "a.gz", sha(source), "https://example.invalid")) == ["one", "two"]
    # the mirror may also be a URL base
    path.unlink()
    monkeypatch.setenv("AT_MIRROR", mirror.as_uri())
    assert read_lines(fetch("demo", "a.gz", sha(source), "https://example.invalid")) == ["one", "two"]


def test_a_checksum_mismatch_is_refused_and_nothing_is_kept(tmp_path, cache, monkeypatch):
    (tmp_path / "mirror" / "demo").mkdir(parents=True)
    gz(tmp_path / "mirror" / "demo" / "a.gz", ["not what we expect"])
    monkeypatch.setenv("AT_MIRROR", str(tmp_path / "mirror"))
    with pytest.raises(DataError, match="not the expected file .* it was not kept"):
        fetch("demo", "a.gz", "0" * 64, "https://example.invalid")
    assert [p.name for p in (cache / "demo").iterdir()] == [".lock"]  # the folder's lock file, nothing downloaded


def test_no_network_and_no_mirror_says_where_to_put_the_files(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("AT_MIRROR", str(tmp_path / "empty"))
    with pytest.raises(
        DataError,
        match=r"could not get .*val\.de\.gz.*put val\.de\.gz into .*multi30k, or set "
        r"AT_MIRROR to a folder that holds multi30k/val\.de\.gz",
    ):
        load_multi30k("valid")
    monkeypatch.delenv("AT_MIRROR")
    with pytest.raises(DataError, match="could not get"):  # no network here, or a bad address: the same advice
        fetch("demo", "a.gz", "0" * 64, "http://127.0.0.1:9")


def test_two_threads_fetching_one_file_at_once_download_it_once(tmp_path, cache, monkeypatch):
    (tmp_path / "mirror" / "demo").mkdir(parents=True)
    source = gz(tmp_path / "mirror" / "demo" / "a.gz", [f"line {i}" for i in range(10_000)])
    monkeypatch.setenv("AT_MIRROR", str(tmp_path / "mirror"))
    opened, real_open = [], downloads._open_source

    def slow_open(source, start=0):
        opened.append(start)
        time.sleep(0.5)  # a slow network: the other thread asks for the file while this download is under way
        return real_open(source, start)

    monkeypatch.setattr(downloads, "_open_source", slow_open)
    ready, paths, errors = threading.Barrier(2), [], []

    def fetch_it():
        ready.wait()
        try:
            paths.append(fetch("demo", "a.gz", sha(source), "https://example.invalid"))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=fetch_it) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and opened == [0]  # one download; the second fetch found its verified result
    assert paths == [cache / "demo" / "a.gz"] * 2 and sha(paths[0]) == sha(source)
    assert sorted(p.name for p in (cache / "demo").iterdir()) == [".lock", "a.gz"]  # no .part file left


def test_an_unusable_data_dir_names_the_variable(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "a-file"))
    with pytest.raises(DataError, match=r"^AT_DATA_DIR=.*a-file: is a file, not a folder; set AT_DATA_DIR to a folder"):
        data_dir()
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(DataError, match=r"^AT_DATA_DIR=.*a-file/cache: cannot be made \(.*\); set AT_DATA_DIR to"):
        data_dir()
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "cache"))
    assert data_dir() == tmp_path / "cache" and data_dir().is_dir()  # a usable folder: made when first needed


def test_a_read_only_data_dir_can_still_be_read(tmp_path, monkeypatch):
    "A shared, filled data folder that this user may only read (common on clusters) is not refused."
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o500)
    monkeypatch.setenv("AT_DATA_DIR", str(shared))
    assert data_dir() == shared
