"""The parallel data sets the recipes train on, Multi30k and Tatoeba's Chinese–English pairs: their files, checksums
and conditions of use, their splits, and their sentence pairs in either direction."""

import codecs
import functools
import gzip
import hashlib
from pathlib import Path
from typing import NamedTuple

from .downloads import DataError, fetch


def iter_lines(path):
    "The lines of a gzip-compressed UTF-8 text file, one at a time, without their line ends (a Windows \\r included)."
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line.removesuffix("\n").removesuffix("\r")


def read_lines(path) -> list[str]:
    "All the lines of a gzip-compressed UTF-8 text file (`iter_lines`)."
    return list(iter_lines(path))


def read_parallel(src_path, tgt_path) -> list[tuple[str, str]]:
    "The (source, target) sentence pairs of two line-aligned files; an error when their line counts differ."
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the two sides of a "
                        "parallel corpus must match line by line")
    return list(zip(src, tgt))


MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"


MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # our name -> file stem


MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


MULTI30K_TERMS = ("Multi30k: provided by its authors for non-commercial research and educational purposes. "
                  "Please cite Elliott, Frank, Sima'an and Specia (2016), \"Multi30K: Multilingual English-German "
                  "Image Descriptions\", Proceedings of the 5th Workshop on Vision and Language (ACL W16-3210).")


def load_multi30k(split: str = "train", direction: str = "de-en") -> list[tuple[str, str]]:
    """The raw (source, target) sentence pairs of a Multi30k Task 1 split: "train" (29,000 pairs),
    "valid" (1,014) or "test" (test2016, 1,000), in `direction` "de-en" or "en-de". Downloaded and
    verified on first use (see `fetch`)."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"unknown Multi30k split {split!r}; the splits are {', '.join(MULTI30K_SPLITS)}")
    if direction not in ("de-en", "en-de"):
        raise ValueError(f"Multi30k translates between German and English: direction 'de-en' or 'en-de', got {direction!r}")
    src, tgt = direction.split("-")
    paths = {lang: fetch("multi30k", f"{MULTI30K_SPLITS[split]}.{lang}.gz",
                         MULTI30K_SHA256[f"{MULTI30K_SPLITS[split]}.{lang}.gz"], MULTI30K_URL, MULTI30K_TERMS)
             for lang in (src, tgt)}
    return read_parallel(paths[src], paths[tgt])


TATOEBA_URL = "https://github.com/13luoyu/Transformer-machine-translation/raw/b172d4aa468126c16f51dbf75797aaff77cf787e"


TATOEBA_SHA256 = "aa264a2447b26ab7c9d413f8321f9e2a779fd134b5118306b6e26a3499b3926e"  # of cmn.txt, the fixed copy


TATOEBA_TERMS = ("Tatoeba (https://tatoeba.org): Chinese-English sentence pairs as https://www.manythings.org/anki/ "
                 "exports them, under Creative Commons Attribution 2.0 France (CC-BY 2.0 FR). Each pair keeps its "
                 "attribution: the numbers of its two sentences on tatoeba.org and their authors.")


TATOEBA_SPLITS = ("train", "valid", "test")


TATOEBA_HELD_OUT = 1_000  # pairs, at least, in each of the validation and test splits


class TatoebaPair(NamedTuple):
    "One pair of Tatoeba's cmn-eng export: an English sentence, its Chinese translation, and their attribution."

    en: str
    zh: str
    attribution: str


def read_tatoeba(path) -> list[TatoebaPair]:
    """The pairs of a cmn-eng file: UTF-8 text, one pair a line in three fields separated by tabs (English, Chinese,
    attribution). A byte-order mark at the start is no part of the first sentence, a blank line (the file ends with
    one) holds no pair, and each field's whitespace is normalised to single spaces. Any other line is a DataError
    that names it."""
    data = Path(path).read_bytes()
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[start:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {start + err.start})") from None
    pairs = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        fields = [" ".join(field.split()) for field in line.removesuffix("\r").split("\t")]
        if len(fields) != 3 or not all(fields):
            raise DataError(f"{path}, line {number}: not a Tatoeba pair (English, Chinese and attribution, separated "
                            f"by tabs): {line[:60]!r}")
        pairs.append(TatoebaPair(*fields))
    return pairs


def split_tatoeba(pairs: list[TatoebaPair], held_out: int = TATOEBA_HELD_OUT) -> dict[str, list[TatoebaPair]]:
    """`pairs` split into "train", "valid" and "test" so that no sentence, English or Chinese, is on two sides.

    Pairs that share a sentence, directly or through other pairs, form a group, and a group is never divided. The
    groups are ranked by a hash of their text, so that the text alone decides the split, not the file's order; test
    takes groups from the top of the ranking until it holds `held_out` pairs, valid the next ones likewise, and train
    keeps the rest. Each split lists its pairs in the file's order."""
    if not isinstance(held_out, int) or isinstance(held_out, bool) or held_out < 1:
        raise ValueError(f"held_out must be a positive integer, got {held_out!r}")
    parent: dict[tuple[str, str], tuple[str, str]] = {}  # union-find over sentences: each points towards its group's root

    def root(node):
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]  # path halving keeps the trees shallow
            node = parent[node]
        return node

    for pair in pairs:
        a, b = root(("en", pair.en)), root(("zh", pair.zh))
        if a != b:
            parent[a] = b
    groups: dict[tuple[str, str], list[int]] = {}
    for i, pair in enumerate(pairs):
        groups.setdefault(root(("en", pair.en)), []).append(i)

    def rank(members: list[int]) -> str:
        return hashlib.sha256("\n".join(sorted(f"{pairs[i].en}\t{pairs[i].zh}" for i in members)).encode()).hexdigest()

    side, held = {}, {"test": 0, "valid": 0}
    for members in sorted(groups.values(), key=rank):
        split = next((s for s in held if held[s] < held_out), "train")
        if split in held:
            held[split] += len(members)
        side.update(dict.fromkeys(members, split))
    if not any(s == "train" for s in side.values()):
        raise ValueError(f"{len(pairs)} pairs leave none for training after two held-out splits of {held_out}")
    return {split: [pair for i, pair in enumerate(pairs) if side[i] == split] for split in TATOEBA_SPLITS}


@functools.lru_cache(maxsize=1)
def _tatoeba_splits(path: str) -> dict[str, list[TatoebaPair]]:
    "The splits of the verified file at `path` (it is always the same file: fetch checked its sha256)."
    return split_tatoeba(read_tatoeba(path))  # tatoeba_pairs hands out copies of its lists


def tatoeba_pairs(split: str = "train") -> list[TatoebaPair]:
    """The pairs of a Tatoeba split, "train", "valid" or "test" (`split_tatoeba`), each with its attribution.
    Downloaded and verified on first use (see `fetch`)."""
    if split not in TATOEBA_SPLITS:
        raise ValueError(f"unknown Tatoeba split {split!r}; the splits are {', '.join(TATOEBA_SPLITS)}")
    return list(_tatoeba_splits(str(fetch("tatoeba", "cmn.txt", TATOEBA_SHA256, TATOEBA_URL, TATOEBA_TERMS)))[split])


def load_tatoeba(split: str = "train", direction: str = "zh-en") -> list[tuple[str, str]]:
    "The (source, target) sentence pairs of a Tatoeba split (`tatoeba_pairs`) in `direction`, \"zh-en\" or \"en-zh\"."
    if direction not in ("zh-en", "en-zh"):
        raise ValueError(f"Tatoeba's pairs translate between Chinese and English: direction 'zh-en' or 'en-zh', got "
                         f"{direction!r}")
    pairs = tatoeba_pairs(split)
    return [(p.zh, p.en) for p in pairs] if direction == "zh-en" else [(p.en, p.zh) for p in pairs]


# The parallel data sets a translation task trains on: each one's loader, (split, direction) -> pairs, and its
# directions, the first being the default.
PARALLEL_DATA = {
    "multi30k": (load_multi30k, ("de-en", "en-de")),
    "tatoeba": (load_tatoeba, ("zh-en", "en-zh")),
}


def parallel_directions(dataset: str) -> tuple[str, ...]:
    "The directions of `dataset`, a name in `PARALLEL_DATA`, its default first; a ValueError names the known ones."
    if dataset not in PARALLEL_DATA:
        raise ValueError(f"unknown data set {dataset!r}; the parallel ones are {', '.join(PARALLEL_DATA)}")
    return PARALLEL_DATA[dataset][1]


def load_pairs(dataset: str, split: str, direction: str | None = None) -> list[tuple[str, str]]:
    "The (source, target) pairs of a split of `dataset`, a name in `PARALLEL_DATA`, in `direction` (default: its first)."
    direction = direction or parallel_directions(dataset)[0]  # an unknown data set is named first
    return PARALLEL_DATA[dataset][0](split, direction)
