"""Commands that use a trained model (`annotated_transformer.cli.models`): the exported model folder against its run,
checkpoints chosen from a run, and `evaluate` against what can stop it from recording its scores."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from annotated_transformer.cli import main


@pytest.mark.parametrize("run", ["tiny_run", "tiny_subword_run"])
def test_an_exported_model_translates_exactly_as_its_run(run, request, tmp_path, capsys):
    "Words or subwords: the folder `export` writes gives the translations of the run's averaged checkpoints."
    from annotated_transformer.lib.checkpoints import checkpoints_to_average
    from annotated_transformer.lib.datasets import load_multi30k
    from annotated_transformer.lib.translate import Translator

    run_dir, _ = request.getfixturevalue(run)
    out = tmp_path / "model"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["out"] == str(out) and len(written["checkpoints"]) == 3  # the recipe's average_checkpoints
    sources = [de for de, _ in load_multi30k("test")[:100]]
    from_run = Translator.from_checkpoint(*checkpoints_to_average(run_dir, 3)).translate(sources)
    assert Translator.from_checkpoint(out).translate(sources) == from_run
    assert Translator.from_pretrained(out).translate(sources) == from_run
    assert main(["translate", "--checkpoint", str(out), "--average", "2"]) == 2  # a model folder is no run
    assert "--average needs a run directory" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--out", str(tmp_path / "model.safetensors")]) == 2
    assert "a model is written as a folder" in capsys.readouterr().err


def test_averaging_more_checkpoints_than_a_run_holds_is_warned_about(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"recipe": {"average_checkpoints": 5, "keep_checkpoints": 5}}))
    for step in (8, 16, 24):
        (run / "checkpoints" / f"step-{step:06d}.pt").touch()  # empty files: loading them then fails, exit code 1
    for options, asked in ((["--average", "5"], "--average 5"), ([], "the run's average_checkpoints=5")):
        assert main(["translate", "--checkpoint", str(run), *options]) == 1
        warning, error = capsys.readouterr().err.splitlines()
        assert warning == (
            f"annotated-transformer: warning: {asked} asks for 5 checkpoints, but {run} holds 3: averaging those 3"
        )
        assert error.startswith("annotated-transformer: error: ") and "step-000008.pt" in error
    assert main(["translate", "--checkpoint", str(run), "--average", "3"]) == 1
    assert "warning" not in capsys.readouterr().err


def test_the_copy_model_translates_from_the_command_line(capsys, monkeypatch):
    "A model of symbols reads and writes numbers: one line out per line in, and a plain error for a word."
    import io
    from pathlib import Path

    from annotated_transformer.lib.translate import Translator

    checkpoint = Path(__file__).parent / "data" / "checkpoint-format-1.pt"  # a copy run of two updates
    monkeypatch.setattr("sys.stdin", io.StringIO("5 7 7 3\n\n12 11\n"))
    assert main(["translate", "--checkpoint", str(checkpoint), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.split("\n")
    from_python = Translator.from_checkpoint(checkpoint, device="cpu").translate(["5 7 7 3", "", "12 11"])
    assert lines == [*from_python, ""] and from_python[1] == ""  # the model's own outputs, empty line for empty line
    assert all(3 <= int(word) <= 12 for line in lines for word in line.split())
    monkeypatch.setattr("sys.stdin", io.StringIO("5 seven\n"))
    assert main(["translate", "--checkpoint", str(checkpoint), "--device", "cpu"]) == 1
    assert "input 1, '5 seven': this model reads its symbols, whole numbers from 3 to 12" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--device", "cpu"]) == 1
    assert "a model of no data set with a test split (such as the copy task)" in capsys.readouterr().err


# `evaluate` under the run's lock, recording what it scored, or refusing before the work


@pytest.fixture
def scored_run(tiny_run, tmp_path, monkeypatch):
    "A copy of the tiny Multi30k run, and a validation set of 12 sentences to evaluate it on in seconds."
    from annotated_transformer.lib import evaluate as translation
    from annotated_transformer.lib.datasets import load_multi30k

    run = tmp_path / "run"
    shutil.copytree(tiny_run[0], run)
    few = load_multi30k("valid")[:12]
    monkeypatch.setattr(translation, "load_pairs", lambda dataset, split, direction: few)
    return run


def evaluate(checkpoint, results, *options):
    return main(["evaluate", "--checkpoint", str(checkpoint), "--split", "valid", "--results", str(results), *options])


def files(*folders):
    return {p: p.read_bytes() for folder in folders for p in Path(folder).rglob("*") if p.is_file()}


def test_a_model_from_the_middle_of_a_run_is_recorded_as_such(scored_run, tmp_path, capsys):
    "The results file says which update it scored, with the loss curve and the training time up to that update."
    assert evaluate(scored_run / "checkpoints" / "step-000020.pt", tmp_path / "results") == 0
    result = json.loads((tmp_path / "results" / "multi30k-cpu-de-en-valid.json").read_text())
    logged = [json.loads(line) for line in (scored_run / "metrics.jsonl").read_text().splitlines()]
    logged = [{key: value for key, value in line.items() if key != "format"} for line in logged]  # each line's version
    assert result["steps"] == 20 and result["checkpoints"] == ["step-000020.pt"]
    stored = torch.load(scored_run / "checkpoints" / "step-000020.pt", weights_only=True)
    assert result["metrics"] == logged[:1] and result["training_wall_time_s"] == stored["elapsed_s"]
    summary = json.loads((scored_run / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["evaluation"]["valid"]["steps"] == 20
    assert evaluate(scored_run, tmp_path / "results") == 0  # the run's last three checkpoints: the whole run
    result = json.loads((tmp_path / "results" / "multi30k-cpu-de-en-valid.json").read_text())
    assert (
        result["steps"] == 40
        and result["metrics"] == logged
        and result["training_wall_time_s"] == summary["wall_time_s"]
    )


def test_evaluate_and_train_never_share_a_run(scored_run, tmp_path, capsys, monkeypatch):
    from annotated_transformer.lib import evaluate as translation
    from annotated_transformer.lib.recipes import Recipe, stored_recipe
    from annotated_transformer.lib.runs import RunDir, RunDirBusy
    from annotated_transformer.lib.trainer import train

    before = files(scored_run)
    with RunDir(scored_run):  # a training holds the run: evaluate is refused before it translates anything
        assert evaluate(scored_run, tmp_path / "results") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{scored_run} is in use: a training or another evaluation writes there" in err
    assert files(scored_run) == before and not (tmp_path / "results").exists()
    # an evaluation holds the run: a training that would write summary.json meanwhile is refused
    recipe = Recipe.from_dict(stored_recipe(scored_run / "config.json")).replace(steps=50)
    refused = []
    translate = translation.Translator.translate

    def translate_while_a_training_tries(self, *args, **kwargs):
        with pytest.raises(RunDirBusy, match="is in use"):
            train(recipe, scored_run, device="cpu", progress=False, resume=True)
        refused.append(True)
        return translate(self, *args, **kwargs)

    monkeypatch.setattr(translation.Translator, "translate", translate_while_a_training_tries)
    assert evaluate(scored_run, tmp_path / "results") == 0 and refused
    assert "valid" in json.loads((scored_run / "summary.json").read_text())["evaluation"]


def test_a_torn_last_metrics_line_does_not_stop_the_recording(scored_run, tmp_path, capsys):
    with open(scored_run / "metrics.jsonl", "a") as f:
        f.write('{"step": 50, "train_lo')  # as a training killed mid-line leaves it; --resume drops it too
    assert evaluate(scored_run, tmp_path / "results") == 0
    result = json.loads((tmp_path / "results" / "multi30k-cpu-de-en-valid.json").read_text())
    assert [m["step"] for m in result["metrics"]] == [20, 40]
    assert "metrics.jsonl: its last line was cut short" in capsys.readouterr().err


@pytest.mark.parametrize("fault", ["read-only run", "read-only results", "results link loop", "results is a file"])
def test_what_would_stop_the_recording_stops_evaluate_before_it_translates(
    fault, scored_run, tmp_path, capsys, monkeypatch
):
    results = tmp_path / "results"
    if fault.startswith("read-only"):  # as for a user without the right (root may write anywhere, so it is feigned)
        folder = scored_run if fault == "read-only run" else results
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != folder and access(path, mode))
        results.mkdir()
    elif fault == "results link loop":
        results.symlink_to(results)
    else:
        results.write_text("not a folder")
    before = files(scored_run)
    assert evaluate(scored_run, results) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "translating" not in err and "BLEU" not in err
    named = scored_run if fault == "read-only run" else results
    assert f"error: {named}: " in err
    assert files(scored_run) == before and not list(tmp_path.glob("results/*.json"))


def test_a_failure_to_write_the_summary_leaves_the_results_file_as_it_was(scored_run, tmp_path, monkeypatch, capsys):
    "The two records stay in step: the results file written first is put back when summary.json cannot be written."
    from annotated_transformer.lib import artifacts

    results = tmp_path / "results"
    assert evaluate(scored_run, results) == 0
    recorded = results / "multi30k-cpu-de-en-valid.json"
    recorded.write_text(recorded.read_text().replace('"bleu"', '"bleu_as_it_was"'))  # what must come back
    before = files(scored_run, results)
    write_json = artifacts.write_json

    def full_disk_at_the_summary(path, data):
        if Path(path).name == "summary.json":
            raise OSError(28, "No space left on device")
        write_json(path, data)

    monkeypatch.setattr(artifacts, "write_json", full_disk_at_the_summary)
    assert evaluate(scored_run, results, "--hypotheses", str(tmp_path / "hypotheses.txt")) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert files(scored_run, results) == before and not (tmp_path / "hypotheses.txt").exists()


def test_the_translations_go_where_asked_after_the_record(scored_run, tmp_path, capsys):
    "A missing folder is a usage mistake found before any work; a named pipe is written into, never replaced."
    import threading

    assert evaluate(scored_run, tmp_path / "results", "--hypotheses", str(tmp_path / "no" / "h.txt")) == 2
    assert "no folder" in capsys.readouterr().err and not (tmp_path / "results").exists()
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_text()), daemon=True)
    reader.start()
    assert evaluate(scored_run, tmp_path / "results", "--hypotheses", str(pipe)) == 0
    reader.join(timeout=60)
    assert received[0].count("\n") == 12 and pipe.is_fifo()


# `translate` streams, and writes text, never terminal commands

COPY_CHECKPOINT = Path(__file__).parent / "data" / "checkpoint-format-1.pt"  # a copy run of two updates


def test_translate_writes_each_batch_before_it_reads_the_next():
    "Memory stays that of a batch: the first 64 translations come out while the input is still open."
    import subprocess
    import sys
    import threading

    process = subprocess.Popen(
        [sys.executable, "-m", "annotated_transformer", "translate", "--checkpoint", str(COPY_CHECKPOINT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        process.stdin.write(b"5 7 7 3\n" * 64)  # one batch, and the input stays open
        process.stdin.flush()
        got = []
        reader = threading.Thread(target=lambda: got.extend(process.stdout.readline() for _ in range(64)), daemon=True)
        reader.start()
        reader.join(timeout=240)  # generous: a loaded machine
        assert len(got) == 64 and process.poll() is None  # out before the input ended
        rest, err = process.communicate(b"5 6\n", timeout=240)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert len(set(got)) == 1 and rest.count(b"\n") == 1  # one line out for each line in


def test_a_vocabulary_with_terminal_commands_never_reaches_the_terminal(tmp_path, monkeypatch, capsys):
    "A word of a checkpoint's vocabulary holding ESC [ ... m (a colour) or a bell is written as U+FFFD, not obeyed."
    import io

    import torch

    from annotated_transformer.cli.models import output_line
    from annotated_transformer.lib.checkpoints import save_checkpoint
    from annotated_transformer.model import make_model

    assert output_line("rot\x1b[31m und\x07 \x9b2J\tgut\nso") == "rot\ufffd[31m und\ufffd \ufffd2J\tgut so\n"
    words = ["<pad>", "<s>", "</s>", "<unk>", "\x1b]0;owned\x07", "\x1b[2J"]
    model = make_model(len(words), len(words), N=1, d_model=16, d_ff=32, h=2)
    with torch.no_grad():  # the model writes the hostile words first, then ends
        model.generator.proj.bias.copy_(torch.tensor([-1e4, -1e4, 0.0, -1e4, 5.0, 4.0]))
        model.generator.proj.weight.zero_()
    vocab = {"kind": "words", "dataset": "multi30k", "direction": "de-en", "src": words, "tgt": words}
    state = {
        "config": model.config.__dict__,
        "src_vocab": 6,
        "tgt_vocab": 6,
        "step": 1,
        "model": model.state_dict(),
        "vocab": vocab,
    }
    path = save_checkpoint(tmp_path / "hostile.pt", state)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hallo\n"))
    assert (
        main(["translate", "--checkpoint", str(path), "--device", "cpu", "--beam-size", "1", "--extra-len", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\ufffd" in out and out.count("\n") == 1


def test_translate_stops_quietly_when_its_reader_does(tmp_path):
    "`translate ... | head -n 1`: a closed pipe ends the command without an error message."
    import subprocess
    import sys

    command = f"{sys.executable} -m annotated_transformer translate --checkpoint {COPY_CHECKPOINT} | head -n 1"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        input=b"5 7 7 3\n" * 2000,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.count(b"\n") == 1 and done.stderr == b"", done.stderr


def test_a_bad_line_after_the_first_batch_is_placed_in_the_input(monkeypatch, capsys):
    "The translator counts the inputs of its batch: the command says where that batch starts."
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("5 6\n" * 70 + "5 x\n"))
    assert main(["translate", "--checkpoint", str(COPY_CHECKPOINT), "--device", "cpu"]) == 1
    out, err = capsys.readouterr()
    assert out.count("\n") == 64  # the first batch, written before the second was read
    assert "lines 65-71 of standard input (inputs counted from line 65): input 7, '5 x'" in err
