"""Runs, recipes and checkpoints (`annotated_transformer.runs`, book/a2_runs.ipynb): the messages a user gets for a
recipe file or a checkpoint that is not what it should be."""

import pytest

from annotated_transformer.runs import CheckpointError, Recipe, load_checkpoint


def test_a_recipe_file_with_unknown_settings_names_them_and_the_settings_there_are():
    with pytest.raises(
        ValueError,
        match=r"not a recipe of this version: unknown setting\(s\) stepz; recipe settings: "
        r".*\bsteps\b.*; model settings: .*\bd_model\b",
    ):
        Recipe.from_dict({"name": "copy", "task": "copy", "stepz": 3})
    with pytest.raises(ValueError, match=r"unknown setting\(s\) colour, lr \(the learning rate follows equation"):
        Recipe.from_dict({"name": "copy", "task": "copy", "lr": 1e-3, "model": {"colour": "blue"}})
    with pytest.raises(ValueError, match="not a recipe of this version .*'task'"):  # a required setting missing
        Recipe.from_dict({"name": "copy"})


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

    from annotated_transformer.runs import MODEL_FILE_FORMAT, export_model, weights_digest

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

    from annotated_transformer.runs import export_model

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

    from annotated_transformer.runs import export_model

    path = export_model(small_state(), tmp_path / "model.safetensors")
    with safe_open(path, framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    forged = tmp_path / "forged.safetensors"
    save_file(tensors, forged, metadata={**metadata, **change})
    with pytest.raises(CheckpointError, match="forged.safetensors: (a model file whose header does not describe|the)"):
        load_checkpoint(forged)
