"""The WMT14 files (`annotated_transformer.lib.wmt14_files`, and the resumable downloads of
`lib.downloads` they need): the test sets as published, the training corpora read from their archives in one pass,
the sample detokenized."""

import gzip
import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest
from conftest import MIRROR, needs_mirror

from annotated_transformer.lib import downloads, wmt14_files
from annotated_transformer.lib.datasets import iter_lines, read_lines
from annotated_transformer.lib.downloads import DataError, fetch
from annotated_transformer.lib.wmt14_files import (
    newstest2014_filtered_lines,
    WMT14_TEXT_FILES,
    load_wmt14_test,
    read_corpus,
    wmt14_file,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    "Serves `payload`, honouring a 'Range: bytes=N-' header as real servers do, and records the ranges asked for."

    payload, ranges = b"", []

    def do_GET(self):
        start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-")) if self.headers["Range"] else 0
        type(self).ranges.append(start)
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_download_cut_short_is_continued_where_it_stopped(cache, monkeypatch):
    monkeypatch.delenv("AT_MIRROR", raising=False)
    payload = os.urandom(300_000)
    _RangeHandler.payload, _RangeHandler.ranges = payload, []
    server = http.server.HTTPServer(("127.0.0.1", 0), _RangeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        partial = cache / "demo" / ".big.bin.part"
        partial.parent.mkdir(parents=True)
        partial.write_bytes(payload[:123_456])  # what an interrupted download left
        path = fetch("demo", "big.bin", sha(payload), f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert _RangeHandler.ranges == [123_456]  # only the rest was asked for
    assert path.read_bytes() == payload and not partial.exists()


def test_a_partial_file_from_a_mirror_is_continued_and_a_wrong_one_is_dropped(tmp_path, cache, monkeypatch):
    (tmp_path / "mirror" / "demo").mkdir(parents=True)
    payload = os.urandom(50_000)
    (tmp_path / "mirror" / "demo" / "f.bin").write_bytes(payload)
    monkeypatch.setenv("AT_MIRROR", str(tmp_path / "mirror"))
    partial = cache / "demo" / ".f.bin.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(payload[:20_000])
    assert fetch("demo", "f.bin", sha(payload), "https://example.invalid").read_bytes() == payload
    (cache / "demo" / "f.bin").unlink()
    partial.write_bytes(b"x" * 20_000)  # a damaged partial file: the whole is wrong, so it starts over
    assert fetch("demo", "f.bin", sha(payload), "https://example.invalid").read_bytes() == payload
    # nothing is left but the file and the lock file that `fetch` holds while it writes (filelock keeps it on Unix)
    assert sorted(p.name for p in (cache / "demo").iterdir()) in (["f.bin"], [".lock", "f.bin"])


@needs_mirror
def test_the_test_sets_have_their_published_sizes_and_the_filtered_set_is_chosen_lines_of_the_full_one(cache):
    assert [len(load_wmt14_test(name)) for name in ("newstest2013", "newstest2014", "newstest2014-filtered")] == [
        3000,
        3003,
        2737,
    ]
    full, filtered = load_wmt14_test("newstest2014"), load_wmt14_test("newstest2014-filtered")
    chosen = newstest2014_filtered_lines()
    assert len(chosen) == len(set(chosen)) == 2737 and [full[i] for i in chosen] == filtered
    for name, (_, text_sha256, _) in WMT14_TEXT_FILES.items():  # the text checksums match the mirror's files
        assert sha(gzip.decompress((Path(MIRROR) / "wmt14" / name).read_bytes())) == text_sha256
    assert load_wmt14_test("newstest2013", "de-en")[0] == tuple(reversed(load_wmt14_test("newstest2013")[0]))


@needs_mirror
def test_without_a_mirror_the_published_text_is_verified_kept_and_its_terms_shown_once(cache, monkeypatch, capsys):

    published = {
        source: gzip.decompress((Path(MIRROR) / "wmt14" / name).read_bytes()).decode("utf-8")
        for name, (_, _, source) in WMT14_TEXT_FILES.items()
    }
    monkeypatch.delenv("AT_MIRROR")
    monkeypatch.setattr(downloads, "_terms_shown", set())  # as in a new process
    monkeypatch.setattr(wmt14_files, "_published_text", lambda source: published[source])  # no network here
    assert read_lines(wmt14_file("newstest2013.en.gz")) == published["sacrebleu:wmt13:en-de:src"].splitlines()
    assert len(load_wmt14_test("newstest2013")) == 3000
    assert capsys.readouterr().err.count("WMT14 English-German: published by") == 1  # two downloads, one notice
    published["sacrebleu:wmt14/full:en-de:src"] += "one line too many\n"
    with pytest.raises(DataError, match="the published text of newstest2014.en.gz .* is not the expected one"):
        wmt14_file("newstest2014.en.gz")
    assert not (cache / "wmt14" / "newstest2014.en.gz").exists()


@pytest.mark.parametrize("data", [b"a\r\nb\n\nc", b"", b"x\n", b"a\xe2\x80\xa8b\r\n", b"\n\n"])
def test_streamed_lines_are_the_lines_read_whole(tmp_path, data):
    path = tmp_path / "text.gz"
    with gzip.open(path, "wb") as f:
        f.write(data)
    assert list(iter_lines(path)) == read_lines(path)


def test_a_training_corpus_is_read_from_its_archive_in_one_pass(tmp_path, cache, monkeypatch):
    import io
    import tarfile

    lines = {lang: [f"{lang} sentence {i}" for i in range(20_000)] for lang in ("en", "de")}
    archive = tmp_path / "mirror" / "wmt14" / "training-parallel-nc-v9.tgz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in [
            ("training/other.txt", "noise\n" * 1000),
            *((f"training/news-commentary-v9.de-en.{lang}", "\n".join(lines[lang]) + "\n") for lang in ("de", "en")),
        ]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    entry = wmt14_files.WMT14_CORPORA["news-commentary-v9"]
    monkeypatch.setitem(
        wmt14_files.WMT14_CORPORA, "news-commentary-v9", (entry[0], 0, sha(archive.read_bytes()), entry[3])
    )
    monkeypatch.setenv("AT_MIRROR", str(tmp_path / "mirror"))
    # Going back in a gzip stream means decompressing it again from its start: count those rewinds.
    rewinds, rewind = [], gzip._GzipReader._rewind
    monkeypatch.setattr(gzip._GzipReader, "_rewind", lambda self: rewinds.append(1) or rewind(self))
    assert list(read_corpus("news-commentary-v9")) == list(zip(lines["en"], lines["de"]))
    assert rewinds == []
    assert list(read_corpus("news-commentary-v9", "de-en"))[5] == ("de sentence 5", "en sentence 5")
    # the source side one line longer (the case a plain zip would swallow): an error, not a shorter corpus
    lines["en"].append("one line too many")
    with tarfile.open(archive, "w:gz") as tar:
        for lang in ("de", "en"):
            data = ("\n".join(lines[lang]) + "\n").encode()
            info = tarfile.TarInfo(f"training/news-commentary-v9.de-en.{lang}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    monkeypatch.setitem(
        wmt14_files.WMT14_CORPORA, "news-commentary-v9", (entry[0], 0, sha(archive.read_bytes()), entry[3])
    )
    (cache / "wmt14" / "training-parallel-nc-v9.tgz").unlink()
    with pytest.raises(DataError, match="differ in length after 20000 lines"):
        list(read_corpus("news-commentary-v9"))


@pytest.mark.slow
@needs_mirror
def test_the_sample_is_detokenized_into_raw_text(cache):
    first = next(read_corpus("sample"))
    assert "&apos;" not in first[0] and "Parliament's legislative prerogative" in first[0]
