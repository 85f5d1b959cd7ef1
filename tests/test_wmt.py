"""Scaling to WMT14 (book/11_scaling_wmt.ipynb): resumable downloads, the WMT14 files, cleaning, SentencePiece,
memory-mapped token data, and training in two processes (torchrun, gloo): the same updates as one process, every
sentence on exactly one process, and a run killed and resumed making the same updates as one never stopped."""

import gzip
import hashlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

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
from annotated_transformer.distributed import accumulation_steps, split_for_processes, torchrun_command
from annotated_transformer.runs import RECIPES, list_checkpoints, load_checkpoint, load_task
from annotated_transformer.training import pair_lengths, token_batches
from annotated_transformer.text import Subwords
from annotated_transformer.wmt import (
    TokenData,
    clean_pairs,
    length_filter,
    prepare_wmt14,
    prepared_folder,
    wmt14_data,
)

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


# Sharing the work among processes


def test_every_sentence_lands_on_exactly_one_process_per_epoch():
    lengths = [3 + (i * 7919) % 40 for i in range(3001)]
    for world in (1, 2, 3, 8):
        order = split_for_processes(token_batches(lengths, lengths, 300, seed=4), world)
        assert len(order) % world == 0
        accum = 2
        seen = Counter()
        for position in range(0, len(order), world * accum):  # the loop's share: update[rank::world]
            update = order[position : position + world * accum]
            shares = [update[rank::world] for rank in range(world)]
            assert len({len(share) for share in shares}) == 1  # the same number of batches for every process
            seen.update(i for share in shares for batch in share for i in batch)
        assert seen == Counter(range(3001))


def test_the_accumulation_comes_from_the_number_of_processes():
    base = RECIPES["wmt14-base"]
    assert [accumulation_steps(base, world) for world in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert accumulation_steps(RECIPES["copy"], 8) == RECIPES["copy"].accum_steps  # no tokens_per_update: as set


def _torchrun(nproc, *args, env=None, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        torchrun_command(nproc, *args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def _children(pid: int) -> list[int]:
    "The processes whose parent is `pid` (Linux: read from /proc)."
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # the process ended while being read
            continue
        if int(fields.get("PPid", "0")) == pid:
            found.append(int(status.parent.name))
    return found


def _running(pid: int) -> bool:
    "Whether `pid` is a process that has not yet ended (a zombie has ended: it holds no files)."
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


COPY = ["train", "copy", "--device", "cpu", "--quiet", "dropout=0.0", "max_tokens=390", "eval_every=1000"]


def _weights(run):
    return load_checkpoint(list_checkpoints(run)[-1])


@pytest.mark.slow
def test_two_processes_make_the_same_updates_as_one_process_on_both_shares(tmp_path):
    # the same 2 batches per update: 2 processes x 1 batch, or 1 process accumulating 2 batches
    steps = ["steps=12", "tokens_per_update=780", "checkpoint_every=6"]
    lengths = pair_lengths(load_task(RECIPES["copy"]).train)
    assert len(token_batches(*lengths, 390, seed=0)) % 2 == 0  # no batch is split for 2 processes
    two = _torchrun(2, *COPY, *steps, "--out", str(tmp_path / "two"))
    one = subprocess.run(
        [sys.executable, "-m", "annotated_transformer", *COPY, *steps, "--out", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    out, err = two.communicate(timeout=600)
    assert two.returncode == 0, err[-2000:]
    assert one.returncode == 0, one.stderr[-2000:]
    a, b = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert a["step"] == b["step"] == 12 and a["world_size"] == 2 and "world_size" not in b
    worst = max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])
    assert worst < 1e-4, worst  # the same updates, up to the order in which float sums were taken
    assert out.count('"finished": true') == 1  # one process speaks for both


@pytest.mark.slow
def test_a_two_process_run_killed_and_resumed_makes_the_same_updates(tmp_path):
    # The hard paths at once: an odd number of batches (one is split for 2 processes), an epoch boundary inside
    # the run with a short last update, checkpoints by the clock (one after every update here), dropout.
    settings = [
        "max_tokens=400",
        "tokens_per_update=1600",
        "steps=110",
        "dropout=0.1",
        "checkpoint_every=1000",
        "checkpoint_minutes=1e-9",
        "keep_checkpoints=3",
    ]
    lengths = pair_lengths(load_task(RECIPES["copy"]).train)
    batches = len(token_batches(*lengths, 400, seed=0))
    assert batches % 2 == 1 and (batches + 1) // 4 < 110  # split once; the first epoch ends within the run
    whole = _torchrun(2, *COPY, *settings, "--out", str(tmp_path / "whole"))
    cut = _torchrun(2, *COPY, *settings, "--out", str(tmp_path / "cut"))
    checkpoints = tmp_path / "cut" / "checkpoints"
    deadline = time.time() + 600
    while not any(int(p.stem[5:]) >= 60 for p in checkpoints.glob("step-*.pt")):
        assert time.time() < deadline and cut.poll() is None, cut.stderr.read()[-2000:] if cut.poll() else "timeout"
        time.sleep(0.02)
    workers = _children(cut.pid)  # torchrun starts each worker in a session of its own
    assert len(workers) == 2
    for pid in (cut.pid, *workers):  # torchrun and both workers, at once, as a lost machine would
        os.kill(pid, signal.SIGKILL)
    cut.wait()
    while any(_running(pid) for pid in workers):  # until they are gone, and their lock with them
        time.sleep(0.02)
    assert max(int(p.stem[5:]) for p in checkpoints.glob("step-*.pt")) < 110
    single = subprocess.run(
        [sys.executable, "-m", "annotated_transformer", *COPY, *settings, "--out", str(tmp_path / "cut"), "--resume"],
        capture_output=True,
        text=True,
    )
    assert single.returncode == 1 and "written by 2 process(es); resume with as many (now 1)" in single.stderr
    resumed = _torchrun(2, *COPY, *settings, "--out", str(tmp_path / "cut"), "--resume")
    for proc in (whole, resumed):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert a["step"] == b["step"] == 110 and a["epoch"] == 1
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert len(list((tmp_path / "whole" / "checkpoints").glob("step-*.pt"))) == 3  # timed ones, the newest kept


_GRADIENTS = """
import sys, torch, torch.distributed as dist
from annotated_transformer import make_model
from annotated_transformer.distributed import Processes, split_for_processes
from annotated_transformer.training import (LabelSmoothing, accumulate_gradients, batches_of, copy_task, pair_lengths,
                                            token_batches)
world = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0)
pairs = copy_task(200, seed=3)
lengths = pair_lengths(pairs)
update = split_for_processes(token_batches(*lengths, 120, seed=0), 2)[:6]  # 3 batches a process
processes = Processes(model, torch.device("cpu"), seed=0, data=(len(pairs),))
mine, normalizer = processes.share(update, lengths[1])  # the training loop's own share and normalizer
accumulate_gradients(processes.learner, [batches_of(pairs, b) for b in mine], LabelSmoothing(13, 0, 0.1), normalizer=normalizer)
torch.save([p.grad for p in model.parameters()], f"{sys.argv[1]}/{dist.get_rank() if world > 1 else 'one'}.pt")
"""


@pytest.mark.slow
def test_two_processes_compute_the_gradient_of_the_whole_update(tmp_path):
    # Adam hides a wrong gradient scale (it divides it out), so the scale is checked on the gradients themselves.
    script = tmp_path / "gradients.py"
    script.write_text(_GRADIENTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in (
        [sys.executable, str(script), str(tmp_path)],
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            str(tmp_path),
            "2",
        ],
    ):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    one = torch.load(tmp_path / "one.pt")
    for rank in (0, 1):
        grads = torch.load(tmp_path / f"{rank}.pt")
        assert all(torch.allclose(g, h, atol=1e-6, rtol=1e-5) for g, h in zip(grads, one))
    assert max(g.abs().max().item() for g in one) > 1e-3  # gradients worth comparing


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
