"""Scoring translations the way that makes scores comparable: sacreBLEU's BLEU (cased, detokenized, with its
signature) and chrF, the tokenizer each target language needs, a split of a data set translated and scored, and the
check that a translation does not loop."""

import re

from ..decoding import ALPHA, BEAM_SIZE, EXTRA_LEN
from .datasets import PARALLEL_DATA, load_pairs
from .tokenizers import WordTokenizer
from .translate import Translator


def greedy_validation_bleu(vocab: dict, valid: list[tuple[str, str]]):
    "A task's final check: the BLEU of greedy translations (`Translator`, beam size 1) of the pairs `valid`."
    def evaluate(model, device) -> dict:
        hypotheses = Translator(model, vocab, device=device).translate([s for s, _ in valid], beam_size=1)
        scores = corpus_scores(hypotheses, [t for _, t in valid], tokenize=bleu_tokenizer(vocab["direction"]))
        return {"valid_greedy_bleu": scores["bleu"], "bleu_signature": scores["bleu_signature"]}
    return evaluate


def bleu_tokenizer(direction: str) -> str:
    "sacreBLEU's tokenizer for translations into the target language of `direction`: \"zh\" for Chinese, else \"13a\"."
    return "zh" if direction.split("-")[-1].split("_")[0] == "zh" else "13a"  # zh, zh_tw ...


def corpus_scores(hypotheses: list[str], references: list[str], lang: str | None = None,
                  tokenize: str = "13a") -> dict:
    """sacreBLEU's BLEU and chrF of detokenized `hypotheses` against raw `references` (one reference each),
    with their signatures. Cased BLEU with the 13a tokenizer, sacreBLEU's default: the comparable number (for
    Chinese, `tokenize="zh"`, from `bleu_tokenizer`).

    With `lang`, also the BLEU that older tutorials report: both sides tokenized with this package's spaCy
    tokenizer for `lang` and lowercased. It is higher and not comparable across tokenizers.
    """
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = sacrebleu.metrics.BLEU(tokenize=tokenize), sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    scores = {"bleu": round(b.score, 2), "bleu_signature": str(bleu.get_signature()), "bleu_detail": str(b),
              "chrf": round(c.score, 2), "chrf_signature": str(chrf.get_signature())}
    if lang is not None:
        tokenize = WordTokenizer(lang)
        tok_bleu = sacrebleu.metrics.BLEU(tokenize="none", lowercase=True, force=True)  # tokenized on purpose
        scores["tokenized_lowercase_bleu"] = round(tok_bleu.corpus_score(
            [" ".join(t) for t in tokenize(hypotheses)], [[" ".join(t) for t in tokenize(references)]]).score, 2)
    return scores


def decoding_variant(beam_size: int, alpha: float, extra_len: int) -> str:
    "\"\" for §6.1's decoding, else the settings, for the name of a results file (`record_result`)."
    if (beam_size, alpha, extra_len) == (BEAM_SIZE, ALPHA, EXTRA_LEN):
        return ""
    return f"-beam{beam_size}-alpha{alpha}-extra{extra_len}"


def evaluate_translator(translator: Translator, split: str = "test", beam_size: int = BEAM_SIZE, alpha: float = ALPHA,
                        extra_len: int = EXTRA_LEN) -> dict:
    "Translate a split of the translator's data set and score it (`corpus_scores`); the hypotheses are under \"hypotheses\"."
    if translator.dataset not in PARALLEL_DATA:
        raise ValueError(f"a translator of the data set {translator.dataset!r} has no split to be scored on")
    pairs = load_pairs(translator.dataset, split, translator.direction)
    hypotheses = translator.translate([s for s, _ in pairs], beam_size, alpha, extra_len)
    tokenize = bleu_tokenizer(translator.direction)  # spaCy's words (lang) are no way to read Chinese
    scores = corpus_scores(hypotheses, [t for _, t in pairs], translator.tgt_lang if tokenize == "13a" else None, tokenize)
    return {"dataset": translator.dataset, "split": split, "direction": translator.direction, "beam_size": beam_size,
            "alpha": alpha, "extra_len": extra_len, **scores, "hypotheses": hypotheses,
            "variant": decoding_variant(beam_size, alpha, extra_len)}


_REPEATED_WORD = re.compile(r"(?<![\w<])(<?[^\W\d_][\w'-]*>?)(?:\s+\1(?![\w>])){3,}", flags=re.IGNORECASE)


def repeats_a_word(text: str) -> bool:
    "Whether `text` has a word, or a symbol such as `<unk>`, four or more times in a row: a decoder's loop."
    return _REPEATED_WORD.search(text) is not None
