"""Checkpoints (`annotated_transformer.lib.checkpoints`): the one description of what a checkpoint holds, written
whole and read safely, its digests, the model it describes checked before it is built, and averaging."""

import dataclasses
import os
import pickle
import re
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from annotated_transformer.lib import checkpoints
from annotated_transformer.lib import processes as processes_module
from annotated_transformer.lib.checkpoints import (
    CheckpointError,
    DamagedCheckpoint,
    TrainingState,
    average_checkpoints,
    checkpoint_digest,
    list_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    weights_digest,
)
from annotated_transformer.lib.recipes import RECIPES, Task
from annotated_transformer.lib.tasks import load_task
from annotated_transformer.model import make_model
from annotated_transformer.training import make_optimizer

DATA = Path(__file__).parent / "data"


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
    with pytest.raises(CheckpointError, match=r"damaged\.pt: what it holds does not match its digest: the file is dam"):
        load_checkpoint(path)


def small_run_checkpoint(path):
    "A checkpoint as `train` writes it: model, recipe, optimizer with its moments, schedule, random state."
    from annotated_transformer.lib.checkpoints import TrainingState, training_checkpoint

    recipe = RECIPES["copy"].replace(N=1, d_model=16, d_ff=32, h=2)
    task = load_task(recipe)
    model = make_model(task.src_vocab, task.tgt_vocab, N=1, d_model=16, d_ff=32, h=2)
    optimizer = torch.optim.Adam(model.parameters())
    sum(p.square().sum() for p in model.parameters()).backward()
    optimizer.step()  # so that Adam has moments
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = TrainingState(step=1)
    rng = {"cpu": torch.get_rng_state(), "cuda": None}
    return save_checkpoint(path, training_checkpoint(recipe, task, model, optimizer, scheduler, state, rng))


def change_adam(state):  # one bit of one of Adam's moments
    moment = state["optimizer"]["state"][0]["exp_avg"]
    moment.view(-1).view(torch.int32)[0] ^= 1


@pytest.mark.parametrize(
    "change",
    [
        change_adam,
        lambda state: state["config"].update(h=1),  # a configuration that lies without changing any shape
        lambda state: state["recipe"].update(lr=2.0),
        lambda state: state["scheduler"].update(last_epoch=7),
        lambda state: state["rng"]["cpu"].__setitem__(0, state["rng"]["cpu"][0] ^ 1),
        lambda state: state.update(position=3),
        lambda state: state.pop("sha256"),  # the digest deleted: not a way round it
        lambda state: state.pop("weights_sha256"),
    ],
    ids=["adam", "config", "recipe", "scheduler", "rng", "position", "no digest", "no fingerprint"],
)
def test_one_digest_covers_everything_a_resume_relies_on(change, tmp_path):
    path = small_run_checkpoint(tmp_path / "step-000001.pt")
    state = load_checkpoint(path)  # intact, it loads
    assert state["format"] == "checkpoint 3" and state["sha256"] == checkpoint_digest(state)
    change(state)
    torch.save(state, path)
    with pytest.raises(
        DamagedCheckpoint,
        match=r"step-000001.pt: (what it holds does not match its digest|"
        r"incomplete checkpoint, missing sha256)",
    ):
        load_checkpoint(path)


def test_the_checkpoint_digest_tells_types_and_orders_apart():
    state = {"a": 1, "b": [1.0, "x"], "c": {0: torch.arange(3)}}
    digest = checkpoint_digest(state)
    assert checkpoint_digest(dict(reversed(state.items()))) == digest  # keys in a fixed order
    assert checkpoint_digest({**state, "sha256": "anything"}) == digest  # not itself
    for other in (
        {"a": 1.0},
        {"a": True},
        {"a": "1"},
        {"b": ["x", 1.0]},
        {"c": {0: torch.arange(3.0)}},
        {"c": {"0": torch.arange(3)}},
        {"c": {0: torch.arange(3).reshape(1, 3)}},
    ):
        assert checkpoint_digest({**state, **other}) != digest, other
    with pytest.raises(TypeError, match="not set"):
        checkpoint_digest({"a": {1, 2}})


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
    with pytest.raises(CheckpointError, match=r"step-2\.pt: what it holds does not match its digest"):
        average_checkpoints(paths)


def test_processes_compare_the_digest_that_the_checkpoint_stores(monkeypatch):
    model, rng = small_model(), {"cpu": torch.get_rng_state(), "cuda": None}
    gathered = []

    def all_gather_object(out, mine):  # two processes: the other one sends `gathered[0]`
        out[:] = [mine, gathered[0]]

    monkeypatch.setattr(processes_module, "rank_and_world_size", lambda: (0, 2))
    monkeypatch.setattr(processes_module.dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(processes_module.nn.parallel, "DistributedDataParallel", lambda model, **kwargs: model)
    gathered.append((1, 2))  # the other process read the same data
    processes = processes_module.Processes(model, torch.device("cpu"), seed=0, data=(1, 2))
    gathered[0] = (rng, weights_digest(model))
    states, recorded = processes.random_states(rng, 5)
    assert recorded == {"world_size": 2} and len(states["processes"]) == 2  # save_checkpoint stores the digest
    gathered[0] = (rng, weights_digest(small_model(seed=1)))
    with pytest.raises(RuntimeError, match="copies of the model differ at update 5"):
        processes.random_states(rng, 5)
    gathered[0] = (1, 3)
    with pytest.raises(ValueError, match="the processes read different training data"):
        processes_module.Processes(model, torch.device("cpu"), seed=0, data=(1, 2))


def test_an_oversized_configuration_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    state = checkpoint_state(small_model())
    oversized = {**state, "config": {**state["config"], "d_model": 32768}, "src_vocab": 70_000, "tgt_vocab": 70_000}
    save_checkpoint(tmp_path / "oversized.pt", oversized)
    built_on = []
    real_make_model = checkpoints.make_model

    def make_model_watched(src_vocab, tgt_vocab, config, **options):
        built_on.append(torch.empty(0).device.type)  # the device that factories use here
        if config.d_model == 32768 and built_on[-1] != "meta":
            raise AssertionError("the oversized model was built on a real device")
        return real_make_model(src_vocab, tgt_vocab, config, **options)

    monkeypatch.setattr(checkpoints, "make_model", make_model_watched)
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
    real_make_model = checkpoints.make_model

    def only_on_meta(*args, **options):
        if torch.empty(0).device.type != "meta":
            pytest.fail("a model was built for real")
        return real_make_model(*args, **options)

    monkeypatch.setattr(checkpoints, "make_model", only_on_meta)
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


def test_a_file_that_is_no_checkpoint_says_what_a_checkpoint_is(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("hello, this is no checkpoint\n")
    with pytest.raises(
        CheckpointError,
        match=r"notes.pt: not a checkpoint: a checkpoint is a file that torch.save "
        r"writes .* starts with b'hell'",
    ):
        load_checkpoint(text)
    empty = tmp_path / "empty.pt"
    empty.touch()
    with pytest.raises(CheckpointError, match="empty.pt: not a readable checkpoint"):  # cut short, not foreign
        load_checkpoint(empty)


def test_a_run_s_checkpoint_holds_what_its_description_lists_and_resumes_from_it(tmp_path):
    from annotated_transformer.lib.checkpoints import (
        RESUME_KEYS,
        Checkpoint,
        TrainingCheckpoint,
        TrainingState,
        model_part,
        training_checkpoint,
    )

    recipe = RECIPES["copy"].replace(N=1, d_model=16, d_ff=32, h=2)
    model = make_model(13, 13, recipe.model)
    optimizer, scheduler = make_optimizer(model, 16)
    task = Task([], [], 13, 13, {"pad": 0, "bos": 1, "eos": 2, "symbols": list(range(3, 13))}, None)
    state = TrainingState(step=7, epoch=1, position=2, elapsed_s=3.5, window_loss=4.0, window_tokens=5)
    written = training_checkpoint(recipe, task, model, optimizer, scheduler, state, {"cpu": torch.get_rng_state()})
    described = set(TrainingCheckpoint.__annotations__)
    assert TrainingCheckpoint.__required_keys__ <= set(written) <= described
    assert written["config"] == recipe.to_dict()["model"] and written["recipe"] == recipe.to_dict()
    back = load_checkpoint(save_checkpoint(tmp_path / "step-000007.pt", written))
    assert RESUME_KEYS <= set(back) and TrainingState.of(back, last={}) == state
    assert sorted(model_part(back)) == [
        "config",
        "format",
        "model",
        "package_version",
        "recipe",
        "src_vocab",
        "step",
        "tgt_vocab",
        "vocab",
    ]  # a model to use, not a run to continue (nor its digest)
    assert set(Checkpoint.__required_keys__) <= set(model_part(back))


@pytest.mark.parametrize("version", [1, 2])
def test_files_written_by_earlier_versions_still_load_and_resume(version):
    """Kept in tests/data: a checkpoint of a 2-update copy run and its exported model file, as each earlier version
    wrote them; each is read as the current version (`artifacts.upgrade`)."""
    from annotated_transformer.lib.checkpoints import RESUME_KEYS, TrainingState
    from annotated_transformer.lib.pretrained import read_model

    raw = torch.load(DATA / f"checkpoint-format-{version}.pt", weights_only=True)
    assert raw["format"] == version  # as that version wrote it
    state = load_checkpoint(DATA / f"checkpoint-format-{version}.pt")
    assert state["format"] == "checkpoint 3" and RESUME_KEYS <= set(state)
    assert TrainingState.of(state, last={}).step == 2
    model, _ = model_from_checkpoint(DATA / f"checkpoint-format-{version}.pt")
    shared = read_model([DATA / f"model-format-{version}.safetensors"])
    assert shared["vocab"] == state["vocab"] and weights_digest(shared["model"]) == weights_digest(model)


def test_weights_that_are_not_finite_are_refused_before_any_decoding(tmp_path, capsys):
    "A checkpoint of a diverged run, with a valid digest: translate would run every sentence to its length limit."
    from annotated_transformer.cli import main

    state = checkpoint_state(small_model())
    weights = dict(state["model"])
    weights["generator.proj.weight"] = weights["generator.proj.weight"].clone().fill_(float("nan"))
    path = save_checkpoint(
        tmp_path / "diverged.pt", {**state, "model": weights, "vocab": {"symbols": list(range(3, 10))}}
    )
    with pytest.raises(CheckpointError, match=r"diverged.pt: its weights are not all finite numbers \(generator"):
        model_from_checkpoint(path)
    import io

    sys.stdin, stdin = io.StringIO("5 6 7\n"), sys.stdin
    try:
        assert main(["translate", "--checkpoint", str(path), "--device", "cpu"]) == 1
    finally:
        sys.stdin = stdin
    assert "its weights are not all finite numbers" in capsys.readouterr().err


class StoppedWriter:
    "A file that takes `room` bytes, then fails its write as `failure` says: a full disk, or a signal meanwhile."

    def __init__(self, room, failure):
        self.written, self.room, self.failure = 0, room, failure

    def write(self, data):
        if self.written + len(data) > self.room:
            raise self.failure
        self.written += len(data)
        return len(data)

    def flush(self):
        pass


@pytest.mark.parametrize(
    "failure, expected",
    [(OSError(28, "No space left on device"), OSError), (KeyboardInterrupt(), KeyboardInterrupt)],
    ids=["full disk", "SIGTERM"],
)
def test_a_write_that_fails_inside_torch_save_says_why(failure, expected, tmp_path, monkeypatch):
    "PyTorch's zip writer turns any failure of a write into '[enforce fail at inline_container.cc]'."
    import contextlib

    @contextlib.contextmanager
    def stopped_file(path):
        yield StoppedWriter(5000, failure)

    monkeypatch.setattr(checkpoints, "atomic_file", stopped_file)
    with pytest.raises(expected) as raised:
        save_checkpoint(tmp_path / "step-000001.pt", checkpoint_state(small_model()))
    assert "enforce fail" not in str(raised.value)
    if expected is OSError:  # the reason, and the file once
        assert raised.value.filename == str(tmp_path / "step-000001.pt") and str(raised.value).count("step-000001") == 1
        assert "not written (No space left on device); nothing was left half-written" in str(raised.value)


def test_weights_of_another_kind_of_number_are_refused_not_cast(tmp_path):
    "Loading would cast complex weights to real ones silently, dropping their imaginary parts."
    state = checkpoint_state(small_model())
    weights = dict(state["model"])
    weights["generator.proj.weight"] = weights["generator.proj.weight"].to(torch.complex64)
    path = save_checkpoint(tmp_path / "complex.pt", {**state, "model": weights})
    with pytest.raises(
        CheckpointError, match=r"complex.pt: generator.proj.weight holds values of type torch.complex64"
    ):
        model_from_checkpoint(path)


WORDS = ["<pad>", "<s>", "</s>", "<unk>", "ein", "Hund", "eine", "Katze", ".", "!"]  # the 10 ids of `small_model`


@pytest.mark.parametrize(
    "vocab, problem",
    [
        ({"symbols": [3, 4], "direction": "de"}, "has the direction 'de', not two language names"),
        ({"symbols": [3, 4], "direction": "../x-y"}, "has the direction"),
        ({"kind": "sentencepiece"}, "of subwords holds no SentencePiece model"),
        ({"kind": "sentencepiece", "model": b"not a model"}, "holds a SentencePiece model that does not load"),
        ({"kind": "words", "direction": "de-en", "src": WORDS, "tgt": WORDS[:4]}, "has 4 words for 'tgt', but the"),
        (
            {"kind": "words", "direction": "de-en", "src": ["a"] * 10, "tgt": ["a"] * 10},
            "of words for 'src' is not one",
        ),
        ({"kind": "symbols", "symbols": [3, 99]}, "of symbols lists no symbols, or symbols that are not ids"),
        ({"kind": "runes"}, "is of the kind 'runes', which this version"),
        ([1, 2], "is a list, not a mapping"),
    ],
)
def test_a_vocabulary_that_cannot_be_read_is_refused_naming_the_file(vocab, problem, tmp_path):
    path = save_checkpoint(tmp_path / "odd-vocab.pt", {**checkpoint_state(small_model()), "vocab": vocab})
    load_checkpoint(path)  # what a resume needs reads; a model to translate with is refused
    with pytest.raises(CheckpointError, match=rf"odd-vocab.pt: its vocabulary {re.escape(problem)}"):
        model_from_checkpoint(path)


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "c.pt", {"config": {}, "model": {}, "step": 1})
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"config": {}, "model": {}, "step": 2})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_a_checkpoint_from_a_stranger_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"format": 1, "config": {}, "model": Payload(), "step": 0}, protocol=2))
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert not marker.exists()
    message = str(refused.value)  # the package's own words, naming the file and what the file asked for
    assert message.startswith(f"{path}: not a readable checkpoint: it holds something other than tensors and plain")
    assert "refuses to run code" in message and re.search(r"\(it asks for \S*mkdir\)", message)
    # PyTorch's own advice (load it with weights_only=False) is neither repeated nor chained to the error
    assert "weights_only" not in message and "can still be loaded" not in message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_broken_or_foreign_checkpoints_get_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="cut.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save({"format": 99, "model": {}}, tmp_path / "strange.pt")
    with pytest.raises(CheckpointError, match="strange.pt: its format '99' is none this package writes"):
        load_checkpoint(tmp_path / "strange.pt")
    torch.save({"format": "checkpoint 4", "model": {}}, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match="future.pt: a checkpoint file of version 4, newer than this package"):
        load_checkpoint(tmp_path / "future.pt")
    torch.save({"format": 1, "model": {}}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match="missing config, src_vocab, step, tgt_vocab"):
        load_checkpoint(tmp_path / "partial.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "empty.pt")
    base = {"config": {"N": 1, "d_model": 16, "d_ff": 32, "h": 2}, "src_vocab": 10, "tgt_vocab": 10, "step": 1}
    save_checkpoint(tmp_path / "odd.pt", {**base, "config": {"N": 1, "colour": "red"}, "model": {}})
    with pytest.raises(CheckpointError, match="odd.pt: the stored configuration is not usable"):
        model_from_checkpoint(tmp_path / "odd.pt")
    save_checkpoint(
        tmp_path / "misfit.pt", {**base, "model": make_model(10, 10, N=1, d_model=32, d_ff=32, h=2).state_dict()}
    )
    with pytest.raises(CheckpointError, match="misfit.pt: the weights do not fit"):
        model_from_checkpoint(tmp_path / "misfit.pt")


def test_training_state_crosses_an_epoch_boundary_and_sums_the_window():
    state, seen = TrainingState(), []
    for batches in (2, 2, 1, 2):  # an epoch of 5 batches, 2 per update: the third update takes the one left
        state.advance(batches, 5, loss=3.0, tokens=10)
        seen.append((state.step, state.epoch, state.position))
    assert seen == [(1, 0, 2), (2, 0, 4), (3, 1, 0), (4, 1, 2)]
    assert (state.window_loss, state.window_tokens) == (12.0, 40)


def test_list_checkpoints_finds_only_the_runs_own_in_step_order(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in (
        "step-000100.pt",
        "step-000020.pt",
        "step-1000000.pt",
        "step-best.pt",
        "step-3.pt",
        "step-000040.pt.bak",
        ".step-000060.pt.4242.tmp",
        "notes.txt",
        "step-000080.pth",
    ):
        (folder / name).write_bytes(b"")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000020.pt", "step-000100.pt", "step-1000000.pt"]
    assert list_checkpoints(tmp_path / "nothing-here") == []


def test_averaging_known_checkpoints_and_refusing_different_models(tmp_path):
    model = make_model(10, 10, N=1, d_model=8, d_ff=16, h=2)
    config = {k: getattr(model.config, k) for k in model.config.__dataclass_fields__}
    paths = []
    for i, value in enumerate([1.0, -2.0, 7.0, 2.0]):
        weights = {name: torch.full_like(t, value) for name, t in model.state_dict().items()}
        paths.append(
            save_checkpoint(
                tmp_path / f"step-{i:06d}.pt",
                {
                    "config": config,
                    "model": weights,
                    "step": i,
                    "src_vocab": 10,
                    "tgt_vocab": 10,
                    "vocab": {},
                    "optimizer": {},
                    "rng": {},
                },
            )
        )
    averaged = average_checkpoints(paths)
    assert all(torch.equal(t, torch.full_like(t, 2.0)) for t in averaged["model"].values())
    assert averaged["step"] == 3 and "optimizer" not in averaged and "rng" not in averaged
    other = make_model(10, 10, N=1, d_model=16, d_ff=16, h=2)
    odd = save_checkpoint(
        tmp_path / "odd.pt",
        {"config": {**config, "d_model": 16}, "model": other.state_dict(), "step": 9, "src_vocab": 10, "tgt_vocab": 10},
    )
    with pytest.raises(Exception, match="odd.pt: its model configuration differs"):
        average_checkpoints([paths[0], odd])
