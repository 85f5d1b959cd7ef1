"""Scaling to WMT14 (book/11_scaling_wmt.ipynb): resumable downloads, the WMT14 files, cleaning, SentencePiece,
memory-mapped token data, and training in two processes (torchrun, gloo): the same updates as one process, every
sentence on exactly one process, and a run killed and resumed making the same updates as one never stopped."""

import gzip
import hashlib
import http.server
import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from annotated_transformer import data as data_module
from annotated_transformer.data import (
    NEWSTEST2014_FILTERED,
    WMT14_TEXT_FILES,
    DataError,
    fetch,
    iter_lines,
    load_wmt14_test,
    read_corpus,
    read_lines,
    wmt14_file,
)
from annotated_transformer.recipes import RECIPES
from annotated_transformer.text import Subwords
from annotated_transformer.wmt import TokenData, clean_pairs, length_filter, prepare_wmt14, prepared_folder, wmt14_data

from conftest import MIRROR, needs_mirror


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Downloads


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


# The WMT14 files


@needs_mirror
def test_the_test_sets_have_their_published_sizes_and_the_filtered_set_is_chosen_lines_of_the_full_one(cache):
    assert [len(load_wmt14_test(name)) for name in ("newstest2013", "newstest2014", "newstest2014-filtered")] == [
        3000,
        3003,
        2737,
    ]
    full, filtered = load_wmt14_test("newstest2014"), load_wmt14_test("newstest2014-filtered")
    chosen = [i for r in NEWSTEST2014_FILTERED.split() for a, b in [map(int, r.split("-"))] for i in range(a, b + 1)]
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
    monkeypatch.setattr(data_module, "_terms_shown", set())  # as in a new process
    monkeypatch.setattr(data_module, "_published_text", lambda source: published[source])  # no network here
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


def test_cleaning_drops_what_pipelines_drop_and_counts_why():
    pairs = [
        ("a b c", "x y z"),
        ("", "x"),
        ("a  b", "x y"),
        ("a b", "x y"),
        ("same text", "same text"),
        (" ", "y"),
        ("a b\tc", "x y z"),
    ]
    counts = Counter()
    kept = list(clean_pairs(pairs, counts))
    assert kept == [("a b c", "x y z"), ("a b", "x y")]
    assert counts == Counter(read=7, kept=2, empty=2, duplicate=2, untranslated=1)
    ids = [([5] * 3, [6] * 4), ([5] * 2, [6] * 4), ([5] * 251, [6] * 250), ([5] * 250, [6] * 250), ([5] * 4, [6] * 6)]
    assert list(length_filter(ids, counts, max_len=250, max_ratio=1.5)) == [ids[0], ids[3], ids[4]]
    assert counts == Counter(read=7, kept=0, empty=2, duplicate=2, untranslated=1, **{"too long": 1, "length ratio": 1})


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
    entry = data_module.WMT14_CORPORA["news-commentary-v9"]
    monkeypatch.setitem(
        data_module.WMT14_CORPORA, "news-commentary-v9", (entry[0], 0, sha(archive.read_bytes()), entry[3])
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
        data_module.WMT14_CORPORA, "news-commentary-v9", (entry[0], 0, sha(archive.read_bytes()), entry[3])
    )
    (cache / "wmt14" / "training-parallel-nc-v9.tgz").unlink()
    with pytest.raises(DataError, match="differ in length after 20000 lines"):
        list(read_corpus("news-commentary-v9"))


@pytest.mark.slow
@needs_mirror
def test_the_sample_is_detokenized_into_raw_text(cache):
    first = next(read_corpus("sample"))
    assert "&apos;" not in first[0] and "Parliament's legislative prerogative" in first[0]


# Subwords and token data


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    if not MIRROR:
        pytest.skip("needs AT_MIRROR")
    folder = tmp_path_factory.mktemp("prepared")
    os.environ["AT_DATA_DIR"], saved = str(folder / "cache"), os.environ.get("AT_DATA_DIR")
    try:
        manifest = prepare_wmt14(folder / "sample", corpora=("sample",), vocab_size=2000, progress=False)
    finally:
        os.environ.pop("AT_DATA_DIR") if saved is None else os.environ.__setitem__("AT_DATA_DIR", saved)
    return folder / "sample", manifest


def test_sentencepiece_round_trips_text_exactly(prepared):
    subwords = Subwords((prepared[0] / "subwords.model").read_bytes())
    assert len(subwords) == 2000
    texts = [s for pair in load_wmt14_test("newstest2014") for s in pair] + [
        "„Anführungszeichen“ 🙂",
        " two  spaces ",
        "",
    ]
    ids = subwords.encode(texts)
    assert [subwords.decode(x) for x in ids] == texts
    assert max(map(max, filter(None, ids))) < 2000 and min(map(min, filter(None, ids))) > 3  # no specials, no <unk>


def test_the_prepared_data_loads_back_as_the_same_tokens(prepared):
    folder, manifest = prepared
    assert manifest["cleaning"]["read"] == 10_000 and manifest["pairs"]["train"] == manifest["cleaning"]["kept"]
    subwords = Subwords((folder / "subwords.model").read_bytes())
    data = TokenData(folder, "train")
    assert len(data) == manifest["pairs"]["train"]
    cleaned = list(zip(*(read_lines(folder / f"train.clean.{lang}.gz") for lang in ("en", "de"))))
    encoded = zip(subwords.encode([s for s, _ in cleaned]), subwords.encode([t for _, t in cleaned]))
    expected = list(length_filter(encoded, Counter(), manifest["max_len"], manifest["max_ratio"]))
    assert len(cleaned) == manifest["cleaning"]["kept"] + manifest["cleaning"]["length ratio"] > len(expected)
    assert [data[i] for i in range(len(data))] == [(s + [2], [1] + t + [2]) for s, t in expected]
    src_lengths, tgt_lengths = data.lengths()
    assert src_lengths[5] == len(data[5][0]) and tgt_lengths[5] == len(data[5][1]) - 1
    valid = TokenData(folder, "valid")
    assert subwords.decode(valid[0][0][:-1]) == load_wmt14_test("newstest2013")[0][0]


def test_token_data_round_trips_any_ids_and_refuses_an_incomplete_folder(tmp_path):
    rng = np.random.default_rng(0)
    pairs = [
        (rng.integers(4, 70_000, rng.integers(0, 9)).tolist(), rng.integers(4, 70_000, rng.integers(1, 9)).tolist())
        for _ in range(50)
    ]
    (tmp_path / "prepared.json").write_text('{"dtype": "int32"}')
    assert TokenData.write(tmp_path, "train", iter(pairs), "int32") == 50
    data = TokenData(tmp_path, "train")
    assert [data[i] for i in range(50)] == [(s + [2], [1] + t + [2]) for s, t in pairs]
    with pytest.raises(DataError, match="no complete prepared split 'valid'.*annotated-transformer prepare"):
        TokenData(tmp_path, "valid")


def test_a_recipe_names_its_data_by_path_or_by_name_in_the_data_folder(cache, tmp_path):
    assert prepared_folder(None) == cache / "wmt14-en-de" and prepared_folder("mine") == cache / "mine"
    assert prepared_folder("./mine") == Path("./mine") and prepared_folder("data/mine") == Path("data/mine")
    assert prepared_folder(str(tmp_path)) == tmp_path


def test_the_wmt14_task_shares_one_vocabulary_and_says_when_the_data_is_missing(prepared, cache):
    task = wmt14_data(RECIPES["wmt14-sample-tiny"].replace(data=str(prepared[0])))
    assert task.src_vocab == task.tgt_vocab == 2000 and task.vocab["kind"] == "sentencepiece"
    with pytest.raises(DataError, match="holds no prepared WMT14 data; run `annotated-transformer prepare wmt14-en-de"):
        wmt14_data(RECIPES["wmt14-base"])


@pytest.mark.slow
@needs_mirror
def test_the_prepare_command_writes_a_complete_folder(tmp_path, cache, capsys):
    from annotated_transformer.cli import main

    out = tmp_path / "prepared"
    assert (
        main(["prepare", "wmt14-en-de", "--corpus", "sample", "--vocab-size", "1000", "--quiet", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr()
    assert '"vocab_size": 1000' in printed.out and f"prepared in {out}" in printed.err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "prepared.json",
            "subwords.model",
            "train.clean.de.gz",
            "train.clean.en.gz",
            "train.offsets.npy",
            "train.src.bin",
            "train.tgt.bin",
            "valid.offsets.npy",
            "valid.src.bin",
            "valid.tgt.bin",
        ]
    )
    assert main(["prepare", "wmt14-en-de", "--corpus", "wikipedia"]) == 2
    assert "invalid choice: 'wikipedia'" in capsys.readouterr().err


def test_train_asks_for_compilation_once_before_training(tmp_path, monkeypatch):
    # torch.compile itself takes minutes on a CPU; here only that train() asks for it, once, before training
    from annotated_transformer.model import EncoderDecoder
    from annotated_transformer.training import train

    calls = []
    monkeypatch.setattr(EncoderDecoder, "compile", lambda self, *a, **k: calls.append(self.training), raising=False)
    recipe = RECIPES["copy"].replace(steps=2, eval_every=2, checkpoint_every=2)
    train(recipe, tmp_path / "run", device="cpu", progress=False, compile=True)
    assert calls == [True]
