"""Scoring translations (`annotated_transformer.lib.evaluate`): sacreBLEU's defaults and signatures, the tokenizer
of each target language, decoding variants, and loops found."""

import pytest

from annotated_transformer.decoding import ALPHA, BEAM_SIZE, EXTRA_LEN
from annotated_transformer.lib.evaluate import bleu_tokenizer, corpus_scores, decoding_variant, repeats_a_word


def test_repeats_a_word_finds_a_decoder_loop_and_nothing_else():
    assert repeats_a_word("-> Die die die die die die")
    assert repeats_a_word("greedy: 'A <unk> <unk> <unk> <unk> in front of a field.'")
    assert repeats_a_word("green green GREEN green shirt")
    assert not repeats_a_word("Two dogs run, run and run; the <unk> <unk> <unk> stay three.")
    assert not repeats_a_word("0 0 0 0 0 | 1 1 1 1")  # numbers in tensors and tables are no words
    assert not repeats_a_word("a man, a man, a man, a man")  # a repeated phrase is not one word in a row


def test_corpus_scores_use_sacrebleu_defaults_and_label_the_tokenized_score():
    refs = ["A man is riding a bike.", "Two dogs play in the snow."]
    perfect = corpus_scores(refs, refs, lang="en")
    assert perfect["bleu"] == 100.0 and perfect["chrf"] == 100.0
    assert "case:mixed" in perfect["bleu_signature"] and "tok:13a" in perfect["bleu_signature"]
    lowered = corpus_scores([r.lower() for r in refs], refs, lang="en")
    assert lowered["bleu"] < 100.0 and lowered["tokenized_lowercase_bleu"] == 100.0
    with pytest.raises(ValueError, match="1 hypotheses for 2 references"):
        corpus_scores(refs[:1], refs)


def test_bleu_into_chinese_counts_characters():
    assert bleu_tokenizer("en-zh") == bleu_tokenizer("en-zh_tw") == "zh"
    assert bleu_tokenizer("zh-en") == bleu_tokenizer("en-de") == "13a"
    refs = ["我累死了。", "他跑了。"]
    perfect = corpus_scores(refs, refs, tokenize="zh")
    assert perfect["bleu"] == 100.0 and "tok:zh" in perfect["bleu_signature"]
    # 13a finds no space in a Chinese sentence: each is one word, with no word pairs to count, and even a perfect
    # translation scores 0; zh counts characters, and one wrong character costs some of the score
    assert corpus_scores(refs, refs)["bleu"] == 0.0
    assert 0.0 < corpus_scores(["我累坏了。", "他跑了。"], refs, tokenize="zh")["bleu"] < 100.0


def test_decoding_variant_is_empty_for_the_papers_decoding_and_names_other_settings():
    assert (BEAM_SIZE, ALPHA, EXTRA_LEN) == (4, 0.6, 50) and decoding_variant(4, 0.6, 50) == ""
    assert decoding_variant(1, 0.6, 50) == "-beam1-alpha0.6-extra50"
    others = [(1, 0.6, 50), (4, 0.0, 50), (4, 0.6, 10), (8, 1.0, 50), (4, 0.6, 0)]
    assert len({decoding_variant(*settings) for settings in others} - {""}) == len(others)  # each its own name
