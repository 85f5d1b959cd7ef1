"""The command line's entry point (`annotated_transformer.cli`): `--version`, `--help`, `--debug`, `--threads`, one
line for every failure with where to read the help, and stops by SIGTERM."""

import pytest
import torch

import annotated_transformer
from annotated_transformer import cli
from annotated_transformer.cli import main
from annotated_transformer.lib.translate import Translator


@pytest.mark.parametrize(
    "argv, hint",
    [
        ([], "(see annotated-transformer --help)"),
        (["--frobnicate"], "(see annotated-transformer --help)"),
        (["train", "kopy"], "(see annotated-transformer train --help)"),
        (["translate"], "(see annotated-transformer translate --help)"),
    ],
)
def test_every_usage_error_says_where_the_help_is(argv, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("annotated-transformer: error: ") and err.endswith(f" {hint}\n") and err.count("\n") == 1


def test_version_names_the_package_pytorch_the_device_and_what_it_does_with_bfloat16(capsys, monkeypatch):
    assert main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"annotated-transformer {annotated_transformer.__version__}" and len(lines) == 3
    assert lines[1].startswith(f"PyTorch {torch.__version__}, default device ")
    for native, default, line in [
        (True, True, "bfloat16 native on cpu: training autocasts to it by default"),
        (True, False, "bfloat16 native on cpu: training autocasts to it only with train --bf16"),
        (False, False, "bfloat16 not native on cpu: training autocasts to it only with train --bf16"),
    ]:
        monkeypatch.setattr(cli, "default_device", lambda: torch.device("cpu"))
        monkeypatch.setattr(cli, "bf16_supported", lambda device, native=native: native)
        monkeypatch.setattr(cli, "bf16_by_default", lambda device, default=default: default)
        assert main(["--version"]) == 0
        assert capsys.readouterr().out.splitlines()[2] == line


def test_the_programs_help_names_version_debug_and_the_environment(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--version" in out and "--debug" in out and "AT_MIRROR" in out and "AT_DATA_DIR" in out


@pytest.mark.parametrize("how", ["before the command", "after it", "AT_DEBUG=1"])
def test_debug_prints_the_traceback_before_the_one_line(how, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AT_DEBUG", raising=False)
    argv = ["train", "copy", "--resume", "--out", str(tmp_path / "none")]  # nothing to resume: fails while running
    assert main(argv) == 1
    plain = capsys.readouterr().err
    assert plain.count("\n") == 1 and "nothing to resume" in plain and "Traceback" not in plain
    if how == "AT_DEBUG=1":
        monkeypatch.setenv("AT_DEBUG", "1")
    debug_argv = {"before the command": ["--debug", *argv], "after it": [*argv, "--debug"], "AT_DEBUG=1": argv}[how]
    assert main(debug_argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "_resumed_recipe" in err and err.endswith(plain)


def test_debug_leaves_usage_errors_and_a_zero_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AT_DEBUG", "0")
    assert main(["train", "copy", "--resume", "--out", str(tmp_path / "none")]) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert main(["--debug", "train", "kopy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown recipe 'kopy'" in err


@pytest.mark.parametrize("command", ["translate", "evaluate", "bench"])
def test_the_commands_that_compute_take_threads(command, tmp_path, capsys, monkeypatch):
    seen = []

    def stand_in(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stopped here")

    checkpoint = tmp_path / "model.pt"
    checkpoint.touch()
    if command == "bench":
        import annotated_transformer.lib.bench as bench

        monkeypatch.setattr(bench, "run_benchmark", stand_in)
        argv = ["bench", "--no-translation", "--out", str(tmp_path)]
    else:  # translate reads its model through the Translator, evaluate with the checkpoint it records
        import annotated_transformer.lib.pretrained as pretrained

        monkeypatch.setattr(Translator, "from_checkpoint", stand_in)
        monkeypatch.setattr(pretrained, "read_model", stand_in)
        argv = [command, "--checkpoint", str(checkpoint)]
    wanted = 1 if torch.get_num_threads() != 1 else 2
    assert main([*argv, "--threads", str(wanted)]) == 1
    assert seen == [wanted] and capsys.readouterr().err == "annotated-transformer: error: stopped here\n"
    assert main(["prepare", "wmt14-en-de", "--threads", "2"]) == 2  # prepare computes nothing with PyTorch
    assert "unrecognized arguments: --threads 2" in capsys.readouterr().err


def test_after_one_sigterm_the_next_ones_are_ignored():
    "The handler that turns SIGTERM into an interruption stands down at once: a second signal cannot break the stop."
    import signal

    from annotated_transformer import cli

    previous = signal.signal(signal.SIGTERM, cli._on_sigterm)
    try:
        with pytest.raises(KeyboardInterrupt):
            cli._on_sigterm(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
