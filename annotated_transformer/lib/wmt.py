"""The paper's own setting, WMT 2014 English→German: the training corpora cleaned, one shared SentencePiece
vocabulary learned, the pairs kept on disk as memory-mapped token arrays (`prepare_wmt14`, `TokenData`); the
"wmt14" task that reads them; and newstest2014 scored three ways, each with what it is comparable to."""

import array
import gzip
import hashlib
import itertools
import random
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ..decoding import ALPHA, BEAM_SIZE, EXTRA_LEN
from ..training import BOS, EOS
from .artifacts import read_artifact, write_artifact
from .downloads import DataError, data_dir
from .datasets import iter_lines
from .evaluate import corpus_scores, decoding_variant, greedy_validation_bleu
from .files import atomic_file
from .progress import with_progress
from .recipes import Recipe, Task
from .tokenizers import Subwords
from .translate import Translator
from .vocab import subwords_vocab
from .wmt14_files import WMT14_CORPORA, load_wmt14_test, newstest2014_filtered_lines, read_corpus


def clean_pairs(pairs, counts: Counter):
    """The sentence pairs worth training on, one at a time; `counts` counts what was read, kept and dropped, by
    reason. Whitespace is normalised; a pair is dropped when a side is empty, when both sides are the same text
    (left untranslated), or when it repeats an earlier pair. Length limits come later, on subwords (`length_filter`)."""
    seen = set()
    for s, t in pairs:
        counts["read"] += 1
        s, t = " ".join(s.split()), " ".join(t.split())
        if not s or not t:
            reason = "empty"
        elif s == t:
            reason = "untranslated"
        elif (key := hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=16).digest()) in seen:
            reason = "duplicate"
        else:
            seen.add(key)
            counts["kept"] += 1
            yield s, t
            continue
        counts[reason] += 1


def length_filter(pairs, counts: Counter, max_len: int = 250, max_ratio: float = 1.5):
    """Pairs of token-id lists within Moses' `clean-corpus-n` limits, as fairseq's WMT14 recipe applies them to
    subwords: at most `max_len` tokens a side, and neither side more than `max_ratio` times as long as the other.
    `counts` counts the pairs dropped as "too long" and for "length ratio" (and takes them off "kept")."""
    for s, t in pairs:
        if len(s) > max_len or len(t) > max_len:
            reason = "too long"
        elif max(len(s), len(t)) > max_ratio * min(len(s), len(t)):
            reason = "length ratio"
        else:
            yield s, t
            continue
        counts[reason] += 1
        counts["kept"] -= 1


class TokenData:
    """Sentence pairs of token ids kept on disk and memory-mapped: `<split>.src.bin` and `<split>.tgt.bin` hold all
    the ids of a side back to back (uint16, or int32 for vocabularies over 65,536), `<split>.offsets.npy` where each
    pair starts on each side. Millions of pairs cost no memory until read, and every process of a run shares the
    operating system's copy. Indexing gives what training needs: (ids + </s>, <s> + ids + </s>)."""

    def __init__(self, folder, split: str):
        folder = Path(folder)
        try:
            offsets = np.load(folder / f"{split}.offsets.npy")
            dtype = read_artifact(folder / "prepared.json", "prepared")["dtype"]
            self.src = np.memmap(folder / f"{split}.src.bin", dtype=dtype, mode="r") if offsets[-1, 0] else np.zeros(0)
            self.tgt = np.memmap(folder / f"{split}.tgt.bin", dtype=dtype, mode="r") if offsets[-1, 1] else np.zeros(0)
        except (OSError, ValueError, KeyError) as err:
            raise DataError(f"{folder} holds no complete prepared split {split!r} ({err}); run "
                            f"`annotated-transformer prepare wmt14-en-de --out {folder}`") from None
        if (len(self.src), len(self.tgt)) != tuple(offsets[-1]):
            raise DataError(f"{folder}/{split}: the token files do not match their offsets; prepare the data again")
        self.offsets = offsets  # (pairs + 1, 2): start of each pair's source and target ids

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        (s0, t0), (s1, t1) = self.offsets[i], self.offsets[i + 1]
        return self.src[s0:s1].tolist() + [EOS], [BOS] + self.tgt[t0:t1].tolist() + [EOS]

    def lengths(self) -> tuple[list[int], list[int]]:
        "Source lengths with </s>, and the target positions the model predicts (ids + </s>), of every pair."
        n = np.diff(self.offsets, axis=0) + 1
        return n[:, 0].tolist(), n[:, 1].tolist()

    @staticmethod
    def write(folder, split: str, pairs, dtype: str) -> int:
        """Write pairs of id lists as `split` into `folder`, each file atomically; returns the number of pairs."""
        folder = Path(folder)
        ends = array.array("q", [0, 0])  # running totals: where each pair ends on each side
        with atomic_file(folder / f"{split}.src.bin") as src, atomic_file(folder / f"{split}.tgt.bin") as tgt:
            for s, t in pairs:
                np.asarray(s, dtype=dtype).tofile(src)
                np.asarray(t, dtype=dtype).tofile(tgt)
                ends.extend((ends[-2] + len(s), ends[-1] + len(t)))
        with atomic_file(folder / f"{split}.offsets.npy") as f:  # last: offsets that match the token files
            np.save(f, np.frombuffer(ends, dtype=np.int64).reshape(-1, 2))
        return len(ends) // 2 - 1


def prepared_folder(data: str | None) -> Path:
    """The folder of prepared data that a recipe's `data` names: a path (absolute, or with a "/" or a leading ".",
    like `./wmt`), or else a name inside `data_dir()`; None is "wmt14-en-de" there."""
    if data is None:
        return data_dir() / "wmt14-en-de"
    return Path(data) if Path(data).is_absolute() or "/" in data or data.startswith(".") else data_dir() / data


def prepare_wmt14(out=None, corpora=tuple(WMT14_CORPORA), direction: str = "en-de", vocab_size: int = 37_000,
                  subword_sentences: int = 2_000_000, max_len: int = 250, max_ratio: float = 1.5, seed: int = 0,
                  progress: bool = True) -> dict:
    """Prepare WMT14 English-German for training into `out` (default `data_dir()/wmt14-en-de`); returns the manifest.

    1. Read the `corpora` (downloaded and verified on first use; "sample" is the 10,000-pair sample), clean them
       with `clean_pairs`, and keep them as compressed text, counting what was dropped and why.
    2. Learn one SentencePiece BPE model of `vocab_size` pieces for both languages from a random sample of
       `subword_sentences` of the kept sentences (all of them when there are fewer), and keep it as `subwords.model`.
    3. Encode the kept pairs into `TokenData` ("train"), keeping those within `length_filter`'s limits (`max_len`
       subwords a side, length ratio `max_ratio`), and newstest2013 ("valid", every pair of at most `max_len`).

    The manifest, `prepared.json`, is written last: a folder without it is incomplete and is never read. Running
    again redoes steps 1-3 (the downloads are kept, and resumed when cut short).
    """
    out = Path(out) if out is not None else prepared_folder(None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepared.json").unlink(missing_ok=True)
    src_lang, tgt_lang = direction.split("-")
    counts, rng, sample, seen = Counter(), random.Random(seed), [], 0
    clean = [out / f"train.clean.{lang}.gz" for lang in (src_lang, tgt_lang)]
    started = time.perf_counter()
    with atomic_file(clean[0]) as src_file, atomic_file(clean[1]) as tgt_file, \
            gzip.open(src_file, "wt", encoding="utf-8") as fs, gzip.open(tgt_file, "wt", encoding="utf-8") as ft:
        pairs = (pair for name in corpora for pair in read_corpus(name, direction))
        for s, t in with_progress(clean_pairs(pairs, counts), "cleaning", " pairs", shown=progress):
            fs.write(s + "\n")
            ft.write(t + "\n")
            for sentence in (s, t):  # reservoir sampling: every kept sentence equally likely to be chosen
                seen += 1
                if len(sample) < subword_sentences:
                    sample.append(sentence)
                elif (j := rng.randrange(seen)) < subword_sentences:
                    sample[j] = sentence
    subwords = Subwords.train(sample, vocab_size)
    del sample
    with atomic_file(out / "subwords.model") as f:
        f.write(subwords.model)
    dtype = "uint16" if len(subwords) <= 1 << 16 else "int32"

    def encoded(pairs):
        pairs = iter(pairs)
        while chunk := list(itertools.islice(pairs, 10_000)):  # SentencePiece is faster on many sentences per call
            yield from zip(subwords.encode([s for s, _ in chunk]), subwords.encode([t for _, t in chunk]))

    train = length_filter(encoded(zip(iter_lines(clean[0]), iter_lines(clean[1]))), counts, max_len,
                          max_ratio)
    valid_counts = Counter()
    valid = length_filter(encoded(load_wmt14_test("newstest2013", direction)), valid_counts, max_len, float("inf"))
    splits = {"train": TokenData.write(out, "train", train, dtype), "valid": TokenData.write(out, "valid", valid, dtype)}
    manifest = {"dataset": "wmt14", "direction": direction, "corpora": list(corpora), "vocab_size": len(subwords),
                "dtype": dtype, "max_len": max_len, "max_ratio": max_ratio, "cleaning": dict(counts),
                "valid_too_long": valid_counts["too long"], "pairs": splits,
                "seconds": round(time.perf_counter() - started, 1)}
    write_artifact(out / "prepared.json", "prepared", manifest)
    return manifest


def read_manifest(folder: Path) -> dict:
    "The manifest of a prepared folder; a clear error when the folder was not (completely) prepared."
    try:
        return read_artifact(Path(folder) / "prepared.json", "prepared")
    except ValueError as err:  # damaged, or another kind or a newer version (FormatError): the file says which
        raise DataError(str(err)) from None
    except OSError:
        raise DataError(f"{folder} holds no prepared WMT14 data; run `annotated-transformer prepare wmt14-en-de "
                        f"--out {folder}` (add --corpus sample for the 10,000-pair sample)") from None


def wmt14_data(recipe: Recipe) -> Task:
    """The "wmt14" task: the prepared folder `recipe.data` (see `prepare_wmt14`) as memory-mapped `TokenData`, one
    shared vocabulary (so the embeddings and the output projection share one matrix, §3.4). The SentencePiece
    model goes into every checkpoint. The final evaluation is greedy BLEU on newstest2013."""
    if not recipe.shared_subwords:
        raise ValueError("the wmt14 task reads one SentencePiece vocabulary for both languages, the one `prepare` "
                         "learned: shared_subwords=False is not available for it")
    folder = prepared_folder(recipe.data)
    manifest = read_manifest(folder)
    direction = recipe.direction or "en-de"
    if manifest["direction"] != direction:
        raise DataError(f"{folder} was prepared for {manifest['direction']}, the recipe asks for {direction}")
    subwords = Subwords((folder / "subwords.model").read_bytes())
    vocab, size = subwords_vocab("wmt14", direction, subwords), len(subwords)
    return Task(train=TokenData(folder, "train"), valid=TokenData(folder, "valid"), src_vocab=size, tgt_vocab=size,
                vocab=vocab, evaluate=greedy_validation_bleu(vocab, load_wmt14_test("newstest2013", direction)))


def tokenized_bleu(hypotheses: list[str], references: list[str], lang: str = "de") -> float:
    """BLEU as the paper's generation of systems reported it: both sides Moses-tokenized, hyphenated compounds
    split ("Wahl-Kampf" becomes "Wahl ##AT##-##AT## Kampf", as in tensor2tensor's get_ende_bleu.sh), cased, scored
    on those tokens. Higher than sacreBLEU, and comparable only with numbers computed the same way."""
    import sacrebleu
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang)

    def split(text):
        return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokenizer.tokenize(text, return_str=True, escape=False))

    bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    return round(bleu.corpus_score([split(h) for h in hypotheses], [[split(r) for r in references]]).score, 2)


def evaluate_wmt14(translator: Translator, beam_size: int = BEAM_SIZE, alpha: float = ALPHA, extra_len: int = EXTRA_LEN,
                   limit: int | None = None) -> dict:
    """Translate newstest2014 (§6.1: beam 4, alpha 0.6, up to input length + 50) and score it three ways, each with
    what it is comparable to: sacreBLEU on the full set ("wmt14/full", 3,003 lines) and on the filtered set
    ("wmt14", 2,737 lines; the same translations, chosen lines), and the paper's tokenized BLEU with compounds split,
    on the filtered set. `limit` translates only the first lines of the full set (a quick look; not comparable)."""
    pairs = load_wmt14_test("newstest2014", translator.direction)[:limit]
    hypotheses = translator.translate([s for s, _ in pairs], beam_size, alpha, extra_len)
    references = [t for _, t in pairs]
    chosen = [i for i in newstest2014_filtered_lines() if i < len(pairs)]
    full = corpus_scores(hypotheses, references)
    filtered = corpus_scores([hypotheses[i] for i in chosen], [references[i] for i in chosen])
    return {"dataset": "wmt14", "split": "newstest2014", "direction": translator.direction, "beam_size": beam_size,
            "alpha": alpha, "extra_len": extra_len, "lines": len(pairs), "limit": limit,
            "bleu_full": full["bleu"], "bleu_filtered": filtered["bleu"], "bleu_signature": full["bleu_signature"],
            "chrf_full": full["chrf"], "tokenized_bleu_filtered": tokenized_bleu(
                [hypotheses[i] for i in chosen], [references[i] for i in chosen], translator.tgt_lang),
            "hypotheses": hypotheses, "variant": decoding_variant(beam_size, alpha, extra_len)}
