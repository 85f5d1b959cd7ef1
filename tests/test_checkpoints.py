"""Checkpoints (`annotated_transformer.checkpoints`, book/a2_run_checkpoints.ipynb): the one description of what a
checkpoint holds, files of earlier versions, the digests of a checkpoint and of its weights, configurations that do not fit their weights,
files that are no checkpoint, and the model file to share."""

import dataclasses
import re
import json
import zipfile
from pathlib import Path

import pytest
import torch

from annotated_transformer import checkpoints, distributed
from annotated_transformer.checkpoints import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    DamagedCheckpoint,
    checkpoint_digest,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    weights_digest,
)
from annotated_transformer.model import make_model
from annotated_transformer.translation import average_checkpoints

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
    with pytest.raises(CheckpointError, match=r"damaged\.pt: what it holds does not match its digest: the file is dam"):
        load_checkpoint(path)


def small_run_checkpoint(path):
    "A checkpoint as `train` writes it: model, recipe, optimizer with its moments, schedule, random state."
    from annotated_transformer.checkpoints import TrainingState, training_checkpoint
    from annotated_transformer.recipes import RECIPES, load_task

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
    assert state["format"] == CHECKPOINT_FORMAT == 2 and state["sha256"] == checkpoint_digest(state)
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


# Files that are no checkpoint, and the model file to share


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


def small_state():
    import torch

    from annotated_transformer import make_model

    torch.manual_seed(0)
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2)  # one embedding shared by both sides and the output
    return {
        "config": model.config.__dict__,
        "src_vocab": 10,
        "tgt_vocab": 10,
        "step": 3,
        "model": model.state_dict(),
        "vocab": {"kind": "sentencepiece", "model": bytes(range(256)) * 3, "direction": "de-en"},
    }


def test_an_exported_model_file_holds_the_weights_once_and_reads_back_as_a_checkpoint(tmp_path):
    import json

    import torch
    from safetensors import safe_open

    from annotated_transformer.checkpoints import MODEL_FILE_FORMAT, export_model, weights_digest

    state = small_state()
    path = export_model(state, tmp_path / "model.safetensors")
    with safe_open(path, framework="pt") as f:  # any safetensors reader can open it: no pickle, no code
        header = {k: json.loads(v) for k, v in f.metadata().items()}
        stored = set(f.keys())
    assert header["format"] == MODEL_FILE_FORMAT and header["weights_sha256"] == weights_digest(state["model"])
    # The embedding shared by both sides and the output layer is stored once (so are other equal values: untrained
    # biases and norms), every other name an alias of it.
    assert header["aliases"]["tgt_embed.0.lut.weight"] == header["aliases"]["generator.proj.weight"] in stored
    assert not set(header["aliases"]) & stored and "vocab.model" in stored and "optimizer" not in header
    back = load_checkpoint(path)
    assert back["vocab"] == state["vocab"] and back["config"] == state["config"] and back["step"] == 3
    assert back["model"].keys() == state["model"].keys()
    assert all(torch.equal(back["model"][k], t) for k, t in state["model"].items())
    assert not list(tmp_path.glob(".*"))  # written whole or not at all


def test_a_damaged_or_foreign_model_file_is_refused_with_its_reason(tmp_path):
    import json

    import torch
    from safetensors.torch import save_file

    from annotated_transformer.checkpoints import export_model

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, foreign, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="a safetensors file, but not a model file of this package"):
        load_checkpoint(foreign)
    path = export_model(small_state(), tmp_path / "model.safetensors")
    for tensor, reason in (("src_embed.0.lut.weight", "the weights"), ("vocab.model", "the vocabulary")):
        data = bytearray(path.read_bytes())
        size = int.from_bytes(data[:8], "little")  # safetensors: the header's length, the header, then the data
        start, _ = json.loads(data[8 : 8 + size])[tensor]["data_offsets"]
        data[8 + size + start] ^= 0x01  # one bit flipped in that tensor's data
        damaged = tmp_path / "damaged.safetensors"
        damaged.write_bytes(bytes(data))
        with pytest.raises(
            CheckpointError, match=f"damaged.safetensors: {reason} do(es)? not match (their|its) digest"
        ):
            load_checkpoint(damaged)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cut.safetensors: not a readable model file"):
        load_checkpoint(cut)


@pytest.mark.parametrize(
    "change",
    [
        {"vocab": "[1, 2]"},  # not a mapping
        {"vocab": '{"model": {"bytes": ["x"]}}'},  # bytes named by a list
        {"vocab": '{"model": {"bytes": "src_embed.0.lut.weight"}}'},  # a weight passed off as vocabulary bytes
        {"aliases": '{"tgt_embed.0.lut.weight": "no.such.tensor"}'},  # shared with a tensor the file lacks
        {"aliases": "3"},
    ],
)
def test_a_model_file_whose_header_lies_about_its_tensors_is_refused(change, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from annotated_transformer.checkpoints import export_model

    path = export_model(small_state(), tmp_path / "model.safetensors")
    with safe_open(path, framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    forged = tmp_path / "forged.safetensors"
    save_file(tensors, forged, metadata={**metadata, **change})
    with pytest.raises(DamagedCheckpoint, match="forged.safetensors: its header does not match its digest"):
        load_checkpoint(forged)
    # with the header's digest taken again, as a forger could, the header is still checked against the tensors
    header = {key: json.loads(value) for key, value in {**metadata, **change}.items()}
    save_file(
        tensors, forged, metadata={**metadata, **change, "sha256": json.dumps(checkpoints._header_digest(header))}
    )
    with pytest.raises(CheckpointError, match="forged.safetensors: (a model file whose header does not describe|the)"):
        load_checkpoint(forged)


def test_a_model_file_whose_configuration_was_edited_is_refused(tmp_path):
    "A number of heads that changes no shape: the model would load, and translate otherwise."
    from safetensors import safe_open
    from safetensors.torch import save_file

    from annotated_transformer.checkpoints import export_model

    path = export_model(small_state(), tmp_path / "model.safetensors")
    with safe_open(path, framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    config = json.loads(metadata["config"])
    save_file(tensors, path, metadata={**metadata, "config": json.dumps({**config, "h": 1})})
    with pytest.raises(DamagedCheckpoint, match="model.safetensors: its header does not match its digest"):
        load_checkpoint(path)


# One description of a checkpoint, and files of earlier versions


def test_a_run_s_checkpoint_holds_what_its_description_lists_and_resumes_from_it(tmp_path):
    from annotated_transformer.checkpoints import (
        RESUME_KEYS,
        Checkpoint,
        TrainingCheckpoint,
        TrainingState,
        model_part,
        training_checkpoint,
    )
    from annotated_transformer.recipes import RECIPES, Task
    from annotated_transformer.training import make_optimizer

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


def test_files_written_by_the_first_format_still_load_and_resume():
    "Kept in tests/data: a checkpoint of a 2-update copy run and its exported model file, as format 1 wrote them."
    from annotated_transformer.checkpoints import RESUME_KEYS, TrainingState

    state = load_checkpoint(DATA / "checkpoint-format-1.pt")
    assert state["format"] == 1 and RESUME_KEYS <= set(state)
    assert TrainingState.of(state, last={}).step == 2
    model, _ = model_from_checkpoint(DATA / "checkpoint-format-1.pt")
    exported, shared = model_from_checkpoint(DATA / "model-format-1.safetensors")
    assert shared["vocab"] == state["vocab"] and weights_digest(exported) == weights_digest(model)


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
    import sys

    sys.stdin, stdin = io.StringIO("5 6 7\n"), sys.stdin
    try:
        assert main(["translate", "--checkpoint", str(path), "--device", "cpu"]) == 1
    finally:
        sys.stdin = stdin
    assert "its weights are not all finite numbers" in capsys.readouterr().err


# What stops a write, told as it is


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
