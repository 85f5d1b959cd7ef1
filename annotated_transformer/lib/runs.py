"""The folder of one training run (`RunDir`): taken by one process at a time, its files written whole, and the run
continued exactly after an interruption from its newest good checkpoint."""

import contextlib
import json
import os
import warnings
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from .artifacts import RunFiles, read_artifact, stamped, upgrade, write_artifact
from .checkpoints import (RESUME_KEYS, CheckpointError, DamagedCheckpoint, TrainingCheckpoint, TrainingState,
                          list_checkpoints, load_checkpoint, save_checkpoint)
from .devices import bf16_by_default, set_rng_state
from .files import TEMPORARY, atomic_file
from .recipes import Recipe, stored_recipe


def _tensorboard_writer():
    "PyTorch's `SummaryWriter`, imported only when a run asks for TensorBoard; a one-line error if it cannot be."
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError("TensorBoard event files (tensorboard=True, --tensorboard) need the tensorboard package: "
                          "pip install 'annotated-transformer[tensorboard]'") from None
    return SummaryWriter


def check_writable(folder: Path, why: str) -> None:
    "Refuse, before any work, a folder this process cannot write in; `why` says what is written there."
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"{folder}: this folder cannot be written (read-only, or another user's), and {why}; "
                              "make it writable")


class RunDirBusy(RuntimeError):
    "A run directory that another process is training into, or evaluating."


def _alive(pid: int) -> bool:
    "Whether the process `pid` still runs on this machine (where that cannot be asked harmlessly: assumed so)."
    if os.name != "posix":  # on Windows os.kill would end the process
        return True
    if pid <= 0:  # not a process: 0 and negative numbers name process groups
        return False
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check that the process exists
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # it exists, but belongs to another user
        return True
    return True


class RunDir:
    """The folder of one training run: `config.json`, `metrics.jsonl`, `checkpoints/` and `summary.json` (`RunFiles`,
    each file of the current version of its kind, `artifacts.FORMATS`).

    Used as `with RunDir(path) as run:`, it takes the folder for this process: a second training into it (or an
    evaluation, which records in it) is refused while this one runs (the lock goes with the process, however it
    ends), and the temporary files of writers that died mid-write are removed. Only the process with
    `writer=True` writes; the others only read, to resume.
    With `tensorboard=True`, every line of metrics also goes to TensorBoard event files in `tensorboard/`."""

    def __init__(self, path, writer: bool = True, tensorboard: bool = False):
        self.path, self.writer = Path(path), writer
        self.files = RunFiles(self.path)
        self.metrics = self.files.metrics
        self._lock = FileLock(self.files.lock, timeout=0)
        # TensorBoard's writer class, imported at once so that a missing package stops the run before it starts
        self._tensorboard = _tensorboard_writer() if tensorboard and writer else None
        self._events, self._resumed_at = None, None  # the open event file; the update a resumed run continues from
        self._made: list[Path] = []  # the lock file and folders that entering made

    def __enter__(self) -> "RunDir":
        if not self.writer:
            return self
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"{self.path} is a file, not a run directory; choose another directory")
        # what this run makes (its lock, folders innermost first): a start that fails before writing anything
        # removes them again, leaving no folder that holds only `.lock`
        self._made = [p for p in (self.files.lock, self.path, *self.path.parents) if not p.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(f"cannot create the run directory {self.path} ({err.strerror}); choose another one") from None
        check_writable(self.path, "a run writes its files there")
        try:
            self._lock.acquire()
        except Timeout:
            raise RunDirBusy(f"{self.path} is in use: another process is training into it or evaluating it; wait "
                             "until it ends, or choose another directory") from None
        except OSError as err:  # a file system that cannot lock (some network ones): go on without the guard
            warnings.warn(f"{self.path}: cannot be locked ({err.strerror or err}); make sure no other process trains "
                          "into it", RuntimeWarning, stacklevel=2)
        for folder in (self.path, self.files.checkpoints):
            for tmp in folder.glob(".*.tmp"):
                if (match := TEMPORARY.fullmatch(tmp.name)) and not _alive(int(match[1])):
                    tmp.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._events is not None:
            self._events.close()
        lock = self.files.lock
        if self._lock.is_locked and lock in self._made and [p.name for p in self.path.iterdir()] == [".lock"]:
            lock.unlink()  # a start that failed before writing anything
            for folder in self._made[1:]:
                with contextlib.suppress(OSError):  # not empty after all: another process wrote there
                    folder.rmdir()
        if self._lock.is_locked:
            self._lock.release()

    def checkpoints(self) -> list[Path]:
        "This run's checkpoints, oldest first."
        return list_checkpoints(self.path)

    def holds_a_run(self) -> bool:
        "Whether the folder holds a run already: its metrics or its checkpoints (a start that failed leaves neither)."
        return self.metrics.exists() or bool(self.checkpoints())

    def in_use(self) -> bool:
        "Whether another process is training into the folder now: it holds the folder's lock."
        if not self.files.lock.exists():
            return False
        try:
            with FileLock(self.files.lock, timeout=0):
                return False
        except Timeout:
            return True

    def finished(self, recipe: Recipe) -> dict | None:
        "The summary of this run if it has finished, and `recipe` asks for no more updates; otherwise None."
        if not self.files.summary.exists() or not (summary := read_artifact(self.files.summary, "summary")).get("finished"):
            return None
        recipe.check_continues(stored_recipe(self.files.config), self.files.config)
        return summary if summary["steps"] >= recipe.steps else None

    def start(self, recipe: Recipe, device: torch.device, world_size: int, accum_steps: int, resume: bool, *,
              bf16_autocast: bool = False) -> None:
        """Refuse a folder that holds another run (unless resuming), then write config.json, with the CPU threads
        PyTorch uses (and `OMP_NUM_THREADS` when set) and whether the run trains in bf16 autocast, and open the
        TensorBoard event file if asked for."""
        if not resume and self.holds_a_run():
            raise FileExistsError(f"{self.path} already holds a run: resume it, or choose another directory")
        if self.writer:
            self.path.mkdir(parents=True, exist_ok=True)
            omp = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if "OMP_NUM_THREADS" in os.environ else {}
            write_artifact(self.files.config, "config", {"recipe": recipe.to_dict(), "device": str(device),
                                                         "world_size": world_size, "accum_steps": accum_steps,
                                                         "threads": torch.get_num_threads(), **omp,
                                                         "bf16_autocast": bf16_autocast})
        if self._tensorboard is not None:
            # TensorBoard hides the events from `purge_step` on: a resumed run's evaluations after its checkpoint
            purge = None if self._resumed_at is None else self._resumed_at + 1
            self._events = self._tensorboard(self.files.tensorboard, purge_step=purge)

    def bf16_autocast(self, device: torch.device, bf16: bool | None, resume: bool) -> bool:
        """Whether the run trains its forward pass in bf16 autocast: as `bf16` says, else as the run being resumed
        did (its config.json), else `bf16_by_default(device)`. A resume from a checkpoint keeps the run's setting:
        bfloat16 rounds differently from float32, so the run would not continue exactly."""
        config, recorded = self.files.config, None
        if resume and config.exists():
            # runs from before the setting was recorded autocast on every CUDA GPU that had bfloat16, emulated or not
            recorded = read_artifact(config, "config").get("bf16_autocast", device.type == "cuda" and torch.cuda.is_bf16_supported())
        if bf16 is None:
            return bf16_by_default(device) if recorded is None else recorded
        if recorded is not None and bf16 != recorded and self.checkpoints():  # without one, the run starts over
            raise ValueError(f"{config}: the run trained {'with' if recorded else 'without'} bf16 autocast, which "
                             "changes how its numbers round, so it would not continue exactly: resume without "
                             f"{'--no-bf16' if recorded else '--bf16'} (bf16=None)")
        return bf16

    def _newest_good_checkpoint(self) -> tuple[dict | None, Path | None]:
        """The newest checkpoint that loads, and its path; damaged newer ones are set aside as `*.damaged`, with a
        warning. (None, None) when there is none. A checkpoint that is whole but cannot be used here (another
        format, or a read that failed for want of memory) stops the resume, the file left as it is."""
        for path in reversed(self.checkpoints()):
            try:
                return load_checkpoint(path), path
            except DamagedCheckpoint as err:
                if self.writer:
                    path.replace(path.with_name(path.name + ".damaged"))
                warnings.warn(f"{err}; set aside as {path.name}.damaged, resuming from an older checkpoint",
                              RuntimeWarning, stacklevel=3)
        return None, None

    def _logged(self, step: float) -> list[dict]:
        """The lines of metrics.jsonl up to update `step`, each in the current version (without its `format`); a last
        line cut short by a crash is dropped."""
        lines = [line for line in self.metrics.read_text().splitlines() if line] if self.metrics.exists() else []
        kept = []
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                if number < len(lines):
                    raise ValueError(f"{self.metrics}, line {number}: not valid JSON; the file is damaged") from None
                warnings.warn(f"{self.metrics}: its last line was cut short; dropped", RuntimeWarning, stacklevel=3)
                break
            if not (isinstance(entry, dict) and isinstance(entry.get("step"), int)):
                raise ValueError(f"{self.metrics}, line {number}: not a line of metrics (no update number); the file "
                                 "is damaged")
            entry = upgrade("metrics", entry, f"{self.metrics}, line {number}")
            if entry["step"] <= step:
                kept.append({key: value for key, value in entry.items() if key != "format"})
        return kept

    def resume(self, recipe: Recipe, model, optimizer, scheduler, device, rank: int = 0,
               world_size: int = 1) -> TrainingState:
        """Restore the newest good checkpoint into the model, optimiser and schedule; returns where the run stood. A
        run stopped before its first checkpoint starts again from its first update (the model, optimiser and schedule
        are then left as they were made)."""
        state, path = self._newest_good_checkpoint()
        if state is None:
            if not self.files.config.exists():
                raise FileNotFoundError(f"nothing to resume: no run in {self.path}")
            warnings.warn(f"{self.path}: no checkpoint to resume from; the run starts again from its first update",
                          RuntimeWarning, stacklevel=2)
            if self.writer and self.metrics.exists():
                self.metrics.unlink()
            return TrainingState()
        if missing := RESUME_KEYS - set(state):
            raise CheckpointError(f"{path}: cannot resume from it, missing {', '.join(sorted(missing))}")
        recipe.check_continues(state["recipe"], path)
        if recipe.steps < state["step"]:
            raise ValueError(f"{path}: the run is at update {state['step']} already, past steps={recipe.steps}")
        if state.get("world_size", 1) != world_size:
            raise CheckpointError(f"{path}: written by {state.get('world_size', 1)} process(es); resume with as "
                                  f"many (now {world_size}), since the share of each depends on their number")
        config = self.files.config
        threads = read_artifact(config, "config").get("threads") if config.exists() else None
        if device.type == "cpu" and threads and threads != torch.get_num_threads():
            raise ValueError(f"{config}: the run trained with {threads} CPU threads, and this process has "
                             f"{torch.get_num_threads()}; the thread count changes the order of float sums, so the "
                             f"run would not continue exactly: resume with --threads {threads} (OMP_NUM_THREADS={threads})")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"]["processes"][rank] if world_size > 1 else state["rng"], device)
        kept = self._logged(state["step"])  # the evaluations after the checkpoint are forgotten: they come again
        self._resumed_at = state["step"]
        if self.writer and self.metrics.exists():
            with atomic_file(self.metrics) as f:
                f.write("".join(json.dumps(stamped("metrics", entry)) + "\n" for entry in kept).encode())
        return TrainingState.of(state, last=kept[-1] if kept else {})

    def log(self, metrics: dict) -> None:
        """Append one line of metrics, on disk before training goes on; with TensorBoard, also each of its numbers but
        the step, as a scalar of the same name at that step."""
        if self.writer:
            with open(self.metrics, "a") as f:
                f.write(json.dumps(stamped("metrics", metrics), allow_nan=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        if self._events is not None:
            for name, value in metrics.items():
                if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):  # not `format`
                    self._events.add_scalar(name, value, metrics["step"])
            self._events.flush()

    def save(self, checkpoint: TrainingCheckpoint, keep: int) -> None:
        "Write `checkpoint` as that of its update, and delete all but the newest `keep`."
        if self.writer:
            save_checkpoint(self.files.checkpoint(checkpoint["step"]), checkpoint)
            for old in self.checkpoints()[:-keep]:
                old.unlink()

    def logged_metrics(self, step: float = float("inf")) -> list[dict]:
        "The metrics logged up to update `step` (by default all); a last line cut short by a crash is left out."
        return self._logged(step)

    def finish(self, summary: dict) -> dict:
        """Write summary.json; returns the summary. The evaluations recorded in it before (`record_result`) that say
        which update they scored are kept."""
        if "evaluation" not in summary and (kept := self._evaluations()):
            summary = {**summary, "evaluation": kept}
        if self.writer:
            write_artifact(self.files.summary, "summary", summary)
        return summary

    def _evaluations(self) -> dict:
        "The evaluations that summary.json records (`record_result`) with the update they scored; {} if none."
        try:
            old = read_artifact(self.files.summary, "summary")
        except (FileNotFoundError, ValueError):  # none yet, or a damaged summary (FormatError too), which `finish` replaces
            return {}
        recorded = old.get("evaluation")
        if not isinstance(recorded, dict):
            return {}
        return {split: e for split, e in recorded.items() if isinstance(e, dict) and "steps" in e}
