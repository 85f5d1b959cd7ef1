"""The WMT14 data prepared for training (`annotated_transformer.lib.wmt`): cleaning, one SentencePiece vocabulary,
memory-mapped token files, the wmt14 task, the prepare command."""

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import MIRROR, needs_mirror

from annotated_transformer.lib.datasets import read_lines
from annotated_transformer.lib.downloads import DataError
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.tokenizers import Subwords
from annotated_transformer.lib.wmt import (
    TokenData,
    clean_pairs,
    length_filter,
    prepare_wmt14,
    prepared_folder,
    wmt14_data,
)
from annotated_transformer.lib.wmt14_files import load_wmt14_test


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
    assert json.loads((folder / "prepared.json").read_text())["format"] == "prepared 1"  # written last, versioned
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
    from annotated_transformer.lib.trainer import train
    from annotated_transformer.model import EncoderDecoder

    calls = []
    monkeypatch.setattr(EncoderDecoder, "compile", lambda self, *a, **k: calls.append(self.training), raising=False)
    recipe = RECIPES["copy"].replace(steps=2, eval_every=2, checkpoint_every=2)
    train(recipe, tmp_path / "run", device="cpu", progress=False, compile=True)
    assert calls == [True]
