"""Faults in what a run leaves on disk (book/a2_runs.ipynb, a1_data, a3_distributed): damaged or oversized
checkpoints, unsafe ones, file names read from files, the commit recorded with a result, and AT_DATA_DIR."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import annotated_transformer
from annotated_transformer import distributed, runs
from annotated_transformer.data import DataError, data_dir
from annotated_transformer.model import make_model
from annotated_transformer.runs import (
    RECIPES,
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    record_result,
    save_checkpoint,
    weights_digest,
)
from annotated_transformer.translation import average_checkpoints


def small_model(seed=0):
    torch.manual_seed(seed)
    return make_model(10, 10, N=1, d_model=16, d_ff=32, h=2)


def checkpoint_state(model):
    return {
        "config": dataclasses.asdict(model.config),
        "src_vocab": 10,
        "tgt_vocab": 10,
        "step": 1,
        "model": model.state_dict(),
    }


# The digest of the weights


def test_a_flipped_byte_inside_a_weight_tensor_is_refused(tmp_path):
    model = small_model()
    path = save_checkpoint(tmp_path / "damaged.pt", checkpoint_state(model))
    load_checkpoint(path)  # intact, it loads
    # torch.save stores each tensor's bytes as they are (uncompressed) in a member of the zip: find one and flip a bit
    weight = model.state_dict()["encoder.layers.0.feed_forward.w_1.weight"]
    raw = bytearray(path.read_bytes())
    start = raw.find(weight.numpy().tobytes())
    assert start > 0 and zipfile.ZipFile(path).testzip() is None
    raw[start + 100] ^= 0x01
    path.write_bytes(raw)
    assert not torch.equal(
        torch.load(path, weights_only=True)["model"]["encoder.layers.0.feed_forward.w_1.weight"], weight
    )
    with pytest.raises(
        CheckpointError, match=r"damaged\.pt: the weights do not match their digest: the file is damaged"
    ):
        load_checkpoint(path)


def test_the_digest_covers_names_shapes_and_types(tmp_path):
    weights = {"a": torch.arange(6.0), "b": torch.arange(6.0) + 10}
    digest = weights_digest(weights)
    assert weights_digest(dict(reversed(weights.items()))) == digest  # a fixed order, whatever the dictionary's
    assert weights_digest({"a": weights["b"], "b": weights["a"]}) != digest  # two tensors that changed places
    assert weights_digest({"a": weights["a"].reshape(2, 3), "b": weights["b"]}) != digest  # the same bytes, reshaped
    assert weights_digest({"a": weights["a"].view(torch.int32), "b": weights["b"]}) != digest  # read as another type
    model = small_model()
    assert weights_digest(model) == weights_digest(model.state_dict())  # a module or its state dict


def test_a_checkpoint_without_a_digest_still_loads(tmp_path):
    model = small_model()
    # as written before the digest: none, or the fingerprint that multi-process runs stored by an older formula
    torch.save({"format": 1, **checkpoint_state(model), "weights_digest": "0" * 64}, tmp_path / "older.pt")
    loaded, state = model_from_checkpoint(tmp_path / "older.pt")
    assert "weights_sha256" not in state
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_averaging_checks_each_file(tmp_path):
    paths = [save_checkpoint(tmp_path / f"step-{i}.pt", checkpoint_state(small_model(i))) for i in (1, 2)]
    average_checkpoints(paths)  # intact: averaged
    state = torch.load(paths[1], weights_only=True)
    state["model"]["generator.proj.bias"][0] += 1.0  # one weight changes after the digest was taken
    torch.save(state, paths[1])
    with pytest.raises(CheckpointError, match=r"step-2\.pt: the weights do not match their digest"):
        average_checkpoints(paths)


def test_processes_compare_the_digest_that_the_checkpoint_stores(monkeypatch):
    model, rng = small_model(), {"cpu": torch.get_rng_state(), "cuda": None}
    gathered = []

    def all_gather_object(out, mine):  # two processes: the other one sends `gathered[0]`
        out[:] = [mine, gathered[0]]

    monkeypatch.setattr(distributed, "rank_and_world_size", lambda: (0, 2))
    monkeypatch.setattr(distributed.dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(distributed.nn.parallel, "DistributedDataParallel", lambda model, **kwargs: model)
    gathered.append((1, 2))  # the other process read the same data
    processes = distributed.Processes(model, torch.device("cpu"), seed=0, data=(1, 2))
    gathered[0] = (rng, weights_digest(model))
    states, recorded = processes.random_states(rng, 5)
    assert recorded == {"world_size": 2} and len(states["processes"]) == 2  # save_checkpoint stores the digest
    gathered[0] = (rng, weights_digest(small_model(seed=1)))
    with pytest.raises(RuntimeError, match="copies of the model differ at update 5"):
        processes.random_states(rng, 5)
    gathered[0] = (1, 3)
    with pytest.raises(ValueError, match="the processes read different training data"):
        distributed.Processes(model, torch.device("cpu"), seed=0, data=(1, 2))


# A configuration that does not fit its weights


def test_an_oversized_configuration_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    state = checkpoint_state(small_model())
    oversized = {**state, "config": {**state["config"], "d_model": 32768}, "src_vocab": 70_000, "tgt_vocab": 70_000}
    save_checkpoint(tmp_path / "oversized.pt", oversized)
    built_on = []
    real_make_model = runs.make_model

    def make_model_watched(src_vocab, tgt_vocab, config):
        built_on.append(torch.empty(0).device.type)  # the device that factories use here
        if config.d_model == 32768 and built_on[-1] != "meta":
            raise AssertionError("the oversized model was built on a real device")
        return real_make_model(src_vocab, tgt_vocab, config)

    monkeypatch.setattr(runs, "make_model", make_model_watched)
    with pytest.raises(CheckpointError) as refused:
        model_from_checkpoint(tmp_path / "oversized.pt")
    assert str(refused.value).startswith(
        f"{tmp_path / 'oversized.pt'}: the weights do not fit the stored configuration: "
        "encoder.layers.0.self_attn.w_q.weight is of shape (16, 16) in the file but of shape (32768, 32768)"
    )
    assert built_on == ["meta"]
    built_on.clear()
    save_checkpoint(tmp_path / "fits.pt", state)
    model_from_checkpoint(tmp_path / "fits.pt")  # a configuration that fits: checked on "meta", then built
    assert built_on == ["meta", "cpu"]


def test_a_configuration_claiming_a_huge_sinusoid_table_is_refused(tmp_path, monkeypatch):
    "The sinusoid table is the one tensor that no checkpoint stores, so the shapes cannot bound it: a limit does."
    state = checkpoint_state(small_model())
    save_checkpoint(tmp_path / "long.pt", {**state, "config": {**state["config"], "max_len": 10**9}})
    real_make_model = runs.make_model

    def only_on_meta(*args):
        if torch.empty(0).device.type != "meta":
            pytest.fail("a model was built for real")
        return real_make_model(*args)

    monkeypatch.setattr(runs, "make_model", only_on_meta)
    with pytest.raises(CheckpointError, match=r"long.pt: the stored configuration asks for 1,000,000,000 positions"):
        model_from_checkpoint(tmp_path / "long.pt")


def test_a_missing_or_extra_tensor_is_named(tmp_path):
    state = checkpoint_state(small_model())
    weights = dict(state["model"])
    del weights["generator.proj.bias"]
    save_checkpoint(tmp_path / "missing.pt", {**state, "model": weights})
    with pytest.raises(CheckpointError, match=r"generator\.proj\.bias is absent in the file but of shape \(10,\)"):
        model_from_checkpoint(tmp_path / "missing.pt")
    save_checkpoint(tmp_path / "extra.pt", {**state, "model": {**state["model"], "spare.weight": torch.ones(3)}})
    with pytest.raises(CheckpointError, match=r"spare\.weight is of shape \(3,\) in the file but absent in a model"):
        model_from_checkpoint(tmp_path / "extra.pt")


# Results files: names read from files, damaged files


def run_folder(tmp_path, name="multi30k-tiny"):
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    recipe = {**RECIPES["multi30k-tiny"].to_dict(), "name": name}
    (run_dir / "config.json").write_text(json.dumps({"recipe": recipe, "device": "cpu"}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "train_loss": 3.0, "valid_loss": 3.5}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": 10, "wall_time_s": 2.0}))
    return run_dir


def evaluation(**changes):
    return {"split": "test", "direction": "de-en", "bleu": 20.0, "hypotheses": ["A dog."], "variant": "", **changes}


def files_in(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_results_file_name_from_a_file_is_never_a_path(tmp_path):
    run_dir = run_folder(tmp_path, name="../../escaped")
    results = tmp_path / "a" / "b" / "results"
    before = files_in(tmp_path)
    with pytest.raises(ValueError, match=r"run/config\.json: the recipe name '\.\./\.\./escaped' is not a plain name"):
        record_result(run_dir, evaluation(), results)
    assert files_in(tmp_path) == before  # nothing written, inside the results folder or out of it
    run_dir = run_folder(tmp_path / "plain")
    for change, setting in (
        ({"direction": "../de-en"}, "direction"),
        ({"split": "/tmp/x"}, "split"),
        ({"variant": "/../../x"}, "variant"),
    ):
        with pytest.raises(ValueError, match=f"the evaluation: the {setting} "):
            record_result(run_dir, evaluation(**change), results)
    assert record_result(run_dir, evaluation(), results) == results / "multi30k-tiny-de-en-test.json"


@pytest.mark.parametrize("damaged", ["config.json", "summary.json", "metrics.jsonl"])
def test_a_damaged_run_file_is_named(tmp_path, damaged):
    run_dir = run_folder(tmp_path)
    (run_dir / damaged).write_bytes(b'{"recipe": {"na')  # cut short
    with pytest.raises(ValueError, match=rf"run/{damaged}: damaged, not valid JSON"):
        record_result(run_dir, evaluation(), tmp_path / "results")


# The commit recorded with a result


def commit_seen_from(package_parent: Path) -> str:
    "What `commit()` returns in a fresh Python whose `annotated_transformer` is the copy in `package_parent`."
    shutil.copytree(
        Path(annotated_transformer.__file__).parent,
        package_parent / "annotated_transformer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(package_parent), "OMP_NUM_THREADS": "1"}
    script = "import annotated_transformer.runs as r; print(r.__file__); print(r.commit())"
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=package_parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    where, found = out.stdout.split()
    assert Path(where).parent == package_parent / "annotated_transformer"  # the copy, not this checkout
    return found


def git_repository(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("someone else's project\n")
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    return folder


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_is_recorded_only_from_this_projects_checkout(tmp_path):
    other = git_repository(tmp_path / "other")
    assert commit_seen_from(other / "venv" / "site-packages") == "None"  # installed inside someone's repository
    assert commit_seen_from(other) == "None"  # at the top of a repository that is not this project
    ours = git_repository(tmp_path / "ours")
    (ours / "book").mkdir()
    (ours / "book" / "a2_runs.ipynb").write_text("{}\n")
    (ours / "pyproject.toml").write_text('[project]\nname = "annotated-transformer"\n')
    subprocess.run(["git", "-C", str(ours), "add", "-A"], check=True)
    git = ["git", "-C", str(ours), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "commit", "-qm", "the project"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert commit_seen_from(ours) == head  # the project's checkout (the package's copy is not tracked: not dirty)


# AT_DATA_DIR


def test_an_unusable_data_dir_names_the_variable(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "a-file"))
    with pytest.raises(DataError, match=r"^AT_DATA_DIR=.*a-file: is a file, not a folder; set AT_DATA_DIR to a folder"):
        data_dir()
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(DataError, match=r"^AT_DATA_DIR=.*a-file/cache: cannot be made \(.*\); set AT_DATA_DIR to"):
        data_dir()
    monkeypatch.setenv("AT_DATA_DIR", str(tmp_path / "cache"))
    assert data_dir() == tmp_path / "cache" and data_dir().is_dir()  # a usable folder: made when first needed


def test_a_read_only_data_dir_can_still_be_read(tmp_path, monkeypatch):
    "A shared, filled data folder that this user may only read (common on clusters) is not refused."
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o500)
    monkeypatch.setenv("AT_DATA_DIR", str(shared))
    assert data_dir() == shared
