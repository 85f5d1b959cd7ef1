"""Shared models (`annotated_transformer.lib.pretrained`): the model folder written whole and read back (by the model
and by the translator, with the same translations), damaged, foreign or forged folders refused with their reason,
and the single .safetensors file of earlier versions still read."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import needs_mirror

from annotated_transformer import make_model
from annotated_transformer.decoding import beam_search
from annotated_transformer.lib import pretrained
from annotated_transformer.lib.checkpoints import CheckpointError, DamagedCheckpoint, weights_digest
from annotated_transformer.lib.pretrained import Transformer, is_model_folder, read_model, save_pretrained
from annotated_transformer.lib.tokenizers import multi30k_subwords
from annotated_transformer.lib.translate import Translator

DATA = Path(__file__).parent / "data"


def small_state(vocab: dict | None = None, size: int = 10):
    torch.manual_seed(0)
    model = make_model(size, size, N=1, d_model=16, d_ff=32, h=2)  # one embedding for both sides and the output
    vocab = vocab or {"kind": "symbols", "pad": 0, "bos": 1, "eos": 2, "symbols": list(range(3, size))}
    return {
        "config": model.config.__dict__,
        "src_vocab": size,
        "tgt_vocab": size,
        "step": 3,
        "model": model.state_dict(),
        "vocab": vocab,
        "recipe": {"name": "demo"},
    }


def subword_state():
    "A model of 1,000 Multi30k subwords, and the SentencePiece model's bytes."
    model = bytes(multi30k_subwords(1000).model)
    return small_state({"kind": "sentencepiece", "model": model, "direction": "de-en"}, size=1000), model


def test_a_model_folder_holds_its_files_the_weights_once_and_reads_back(tmp_path):
    from safetensors import safe_open

    state = small_state()
    folder = save_pretrained(state, tmp_path / "model")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "model 3" and config["weights_sha256"] == weights_digest(state["model"])
    assert config["recipe"] == {"name": "demo"} and config["step"] == 3 and "optimizer" not in config
    with safe_open(folder / "model.safetensors", framework="pt") as f:  # any safetensors reader opens it
        stored, aliases = set(f.keys()), f.metadata()
    # the embedding that both sides and the output layer share is stored once, the other names pointing to it
    shared = {"src_embed.0.lut.weight", "tgt_embed.0.lut.weight", "generator.proj.weight"}
    assert len(shared & stored) == 1 and shared - stored <= set(aliases) and not set(aliases) & stored
    back = read_model([folder])
    assert back["vocab"] == state["vocab"] and back["config"] == state["config"] and back["step"] == 3
    assert back["model"].keys() == state["model"].keys()
    assert all(torch.equal(back["model"][k], t) for k, t in state["model"].items())
    assert is_model_folder(folder) and not list(tmp_path.glob(".*"))  # written whole, nothing left beside it


def test_a_subword_model_s_tokenizer_is_its_own_file_and_a_word_model_s_are_word_lists(tmp_path):
    state, model = subword_state()
    folder = save_pretrained(state, tmp_path / "s")
    assert (folder / "sentencepiece.model").read_bytes() == model
    assert json.loads((folder / "config.json").read_text())["vocab"]["model"] == {"file": "sentencepiece.model"}
    words = {
        "kind": "words",
        "direction": "de-en",
        "src": ["<pad>", "<s>", "</s>", "<unk>", *"abcdef"],
        "tgt": ["<pad>", "<s>", "</s>", "<unk>", *"uvwxyz"],
    }
    folder = save_pretrained(small_state(words), tmp_path / "w")
    assert json.loads((folder / "source.words.json").read_text()) == words["src"]
    assert read_model([folder])["vocab"] == words
    # readable by others, as any folder the user makes: shared models are meant to be passed on
    (tmp_path / "made").mkdir()
    assert folder.stat().st_mode & 0o777 == (tmp_path / "made").stat().st_mode & 0o777
    cut = (folder / "source.words.json").read_bytes()[:-5]  # cut short: named as damaged, not a bare JSON error
    (folder / "source.words.json").write_bytes(cut)
    with pytest.raises(DamagedCheckpoint, match="w: the tokenizer's files do not match their digest"):
        read_model([folder])


def test_the_model_saves_and_loads_itself_with_the_same_outputs(tmp_path):
    torch.manual_seed(1)
    model = Transformer.of(make_model(12, 12, N=2, d_model=32, d_ff=64, h=4).eval())
    assert isinstance(model, type(make_model(3, 3, N=1, d_model=8, d_ff=8, h=2))) and model.config.N == 2
    model.save_pretrained(tmp_path / "m")
    back = Transformer.from_pretrained(tmp_path / "m")
    src, tgt = torch.randint(3, 12, (2, 5)), torch.randint(3, 12, (2, 4))
    with torch.no_grad():
        torch.testing.assert_close(back(src, tgt, None, None), model(src, tgt, None, None), rtol=0, atol=0)
    assert back.generator.proj.weight is back.tgt_embed[0].lut.weight  # still one matrix
    # In evaluation mode, and still after a search, which puts back the mode it found: no dropout in later outputs.
    beam_search(back, src, torch.ones(2, 1, 5, dtype=torch.bool), extra_len=3)
    assert not any(m.training for m in back.modules()) and not any(m.training for m in model.modules())


@needs_mirror
@pytest.mark.parametrize("fixture", ["tiny_run", "tiny_subword_run"])
def test_a_translator_saved_and_read_back_translates_100_test_sentences_the_same(fixture, request, tmp_path):
    from annotated_transformer.lib.datasets import load_multi30k

    run_dir, _ = request.getfixturevalue(fixture)
    translator = Translator.from_checkpoint(run_dir, device="cpu")
    folder = translator.save_pretrained(tmp_path / "shared")
    back = Translator.from_pretrained(folder, device="cpu")
    sentences = [de for de, _ in load_multi30k("test")[:100]]
    assert back.translate(sentences) == translator.translate(sentences)
    assert back.vocab == translator.vocab and back.about["step"] == translator.about["step"]


def test_an_existing_folder_is_replaced_only_if_it_is_a_model_folder(tmp_path):
    save_pretrained(small_state(), tmp_path / "m")
    save_pretrained(small_state(), tmp_path / "m")  # an earlier model: replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine: exists and is not a model folder"):
        save_pretrained(small_state(), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="file: exists and is not a model folder"):
        save_pretrained(small_state(), tmp_path / "file")


def test_a_damaged_forged_or_foreign_folder_is_refused_with_its_reason(tmp_path):
    folder = save_pretrained(small_state(), tmp_path / "m")
    for name, reason in (("model.safetensors", "the weights do not match their digest"),):
        damaged = tmp_path / "damaged"
        shutil.copytree(folder, damaged)
        data = bytearray((damaged / name).read_bytes())
        size = int.from_bytes(data[:8], "little")  # safetensors: the header's length, the header, then the data
        data[8 + size + 5] ^= 0x01  # one bit flipped in the weights
        (damaged / name).write_bytes(bytes(data))
        with pytest.raises(DamagedCheckpoint, match=f"damaged/{name}: {reason}"):
            read_model([damaged])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format": "config 1"}))
    assert not is_model_folder(folder)  # a run's config.json: not a model folder
    (folder / "config.json").write_text(json.dumps({**config, "format": "model 9"}))
    with pytest.raises(CheckpointError, match="a model file of version 9, newer than this package reads"):
        pretrained.read_model_folder(folder)
    (folder / "config.json").write_text(json.dumps({**config, "weights_sha256": "0" * 64}))
    with pytest.raises(DamagedCheckpoint, match="the weights do not match their digest in config.json"):
        read_model([folder])


def test_a_subword_folder_whose_tokenizer_was_changed_is_refused(tmp_path):
    state, model = subword_state()
    folder = save_pretrained(state, tmp_path / "s")
    (folder / "sentencepiece.model").write_bytes(model[:-1] + bytes([model[-1] ^ 1]))
    with pytest.raises(DamagedCheckpoint, match="the tokenizer's files do not match their digest"):
        read_model([folder])


def test_a_shared_model_is_read_alone(tmp_path):
    folder = save_pretrained(small_state(), tmp_path / "m")
    with pytest.raises(CheckpointError, match="a shared model is read alone"):
        read_model([folder, DATA / "checkpoint-format-2.pt"])


def test_a_model_file_of_an_earlier_version_reads_and_a_foreign_or_damaged_one_is_refused(tmp_path):
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, foreign, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="a safetensors file, but not a model file of this package"):
        read_model([foreign])
    path = DATA / "model-format-2.safetensors"
    assert read_model([path])["step"] == 2
    data = bytearray(path.read_bytes())  # the copy task's vocabulary has no bytes: the weights are what to damage
    size = int.from_bytes(data[:8], "little")
    start, _ = json.loads(data[8 : 8 + size])["src_embed.0.lut.weight"]["data_offsets"]
    data[8 + size + start] ^= 0x01  # one bit flipped in that tensor's data
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged.safetensors: the weights do not match their digest"):
        read_model([damaged])
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cut.safetensors: not a readable model file"):
        read_model([cut])


def test_a_model_file_of_version_2_whose_header_was_edited_is_refused(tmp_path):
    "A number of heads that changes no shape: the model would load, and translate otherwise."
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(DATA / "model-format-2.safetensors", framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    config = json.loads(metadata["config"])
    forged = tmp_path / "forged.safetensors"
    save_file(tensors, forged, metadata={**metadata, "config": json.dumps({**config, "h": 1})})
    with pytest.raises(DamagedCheckpoint, match="forged.safetensors: its header does not match its digest"):
        read_model([forged])


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
def test_a_model_file_of_version_2_whose_header_lies_about_its_tensors_is_refused(change, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(DATA / "model-format-2.safetensors", framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    forged = tmp_path / "forged.safetensors"
    save_file(tensors, forged, metadata={**metadata, **change})
    with pytest.raises(DamagedCheckpoint, match="forged.safetensors: its header does not match its digest"):
        read_model([forged])
    # with the header's digest taken again, as a forger could, the header is still checked against the tensors
    header = {key: json.loads(value) for key, value in {**metadata, **change}.items()}
    save_file(tensors, forged, metadata={**metadata, **change, "sha256": json.dumps(pretrained._header_digest(header))})
    with pytest.raises(CheckpointError, match="forged.safetensors: (a model file whose header does not describe|the)"):
        read_model([forged])
