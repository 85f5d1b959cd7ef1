"""Translating text with a trained model (`Translator`): text to token ids with the model's own vocabulary, batches of
similar length, §6.1's beam search, ids back to text; read from checkpoints (several: their average) or a shared
model folder, and saved as one (`save_pretrained`)."""

import functools
import warnings
from pathlib import Path

import torch

from ..decoding import ALPHA, BEAM_SIZE, EXTRA_LEN, beam_search
from ..model import EncoderDecoder
from ..training import BOS, EOS, PAD, pad_sequences, padding_mask
from .checkpoints import Checkpoint, checkpoints_to_read, model_from_state
from .devices import check_device
from .pretrained import is_model_folder, model_state, read_model, save_pretrained
from .vocab import text_codec


def decode_batches(model: EncoderDecoder, sources: list[list[int]], batch_size: int = 64, beam_size: int = BEAM_SIZE,
                   alpha: float = ALPHA, extra_len: int = EXTRA_LEN, cache: bool = True,
                   banned: tuple[int, ...] = (PAD, BOS)) -> list[list[int]]:
    """Decode source sentences given as token ids (each ending in </s>) with `beam_search`: sorted by length so
    that a batch wastes little on padding, `batch_size` at a time. Returns the output token ids in input order;
    an empty source gives an empty output without running the model. No output holds a token in `banned`."""
    device = next(model.parameters()).device
    out: list[list[int]] = [[] for _ in sources]
    order = sorted((i for i, x in enumerate(sources) if x), key=lambda i: len(sources[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = pad_sequences([sources[i] for i in chunk]).to(device)
        hyps = beam_search(model, src, padding_mask(src), beam_size, alpha, extra_len, cache, banned=banned)
        for i, hyp in zip(chunk, hyps):
            out[i] = hyp.tokens
    return out


class Translator:
    """Translate text with a trained model: tokenization, batched beam search, detokenization.

    `from_checkpoint` loads checkpoints of `train` (several: their average), `from_pretrained` a shared model
    folder (`save_pretrained` writes one). `translate(sentences)` returns one string per input string, in order: `encode` turns the text into source
    token ids with the `codec` of the stored vocabulary (`text_codec`), `decode_batches` decodes them `batch_size`
    at a time, and the codec turns the ids back into text. An empty or whitespace-only input gives an empty output without running the model.
    """

    def __init__(self, model: EncoderDecoder, vocab: dict, device="cpu", batch_size: int = 64, about: dict | None = None):
        self.codec = text_codec(vocab)  # words, subwords, or the copy task's symbols
        self.model, self.device, self.batch_size = model.eval(), torch.device(device), batch_size
        self.vocab, self.dataset, self.direction = vocab, vocab.get("dataset"), vocab.get("direction", "-")
        self.src_lang, self.tgt_lang = self.direction.split("-")
        self.about = dict(about or {})  # what made the model, as a model folder records it: recipe, step, averaged

    @classmethod
    def from_state(cls, state: Checkpoint, source, device=None, batch_size: int = 64) -> "Translator":
        "A translator of the model that `state` holds (a checkpoint, or what `read_model` returns), read from `source`."
        device = check_device(device)
        about = {key: state[key] for key in ("recipe", "step", "averaged") if state.get(key) is not None}
        return cls(model_from_state(state, source, device), state.get("vocab", {}), device, batch_size, about)

    @classmethod
    def from_checkpoint(cls, *paths, device=None, batch_size: int = 64) -> "Translator":
        """A translator from a checkpoint, the average of several (§6.1), a run's last ones, or a shared model (a
        folder, or the single file of earlier versions)."""
        if not paths:
            raise ValueError("from_checkpoint needs at least one checkpoint path")
        paths, _ = checkpoints_to_read(paths)
        return cls.from_state(read_model(paths), paths[-1], device, batch_size)

    @classmethod
    def from_pretrained(cls, path, **options) -> "Translator":
        "A translator from a shared model: a folder that `save_pretrained` wrote (or a .safetensors file of old)."
        if not (is_model_folder(path) or Path(path).suffix == ".safetensors" and Path(path).is_file()):
            raise ValueError(f"{path}: not a model folder (one that save_pretrained or `annotated-transformer export` "
                             "writes); for a run or its checkpoints, use from_checkpoint")
        return cls.from_checkpoint(path, **options)

    def save_pretrained(self, folder) -> Path:
        "Write this translator's model and vocabulary to the model folder `folder` (`pretrained.save_pretrained`)."
        return save_pretrained(model_state(self.model, self.vocab, **self.about), folder)

    def encode(self, sentences) -> list[list[int]]:
        "Source token ids of each string, ending in </s> and cut to the model's positions; [] for an empty one."
        sentences = list(sentences)
        if any(not isinstance(s, str) for s in sentences):
            raise TypeError("translate takes a string or a list of strings")
        limit = self.model.config.max_len - 1                              # source positions, </s> included
        ids = self.codec.source_ids(sentences)
        if cut := [n for n, x in enumerate(ids, 1) if len(x) > limit - 1]:
            which = ", ".join(map(str, cut[:10])) + (", ..." if len(cut) > 10 else "")
            warnings.warn(f"{len(cut)} input(s) longer than the model's {limit - 1} source tokens were cut to fit: "
                          f"input(s) {which}, counting from 1")
        return [x[:limit - 1] + [EOS] if x else [] for x in ids]

    @functools.cached_property
    def banned(self) -> tuple[int, ...]:
        "The target ids never written: padding, <s>, and every token whose text holds a line break (`str.splitlines`)."
        texts = self.codec.token_texts()
        return (PAD, BOS, *(i for i, text in enumerate(texts) if len(f"x{text}x".splitlines()) > 1))

    def translate(self, sentences, beam_size: int = BEAM_SIZE, alpha: float = ALPHA, extra_len: int = EXTRA_LEN,
                  cache: bool = True) -> list[str] | str:
        """One translation per input string, in order (§6.1's decoding by default); a single string is one sentence
        and gives one string. A translation is one line: besides the `banned` tokens, a line break that several
        byte pieces spell together (which no single banned token catches) becomes a space."""
        if isinstance(sentences, str):
            return self.translate([sentences], beam_size, alpha, extra_len, cache)[0]
        outputs = decode_batches(self.model, self.encode(sentences), self.batch_size, beam_size, alpha, extra_len,
                                 cache, self.banned)
        return [" ".join(self.codec.decode(tokens).splitlines()) if tokens else "" for tokens in outputs]
