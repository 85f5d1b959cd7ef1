"""Faults a training run meets in real use, injected on purpose: processes killed (SIGKILL) or stopped (SIGTERM) at
awkward moments, two trainings into one folder, run files damaged by a crash, a finished run resumed. Each test
shows that nothing the user made is lost, mixed up or left half-written, and that every failure reads as one line.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from annotated_transformer.cli import main
from annotated_transformer.lib.checkpoints import CheckpointError, list_checkpoints, load_checkpoint
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.runs import RunDir
from annotated_transformer.lib.trainer import train

# The copy recipe at its smallest: a few seconds on a CPU, with three evaluations and three checkpoints.
SETTINGS = {"N": 1, "d_model": 32, "d_ff": 64, "steps": 24, "warmup": 10, "eval_every": 8, "checkpoint_every": 8}
TINY = RECIPES["copy"].replace(**SETTINGS)
WORDS = [f"{key}={value}" for key, value in SETTINGS.items()]

# A training started from the command line in its own process. `where` makes it stall at a chosen moment (after
# writing a marker file, so that the test knows it is there): in the final evaluation, or halfway through writing
# the checkpoint of update 16.
TRAINER = """
import sys, time
from pathlib import Path
import torch
import annotated_transformer.lib.tasks as tasks
import annotated_transformer.lib.trainer as trainer
from annotated_transformer.cli import main

marker, where, out, *words = sys.argv[1:]

def stall(message):
    Path(marker).write_text(message)
    time.sleep(600)

if where == "evaluation":
    tasks.copy_exact_match = lambda *args, **kwargs: stall("evaluating")
elif where == "checkpoint":
    save = torch.save
    def half_save(state, f, *args, **kwargs):
        if state["step"] == 16:
            f.write(b"the first half of a checkpoint")
            f.flush()
            stall("writing")
        return save(state, f, *args, **kwargs)
    torch.save = half_save
else:
    trainer.token_batches = lambda *args, _real=trainer.token_batches, **kwargs: (
        Path(marker).write_text("training"), _real(*args, **kwargs))[1]
sys.exit(main(["train", "copy", "--out", out, "--quiet", *words]))
"""


def start_trainer(tmp_path, where: str, out: Path, *words: str) -> tuple[subprocess.Popen, Path]:
    "Start TRAINER in a process of its own and wait until it reaches `where`."
    marker = tmp_path / f"reached-{where}"
    # the same threads as this process (inherited), so that its numbers are those of a run in this process
    process = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(marker), where, str(out), *words],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300  # generous: the machine may be busy
    while not marker.exists():
        if process.poll() is not None:
            pytest.fail(f"the training process ended early: {process.communicate()[1]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the training process never reached " + where)
        time.sleep(0.1)
    return process, marker


def temporaries(run: Path) -> list[str]:
    return sorted(p.name for p in run.rglob("*.tmp"))


def weights(run: Path) -> dict:
    return load_checkpoint(list_checkpoints(run)[-1])["model"]


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    "The tiny recipe trained without interruption: what every interrupted run must end as."
    run = tmp_path_factory.mktemp("straight") / "run"
    train(TINY, run, device="cpu", progress=False)
    return run


# ---- Item 2: a finished run, and a run killed during its final evaluation ---------------------------------------


def test_resuming_a_finished_run_changes_nothing(tmp_path, straight, capsys):
    run = tmp_path / "run"
    train(TINY, run, device="cpu", progress=False)
    summary = json.loads((run / "summary.json").read_text())
    summary["evaluation"] = {"test": {"bleu": 12.3, "steps": 24}}  # as `evaluate` adds it
    (run / "summary.json").write_text(json.dumps(summary))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train(TINY, run, device="cpu", progress=True, resume=True) == summary
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert (
        capsys.readouterr().err == "copy: finished its 24 updates already: nothing to do (a larger steps= trains on)\n"
    )
    # asked for more updates, the finished run trains on from where it ended
    more = train(TINY.replace(steps=32), run, device="cpu", progress=False, resume=True)
    assert more["steps"] == 32 and more["finished"] and more["final"]["step"] == 32
    assert more["evaluation"] == summary["evaluation"]  # an evaluation recorded before is kept (it names its update)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [8, 16, 24, 32]


def test_a_run_killed_during_its_final_evaluation_resumes_with_the_evaluation_alone(tmp_path, straight):
    run = tmp_path / "run"
    process, _ = start_trainer(tmp_path, "evaluation", run, *WORDS)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run / "summary.json").exists() and list_checkpoints(run)[-1].name == "step-000024.pt"
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "config.json"}
    summary = train(TINY, run, device="cpu", progress=False, resume=True)
    assert {p: p.read_bytes() for p in files} == files  # no update trained again, no metrics logged again
    assert summary["finished"] and summary["steps"] == 24 and summary["final"]["step"] == 24
    assert summary["exact_match"] == json.loads((straight / "summary.json").read_text())["exact_match"]


# ---- Items 3 and 4: two trainings into one folder; SIGTERM; temporaries of dead writers -------------------------


def test_a_second_training_into_a_busy_folder_is_refused_and_sigterm_stops_like_ctrl_c(tmp_path, capsys):
    run = tmp_path / "run"
    first, _ = start_trainer(tmp_path, "training", run, *WORDS, "steps=100000")
    try:
        for words in ([], ["--resume"]):
            assert main(["train", "copy", "--out", str(run), "--quiet", *WORDS, *words]) == 1
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{run} is in use: another process is training into it" in err
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 143
    assert err.strip().splitlines()[-1] == (
        f"annotated-transformer: stopped by SIGTERM; continue with: annotated-transformer train --out {run} --resume"
    )
    assert temporaries(run) == []
    log = run / "metrics.jsonl"  # one run's log, whole lines only (if it got as far as its first evaluation)
    for line in log.read_text().splitlines() if log.exists() else []:
        json.loads(line)
    with RunDir(run):  # the lock went with the process: the folder is free again
        pass


@pytest.mark.parametrize("where", ["training", "checkpoint"])
def test_two_sigterms_half_a_millisecond_apart_stop_the_run_once(where, tmp_path):
    "As a supervisor may send them: the second must not break the clean stop that the first began."
    run = tmp_path / "run"
    process, _ = start_trainer(tmp_path, where, run, *WORDS, "steps=100000")
    process.send_signal(signal.SIGTERM)
    time.sleep(0.0005)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("annotated-transformer: stopped by SIGTERM")
    assert temporaries(run) == []


def test_sigterm_during_a_checkpoint_write_leaves_no_temporary_file(tmp_path):
    run = tmp_path / "run"
    process, _ = start_trainer(tmp_path, "checkpoint", run, *WORDS)
    assert len(temporaries(run)) == 1  # the write is under way
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143 and "stopped by SIGTERM" in err and "Traceback" not in err
    assert temporaries(run) == [] and [p.name for p in list_checkpoints(run)] == ["step-000008.pt"]


def test_the_temporary_file_of_a_writer_killed_mid_write_is_removed_on_resume(tmp_path, straight):
    run = tmp_path / "run"
    process, _ = start_trainer(tmp_path, "checkpoint", run, *WORDS)
    process.send_signal(signal.SIGKILL)
    process.wait()
    left = temporaries(run)
    assert left == [f".step-000016.pt.{process.pid}.tmp"]  # what SIGKILL leaves: nothing can clean up
    mine = run / "checkpoints" / f".step-000099.pt.{os.getpid()}.tmp"  # a living process's write: not touched
    mine.write_bytes(b"in progress")
    assert main(["train", "copy", "--out", str(run), "--quiet", "--resume"]) == 0
    assert temporaries(run) == [mine.name]
    assert same_weights(weights(run), weights(straight))


# ---- Item 5: damaged run files -----------------------------------------------------------------------------------


def interrupted(tmp_path, stop: int = 20) -> Path:
    run = tmp_path / "run"
    train(TINY, run, device="cpu", progress=False, stop_after=stop)
    return run


def test_a_torn_last_line_of_the_log_is_dropped_and_the_run_resumes_exactly(tmp_path, straight):
    run = interrupted(tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 24, "epoch": 3, "train_lo')  # the process died in the middle of this line
    with pytest.warns(RuntimeWarning, match="metrics.jsonl: its last line was cut short; dropped"):
        train(TINY, run, device="cpu", progress=False, resume=True)
    assert same_weights(weights(run), weights(straight))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [8, 16, 24]


def test_a_damaged_line_inside_the_log_is_an_error_naming_the_file_and_line(tmp_path):
    run = interrupted(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(["{oops", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 1: not valid JSON"):
        train(TINY, run, device="cpu", progress=False, resume=True)


@pytest.mark.parametrize("damage", ["cut short", "a bit of Adam's state"])
def test_a_damaged_newest_checkpoint_is_set_aside_and_an_older_one_resumed(damage, tmp_path, straight):
    run = interrupted(tmp_path)
    newest = list_checkpoints(run)[-1]
    assert newest.name == "step-000020.pt"
    if damage == "cut short":  # as by a full disk without atomic writes
        newest.write_bytes(newest.read_bytes()[:5000])
        reason = "not a readable checkpoint"
    else:  # a bit flipped where only resuming would notice: the weights are intact
        state = torch.load(newest, weights_only=True)
        state["optimizer"]["state"][0]["exp_avg_sq"].view(-1).view(torch.int32)[0] ^= 1
        torch.save(state, newest)
        reason = "what it holds does not match its digest"
    with pytest.warns(RuntimeWarning, match=f"step-000020.pt: {reason}.*set aside"):
        train(TINY, run, device="cpu", progress=False, resume=True)
    assert (run / "checkpoints" / "step-000020.pt.damaged").exists()  # kept for the user, out of the way
    assert same_weights(weights(run), weights(straight))


@pytest.mark.parametrize("fault", ["another format", "out of memory", "a failing disk"])
def test_an_intact_checkpoint_that_cannot_be_used_stops_the_resume_and_is_left_alone(fault, tmp_path, monkeypatch):
    "Only damaged files are set aside: a whole checkpoint of another format, or a read that failed, stops the run."
    run = interrupted(tmp_path)
    newest = list_checkpoints(run)[-1]
    if fault == "another format":  # as another version of the package would write it
        state = torch.load(newest, weights_only=True)
        torch.save({**state, "format": "checkpoint 4"}, newest)
    else:
        error = MemoryError("out of memory") if fault == "out of memory" else OSError(5, "Input/output error")

        def failing_load(*args, **kwargs):
            raise error

        monkeypatch.setattr(torch, "load", failing_load)
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    log = (run / "metrics.jsonl").read_bytes()
    message = (
        "a checkpoint file of version 4, newer than this package reads \\(up to 3\\)"
        if fault == "another format"
        else ("could not be read .*; the file is left as it is")
    )
    with pytest.raises(CheckpointError, match=rf"step-000020.pt: {message}"):
        train(TINY, run, device="cpu", progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before  # nothing renamed or rewritten
    assert (run / "metrics.jsonl").read_bytes() == log  # and the history kept


def test_files_that_are_not_the_runs_own_are_ignored(tmp_path, straight):
    run = interrupted(tmp_path)
    (run / "checkpoints" / "step-final.pt").write_bytes(b"a copy made by hand")
    (run / "checkpoints" / "notes.txt").write_text("mine")
    train(TINY, run, device="cpu", progress=False, resume=True)
    assert same_weights(weights(run), weights(straight))
    assert (run / "checkpoints" / "step-final.pt").exists() and (run / "checkpoints" / "notes.txt").exists()


def test_a_damaged_config_is_named_in_the_error(tmp_path, capsys):
    run = interrupted(tmp_path)
    (run / "config.json").write_text('{"recipe": {"name": "co')
    assert main(["train", "copy", "--out", str(run), "--quiet", "--resume"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json: damaged, not valid JSON" in err


def test_resume_takes_the_runs_own_settings_and_names_a_differing_one(tmp_path, straight, capsys):
    run = interrupted(tmp_path, stop=12)
    assert main(["train", "copy", "--out", str(run), "--quiet", "--resume", "d_model=64", "seed=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        "config.json: a resumed run keeps its settings, and these differ: d_model=64 (the run has 32), seed=3 (the "
        "run has 0); only steps may grow" in err
    )
    assert main(["train", "copy", "--out", str(run), "--quiet", "--resume", "steps=24"]) == 0  # the same value
    assert same_weights(weights(run), weights(straight))


def test_a_run_stopped_before_its_first_checkpoint_starts_again_on_resume(tmp_path, straight):
    run = interrupted(tmp_path, stop=8)
    (run / "checkpoints" / "step-000008.pt").unlink()  # as if stopped while writing its first checkpoint
    with pytest.warns(RuntimeWarning, match="no checkpoint to resume from; the run starts again from its first update"):
        train(TINY, run, device="cpu", progress=False, resume=True)
    assert same_weights(weights(run), weights(straight))
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [8, 16, 24]


def test_a_cpu_run_resumed_with_another_thread_count_is_refused_naming_both(tmp_path):
    "The thread count changes the order of float sums: resumed with another, a run would not continue exactly."
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run = interrupted(tmp_path)
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match=r"trained with 1 CPU threads, and this process has 2; .*--threads 1"):
            train(TINY, run, device="cpu", progress=False, resume=True)
        torch.set_num_threads(1)
        assert train(TINY, run, device="cpu", progress=False, resume=True)["finished"]
    finally:
        torch.set_num_threads(before)
