"""How text becomes tokens: words and punctuation with spaCy, and a word vocabulary per language; subwords with
SentencePiece (byte-pair encoding, §5.1), one vocabulary for both languages or one per language, learned from a data
set's training split."""

import contextlib
import functools
import io
import os
import sys
from collections import Counter

from ..training import BOS, EOS, PAD, SPECIALS, UNK
from .datasets import load_multi30k, load_pairs, parallel_directions
from .progress import with_progress


class WordTokenizer:
    """Words and punctuation of one language, with spaCy's rule-based tokenizer (`spacy.blank(lang)`: no
    model to download), and the way back to text with the Moses detokenizer (sacremoses).

    `tokenizer(texts)` returns one list of tokens per text; `tokenizer.detokenize(tokens)` returns a string.
    A hyphen that spaCy splits out of a word ("t-shirt" -> t - shirt) becomes Moses's `@-@`, so that the
    detokenizer can join it again; a free-standing dash stays "-".
    """

    def __init__(self, lang: str):
        import spacy
        from sacremoses import MosesDetokenizer

        self.lang = lang
        self._nlp = spacy.blank(lang)
        self._detokenizer = MosesDetokenizer(lang=lang)

    def __call__(self, texts) -> list[list[str]]:
        return [[self._token(doc, t) for t in doc if not t.is_space]
                for doc in self._nlp.tokenizer.pipe(texts, batch_size=1000)]

    @staticmethod
    def _token(doc, t) -> str:
        inside_word = t.text == "-" and 0 < t.i < len(doc) - 1 and not doc[t.i - 1].whitespace_ and not t.whitespace_
        return "@-@" if inside_word else t.text

    def detokenize(self, tokens: list[str]) -> str:
        return self._detokenizer.detokenize(tokens)


class Vocab:
    """A word vocabulary: the special symbols (ids 0-3: padding, start, end, unknown), then the words.

    `Vocab.build(sentences, min_freq)` keeps every word seen at least `min_freq` times, most frequent first
    (ties alphabetically, so the same data always gives the same ids). `encode` maps unknown words to `<unk>`, and
    so the words that spell a special symbol: `<s>` in a sentence is text, never the start symbol.
    """

    def __init__(self, itos: list[str]):
        if tuple(itos[:len(SPECIALS)]) != SPECIALS or len(set(itos)) != len(itos):
            raise ValueError(f"a vocabulary starts with {SPECIALS} and lists each word once")
        self.itos = list(itos)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences, min_freq: int = 1) -> "Vocab":
        counts = Counter(w for tokens in sentences for w in tokens)
        words = sorted((w for w, n in counts.items() if n >= min_freq and w not in SPECIALS), key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + words)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str]) -> list[int]:
        return [UNK if w in SPECIALS else self.stoi.get(w, UNK) for w in tokens]

    def decode(self, ids: list[int]) -> list[str]:
        return [self.itos[i] for i in ids]


@functools.lru_cache(maxsize=4)
def tokenized_multi30k(split: str, direction: str = "de-en") -> tuple[list[list[str]], list[list[str]]]:
    "The source and target words of a Multi30k split, computed once per process (the files are fixed by checksum)."
    src_lang, tgt_lang = direction.split("-")
    src, tgt = zip(*load_multi30k(split, direction))  # a progress bar for each side, on a terminal
    return (WordTokenizer(src_lang)(with_progress(src, f"tokenizing Multi30k {split}.{src_lang}", "sentence")),
            WordTokenizer(tgt_lang)(with_progress(tgt, f"tokenizing Multi30k {split}.{tgt_lang}", "sentence")))


class Subwords:
    """A SentencePiece model (one for both languages, or one per language) with the package's special ids: <pad> 0, <s> 1, </s> 2,
    <unk> 3. `encode` turns sentences into lists of ids (no specials), `decode` ids back into text; made from the
    model's bytes, which are what checkpoints store."""

    def __init__(self, model: bytes):
        import sentencepiece as spm

        self.model = bytes(model)
        self.processor = spm.SentencePieceProcessor(model_proto=self.model)
        if [self.processor.pad_id(), self.processor.bos_id(), self.processor.eos_id(), self.processor.unk_id()] != [PAD, BOS, EOS, UNK]:
            raise ValueError("this SentencePiece model's special ids are not <pad> 0, <s> 1, </s> 2, <unk> 3")

    @classmethod
    def train(cls, sentences, vocab_size: int) -> "Subwords":
        """Learn a byte-pair-encoding model of `vocab_size` pieces from `sentences` (§5.1: "a shared source-target
        vocabulary"). The rarest characters (0.05% of the text) get no piece of their own: byte fallback spells them.
        The result depends only on the sentences."""
        import sentencepiece as spm

        model = io.BytesIO()
        with _quiet_stderr():  # SentencePiece logs thousands of lines from C++
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=model, model_type="bpe", vocab_size=vocab_size,
                character_coverage=0.9995, byte_fallback=True, normalization_rule_name="identity",
                remove_extra_whitespaces=False, pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK, pad_piece="<pad>",
                bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>", input_sentence_size=0, shuffle_input_sentence=False,
                num_threads=1, max_sentence_length=1 << 16, minloglevel=2)
        return cls(model.getvalue())

    def __len__(self) -> int:
        "The vocabulary size, special ids included."
        return self.processor.get_piece_size()

    def encode(self, sentences: list[str]) -> list[list[int]]:
        "The ids of each sentence's pieces."
        return self.processor.encode(list(sentences))

    def pieces(self, sentence: str) -> list[str]:
        "The pieces of one sentence, as text (▁ marks a space before the piece)."
        return self.processor.encode(sentence, out_type=str)

    def decode(self, ids: list[int]) -> str:
        "The text of a list of piece ids: exactly the sentence they were encoded from."
        return self.processor.decode(list(ids))


@contextlib.contextmanager
def _quiet_stderr():
    "Silence what C++ code writes to the process's standard error (file descriptor 2) for a while."
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@functools.lru_cache(maxsize=4)
def dataset_subwords(dataset: str, size: int, language: str | None = None) -> Subwords:
    """One vocabulary of `size` subwords for both languages of `dataset` (a name in `PARALLEL_DATA`), learned from its
    training split: the sentences of its default direction's source language, then those of its target language,
    whitespace normalised. The same for both directions (`Recipe.subwords`). With a `language`, the vocabulary of
    that language alone, from its sentences only (`Recipe.shared_subwords`)."""
    languages = parallel_directions(dataset)[0].split("-")
    if language is not None and language not in languages:
        raise ValueError(f"{dataset} has no language {language!r}; it has {' and '.join(languages)}")
    train = load_pairs(dataset, "train")
    sides = [languages.index(language)] if language else [0, 1]
    return Subwords.train([" ".join(pair[side].split()) for side in sides for pair in train], size)


def multi30k_subwords(size: int) -> Subwords:
    "One vocabulary of `size` subwords for German and English, from Multi30k's training split (`dataset_subwords`)."
    return dataset_subwords("multi30k", size)
