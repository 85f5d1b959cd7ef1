"""The WMT 2014 English–German files: the training corpora (archives of about 4.5 million pairs), the news test sets
(newstest2013 for development, newstest2014 full and filtered), and a 10,000-pair training sample, each checked
against its sha256, from a mirror or from where it is published."""

import gzip
import hashlib
import io
import itertools
import os
import tarfile
from pathlib import Path

from .datasets import read_lines, read_parallel
from .downloads import DataError, data_dir, fetch, file_sha256, show_terms
from .files import atomic_file


WMT14_URL = "https://www.statmt.org"


# The training corpora of the WMT 2014 English-German task: the archive (under WMT14_URL), its size and sha256, and
# the stem of its English and German files. About 4.5 million sentence pairs in all.
WMT14_CORPORA = {
    "europarl-v7": ("wmt13/training-parallel-europarl-v7.tgz", 657_632_379,
                    "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7", "training/europarl-v7.de-en"),
    "commoncrawl": ("wmt13/training-parallel-commoncrawl.tgz", 918_311_367,
                    "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", "commoncrawl.de-en"),
    "news-commentary-v9": ("wmt14/training-parallel-nc-v9.tgz", 80_418_416,
                           "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485",
                           "training/news-commentary-v9.de-en"),
}


_SAMPLE_URL = "https://raw.githubusercontent.com/harvardnlp/seq2seq-attn/2d36b4348dad5a18571495feacddcf8c6620a678/data"


# Line files kept gzip-compressed as data_dir()/wmt14/<file>: sha256 of the .gz as a mirror holds it, sha256 of the
# text inside (what is checked when the text comes from its publisher instead), and where it is published.
WMT14_TEXT_FILES = {
    "newstest2013.en.gz": ("162df22a4c495e32b7039463d27085e20ffff94b816f57a96ede3b1d92ddfa3e",
                           "ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e", "sacrebleu:wmt13:en-de:src"),
    "newstest2013.de.gz": ("f3b87352620b54bc2bb2e314ee11595af4af957389d254303708b701a0893b5d",
                           "d7ea35ab91ff3709e03ad9cb6bf5b4f2cc775cd2d72efd5254c4aec5e69663ca", "sacrebleu:wmt13:en-de:ref"),
    "newstest2014.en.gz": ("c9d36aa995abde6b41abebef6411be4f1ecc2f520f04dd6e382a232c34b36ff6",
                           "7294bccf2879a97b3706b95c9595f1459617a8ee7130d5d8581c910e69736971",
                           "sacrebleu:wmt14/full:en-de:src"),
    "newstest2014.de.gz": ("20b141a4dfe4c78a991f9999174f8f378565ea479ebaef056a68b16d23b74702",
                           "ae5d110486bc33d7175e9e28c7d0051eb3e5fcd2166dd93371089852c091a20e",
                           "sacrebleu:wmt14/full:en-de:ref"),
    "newstest2014-filtered.en.gz": ("a8a2f0c8ac2c6be02c5031720d5770f46cbb10cb687fe30661d4f0b1d8603fe1",
                                    "18db2323feae45b4b9e7d3b400d3ee3740f03a4da50046c07e3c255b9985a3f9",
                                    "lines:newstest2014.en.gz"),
    "newstest2014-filtered.de.gz": ("c8355a26763b4da9d7bd328f5d15179a3ecadd3ee14781ca1456b4805cd62826",
                                    "48fad9e043d7e8e89c06fa8203283501166e4f4a059f6cf08d9a4d6674a19fd8",
                                    "lines:newstest2014.de.gz"),
    "train-sample-10k.tok.en.gz": ("d40f414510be2d054e09c0c8bf122016fa6fe798c1175ea7d6d601aec85d4248",
                                   "db668a7d798bddf21d1ab8fcb403efbc724ba01b70472ad30d1e2049fd46e12b",
                                   f"{_SAMPLE_URL}/src-train.txt"),
    "train-sample-10k.tok.de.gz": ("31b69fac5e44e57420df1ce8b3d287219dd6826ec1963d69ecf4fb14db696379",
                                   "fe1f824a189baa650eec46269e66eef07f7304ba7572598ebbe61c55eeff7d01",
                                   f"{_SAMPLE_URL}/targ-train.txt"),
}


# The 2,737 of newstest2014's 3,003 lines that make up its filtered version (sacreBLEU's "wmt14"), in that version's
# order: line ranges of the full set, one per document.
NEWSTEST2014_FILTERED = (
    "2221-2229 1773-1809 2131-2141 1135-1143 1643-1672 1471-1489 785-795 1182-1224 1108-1134 1959-1978 "
    "817-853 2697-2709 194-219 2519-2525 2685-2696 2944-2953 1522-1534 1955-1958 1366-1377 2486-2500 "
    "1056-1078 2337-2359 1428-1434 2088-2094 104-123 2774-2841 911-925 1979-1983 2600-2612 1729-1772 "
    "1178-1181 465-507 2208-2220 321-362 168-193 1246-1249 1635-1642 978-995 2989-3002 402-439 611-628 "
    "2330-2336 2982-2988 2095-2110 2446-2464 2537-2553 1250-1272 1843-1847 1602-1615 2402-2445 804-816 "
    "0-24 1535-1552 2564-2577 1079-1099 2742-2747 2390-2401 796-803 2842-2856 1273-1282 883-892 124-140 "
    "2748-2773 2465-2485 1861-1878 1925-1954 2657-2684 1384-1427 677-685 2314-2322 2636-2640 382-394 "
    "508-514 220-247 659-663 1283-1365 2857-2885 2142-2162 1144-1177 1039-1055 2929-2943 945-948 376-381 "
    "2554-2563 2501-2518 1828-1842 2886-2910 664-669 1848-1860 440-464 2578-2595 2641-2656 2371-2389 "
    "148-160 39-103 903-910 1465-1470 303-320 2360-2370 1898-1924 395-401 2163-2166 248-302 2111-2120 "
    "2632-2635 2720-2727 1378-1383 559-580 733-742 1490-1521 670-676 2526-2536 537-546 2710-2719 996-999 "
    "893-902 2189-2207 547-558 1568-1601 2297-2308 949-968 2015-2041 2121-2130 363-375 926-944 719-732 "
    "2954-2981 648-658 1673-1680 2309-2313 1029-1038 2596-2599 1810-1827 2613-2631 1010-1028 25-38 "
    "141-147 515-536 1879-1897 2323-2329 2167-2188 1984-2014 686-718 1681-1728 854-864 2728-2741 "
    "1616-1634 1455-1464 2911-2928 2042-2087")


def newstest2014_filtered_lines() -> list[int]:
    "The indices in the full newstest2014 of the lines of its filtered version, in that version's order."
    return [i for r in NEWSTEST2014_FILTERED.split() for a, b in [map(int, r.split("-"))] for i in range(a, b + 1)]


WMT14_TERMS = ("WMT14 English-German: published by the Workshop on Statistical Machine Translation for research use "
               "(Bojar et al. 2014, \"Findings of the 2014 Workshop on Statistical Machine Translation\"); Europarl, "
               "Common Crawl and News Commentary each have their own terms, listed on https://www.statmt.org/wmt14/.")


def _published_text(source: str) -> str:
    "The text of a WMT14 line file from where it is published: sacreBLEU's copy of a test set, a URL, or other lines."
    kind, _, rest = source.partition(":")
    if kind == "sacrebleu":  # sacreBLEU downloads the official test sets and extracts their sentences
        from sacrebleu.utils import get_reference_files, get_source_file

        test_set, pair, side = rest.split(":")
        path = get_source_file(test_set, pair) if side == "src" else get_reference_files(test_set, pair)[0]
        return Path(path).read_text(encoding="utf-8")
    if kind == "lines":  # the filtered newstest2014: chosen lines of the full set
        full = read_lines(wmt14_file(rest))
        return "".join(full[i] + "\n" for i in newstest2014_filtered_lines())
    folder, name = source.rsplit("/", 1)
    text_sha256 = next(text for _, text, where in WMT14_TEXT_FILES.values() if where == source)
    return fetch("wmt14-published", name, text_sha256, folder).read_text(encoding="utf-8")


def wmt14_file(name: str) -> Path:
    """The path of a verified WMT14 line file (a test set or the training sample; see `WMT14_TEXT_FILES`).

    With `$AT_MIRROR`, the .gz is copied from `$AT_MIRROR/wmt14/<name>` and checked against its sha256, as
    `fetch` does for every data set. Without one, the text comes from its publisher (sacreBLEU's download of
    the official test sets, or the sample's repository) and is checked against the sha256 of the text. Either
    way, the first download in a process shows `WMT14_TERMS`.
    """
    if name not in WMT14_TEXT_FILES:
        raise ValueError(f"unknown WMT14 file {name!r}; the files are {', '.join(WMT14_TEXT_FILES)}")
    gz_sha256, text_sha256, source = WMT14_TEXT_FILES[name]
    target = data_dir() / "wmt14" / name
    if target.is_file() and file_sha256(target, gzip.open) == text_sha256:
        return target
    if os.environ.get("AT_MIRROR"):
        return fetch("wmt14", name, gz_sha256, "(no canonical .gz)", WMT14_TERMS)
    show_terms("wmt14", WMT14_TERMS)
    text = _published_text(source)
    found = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if found != text_sha256:
        raise DataError(f"the published text of {name} ({source}) is not the expected one (sha256 {found}, "
                        f"expected {text_sha256}); set AT_MIRROR to a folder holding wmt14/{name}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(target) as f:
        f.write(gzip.compress(text.encode("utf-8")))
    return target


WMT14_TEST_SETS = ("newstest2013", "newstest2014", "newstest2014-filtered")


def load_wmt14_test(name: str = "newstest2014", direction: str = "en-de") -> list[tuple[str, str]]:
    """The raw (source, target) sentence pairs of a WMT14 news test set: "newstest2013" (3,000 pairs, the
    development set of Table 3), "newstest2014" (3,003, sacreBLEU's "wmt14/full") or "newstest2014-filtered"
    (2,737, sacreBLEU's "wmt14"), in `direction` "en-de" or "de-en"."""
    if name not in WMT14_TEST_SETS:
        raise ValueError(f"unknown WMT14 test set {name!r}; the sets are {', '.join(WMT14_TEST_SETS)}")
    if direction not in ("en-de", "de-en"):
        raise ValueError(f"WMT14 English-German: direction 'en-de' or 'de-en', got {direction!r}")
    src, tgt = direction.split("-")
    return read_parallel(wmt14_file(f"{name}.{src}.gz"), wmt14_file(f"{name}.{tgt}.gz"))


def read_corpus(name: str, direction: str = "en-de"):
    """The (source, target) sentence pairs of a WMT14 training corpus, one at a time: "europarl-v7", "commoncrawl"
    or "news-commentary-v9" (downloaded on first use, see `fetch`), or "sample" (the 10,000-pair sample, which is
    Moses-tokenized: it is detokenized here, so that it looks like the raw text of the other corpora)."""
    src, tgt = direction.split("-")
    if name == "sample":
        from sacremoses import MosesDetokenizer

        detok = {lang: MosesDetokenizer(lang) for lang in (src, tgt)}
        for s, t in read_parallel(wmt14_file(f"train-sample-10k.tok.{src}.gz"), wmt14_file(f"train-sample-10k.tok.{tgt}.gz")):
            yield detok[src].detokenize(s.split()), detok[tgt].detokenize(t.split())
        return
    if name not in WMT14_CORPORA:
        raise ValueError(f"unknown WMT14 corpus {name!r}; the corpora are {', '.join(WMT14_CORPORA)} and 'sample'")
    archive, _, sha256, stem = WMT14_CORPORA[name]
    folder, file = archive.rsplit("/", 1)
    path = fetch("wmt14", file, sha256, f"{WMT14_URL}/{folder}", WMT14_TERMS)
    # One reader of the archive per side: a compressed archive cannot jump back and forth between its two files
    # without decompressing from the start again.
    with tarfile.open(path, "r:gz") as src_tar, tarfile.open(path, "r:gz") as tgt_tar:
        sides = [_member_lines(tar, f"{stem}.{lang}", path) for tar, lang in ((src_tar, src), (tgt_tar, tgt))]
        for number, (s, t) in enumerate(itertools.zip_longest(*sides), 1):
            if s is None or t is None:  # one side ended first
                raise DataError(f"{path}: {stem}.{src} and {stem}.{tgt} differ in length after {number - 1} lines; "
                                "the two sides of a parallel corpus must match line by line")
            yield s, t


def _member_lines(tar: tarfile.TarFile, name: str, path: Path):
    "The lines of the file `name` inside an archive, read in one pass (without their line ends)."
    for member in tar:  # the archive is read front to back, so this finds the member without going back
        if member.name.removeprefix("./") == name:
            for line in io.TextIOWrapper(tar.extractfile(member), encoding="utf-8", newline="\n"):
                yield line.rstrip("\r\n")
            return
    raise DataError(f"{path} has no file {name}; delete it and run again to download it anew")
