"""What a checkpoint holds (`Checkpoint`, `TrainingCheckpoint`), how it is written whole and read safely (a digest of
all it holds, checked on reading; `torch.load(weights_only=True)`), the model it describes rebuilt and checked, and a
run's checkpoints found, averaged (§6.1) and chosen."""

import dataclasses
import errno
import hashlib
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import torch
from torch import Tensor, nn

from .. import __version__
from ..decoding import average_weights
from ..model import EncoderDecoder, TransformerConfig, make_model
from .artifacts import FormatError, RunFiles, format_of, kind_of_file, stamped, upgrade
from .files import atomic_file
from .recipes import Recipe, Task, stored_recipe
from .vocab import shares_vocabulary, vocab_problem


class CheckpointError(RuntimeError):
    "A checkpoint that cannot be used: unreadable, unsafe, damaged, or written for something else."


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose bytes are damaged: cut short, not a file `torch.save` wrote, incomplete, or not matching its
    digest. A run sets such a file aside and resumes from an earlier one; any other `CheckpointError` (a file of
    another format, one that could not be read for want of memory or a failing disk) stops the resume instead."""


class Checkpoint(TypedDict):
    """A model as a checkpoint holds it, all that `model_from_state` and a `Translator` need. Every checkpoint file
    holds it; so do an average of checkpoints (`model_part`) and a shared model (`pretrained.read_model`)."""

    format: str  # "checkpoint 3" (`artifacts.FORMATS`), which `save_checkpoint` writes
    config: dict  # the model's `TransformerConfig`, as plain values
    src_vocab: int  # the vocabulary sizes
    tgt_vocab: int
    model: dict[str, Tensor]  # the weights, by name
    step: int  # the updates that trained them
    package_version: NotRequired[str]  # the package that wrote the file
    weights_sha256: NotRequired[str]  # `weights_digest(model)`: the model's fingerprint (checked in version 1 files)
    sha256: NotRequired[str]  # `checkpoint_digest` of all the rest: in every file since version 2, checked on reading
    vocab: NotRequired[dict]  # what the token ids mean (`text_codec` reads it)
    recipe: NotRequired[dict]  # the recipe that trained the model, as `Recipe.to_dict` gives it
    averaged: NotRequired[list[str]]  # of an average (§6.1): the files averaged


class TrainingCheckpoint(Checkpoint):
    """A checkpoint that a run continues from exactly: the model's part, always with its `recipe` (a resumed run
    compares it with its own), and where the run stood (`TrainingState`), as `training_checkpoint` writes it."""

    optimizer: dict  # Adam's moments and step
    scheduler: dict  # the learning-rate schedule's step
    epoch: int
    position: int
    elapsed_s: float
    window: tuple[float, int]  # the loss and tokens summed since the last evaluation
    rng: dict  # `rng_state`, or with several processes {"processes": [each one's]}
    world_size: NotRequired[int]  # the processes that trained together (absent: one)


# What resuming needs beyond the model's part: the training state's keys, and the recipe.
RESUME_KEYS = (TrainingCheckpoint.__required_keys__ - Checkpoint.__required_keys__) | {"recipe"}


@dataclass
class TrainingState:
    """Where a run stands: updates done, the epoch and the batches of it already used, time, the running loss and the
    newest evaluation."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    elapsed_s: float = 0.0
    window_loss: float = 0.0  # summed loss and tokens since the last evaluation
    window_tokens: int = 0
    last: dict = dataclasses.field(default_factory=dict)  # the newest evaluation's metrics

    def advance(self, batches: int, epoch_batches: int, loss: float, tokens: int) -> None:
        "Count one update of `batches` batches out of an epoch of `epoch_batches`, with its summed loss and tokens."
        self.step, self.position = self.step + 1, self.position + batches
        if self.position >= epoch_batches:
            self.epoch, self.position = self.epoch + 1, 0
        self.window_loss, self.window_tokens = self.window_loss + loss, self.window_tokens + tokens

    @classmethod
    def of(cls, checkpoint: TrainingCheckpoint, last: dict) -> "TrainingState":
        "Where the run of `checkpoint` stood when it was written, `last` being its newest evaluation then."
        return cls(checkpoint["step"], checkpoint["epoch"], checkpoint["position"], checkpoint["elapsed_s"],
                   *checkpoint["window"], last=last)


def training_checkpoint(recipe: Recipe, task: Task, model: nn.Module, optimizer, scheduler, state: TrainingState,
                        rng: dict, world_size: int = 1) -> TrainingCheckpoint:
    """The checkpoint that `train` saves at update `state.step`: the model with its recipe and vocabulary, the
    optimizer and schedule, where the run stands, and the random state `rng` (`Processes.random_states`)."""
    settings = recipe.to_dict()
    return TrainingCheckpoint(
        format=stamped("checkpoint", {})["format"], config=settings["model"], recipe=settings, src_vocab=task.src_vocab,
        tgt_vocab=task.tgt_vocab, vocab=task.vocab, model=model.state_dict(), step=state.step,
        optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), epoch=state.epoch, position=state.position,
        elapsed_s=state.elapsed_s, window=(state.window_loss, state.window_tokens), rng=rng,
        **({"world_size": world_size} if world_size > 1 else {}))


def model_part(checkpoint: Checkpoint) -> Checkpoint:
    """`checkpoint` without what only resuming needs: a model to use or share, not a run to continue. Without its
    digests too: the part is made to be changed (averaged), and `save_checkpoint` and `save_pretrained` take them anew."""
    keys = Checkpoint.__required_keys__ | Checkpoint.__optional_keys__ - {"weights_sha256", "sha256"}
    return Checkpoint(**{key: value for key, value in checkpoint.items() if key in keys})


def _add_tensor(digest, label: str, t: Tensor) -> None:
    "Feed `t` to the hash `digest`: `label`, type and shape first, so that the same bytes read otherwise differ."
    t = t.detach().cpu().contiguous()
    digest.update(f"{label}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy())


def weights_digest(weights) -> str:
    """A fingerprint of a model's weights, `weights` being the model or its state dict: the sha256 of every
    tensor's name, type, shape and bytes, taken in the order of the names. Every checkpoint and model file stores
    it, and processes training together compare theirs (`Processes.random_states`)."""
    if isinstance(weights, nn.Module):
        weights = weights.state_dict()
    digest = hashlib.sha256()
    for name in sorted(weights):
        _add_tensor(digest, name, weights[name])  # the name first, so that swapped tensors change it too
    return digest.hexdigest()


def checkpoint_digest(state: dict) -> str:
    """The sha256 of everything a checkpoint holds but this digest (its key `sha256`): the weights, and with them
    the configuration, the vocabulary, the optimizer's moments, the schedule, the random states, where the run
    stood. Each value is taken with its type, dictionaries in the order of their keys; anything but tensors, bytes,
    plain values and containers of them is refused (TypeError), as `torch.load(weights_only=True)` refuses it."""
    digest = hashlib.sha256()

    def add(value) -> None:
        if isinstance(value, Tensor):
            _add_tensor(digest, "tensor", value)
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)}\0".encode())
            for key in sorted(value, key=repr):  # keys of several types (the optimizer's are numbers)
                add(key)
                add(value[key])
        elif isinstance(value, (list, tuple)):  # torch.load gives back what was stored, but a list is no tuple
            digest.update(f"list {len(value)}\0".encode())
            for item in value:
                add(item)
        elif isinstance(value, bytes):
            digest.update(f"bytes {len(value)}\0".encode() + value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            text = repr(value)  # exact for every float, and True is not 1
            digest.update(f"{type(value).__name__} {len(text)}\0{text}".encode())
        else:
            raise TypeError(f"a checkpoint holds tensors, bytes, plain values and containers of them, not {type(value).__name__}")

    add({key: value for key, value in state.items() if key != "sha256"})
    return digest.hexdigest()


def save_checkpoint(path, state: Checkpoint) -> Path:
    """Write `state` to `path` atomically (`atomic_file`), creating its folder if needed, in the current version of
    checkpoints (`artifacts.FORMATS`): with the fingerprint of its weights (`weights_digest`) and the digest of all it
    holds (`checkpoint_digest`), which `load_checkpoint` checks."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = stamped("checkpoint", {**{key: value for key, value in state.items() if key != "sha256"},
                                   "package_version": __version__, "weights_sha256": weights_digest(state["model"])})
    with atomic_file(path) as f:
        try:
            torch.save({**state, "sha256": checkpoint_digest(state)}, f)
        except RuntimeError as err:  # PyTorch's zip writer reports a failed write in its own words: give the reason
            if isinstance(err.__context__, KeyboardInterrupt):  # Ctrl-C or SIGTERM during the write: a stop, no error
                raise err.__context__ from None
            if isinstance(err.__context__, OSError):
                failed = err.__context__
                raise OSError(failed.errno, f"not written ({failed.strerror or failed}); nothing was left "
                              "half-written", str(path)) from None
            raise
    return path


# Errors of the machine rather than of a file's bytes (a cut-short file makes torch.load raise EINVAL, which is not).
_READ_FAILURES = {errno.EIO, errno.ENOMEM, errno.EACCES, errno.EPERM, errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE}


def load_checkpoint(path) -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint`, safely: `torch.load(weights_only=True)` only rebuilds
    tensors and plain containers, so a file from a stranger cannot run code, and what it holds must match the digest
    stored with it (in version 1, the digest of the weights, which the oldest files lack). A checkpoint of an earlier
    version is read as the current one (`artifacts.upgrade`). Any problem raises `CheckpointError` naming the file and
    what is wrong. (Shared models, a folder or a .safetensors file: `pretrained.read_model`.)"""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # the safe loader met something that would run code, and stopped
        asks = re.search(r"GLOBAL (\S+)", str(err))
        raise CheckpointError(f"{path}: not a readable checkpoint: it holds something other than tensors and plain "
                              f"values{f' (it asks for {asks[1]})' if asks else ''}, and this package refuses to run "
                              "code from a file; use a checkpoint written by save_checkpoint") from None
    except Exception as err:  # truncated zip, or not a torch file; or the machine failed, not the file
        if isinstance(err, MemoryError) or isinstance(err, OSError) and err.errno in _READ_FAILURES:
            raise CheckpointError(f"{path}: could not be read ({type(err).__name__}: {err}); the file is left as it "
                                  "is: free memory or mend the disk, and try again") from err
        with path.open("rb") as f:
            start = f.read(4)
        if start and not start.startswith((b"PK", b"\x80")):  # torch.save: a zip archive, or a legacy pickle
            raise DamagedCheckpoint(f"{path}: not a checkpoint: a checkpoint is a file that torch.save writes (as `train` "
                                  f"does in a run's checkpoints/ folder), and this one starts with {start!r}") from None
        reason = (str(err) or "the file ends too early").splitlines()[0]
        raise DamagedCheckpoint(f"{path}: not a readable checkpoint ({type(err).__name__}: {reason})") from err
    return _checked(path, _whole(path, state))


def _whole(path: Path, state) -> Checkpoint:
    """`state`, read from `path`, in the current version, once it is found whole as its version wrote it: since
    version 2 by the digest of all it holds, in version 1 by that of its weights where it has one. A file of another
    kind or of a newer version is a `CheckpointError`; one that does not match its digest, a `DamagedCheckpoint`."""
    try:
        current = upgrade("checkpoint", state, path)  # another kind, or a newer version: refused before any digest
    except FormatError as err:
        raise CheckpointError(f"{err}; use the version of the package that wrote it") from None
    version = format_of(state)[1]
    if version >= 2:  # first the digest: whatever differs from what was written is damage, not a choice
        if "sha256" not in state:
            raise DamagedCheckpoint(f"{path}: incomplete checkpoint, missing sha256")
        try:
            digest = checkpoint_digest(state)
        except TypeError as err:
            raise DamagedCheckpoint(f"{path}: not a checkpoint of this package: {err}") from None
        if state["sha256"] != digest:
            raise DamagedCheckpoint(f"{path}: what it holds does not match its digest: the file is damaged or was "
                                    "edited; use an earlier checkpoint of the run, or another copy of this one")
    elif "weights_sha256" in state:
        weights = _named_tensors(path, state.get("model"))
        if state["weights_sha256"] != weights_digest(weights):
            raise DamagedCheckpoint(f"{path}: the weights do not match their digest: the file is damaged; use an "
                                    "earlier checkpoint of the run, or another copy of this one")
    return current


def _named_tensors(path: Path, weights) -> dict[str, Tensor]:
    "`weights` if they are a dictionary of named tensors, as every checkpoint stores them; else `DamagedCheckpoint`."
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(t, torch.Tensor)
                                                for k, t in weights.items()):
        raise DamagedCheckpoint(f"{path}: its weights are not a dictionary of named tensors")
    return weights


def _checked(path: Path, state: Checkpoint) -> Checkpoint:
    "`state`, a checkpoint of the current version read from `path`, if it holds all a model needs; else CheckpointError."
    if missing := Checkpoint.__required_keys__ - set(state):
        raise DamagedCheckpoint(f"{path}: incomplete checkpoint, missing {', '.join(sorted(missing))}")
    _named_tensors(path, state["model"])
    if not all(isinstance(state[k], int) and not isinstance(state[k], bool) and state[k] > 0
               for k in ("src_vocab", "tgt_vocab")):
        raise CheckpointError(f"{path}: its vocabulary sizes are not positive whole numbers")
    return state


def model_from_checkpoint(path, device="cpu") -> tuple[EncoderDecoder, Checkpoint]:
    "Rebuild the model stored in a checkpoint (in eval mode, on `device`); returns (model, checkpoint state)."
    state = load_checkpoint(path)
    return model_from_state(state, path, device), state


# The one tensor a model builds that no checkpoint stores: the sinusoid table, max_len x d_model values. Bounded so
# that a stored configuration cannot make it huge (the base model's: 2.6 million values; this bound: 67 million).
_MAX_POSITION_TABLE = 2**26


def model_from_state(state: Checkpoint, path, device="cpu") -> EncoderDecoder:
    """The model whose configuration and weights `state` (a loaded checkpoint, or an average of several) holds.
    The configuration is first built on the "meta" device, which gives tensors their shapes but no memory: a
    configuration whose tensors are not the stored ones (say, one that claims a far larger model) is refused,
    naming the first tensor that differs, before anything is allocated; so is one whose sinusoid table, which no
    checkpoint stores, would be huge, and weights that are not all finite (a diverged run), which would decode
    nothing but run to the length limit."""
    shared_vocab = shares_vocabulary(state.get("vocab"))
    try:
        config = TransformerConfig(**state["config"])
        with torch.device("meta"):
            needed = make_model(state["src_vocab"], state["tgt_vocab"], config, shared_vocab=shared_vocab).state_dict()
    except (TypeError, ValueError) as err:  # a setting this version does not know, or a value it refuses
        raise CheckpointError(f"{path}: the stored configuration is not usable here ({err})") from None
    stored = state["model"]
    for name in [*needed, *(n for n in stored if n not in needed)]:
        if name not in needed or name not in stored or needed[name].shape != stored[name].shape:
            shape = [f"of shape {tuple(w[name].shape)}" if name in w else "absent" for w in (stored, needed)]
            raise CheckpointError(f"{path}: the weights do not fit the stored configuration: {name} is {shape[0]} "
                                  f"in the file but {shape[1]} in a model of that configuration")
        # loading casts: refused where the cast would lose a part of each value (complex) or make numbers of others
        if stored[name].dtype.is_complex or stored[name].is_floating_point() != needed[name].is_floating_point():
            raise CheckpointError(f"{path}: {name} holds values of type {stored[name].dtype}, and the model's are "
                                  f"{needed[name].dtype}; the file was not written for this model")
    if config.positional == "sinusoidal" and config.max_len * config.d_model > _MAX_POSITION_TABLE:
        raise CheckpointError(f"{path}: the stored configuration asks for {config.max_len:,} positions, a sinusoid "
                              f"table of {config.max_len * config.d_model:,} values that no stored weight accounts "
                              "for; refused")
    if "vocab" in state and (problem := vocab_problem(state["vocab"], state["src_vocab"], state["tgt_vocab"])):
        raise CheckpointError(f"{path}: its vocabulary {problem}; the model's ids would mean nothing")
    if bad := next((n for n, t in stored.items() if t.is_floating_point() and not torch.isfinite(t).all()), None):
        raise CheckpointError(f"{path}: its weights are not all finite numbers ({bad} holds NaN or infinity): the "
                              "run diverged before it was saved; use an earlier checkpoint of the run")
    model = make_model(state["src_vocab"], state["tgt_vocab"], config, shared_vocab=shared_vocab)
    model.load_state_dict(stored)
    return model.to(device).eval()


def list_checkpoints(run_dir) -> list[Path]:
    "The checkpoints a run wrote (`checkpoints/step-NNNNNN.pt`, `RunFiles`), oldest first; other files are not its own."
    found = [p for p in RunFiles(run_dir).checkpoints.glob("step-*.pt") if RunFiles.checkpoint_step(p) is not None]
    return sorted(found, key=RunFiles.checkpoint_step)


def checkpoints_to_average(run_dir, k: int) -> list[Path]:
    "The last `k` checkpoints of a run directory (fewer if it has fewer), oldest first: those that §6.1 averages."
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoints in {RunFiles(run_dir).checkpoints}")
    return found[-k:]


def checkpoints_to_read(paths, average: int | None = None, option: str = "average") -> tuple[list[Path], Path | None]:
    """The checkpoint files that `paths` name, and the run directory they come from (None for loose files). A run
    directory gives its last `average` checkpoints, by default as many as its recipe averages, fewer with a warning
    if it holds fewer (the warning names the setting as `option`); files, and a shared model's folder, are taken as
    they are."""
    paths = [Path(p) for p in paths]
    if len(paths) == 1 and paths[0].is_dir() and kind_of_file(paths[0] / "config.json") != "model":
        run_dir, asked = paths[0], f"{option} {average}"
        if average is None:
            config = RunFiles(run_dir).config
            average = stored_recipe(config).get("average_checkpoints", 1) if config.exists() else 1
            asked = f"the run's average_checkpoints={average}"
        found = checkpoints_to_average(run_dir, average)
        if len(found) < average:
            warnings.warn(f"{asked} asks for {average} checkpoints, but {run_dir} holds {len(found)}: "
                          f"averaging those {len(found)}", stacklevel=2)
        return found, run_dir
    if average is not None:
        raise ValueError(f"{option} needs a run directory")
    parents = {p.resolve().parent for p in paths}
    run_dir = next(iter(parents)).parent if len(parents) == 1 else None
    return paths, run_dir if run_dir is not None and RunFiles(run_dir).config.exists() else None


def average_checkpoints(paths) -> Checkpoint:
    """One checkpoint whose weights are the element-wise mean of the weights in `paths` (§6.1, `average_weights`),
    read one file at a time. The checkpoints must come from the same model (configuration, names and shapes).
    Everything else comes from the last path, except the optimizer and training-loop state: an average is a model to
    evaluate, not a run to resume. The result lists the averaged files under "averaged"."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    states = []

    def weights():
        for path in paths:
            state = load_checkpoint(path)
            if states and state["config"] != states[0]["config"]:
                raise CheckpointError(f"{path}: its model configuration differs from {paths[0]}; only checkpoints of "
                                      "one model can be averaged")
            states[:] = [states[0] if states else state, state]  # the first, for comparing, and the newest
            yield state["model"]

    try:
        averaged = average_weights(weights())
    except ValueError as err:  # "model n: ...", n counting the paths from 1, compared with model 1
        if not (about := re.fullmatch(r"model (\d+): (.*)", str(err))):  # no model at all: no path to name
            raise
        n, detail = about.groups()
        raise CheckpointError(f"{paths[int(n) - 1]}: {detail.replace('model 1', str(paths[0]))}") from None
    return {**model_part(states[-1]), "model": averaged, "averaged": [p.name for p in paths]}
