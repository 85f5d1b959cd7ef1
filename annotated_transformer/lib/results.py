"""The results files of evaluations (`record_result`): a run's scores with what makes them comparable (the recipe,
the data, the signatures, the machine, the commit, the loss curve), kept in the run's `summary.json` and in a file
under `results/`."""

import inspect
import re
import subprocess
import warnings
from pathlib import Path

import torch

from .. import __version__
from ..model import make_model
from .artifacts import RESULTS, FormatError, RunFiles, read_artifact, write_artifact
from .devices import device_name
from .files import atomic_file
from .recipes import PLAIN_NAME
from .runs import RunDir, check_writable


def commit() -> str | None:
    """The git commit of the package's source, with '-dirty' when it has uncommitted changes. None unless the
    package runs from this project's own checkout: installed, or copied into another repository, it has no commit
    of its own, and that repository's would say nothing about this code."""
    here = Path(inspect.getfile(make_model)).resolve().parent  # the package's folder, also seen from the notebook

    def git(*args):
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, check=True).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        pyproject = top / "pyproject.toml"
        ours = (top == here.parent and (top / "_toc.yml").is_file() and pyproject.is_file() and
                re.search(r'^name\s*=\s*"annotated-transformer"', pyproject.read_text(), re.M) is not None)
        if not ours:
            return None
        sha, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("-dirty" if dirty else "")


def result_path(run_dir, direction: str, split: str, variant: str = "", results_dir=RESULTS) -> Path:
    """The results file that `record_result` writes for an evaluation of the run in `run_dir`:
    `results_dir/<recipe>-<direction>-<split><variant>.json`, where `variant` names decoding other than §6.1's.
    Checked before an evaluation does any work, so that scores are never computed only to be lost: the parts of
    the name must be plain names (letters, digits, '.', '_', '-'), never paths; the run's files must read; the run
    folder and the results folder (or the folder it will be made in) must be writable. Raises an error naming the
    file otherwise."""
    run_dir, results_dir, files = Path(run_dir), Path(results_dir), RunFiles(run_dir)
    config_path = files.config
    config = read_artifact(config_path, "config")
    recipe = config.get("recipe")
    parts = {"recipe name": (config_path, recipe.get("name") if isinstance(recipe, dict) else None),
             "direction": ("the evaluation", direction), "split": ("the evaluation", split)}
    for setting, (source, value) in parts.items():  # names read from files make a file name, so they must not be paths
        if not (isinstance(value, str) and PLAIN_NAME.fullmatch(value)):
            raise ValueError(f"{source}: the {setting} {value!r} is not a plain name (letters, digits, '.', '_', '-' "
                             "and no path), and the results file is named after it; correct it")
    if not (isinstance(variant, str) and re.fullmatch(r"[A-Za-z0-9._-]*", variant)):
        raise ValueError(f"the evaluation: the variant {variant!r} may hold only letters, digits, '.', '_' and '-'")
    if not isinstance(config.get("device"), str):
        raise ValueError(f"{config_path}: names no device; the run's files are incomplete")
    if files.summary.exists():
        try:
            read_artifact(files.summary, "summary")
        except FormatError as err:
            raise ValueError(f"{err}; restore the file or train the run again") from None
    RunDir(run_dir, writer=False).logged_metrics()
    if results_dir.is_symlink() and not results_dir.exists():
        raise FileNotFoundError(f"{results_dir}: a link that loops or leads nowhere, not a folder; choose another "
                                "results folder (--results)")
    existing = next(p for p in (results_dir, *results_dir.parents) if p.exists())  # made from here when recording
    if not existing.is_dir():
        raise NotADirectoryError(f"{existing}: a file, not a folder; choose another results folder (--results)")
    for folder in (run_dir, existing):
        check_writable(folder, "the evaluation is recorded there")
    return results_dir / f"{recipe['name']}-{direction}-{split}{variant}.json"


def record_result(run_dir, evaluation: dict, results_dir=RESULTS) -> Path:
    """Record an evaluation of the run in `run_dir`: under "evaluation" in its summary.json, and as the results file
    of `result_path`, with what is needed to compare runs (recipe, data, scores with signatures, training wall time,
    device, commit, the loss curve). `evaluation["steps"]`, the update of the model scored, says which part of the
    run the file describes (by default the whole run): the loss curve and the training time stop there. The two
    files stay in step: when summary.json cannot be written, the results file is put back as it was. Returns the
    results file's path."""
    run_dir = Path(run_dir)
    variant = evaluation.get("variant", "")
    path = result_path(run_dir, evaluation["direction"], evaluation["split"], variant, results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    files = RunFiles(run_dir)
    config = read_artifact(files.config, "config")
    summary = read_artifact(files.summary, "summary") if files.summary.exists() else {}
    steps = evaluation.get("steps", summary.get("steps"))
    with warnings.catch_warnings():  # a torn last line of the log: `result_path` has said so already
        warnings.simplefilter("ignore")
        metrics = RunDir(run_dir, writer=False).logged_metrics(steps if steps is not None else float("inf"))
    if steps is not None and steps == summary.get("steps"):
        wall_time = summary.get("wall_time_s")
    else:  # a model from the middle of the run: the time its checkpoint stored, or that of an evaluation then
        logged = next((m.get("elapsed_s") for m in metrics if m["step"] == steps), None)
        wall_time = evaluation.get("training_wall_time_s", logged)
    scores = {k: v for k, v in evaluation.items() if k not in ("hypotheses", "variant")}
    result = {"recipe": config["recipe"]["name"], **scores, "steps": steps, "training_wall_time_s": wall_time,
              "device": config["device"], "threads": config.get("threads"),
              "bf16_autocast": config.get("bf16_autocast"),
              "device_name": device_name(config["device"]), "commit": commit(), "package_version": __version__,
              "torch_version": torch.__version__, "recipe_settings": config["recipe"], "metrics": metrics}
    summary.setdefault("evaluation", {})[evaluation["split"]] = {**scores, "steps": steps}
    before = path.read_bytes() if path.exists() else None
    write_artifact(path, "results", result)
    try:
        write_artifact(files.summary, "summary", summary)
    except BaseException:  # the two files stay in step: the results file as it was
        if before is None:
            path.unlink(missing_ok=True)
        else:
            with atomic_file(path) as f:
                f.write(before)
        raise
    return path
