"""The data sets (`annotated_transformer.lib.datasets`): Multi30k's published files, Tatoeba's pairs split so that no
sentence is on two sides, line-aligned files read exactly."""

import gzip
import hashlib
import itertools
import random
from pathlib import Path

import pytest
from conftest import needs_mirror

from annotated_transformer.lib import datasets as data
from annotated_transformer.lib.datasets import (
    MULTI30K_SHA256,
    TATOEBA_SHA256,
    TATOEBA_SPLITS,
    TatoebaPair,
    iter_lines,
    load_multi30k,
    read_lines,
    read_parallel,
    read_tatoeba,
    split_tatoeba,
    tatoeba_pairs,
)
from annotated_transformer.lib.downloads import DataError, fetch


def gz(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_parallel_files_must_have_the_same_number_of_lines(tmp_path):
    a, b = gz(tmp_path / "a.gz", ["x", "y"]), gz(tmp_path / "b.gz", ["x"])
    with pytest.raises(DataError, match=r"a\.gz has 2 lines but .*b\.gz has 1"):
        read_parallel(a, b)


def test_lines_split_only_on_newlines_and_drop_the_carriage_return_of_a_line_end(tmp_path):
    path = tmp_path / "a.gz"
    text = "one\u2028still one\r\ntwo\x0cstill two\nthree\rstill three\n\x85four"  # the last line has no line end
    path.write_bytes(gzip.compress(text.encode()))
    expected = ["one\u2028still one", "two\x0cstill two", "three\rstill three", "\x85four"]
    lines = iter_lines(path)
    assert next(lines) == expected[0]  # one line at a time
    assert [expected[0], *lines] == expected and read_lines(path) == expected
    assert read_lines(gz(tmp_path / "b.gz", ["last\r", "\r", ""])) == ["last", "", ""]  # empty lines stay lines


def test_multi30k_has_the_published_sizes_and_checksums():
    for file, digest in MULTI30K_SHA256.items():  # fetch verified them; check the cached copies again anyway
        assert sha(fetch("multi30k", file, digest, "https://example.invalid")) == digest
    sizes = {split: len(load_multi30k(split)) for split in ("train", "valid", "test")}
    assert sizes == {"train": 29_000, "valid": 1_014, "test": 1_000}
    de_en, en_de = load_multi30k("test", "de-en"), load_multi30k("test", "en-de")
    assert de_en[0] == en_de[0][::-1] and de_en[0][0].startswith("Ein Mann")
    with pytest.raises(ValueError, match="direction 'de-en' or 'en-de'"):
        load_multi30k("test", "de-fr")
    with pytest.raises(ValueError, match="unknown Multi30k split"):
        load_multi30k("dev")


ATTRIBUTION = "CC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)"


def test_tatoeba_file_byte_order_mark_blank_lines_and_attribution(tmp_path):
    path = tmp_path / "cmn.txt"
    path.write_bytes(f"\ufeffHi.\t嗨。\t{ATTRIBUTION}\r\n\nRun!\t  你用跑的。 \t{ATTRIBUTION}\n\n".encode())
    assert read_tatoeba(path) == [
        TatoebaPair("Hi.", "嗨。", ATTRIBUTION),
        TatoebaPair("Run!", "你用跑的。", ATTRIBUTION),
    ]
    path.write_bytes(f"Hi.\t嗨。\t{ATTRIBUTION}\nHello.\t你好。\n".encode())  # the attribution missing
    with pytest.raises(DataError, match=r"cmn\.txt, line 2: not a Tatoeba pair .*'Hello\.\\t你好。'"):
        read_tatoeba(path)
    path.write_bytes(("\ufeffHi.\t嗨。\t".encode())[:-5] + b"\n")  # cut inside 嗨, which starts at byte 7
    with pytest.raises(DataError, match=r"not UTF-8 text .* at byte 7\)"):
        read_tatoeba(path)


def crossing(splits) -> list:
    "The sentences found on two sides of `splits`."
    return [
        (a, b, lang, s)
        for a, b in itertools.combinations(splits, 2)
        for lang in ("en", "zh")
        for s in {getattr(p, lang) for p in splits[a]} & {getattr(p, lang) for p in splits[b]}
    ]


def test_split_keeps_every_group_of_pairs_that_share_a_sentence_on_one_side():
    rng = random.Random(0)
    # 600 pairs in chains of 1 to 6: in a chain, pair i shares its English sentence with pair i + 1 when i is even,
    # its Chinese one when i is odd, so that only the whole chain keeps every sentence on one side
    pairs, n = [], 0
    while len(pairs) < 600:
        size = rng.randint(1, 6)
        pairs += [TatoebaPair(f"E{n + i // 2}", f"Z{n + (i + 1) // 2}", ATTRIBUTION) for i in range(size)]
        n += size + 1
    splits = split_tatoeba(pairs, held_out=100)
    assert crossing(splits) == [] and sum(map(len, splits.values())) == len(pairs)
    assert all(100 <= len(splits[s]) < 106 for s in ("valid", "test")), {s: len(p) for s, p in splits.items()}
    # the text alone decides: another order of the same pairs gives the same split, each in the file's order
    shuffled = rng.sample(pairs, len(pairs))
    again = split_tatoeba(shuffled, held_out=100)
    assert {s: set(p) for s, p in again.items()} == {s: set(p) for s, p in splits.items()}
    assert again["test"] == [p for p in shuffled if p in set(splits["test"])]
    with pytest.raises(ValueError, match="leave none for training"):
        split_tatoeba(pairs[:150], held_out=100)
    with pytest.raises(ValueError, match="held_out must be a positive integer"):
        split_tatoeba(pairs, held_out=0)


def test_a_damaged_or_truncated_tatoeba_download_is_refused(tmp_path, cache, monkeypatch):
    (tmp_path / "mirror" / "tatoeba").mkdir(parents=True)
    monkeypatch.setenv("AT_MIRROR", str(tmp_path / "mirror"))
    whole = f"\ufeffHi.\t嗨。\t{ATTRIBUTION}\n".encode() * 50
    for damaged in (whole[: len(whole) // 2], whole.replace("嗨".encode(), b"??!")):  # cut short; bytes changed
        (tmp_path / "mirror" / "tatoeba" / "cmn.txt").write_bytes(damaged)
        with pytest.raises(DataError, match="not the expected file .* it was not kept"):
            tatoeba_pairs("test")
        assert [p.name for p in (cache / "tatoeba").iterdir()] == [".lock"]
    with pytest.raises(ValueError, match="unknown Tatoeba split 'dev'"):
        tatoeba_pairs("dev")


def test_load_pairs_reads_a_data_set_by_name_in_its_default_direction(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown data set 'europarl'; the parallel ones are multi30k, tatoeba$"):
        data.load_pairs("europarl", "train")
    calls = []
    monkeypatch.setitem(
        data.PARALLEL_DATA,
        "demo",
        (lambda split, direction: calls.append((split, direction)) or [("a", "b")], ("xx-yy", "yy-xx")),
    )
    assert data.load_pairs("demo", "valid") == [("a", "b")] and data.load_pairs("demo", "test", "yy-xx") == [("a", "b")]
    assert calls == [("valid", "xx-yy"), ("test", "yy-xx")]


@needs_mirror
def test_tatoeba_splits_of_the_real_file():
    splits = {split: tatoeba_pairs(split) for split in TATOEBA_SPLITS}
    assert {s: len(p) for s, p in splits.items()} == {"train": 27_155, "valid": 1_000, "test": 1_000}
    assert crossing(splits) == []
    splits["test"].clear()  # a caller's change to its list leaves the loader's own alone
    assert len(tatoeba_pairs("test")) == 1_000
    assert all(p.attribution.startswith("CC-BY 2.0 (France) Attribution: tatoeba.org #") for p in splits["train"])
    zh_en, en_zh = data.load_tatoeba("valid", "zh-en"), data.load_tatoeba("valid", "en-zh")
    assert zh_en[0] == en_zh[0][::-1] == (splits["valid"][0].zh, splits["valid"][0].en)
    with pytest.raises(ValueError, match="direction 'zh-en' or 'en-zh'"):
        data.load_tatoeba("valid", "zh-de")
    path = fetch("tatoeba", "cmn.txt", TATOEBA_SHA256, "https://example.invalid")
    assert path.read_bytes().startswith(b"\xef\xbb\xbfHi.\t") and path.read_bytes().endswith(b")\n\n")
