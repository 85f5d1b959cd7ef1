"""Stored vocabularies and their codecs (`annotated_transformer.lib.vocab`): each kind reads its own output back."""

import pytest

from annotated_transformer.lib.tokenizers import Subwords, Vocab, WordTokenizer
from annotated_transformer.lib.vocab import SubwordCodec, WordCodec, shares_vocabulary, text_codec, vocab_problem
from annotated_transformer.training import BOS, EOS, PAD, SPECIALS, UNK

GERMAN = ["Ein Hund läuft über die Wiese.", "Zwei Hunde spielen im Schnee.", "Ein Mann trägt ein T-Shirt."]


ENGLISH = ["A dog runs across the meadow.", "Two dogs play in the snow.", "A man wears a t-shirt."]


@pytest.fixture(scope="module")
def codecs():
    words = {
        "kind": "words",
        "direction": "de-en",
        "src": Vocab.build(WordTokenizer("de")(GERMAN)).itos,
        "tgt": Vocab.build(WordTokenizer("en")(ENGLISH)).itos,
    }
    pieces = {
        "kind": "sentencepiece",
        "direction": "de-en",
        "model": Subwords.train((GERMAN + ENGLISH) * 20, 320).model,
    }
    return text_codec(words), text_codec(pieces)


def test_the_special_ids_are_those_of_every_vocabulary(codecs):
    words, pieces = codecs
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3) and len(SPECIALS) == 4
    for codec in (words, pieces):
        assert codec.token_texts()[:4] == list(SPECIALS) and codec.token_texts(source=True)[:4] == list(SPECIALS)


def test_text_codec_picks_the_codec_of_the_stored_kind_and_refuses_a_checkpoint_without_one(codecs):
    words, pieces = codecs
    assert type(words) is WordCodec and type(pieces) is SubwordCodec
    with pytest.raises(ValueError, match="has no vocabulary"):
        text_codec({})
    with pytest.raises(ValueError, match="of the kind 'bytes', which this version of the package does not read"):
        text_codec({"kind": "bytes"})


def test_each_codec_reads_its_own_output_back(codecs):
    for codec in codecs:
        for sentences, ids in ((ENGLISH, codec.target_ids(ENGLISH)), (GERMAN, codec.source_ids(GERMAN))):
            assert all(min(x) > UNK for x in ids)
        assert [codec.decode(x) for x in codec.target_ids(ENGLISH)] == ENGLISH


def test_a_shared_subword_model_reads_both_sides_as_its_training_data_was(codecs):
    _, pieces = codecs
    assert pieces.source_ids(["A  dog\truns. "]) == pieces.source_ids(["A dog runs."])
    assert pieces.target_ids(["A  dog."]) == pieces.subwords.encode(["A dog."])
    assert len(pieces.token_texts()) == len(pieces.subwords) and pieces.token_texts() == pieces.token_texts(True)


def test_a_subword_model_per_side_reads_the_source_and_writes_the_target(codecs):
    _, shared = codecs
    vocab = {
        "kind": "sentencepiece",
        "direction": "de-en",
        "src_model": Subwords.train(GERMAN * 20, 300).model,
        "tgt_model": Subwords.train(ENGLISH * 20, 310).model,
    }
    codec = text_codec(vocab)
    assert isinstance(codec, SubwordCodec) and codec.source.model != codec.subwords.model
    assert codec.source_ids(GERMAN) == codec.source.encode(GERMAN) != codec.subwords.encode(GERMAN)
    assert codec.target_ids(ENGLISH) == codec.subwords.encode(ENGLISH) != codec.source.encode(ENGLISH)
    assert [codec.decode(x) for x in codec.target_ids(ENGLISH)] == ENGLISH
    assert (len(codec.token_texts(source=True)), len(codec.token_texts())) == (300, 310)
    assert vocab_problem(vocab, 300, 310) is None
    assert vocab_problem(vocab, 310, 310).startswith("has 300 source and 310 target subwords, but the model has 310")
    assert vocab_problem({**vocab, "tgt_model": None}, 300, 310) == (
        "of subwords holds no SentencePiece model for 'tgt_model'"
    )
    # the model shares the source embedding only where one vocabulary serves both sides
    assert shares_vocabulary(vocab) is False and shares_vocabulary({"kind": "words"}) is False
    assert shares_vocabulary({"kind": "sentencepiece", "model": shared.subwords.model}) is None
    assert shares_vocabulary({"symbols": [3, 4]}) is shares_vocabulary(None) is None


def test_the_copy_tasks_vocabulary_reads_and_writes_numbers():
    from annotated_transformer.lib.vocab import SymbolCodec, text_codec

    codec = text_codec({"pad": 0, "bos": 1, "eos": 2, "symbols": list(range(3, 13))})  # as copy checkpoints store it
    assert isinstance(codec, SymbolCodec) and isinstance(
        text_codec({"kind": "symbols", "symbols": [3, 4]}), SymbolCodec
    )
    assert codec.source_ids(["5 7  7 3", ""]) == [[5, 7, 7, 3], []] and codec.decode([5, 7, 7, 3]) == "5 7 7 3"
    assert codec.token_texts() == ["<pad>", "<s>", "</s>", *map(str, range(3, 13))]
    for bad in ("5 13", "5 -3", "5.0", "five"):
        with pytest.raises(ValueError, match="input 1, .*whole numbers from 3 to 12"):
            codec.source_ids([bad])
    with pytest.raises(ValueError, match="this checkpoint has no vocabulary"):
        text_codec({})
    assert text_codec({"pad": 0, "bos": 1, "eos": 2, "symbols": [5, 6]}).token_texts() == [
        "<pad>",
        "<s>",
        "</s>",
        "<?>",
        "<?>",
        "5",
        "6",
    ]  # ids of neither kind: no text of their own
    with pytest.raises(ValueError, match="at least one symbol"):
        SymbolCodec({"symbols": []})
