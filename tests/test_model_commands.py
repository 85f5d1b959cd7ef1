"""Commands that use a trained model (`annotated_transformer.model_commands`, book/a4_model_commands.ipynb): the
exported model file against its run, and checkpoints chosen from a run."""

import json

import pytest

from annotated_transformer.cli import main


@pytest.mark.parametrize("run", ["tiny_run", "tiny_subword_run"])
def test_an_exported_model_translates_exactly_as_its_run(run, request, tmp_path, capsys):
    "Words or subwords: the file `export` writes gives the translations of the run's averaged checkpoints."
    from annotated_transformer.data import load_multi30k
    from annotated_transformer.checkpoints import checkpoints_to_average
    from annotated_transformer.translation import Translator

    run_dir, _ = request.getfixturevalue(run)
    out = tmp_path / "model.safetensors"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["out"] == str(out) and len(written["checkpoints"]) == 3  # the recipe's average_checkpoints
    sources = [de for de, _ in load_multi30k("test")[:100]]
    from_run = Translator.from_checkpoint(*checkpoints_to_average(run_dir, 3)).translate(sources)
    assert Translator.from_checkpoint(out).translate(sources) == from_run
    assert main(["export", str(run_dir), "--out", str(tmp_path / "model.pt")]) == 2
    assert "a model file is named *.safetensors" in capsys.readouterr().err


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

    from annotated_transformer.translation import Translator

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
