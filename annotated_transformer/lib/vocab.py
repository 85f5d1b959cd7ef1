"""What a model's token ids mean: the vocabulary a checkpoint or a shared model stores with the weights, made here,
checked here (`vocab_problem`), and read here into a codec that turns text into ids and ids into text."""

# A stored vocabulary is a dict of one of three kinds. "words": a word list per side ("src", "tgt"), read with spaCy.
# "sentencepiece": the bytes of one SentencePiece model for both sides ("model"), or one per side ("src_model",
# "tgt_model"). "symbols": ids written as numbers ("symbols", the ids a sequence may hold; "pad", "bos", "eos"), such
# as the copy task's. Every kind also names its "dataset" and "direction" (source-target) where it has them.

from ..training import BOS, EOS, PAD, SPECIALS
from .recipes import DIRECTION
from .tokenizers import Subwords, Vocab, WordTokenizer


def words_vocab(dataset: str, direction: str, src: Vocab, tgt: Vocab) -> dict:
    "The stored vocabulary of a model of words: a `Vocab` per side."
    return {"kind": "words", "dataset": dataset, "direction": direction, "src": src.itos, "tgt": tgt.itos}


def subwords_vocab(dataset: str, direction: str, source: Subwords, target: Subwords | None = None) -> dict:
    "The stored vocabulary of a model of subwords: one SentencePiece model for both sides, or (with `target`) one each."
    models = {"model": source.model} if target is None else {"src_model": source.model, "tgt_model": target.model}
    return {"kind": "sentencepiece", "dataset": dataset, "direction": direction, **models}


def symbols_vocab(symbols) -> dict:
    "The stored vocabulary of a model of symbols (ids written as numbers), with the special ids it uses."
    return {"kind": "symbols", "pad": PAD, "bos": BOS, "eos": EOS, "symbols": list(symbols)}


class WordCodec:
    "Text and token ids of a word-vocabulary model: spaCy's tokens and one `Vocab` per language (kind \"words\")."

    def __init__(self, vocab: dict):
        src_lang, tgt_lang = vocab["direction"].split("-")
        self.src_vocab, self.tgt_vocab = Vocab(vocab["src"]), Vocab(vocab["tgt"])
        self.src_tokenizer, self.tgt_tokenizer = WordTokenizer(src_lang), WordTokenizer(tgt_lang)

    def source_ids(self, sentences: list[str]) -> list[list[int]]:
        "The source vocabulary's ids of each sentence's words."
        return [self.src_vocab.encode(tokens) for tokens in self.src_tokenizer(sentences)]

    def target_ids(self, sentences: list[str]) -> list[list[int]]:
        "The target vocabulary's ids of each sentence's words (for reading a given translation, e.g. a reference)."
        return [self.tgt_vocab.encode(tokens) for tokens in self.tgt_tokenizer(sentences)]

    def decode(self, ids: list[int]) -> str:
        "The text of target token ids: words, detokenized."
        return self.tgt_tokenizer.detokenize(self.tgt_vocab.decode(ids))

    def token_texts(self, source: bool = False) -> list[str]:
        "The text of each target id on its own (`source=True`: each source id's)."
        return self.src_vocab.itos if source else self.tgt_vocab.itos


class SubwordCodec:
    """Text and token ids of SentencePiece (kind "sentencepiece"): one model, one vocabulary for both sides
    ("model"), or a model per side ("src_model" and "tgt_model"). `subwords` is the target side's."""

    def __init__(self, vocab: dict):
        shared = "model" in vocab
        self.subwords = Subwords(vocab["model" if shared else "tgt_model"])
        self.source = self.subwords if shared else Subwords(vocab["src_model"])

    def source_ids(self, sentences: list[str]) -> list[list[int]]:
        """The subword ids of each sentence, its whitespace normalised as in the training data. SentencePiece never
        reads a control symbol from text: `<s>` typed in a sentence is spelled in pieces, like any other text."""
        return self.source.encode([" ".join(s.split()) for s in sentences])

    def target_ids(self, sentences: list[str]) -> list[list[int]]:
        "The target side's subword ids of each sentence, whitespace normalised as on the source side."
        return self.subwords.encode([" ".join(s.split()) for s in sentences])

    def decode(self, ids: list[int]) -> str:
        "The text of target subword ids."
        return self.subwords.decode(ids)

    def token_texts(self, source: bool = False) -> list[str]:
        """The text of each target subword id on its own (`source=True`: each source id's): the piece as SentencePiece
        writes it (▁ marks a space before it), the special symbols by name, and a byte piece its byte where that byte
        is a character alone (so that a translator finds the pieces that break a line)."""
        p = (self.source if source else self.subwords).processor
        return [*SPECIALS, *(p.decode([i]) if p.is_byte(i) else p.id_to_piece(i) for i in range(len(SPECIALS), len(p)))]


class SymbolCodec:
    """Token ids written as whole numbers, for a model of symbols rather than text, such as the copy task's (kind
    "symbols", or a vocabulary of `symbols` alone): "5 7 7 3" is the sequence 5, 7, 7, 3, and so is its output."""

    def __init__(self, vocab: dict):
        self.symbols = sorted(vocab["symbols"])
        if not self.symbols:
            raise ValueError("a vocabulary of symbols lists at least one symbol")
        # the other ids by name: the special ids the vocabulary stores (the copy task's are PAD, BOS and EOS)
        self.names = {vocab.get(key, i): SPECIALS[i] for i, key in enumerate(("pad", "bos", "eos"))}

    def source_ids(self, sentences: list[str]) -> list[list[int]]:
        "The ids that each sentence spells, as numbers separated by spaces; a ValueError names a line that is not."
        known, ids = set(self.symbols), []
        for number, sentence in enumerate(sentences, 1):
            words = sentence.split()
            if not all(w.isdecimal() and int(w) in known for w in words):
                raise ValueError(f"input {number}, {sentence[:40]!r}: this model reads its symbols, whole numbers "
                                 f"from {self.symbols[0]} to {self.symbols[-1]} separated by spaces")
            ids.append([int(w) for w in words])
        return ids

    def target_ids(self, sentences: list[str]) -> list[list[int]]:
        "As `source_ids`: both sides write the same symbols."
        return self.source_ids(sentences)

    def decode(self, ids: list[int]) -> str:
        "The numbers of target ids, separated by spaces."
        return " ".join(map(str, ids))

    def token_texts(self, source: bool = False) -> list[str]:
        "The text of each id up to the largest symbol: a symbol its number, a special id its name, any other `<?>`."
        known = set(self.symbols)
        return [str(i) if i in known else self.names.get(i, "<?>") for i in range(self.symbols[-1] + 1)]


def vocab_problem(vocab, src_vocab: int, tgt_vocab: int) -> str | None:
    """What is wrong with `vocab`, a checkpoint's stored vocabulary, for a model of `src_vocab` and `tgt_vocab` ids;
    None when nothing is. Checked when a checkpoint is read, so that a bad one is refused naming its file, not met
    as a `KeyError` or an index out of range in the middle of a translation."""
    if not isinstance(vocab, dict):
        return f"is a {type(vocab).__name__}, not a mapping"
    direction = vocab.get("direction", "-")
    if not (isinstance(direction, str) and (direction == "-" or DIRECTION.fullmatch(direction))):
        return f"has the direction {direction!r}, not two language names joined by '-' (such as de-en)"
    if not isinstance(vocab.get("dataset"), (str, type(None))):
        return f"names the data set {vocab['dataset']!r}, not a name"
    kind = vocab.get("kind", "symbols" if "symbols" in vocab else None)
    if kind == "words":
        for side, size in (("src", src_vocab), ("tgt", tgt_vocab)):
            words = vocab.get(side)
            if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
                return f"of words has no list of words for {side!r}"
            if len(words) != size:
                return f"has {len(words)} words for {side!r}, but the model has {size} ids"
            try:
                Vocab(words)
            except ValueError as err:  # its specials, or a word twice
                return f"of words for {side!r} is not one: {err}"
    elif kind == "sentencepiece":  # one model for both sides, or one per side
        keys = ["model"] if "model" in vocab or "src_model" not in vocab else ["src_model", "tgt_model"]
        pieces = []
        for key in keys:
            if not isinstance(vocab.get(key), bytes):
                return "of subwords holds no SentencePiece model" + ("" if key == "model" else f" for {key!r}")
            try:
                pieces.append(len(Subwords(vocab[key]).processor))
            except (RuntimeError, OSError, ValueError) as err:
                return f"holds a SentencePiece model that does not load ({' '.join(str(err).split())})"
        if len(pieces) == 1 and not pieces[0] == src_vocab == tgt_vocab:
            return f"has {pieces[0]} subwords, but the model has {src_vocab} source and {tgt_vocab} target ids"
        if len(pieces) == 2 and pieces != [src_vocab, tgt_vocab]:
            return (f"has {pieces[0]} source and {pieces[1]} target subwords, but the model has {src_vocab} source and "
                    f"{tgt_vocab} target ids")
    elif kind == "symbols":
        symbols = vocab.get("symbols")
        if not (isinstance(symbols, list) and symbols and all(isinstance(s, int) and not isinstance(s, bool)
                                                              and 0 <= s < min(src_vocab, tgt_vocab) for s in symbols)):
            return f"of symbols lists no symbols, or symbols that are not ids of the model (0 to {min(src_vocab, tgt_vocab) - 1})"
    elif kind is not None:
        return f"is of the kind {kind!r}, which this version of the package does not read (a newer one may)"
    return None


def shares_vocabulary(vocab) -> bool | None:
    """False where a stored vocabulary gives each side ids of its own (a word vocabulary per language, or a
    SentencePiece model per side), so that the model must not share the source embedding with the target's
    (`make_model`'s `shared_vocab`); None otherwise, where equal sizes mean one vocabulary."""
    if isinstance(vocab, dict) and (vocab.get("kind") == "words" or
                                    vocab.get("kind") == "sentencepiece" and "model" not in vocab):
        return False
    return None


def text_codec(vocab: dict) -> WordCodec | SubwordCodec | SymbolCodec:
    "The codec of a checkpoint's stored vocabulary, by its kind; a vocabulary of `symbols` alone is of kind \"symbols\"."
    codecs = {"words": WordCodec, "sentencepiece": SubwordCodec, "symbols": SymbolCodec}
    kind = vocab.get("kind", "symbols" if "symbols" in vocab else None)
    if kind is None:
        raise ValueError("this checkpoint has no vocabulary; a translator needs a checkpoint of a task of text or "
                         "symbols, such as multi30k or copy")
    if kind not in codecs:
        raise ValueError(f"this checkpoint's vocabulary is of the kind {kind!r}, which this version of the "
                         f"package does not read (it reads {', '.join(codecs)}); a newer version may")
    return codecs[kind](vocab)
