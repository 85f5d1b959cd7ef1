"""Tokenizers (`annotated_transformer.lib.tokenizers`): words with spaCy, subwords with SentencePiece."""

import pytest

from annotated_transformer.lib.tokenizers import Subwords, Vocab, WordTokenizer
from annotated_transformer.training import UNK

GERMAN = ["Ein Hund läuft über die Wiese.", "Zwei Hunde spielen im Schnee.", "Ein Mann trägt ein T-Shirt."]


ENGLISH = ["A dog runs across the meadow.", "Two dogs play in the snow.", "A man wears a t-shirt."]


@pytest.fixture(scope="module")
def subwords():
    return Subwords.train((GERMAN + ENGLISH) * 20, 320)


def test_an_unseen_word_is_unknown_to_words_and_spelled_by_subwords(subwords):
    tokenize = WordTokenizer("en")
    vocab = Vocab.build(tokenize(ENGLISH))
    new = "A cat wears a t-shirt."
    assert UNK in vocab.encode(tokenize([new])[0]) and "<unk>" in vocab.decode(vocab.encode(tokenize([new])[0]))
    assert UNK not in subwords.encode([new])[0] and subwords.decode(subwords.encode([new])[0]) == new
