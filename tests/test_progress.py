"""What a training run shows and records about itself (`annotated_transformer.lib.progress`, and what `lib.trainer` records): the CPU threads
in config.json, a progress bar on a terminal and one line per evaluation elsewhere, progress while data is read, and
TensorBoard event files holding the numbers of metrics.jsonl."""

import contextlib
import io
import json
import sys

import pytest
import torch

from annotated_transformer.lib import runs, tokenizers, trainer
from annotated_transformer.lib.checkpoints import list_checkpoints
from annotated_transformer.lib.files import read_json
from annotated_transformer.lib.progress import ProgressReport, progress_shown, with_progress
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.runs import RunDir
from annotated_transformer.lib.tasks import copy_data
from annotated_transformer.lib.trainer import train

# The copy recipe at its smallest: a few seconds on a CPU, with three evaluations (8, 16, 24) and three checkpoints.
TINY = RECIPES["copy"].replace(N=1, d_model=32, d_ff=64, steps=24, warmup=10, eval_every=8, checkpoint_every=8)
NUMBERS = ("epoch", "train_loss", "valid_loss", "valid_ppl", "lr", "tokens_per_s", "elapsed_s")


class Terminal(io.StringIO):
    "A stderr that says it is a terminal, and keeps what is written to it."

    def isatty(self) -> bool:
        return True


def on_a_terminal():
    "Within the block, stderr is a `Terminal` (set in the test itself: pytest restores its own stderr between phases)."
    return contextlib.redirect_stderr(Terminal())


@pytest.fixture
def one_thread():
    "PyTorch set to one CPU thread for the test, then back to what it was."
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def metrics_of(run) -> list[dict]:
    return read_json(run / "metrics.jsonl", lines=True)


# --- threads ---------------------------------------------------------------------------------------------------------


def test_config_records_the_threads_a_run_used(tmp_path, one_thread, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train(TINY, tmp_path / "run", device="cpu", progress=False)
    config = read_json(tmp_path / "run" / "config.json")
    assert config["threads"] == 1 and config["OMP_NUM_THREADS"] == "1"


def test_config_records_the_thread_count_of_the_moment_and_omp_num_threads_only_when_set(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        RunDir(tmp_path).start(TINY, torch.device("cpu"), 1, 1, resume=False)
    finally:
        torch.set_num_threads(before)
    config = read_json(tmp_path / "config.json")
    assert config["threads"] == 2 and "OMP_NUM_THREADS" not in config


# --- bf16 autocast ----------------------------------------------------------------------------------------------------


@pytest.fixture
def autocast_seen(monkeypatch):
    "The `autocast` argument of every `accumulate_gradients` call that `train` makes, in order."
    seen, real = [], trainer.accumulate_gradients
    monkeypatch.setattr(trainer, "accumulate_gradients", lambda *args: seen.append(args[3]) or real(*args))
    return seen


def test_a_bf16_run_is_recorded_as_one_and_resumes_exactly_in_bf16(tmp_path, autocast_seen):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(TINY, whole, device="cpu", progress=False, bf16=True)
    assert read_json(whole / "config.json")["bf16_autocast"] is True and set(autocast_seen) == {True}
    train(TINY, parts, device="cpu", progress=False, bf16=True, stop_after=8)
    with pytest.raises(ValueError, match="trained with bf16 autocast, .* resume without --no-bf16"):
        train(TINY, parts, device="cpu", progress=False, resume=True, bf16=False)
    autocast_seen.clear()
    train(TINY, parts, device="cpu", progress=False, resume=True)  # not said: as the run did
    assert set(autocast_seen) == {True} and read_json(parts / "config.json")["bf16_autocast"] is True
    losses = [[(m["step"], m["train_loss"], m["valid_loss"]) for m in metrics_of(run)] for run in (whole, parts)]
    assert losses[0] == losses[1]  # interrupted and resumed, the same numbers as without a break
    train(TINY, tmp_path / "f32", device="cpu", progress=False, bf16=False)
    assert [m["valid_loss"] for m in metrics_of(tmp_path / "f32")] != [v for _, _, v in losses[0]]  # it rounded


def test_a_new_run_autocasts_as_bf16_by_default_says_and_a_run_without_a_checkpoint_may_change(
    tmp_path, autocast_seen, monkeypatch
):
    for default in (True, False):
        monkeypatch.setattr(runs, "bf16_by_default", lambda device, default=default: default)
        autocast_seen.clear()
        train(TINY.replace(steps=8), tmp_path / str(default), device="cpu", progress=False)
        assert read_json(tmp_path / str(default) / "config.json")["bf16_autocast"] is default
        assert set(autocast_seen) == {default}
    RunDir(tmp_path / "none").start(TINY, torch.device("cpu"), 1, 1, resume=False, bf16_autocast=True)
    # stopped before its first checkpoint: it starts over, so another setting is no break in the run
    assert RunDir(tmp_path / "none").bf16_autocast(torch.device("cpu"), False, resume=True) is False
    assert RunDir(tmp_path / "none").bf16_autocast(torch.device("cpu"), None, resume=True) is True  # as it began


def test_a_run_that_recorded_no_setting_resumes_as_it_trained_in_float32_on_a_cpu(tmp_path):
    train(TINY.replace(steps=8), tmp_path, device="cpu", progress=False, bf16=False)
    config = read_json(tmp_path / "config.json")
    assert config.pop("bf16_autocast") is False
    (tmp_path / "config.json").write_text(json.dumps(config))  # as runs wrote it before the setting was recorded
    assert RunDir(tmp_path).bf16_autocast(torch.device("cpu"), None, resume=True) is False
    with pytest.raises(ValueError, match="trained without bf16 autocast, .* resume without --bf16"):
        RunDir(tmp_path).bf16_autocast(torch.device("cpu"), True, resume=True)


# --- progress: lines where stderr is no terminal, a bar where it is ----------------------------------------------------


def test_without_a_terminal_a_run_prints_one_line_per_evaluation(tmp_path, capsys):
    assert not sys.stderr.isatty()
    train(TINY, tmp_path / "run", device="cpu", progress=True)
    err = capsys.readouterr().err
    metrics = metrics_of(tmp_path / "run")
    assert [m["step"] for m in metrics] == [8, 16, 24]
    assert "\r" not in err  # no bar redrawn in place
    lines = err.splitlines()
    assert lines[0] == "copy: reading the data" and lines[1].startswith("copy: data ready in ")
    assert len(lines) == 2 + len(metrics)  # and nothing else
    for line, m in zip(lines[2:], metrics, strict=True):
        assert line == (
            f"copy: step {m['step']}/24 train_loss={m['train_loss']:.3f} valid_loss={m['valid_loss']:.3f} "
            f"valid_ppl={m['valid_ppl']:.2f} lr={m['lr']:.2e} tokens_per_s={m['tokens_per_s']:.0f}"
        )


def test_a_quiet_run_prints_nothing(tmp_path, capsys):
    with on_a_terminal() as screen:
        train(TINY, tmp_path / "run", device="cpu", progress=False)
    assert screen.getvalue() == "" and capsys.readouterr().err == ""


def test_on_a_terminal_the_bar_shows_the_newest_validation_loss_and_perplexity(tmp_path):
    with on_a_terminal() as screen:
        train(TINY, tmp_path / "run", device="cpu", progress=True)
    shown, last = screen.getvalue(), metrics_of(tmp_path / "run")[-1]
    assert "\r" in shown and "| 24/24" in shown  # a bar, redrawn in place, that reached the end
    assert f"valid {last['valid_loss']:.3f} ppl {last['valid_ppl']:.2f}" in shown
    assert "train_loss=" not in shown  # no evaluation lines on a terminal


def test_a_resumed_run_s_bar_starts_where_the_run_stands(tmp_path):
    train(TINY, tmp_path / "run", device="cpu", progress=False, stop_after=16)
    with on_a_terminal() as screen:
        train(TINY, tmp_path / "run", device="cpu", progress=True, resume=True)
    shown = screen.getvalue()
    assert "| 16/24" in shown and "| 24/24" in shown and "| 0/24" not in shown and "| 1/24" not in shown


@pytest.mark.parametrize("columns", [120, 80, 60])
def test_the_bar_fits_the_terminal_with_the_validation_numbers_first(columns, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    with on_a_terminal() as screen:
        train(TINY, tmp_path / "run", device="cpu", progress=True)
    drawn = [line for line in screen.getvalue().replace("\n", "\r").split("\r") if line.startswith("copy: ")]
    assert drawn and all(len(line) <= columns for line in drawn)
    last = metrics_of(tmp_path / "run")[-1]
    validation = f"valid {last['valid_loss']:.3f} ppl {last['valid_ppl']:.2f}"
    assert "24/24" in drawn[-1] and (validation in drawn[-1]) is (columns >= 80)  # first, where it fits at all
    assert ("tok/s" in drawn[-1] and "lr " in drawn[-1]) is (columns >= 120)  # the rest where there is room
    assert "########" in drawn[-1]  # and the bar keeps its room


def test_a_resumed_run_says_after_which_update_it_continues(tmp_path, capsys):
    train(TINY, tmp_path / "run", device="cpu", progress=False, stop_after=16)
    train(TINY, tmp_path / "run", device="cpu", progress=True, resume=True)
    assert "copy: resuming after update 16 of 24\n" in capsys.readouterr().err


def test_a_valid_perplexity_too_large_for_a_float_reads_inf(capsys):
    with ProgressReport(TINY) as report:
        report.evaluation(
            {"step": 8, "train_loss": 800.0, "valid_loss": 800.0, "valid_ppl": None, "lr": 1e-3, "tokens_per_s": 10.0}
        )
    assert "valid_ppl=inf lr=1.00e-03" in capsys.readouterr().err


# --- progress while the data is read ------------------------------------------------------------------------------------


def test_data_bars_show_on_a_terminal_only_and_never_when_silenced(capsys):
    with on_a_terminal() as screen:
        assert list(with_progress(range(5), "counting")) == list(range(5))
    assert "counting:" in screen.getvalue() and "/5 [" in screen.getvalue()  # a bar, cleared when done
    with on_a_terminal() as screen, progress_shown(False):
        assert list(with_progress(range(5), "counting")) == list(range(5))
    assert screen.getvalue() == ""
    with on_a_terminal() as screen:
        assert list(with_progress(range(5), "counting again")) == list(range(5))  # the block's setting has ended
    assert "counting again" in screen.getvalue()
    assert list(with_progress(range(5), "counting")) == list(range(5))  # pytest's stderr is a file: no bar
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("progress", [True, False])
def test_train_s_progress_setting_reaches_the_data_s_bars(tmp_path, monkeypatch, progress):
    def load_task(recipe):  # a task whose data takes a pass that shows progress, as Multi30k's tokenizer does
        assert list(with_progress(range(3), "preparing the data")) == [0, 1, 2]
        return copy_data(recipe)

    monkeypatch.setattr(trainer, "load_task", load_task)
    with on_a_terminal() as screen:
        train(TINY, tmp_path / "run", device="cpu", progress=progress)
    assert ("preparing the data" in screen.getvalue()) == progress


def test_multi30k_tokenization_shows_a_bar_per_side(monkeypatch):
    pairs = [("Ein Hund läuft.", "A dog runs."), ("Zwei Katzen.", "Two cats.")]
    monkeypatch.setattr(tokenizers, "load_multi30k", lambda split, direction: pairs)
    with on_a_terminal() as screen:
        src, tgt = tokenizers.tokenized_multi30k.__wrapped__("valid", "de-en")  # past the per-process cache
    assert src == [["Ein", "Hund", "läuft", "."], ["Zwei", "Katzen", "."]] and tgt[0] == ["A", "dog", "runs", "."]
    assert "tokenizing Multi30k valid.de" in screen.getvalue() and "tokenizing Multi30k valid.en" in screen.getvalue()


# --- TensorBoard -------------------------------------------------------------------------------------------------------


def tensorboard_scalars(run) -> dict[str, list[tuple[int, float]]]:
    "The scalars of a run's TensorBoard event files, read with TensorBoard's own reader: {tag: [(step, value)]}."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def as_logged(run) -> dict[str, list[tuple[int, float]]]:
    "metrics.jsonl's numbers by name, each rounded to float32, the precision of a TensorBoard scalar."
    metrics = metrics_of(run)
    return {name: [(m["step"], torch.tensor(m[name], dtype=torch.float32).item()) for m in metrics] for name in NUMBERS}


def test_tensorboard_event_files_hold_the_numbers_of_metrics_jsonl(tmp_path):
    train(TINY, tmp_path / "run", device="cpu", progress=False, tensorboard=True)
    scalars = tensorboard_scalars(tmp_path / "run")
    assert scalars == as_logged(tmp_path / "run")
    assert [step for step, _ in scalars["valid_loss"]] == [8, 16, 24]


def test_a_resumed_run_s_tensorboard_forgets_what_came_after_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    train(TINY, run, device="cpu", progress=False, tensorboard=True, stop_after=16)
    list_checkpoints(run)[-1].unlink()  # died after logging update 16, before its checkpoint was kept
    train(TINY, run, device="cpu", progress=False, tensorboard=True, resume=True)
    scalars = tensorboard_scalars(run)
    assert scalars == as_logged(run)  # update 16 once, with the resumed run's numbers (its speed differs)
    assert [step for step, _ in scalars["tokens_per_s"]] == [8, 16, 24]


def test_without_the_tensorboard_package_the_error_names_the_extra_and_nothing_starts(tmp_path, monkeypatch):
    for module in ("tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it now fails, as where it is not installed
    with pytest.raises(ImportError) as err:
        train(TINY, tmp_path / "run", device="cpu", progress=False, tensorboard=True)
    message = str(err.value)
    assert "\n" not in message and "pip install 'annotated-transformer[tensorboard]'" in message
    assert not (tmp_path / "run").exists()
    RunDir(tmp_path / "other", writer=False, tensorboard=True)  # a process that does not write needs no TensorBoard
    train(TINY.replace(steps=8), tmp_path / "plain", device="cpu", progress=False)  # nor a run that does not ask
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())["finished"]
