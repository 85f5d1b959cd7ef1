"""Text in and text out of translation (book/07_decoding.ipynb, book/a02_tokenizers.ipynb and the `translate`
command of book/a08_cli.ipynb): one line out for every line in, whatever the model prefers and whatever
bytes come in; special symbols typed as text stay text; a single string is one sentence."""

import dataclasses
import io
import sys

import pytest
import torch

from annotated_transformer import cli, make_model
from annotated_transformer.lib.checkpoints import save_checkpoint
from annotated_transformer.lib.tokenizers import Subwords, Vocab
from annotated_transformer.lib.translate import Translator
from annotated_transformer.lib.vocab import SubwordCodec
from annotated_transformer.training import BOS, EOS, PAD, SPECIALS, UNK

# Every character that str.splitlines() ends a line at.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def favouring_model(vocab: int, biases: dict[int, float], max_len: int = 24):
    "A tiny model whose output layer prefers the given target ids by the given margins, whatever the input."
    torch.manual_seed(0)
    model = make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2, max_len=max_len).eval()
    with torch.no_grad():
        for token, bias in biases.items():
            model.generator.proj.bias[token] = bias
    return model


def checkpoint(path, model, vocab: dict):
    "A checkpoint of `model` as training writes one, which `Translator.from_checkpoint` reads."
    return save_checkpoint(
        path,
        {
            "config": dataclasses.asdict(model.config),
            "model": model.state_dict(),
            "step": 1,
            "src_vocab": model.src_embed[0].lut.num_embeddings,
            "tgt_vocab": model.generator.proj.out_features,
            "vocab": vocab,
        },
    )


@pytest.fixture(scope="module")
def subwords():
    "A SentencePiece model with byte fallback, as `prepare` learns one, from a few lines."
    lines = ["the quick brown fox jumps over the lazy dog", "der schnelle braune Fuchs springt", "a cat sat"] * 10
    return Subwords.train(lines, 300)


@pytest.fixture(scope="module")
def newline_checkpoint(tmp_path_factory, subwords):
    "A valid subword checkpoint whose model most wants to write the byte piece <0x0A> (a newline), then 'a'."
    pieces = subwords.processor
    biases = {pieces.piece_to_id("<0x0A>"): 50.0, pieces.piece_to_id("<0x0D>"): 45.0, pieces.piece_to_id("a"): 25.0}
    assert pieces.id_to_piece(pieces.piece_to_id("a")) == "a"
    model = favouring_model(len(subwords), biases)
    vocab = {"kind": "sentencepiece", "dataset": "wmt14", "direction": "en-de", "model": subwords.model}
    return checkpoint(tmp_path_factory.mktemp("newline") / "step-000001.pt", model, vocab)


def run_translate(monkeypatch, capsys, path, stdin: bytes, *options):
    "`annotated-transformer translate` in this process, on stdin bytes; returns (exit code, stdout bytes, stderr)."
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", out)
    code = cli.main(["translate", "--checkpoint", str(path), "--device", "cpu", *options])
    out.flush()
    return code, out.buffer.getvalue(), capsys.readouterr().err


# One line in, one line out


def test_pieces_that_break_a_line_are_never_produced(newline_checkpoint, subwords):
    translator = Translator.from_checkpoint(newline_checkpoint, device="cpu")
    assert isinstance(translator.codec, SubwordCodec)
    breaking = {i for i in range(len(subwords)) if any(c in subwords.decode([i]) for c in LINE_BREAKS)}
    assert {subwords.processor.piece_to_id(f"<0x{b:02X}>") for b in (10, 11, 12, 13, 28, 29, 30)} <= breaking
    assert breaking | {PAD, BOS} <= set(translator.banned) and EOS not in translator.banned
    for beam_size in (1, 3):
        out = translator.translate(["a cat", "the dog", ""], beam_size=beam_size, extra_len=4)
        # the model's favourites are the newline and carriage-return bytes; banned, the next best is "a", as
        # long as a translation may be (4 tokens more than its source)
        limits = [len(ids) - 1 + 4 for ids in translator.encode(["a cat", "the dog"])]
        assert out == ["a" * limits[0], "a" * limits[1], ""]


def test_translate_writes_one_line_per_input_line_with_a_model_that_prefers_newlines(
    newline_checkpoint, monkeypatch, capsys
):
    stdin = "the fox\r\nder Fuchs\u2028springt\n\na cat\x85sat\nlast line".encode()
    code, out, err = run_translate(monkeypatch, capsys, newline_checkpoint, stdin, "--extra-len", "10")
    assert code == 0, err
    lines = out.decode("utf-8").split("\n")
    assert len(lines) == 6 and lines[-1] == "" and lines[2] == ""
    assert len(out.decode("utf-8").splitlines()) == 5  # no other line break anywhere in the output
    assert all(set(line) == {"a"} for i, line in enumerate(lines[:5]) if i != 2)


def test_translate_makes_any_translation_one_line(newline_checkpoint, monkeypatch, capsys):
    "Whatever a translator returns, the command writes one line for it: a line break inside becomes a space."
    fake = ["one\ntwo", "three\r\nfour\u2028five", "\x85", "six\n"]
    monkeypatch.setattr(Translator, "translate", lambda self, sentences, *args: fake[: len(sentences)])
    code, out, err = run_translate(monkeypatch, capsys, newline_checkpoint, b"1\n2\n3\n4\n")
    assert code == 0, err
    assert out.decode("utf-8") == "one two\nthree four five\n\nsix\n"


# Bytes in


@pytest.fixture
def echo(monkeypatch):
    "Translators that return their input, upper-cased; the inputs they were given are recorded."
    seen = []

    def translate(self, sentences, *args):
        seen.extend(sentences)
        return [s.upper() for s in sentences]

    monkeypatch.setattr(Translator, "translate", translate)
    return seen


def test_invalid_utf8_is_replaced_and_named_by_its_line_number(newline_checkpoint, monkeypatch, capsys, echo):
    stdin = b"good\nb\xffad\xfe\nfine\n\xc3\n\xc3\xa4h\n"
    code, out, err = run_translate(monkeypatch, capsys, newline_checkpoint, stdin)
    assert code == 0, err
    assert echo == ["good", "b\ufffdad\ufffd", "fine", "\ufffd", "äh"]
    assert out.decode("utf-8") == "GOOD\nB\ufffdAD\ufffd\nFINE\n\ufffd\nÄH\n"
    warnings = err.splitlines()
    assert len(warnings) == 2 and "line 2" in warnings[0] and "line 4" in warnings[1]
    assert all(w.startswith("annotated-transformer: warning:") and "UTF-8" in w for w in warnings)


def test_a_byte_order_mark_at_the_start_is_not_text(newline_checkpoint, monkeypatch, capsys, echo):
    code, out, err = run_translate(monkeypatch, capsys, newline_checkpoint, b"\xef\xbb\xbfHallo\r\nWelt\n")
    assert code == 0 and err == ""
    assert echo == ["Hallo", "Welt"] and out == b"HALLO\nWELT\n"


def test_the_long_input_warning_is_one_line(tmp_path, subwords, monkeypatch, capsys):
    path = checkpoint(
        tmp_path / "step-000001.pt",
        favouring_model(len(subwords), {}, max_len=12),
        {"kind": "sentencepiece", "direction": "en-de", "model": subwords.model},
    )
    stdin = b"a cat\n" + b"the quick brown fox jumps over the lazy dog\n" * 2
    code, out, err = run_translate(monkeypatch, capsys, path, stdin, "--beam-size", "1", "--extra-len", "2")
    assert code == 0 and len(out.splitlines()) == 3
    assert err.count("\n") == 1 and err.startswith("annotated-transformer: warning: 2 input")
    assert "cut to fit" in err and "2, 3" in err  # which inputs, counting from 1: here the line numbers


# Special symbols typed as text, and a single string


def test_special_symbols_typed_in_the_input_are_text(tmp_path, subwords):
    vocab = Vocab([*SPECIALS, "ein", "Hund"])
    assert vocab.encode([*SPECIALS, "Hund", "Katze"]) == [UNK, UNK, UNK, UNK, 5, UNK]
    typed = "<pad> ein <s> Hund </s> <unk>"
    words = [*SPECIALS, "ein", "Hund", "<", ">", "s", "/s", "pad", "unk"]
    vocab = {"kind": "words", "direction": "de-en", "src": words, "tgt": words}
    word_translator = Translator.from_checkpoint(checkpoint(tmp_path / "w.pt", favouring_model(len(words), {}), vocab))
    vocab = {"kind": "sentencepiece", "direction": "en-de", "model": subwords.model}
    subword_translator = Translator(favouring_model(len(subwords), {}, max_len=64), vocab)
    for translator in (word_translator, subword_translator):
        (ids,) = translator.encode([typed])
        assert ids[-1] == EOS and not {PAD, BOS, EOS} & set(ids[:-1])
    assert subwords.decode(subword_translator.encode([typed])[0][:-1]) == typed  # spelled as text, in pieces


def test_a_single_string_is_one_sentence(newline_checkpoint):
    translator = Translator.from_checkpoint(newline_checkpoint, device="cpu")
    one = translator.translate("the fox", beam_size=1, extra_len=3)
    assert isinstance(one, str) and one == translator.translate(["the fox"], beam_size=1, extra_len=3)[0]
    assert one == "a" * (len(translator.encode(["the fox"])[0]) - 1 + 3)
    assert translator.translate("") == "" and translator.translate([]) == []
    with pytest.raises(TypeError, match="a string or a list of strings"):
        translator.translate([b"bytes"])


def test_word_vocabulary_entries_that_break_a_line_are_never_produced(tmp_path):
    words = [*SPECIALS, "ein", "Hund", "a\u2028b", "c\nd", "dog"]
    model = favouring_model(len(words), {6: 50.0, 7: 45.0, 8: 25.0})
    path = checkpoint(tmp_path / "w.pt", model, {"kind": "words", "direction": "de-en", "src": words, "tgt": words})
    translator = Translator.from_checkpoint(path, device="cpu")
    assert {PAD, BOS, 6, 7} <= set(translator.banned) and not {EOS, UNK, 4, 5, 8} & set(translator.banned)
    assert translator.translate(["ein Hund"], beam_size=2, extra_len=2) == [" ".join(["dog"] * (2 + 2))]
