"""Translating text (`annotated_transformer.lib.translate`): a `Translator` from checkpoints, a run or a model folder;
empty, long and unknown inputs; the commands that translate and evaluate."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer import make_model
from annotated_transformer.decoding import beam_search
from annotated_transformer.lib.checkpoints import save_checkpoint
from annotated_transformer.lib.datasets import load_multi30k
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.trainer import train
from annotated_transformer.lib.translate import Translator, decode_batches
from annotated_transformer.lib.vocab import SubwordCodec, WordCodec
from annotated_transformer.training import EOS, SPECIALS
from helpers import sharp_model


def words_checkpoint(path: Path) -> Path:
    "A checkpoint of an untrained model with word vocabularies, as a translation task writes them."
    model = make_model(8, 8, N=1, d_model=16, d_ff=32, h=2)
    words = [*SPECIALS, "ein", "Hund", "a", "dog"]
    return save_checkpoint(
        path,
        {
            "config": dataclasses.asdict(model.config),
            "model": model.state_dict(),
            "step": 1,
            "src_vocab": 8,
            "tgt_vocab": 8,
            "vocab": {"kind": "words", "direction": "de-en", "src": words, "tgt": words},
        },
    )


def test_from_checkpoint_reads_the_stored_vocabulary_through_its_codec(tmp_path):
    path = words_checkpoint(tmp_path / "step-000001.pt")

    class Other(Translator):
        "A subclass: from_checkpoint makes one of it."

    for paths in ([path], [path, path]):  # one checkpoint, or an average
        translator = Other.from_checkpoint(*paths)
        assert type(translator) is Other and isinstance(translator.codec, WordCodec)
        assert translator.direction == "de-en" and len(translator.codec.tgt_vocab) == 8


def test_a_subword_run_translates_and_is_evaluated_on_multi30k(tiny_subword_run, tmp_path, monkeypatch, capsys):
    from annotated_transformer.cli import main
    from annotated_transformer.lib import evaluate

    run_dir, summary = tiny_subword_run
    assert summary["finished"] and "valid_greedy_bleu" in summary
    translator = Translator.from_checkpoint(*sorted((run_dir / "checkpoints").glob("*.pt")))  # averaged
    assert isinstance(translator.codec, SubwordCodec) and translator.dataset == "multi30k"
    assert translator.direction == "de-en" and len(translator.codec.token_texts()) == RECIPES["multi30k-cpu"].subwords
    assert translator.codec.target_ids(["A  dog."]) == translator.codec.subwords.encode(["A dog."])
    out = translator.translate(["Ein Hund.", "", "Ein Zorblax!"], beam_size=2)
    assert len(out) == 3 and out[1] == "" and all(isinstance(o, str) and "\n" not in o for o in out)
    few = load_multi30k("valid")[:12]  # the command scores Multi30k (not newstest2014), here on 12 sentences
    asked = []
    monkeypatch.setattr(evaluate, "load_pairs", lambda *args: asked.append(args) or few)
    assert main(["evaluate", "--checkpoint", str(run_dir), "--split", "valid", "--results", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "tokenized, lowercased BLEU" in out
    assert "translating Multi30k valid with beam 4, alpha 0.6, on cpu" in err  # said before the long silent part
    assert asked == [("multi30k", "valid", "de-en")]
    result = json.loads((tmp_path / "multi30k-cpu-de-en-valid.json").read_text())
    assert result["dataset"] == "multi30k" and result["split"] == "valid" and result["recipe_settings"]["subwords"]


def test_translator_defines_empty_long_and_unknown_inputs(tiny_run):
    run_dir, _ = tiny_run
    translator = Translator.from_checkpoint(sorted((run_dir / "checkpoints").glob("*.pt"))[-1], device="cpu")
    long = " ".join(["Hund"] * 100)  # the model has 64 positions
    with pytest.warns(UserWarning, match="1 input.* were cut to fit"):
        out = translator.translate(["Ein Hund.", "", "   ", "Quokkaxyz!", long, "Ein Hund."])
    assert len(out) == 6 and out[1] == out[2] == "" and out[0] == out[5]
    assert all(isinstance(o, str) for o in out)
    with pytest.raises(TypeError, match="list of strings"):
        translator.translate([None])


def test_a_copy_task_checkpoint_translates_its_symbols(tmp_path):
    "Trained by `train` itself: the copy task's vocabulary of symbols makes its checkpoints translators of numbers."
    summary = train(
        RECIPES["copy"].replace(steps=2, eval_every=1, checkpoint_every=1), tmp_path / "copy", progress=False
    )
    assert summary["finished"]
    translator = Translator.from_checkpoint(tmp_path / "copy")
    ids = decode_batches(translator.model, translator.encode(["5 7 7 3"]), banned=translator.banned)[0]
    assert translator.translate(["5 7 7 3", ""]) == [" ".join(map(str, ids)), ""]  # the search's own ids, as numbers


def run_cli(*args, stdin=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "annotated_transformer", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_translate_and_evaluate_commands(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    last = sorted((run_dir / "checkpoints").glob("*.pt"))[-1]
    done = run_cli("translate", "--checkpoint", str(last), "--beam-size", "2", stdin="Ein Hund.\n\nZwei Männer.\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    done = run_cli(
        "evaluate",
        "--checkpoint",
        str(run_dir),
        "--split",
        "valid",
        "--results",
        str(tmp_path / "results"),
        "--hypotheses",
        str(tmp_path / "hyps.txt"),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    result = json.loads((tmp_path / "results" / "multi30k-cpu-de-en-valid.json").read_text())
    assert f"BLEU = {result['bleu']:.2f}" in done.stdout and result["bleu_signature"] in done.stdout
    assert "case:mixed" in result["bleu_signature"] and "tokenized, lowercased" in done.stdout
    assert summary["evaluation"]["valid"]["bleu"] == result["bleu"]
    assert result["checkpoints"] == [p.name for p in sorted((run_dir / "checkpoints").glob("*.pt"))]  # the last 3
    assert result["steps"] == 40 and result["metrics"] and result["direction"] == "de-en" and result["beam_size"] == 4
    assert len((tmp_path / "hyps.txt").read_text().splitlines()) == 1014
    done = run_cli("evaluate", "--checkpoint", str(last), "--average", "2")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--average needs a run directory" in done.stderr


def test_decode_batches_keeps_the_input_order_and_skips_empty_sources():
    model = sharp_model(9)
    sources = [
        [int(t) for t in torch.randint(3, 30, (n,), generator=torch.Generator().manual_seed(n))] + [EOS]
        for n in (7, 2, 11, 4)
    ]
    sources.insert(2, [])
    batched = decode_batches(model, sources, batch_size=2, beam_size=3, extra_len=5)
    one_by_one = [
        beam_search(model, torch.tensor([s]), torch.ones(1, 1, len(s), dtype=torch.bool), beam_size=3, extra_len=5)[
            0
        ].tokens
        if s
        else []
        for s in sources
    ]
    assert batched == one_by_one and batched[2] == []


def test_from_checkpoint_takes_a_run_directory_as_the_command_line_does(tiny_run):
    from annotated_transformer.lib.checkpoints import checkpoints_to_average

    run_dir, _ = tiny_run
    sources = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball."]
    by_folder = Translator.from_checkpoint(run_dir)  # its last checkpoints, as many as its recipe averages (3)
    assert by_folder.translate(sources) == Translator.from_checkpoint(*checkpoints_to_average(run_dir, 3)).translate(
        sources
    )


@pytest.mark.parametrize("version", [1, 2])
def test_from_pretrained_reads_a_shared_model_and_only_that(version, tmp_path):
    data = Path(__file__).parent / "data"  # a copy run of two updates, its checkpoint and its exported model file
    shared = Translator.from_pretrained(data / f"model-format-{version}.safetensors", device="cpu")
    from_checkpoint = Translator.from_checkpoint(data / f"checkpoint-format-{version}.pt", device="cpu")
    assert shared.translate(["5 7 7 3", "12 11"]) == from_checkpoint.translate(["5 7 7 3", "12 11"])
    folder = shared.save_pretrained(tmp_path / "model")  # today's form: a folder
    assert Translator.from_pretrained(folder).translate(["5 7 7 3"]) == shared.translate(["5 7 7 3"])
    with pytest.raises(ValueError, match=r"checkpoint-format-1.pt: not a model folder"):
        Translator.from_pretrained(data / "checkpoint-format-1.pt")
