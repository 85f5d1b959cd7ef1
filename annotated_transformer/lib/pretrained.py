"""A trained model to share: a folder that `save_pretrained` writes and `from_pretrained` reads, and `read_model`, the
one way to read a model from whatever holds one (checkpoints, averaged or not; a model folder; the single
.safetensors file of earlier versions)."""

# A model folder holds `config.json` (format "model 3": the model's configuration, its vocabulary sizes, what the token
# ids mean, the recipe and update that trained it, and digests of the weights and the tokenizer files, checked on
# reading), `model.safetensors` (the weights; a matrix that several names share is stored once, as
# `safetensors.torch.save_model` does) and the tokenizer's own files: SentencePiece models as `*.model`, word lists
# as `*.words.json`. No optimizer state and no pickle: any safetensors reader opens the weights safely.

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .. import __version__
from ..model import EncoderDecoder
from .artifacts import FormatError, format_of, kind_of_file, read_artifact, stamped, upgrade, write_artifact
from .checkpoints import (Checkpoint, CheckpointError, DamagedCheckpoint, average_checkpoints, load_checkpoint,
                          model_from_state, weights_digest)

CONFIG, WEIGHTS = "config.json", "model.safetensors"
# A stored vocabulary's entries that are files of their own in a model folder, and their names there.
TOKENIZER_FILES = {"model": "sentencepiece.model", "src_model": "source.model", "tgt_model": "target.model",
                   "src": "source.words.json", "tgt": "target.words.json"}


def is_model_folder(path) -> bool:
    "Whether `path` is a folder that `save_pretrained` wrote (its config.json names the format \"model\")."
    return Path(path).is_dir() and kind_of_file(Path(path) / CONFIG) == "model"


def _file_bytes(key: str, value) -> bytes:
    "A stored vocabulary's entry as the bytes of its file: a SentencePiece model as it is, a word list as JSON."
    return value if isinstance(value, bytes) else json.dumps(value, ensure_ascii=False).encode()


def _tokenizer_digest(files: dict[str, bytes]) -> str:
    "The sha256 of the tokenizer's files, by name, as a model folder stores and checks it."
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def save_pretrained(state: Checkpoint, folder) -> Path:
    """Write the model of `state` (a checkpoint, an average of checkpoints, or what `read_model` returns) to the
    folder `folder`, whole or not at all: it is written beside, then put in place. An existing folder is replaced
    only if it is empty or an earlier model folder; any other is refused, and nothing in it is touched."""
    folder = Path(folder)
    if folder.exists() and not (folder.is_dir() and (is_model_folder(folder) or not any(folder.iterdir()))):
        raise FileExistsError(f"{folder}: exists and is not a model folder; choose another --out, or remove it")
    from safetensors.torch import save_model

    model = model_from_state(state, folder)  # the checks of a model read back, before anything is written
    vocab = state.get("vocab") or {}
    files = {TOKENIZER_FILES[key]: _file_bytes(key, value) for key, value in vocab.items() if key in TOKENIZER_FILES}
    config = {"config": state["config"], "src_vocab": state["src_vocab"], "tgt_vocab": state["tgt_vocab"],
              "vocab": {key: {"file": TOKENIZER_FILES[key]} if key in TOKENIZER_FILES else value
                        for key, value in vocab.items()},
              "recipe": state.get("recipe"), "step": state.get("step"),
              "averaged": [Path(p).name for p in state.get("averaged", [])], "package_version": __version__,
              "weights_sha256": weights_digest(model), "tokenizer_sha256": _tokenizer_digest(files)}
    folder.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        save_model(model, str(new / WEIGHTS))
        for name, data in files.items():
            (new / name).write_bytes(data)
        write_artifact(new / CONFIG, "model", config)
        for path in new.iterdir():  # on disk before the folder takes its name
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        new.chmod(0o777 & ~_umask())  # mkdtemp's folder is its owner's alone; a folder to share is as any other
        if folder.exists():  # an earlier model folder, or an empty one: set aside, then removed once replaced
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
            os.replace(folder, old / folder.name)
            os.replace(new, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(new, folder)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return folder


def _umask() -> int:
    "The process's umask (reading it means setting it: it is put back at once)."
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_model_folder(folder) -> Checkpoint:
    """The model in a folder that `save_pretrained` wrote, as the keys of a checkpoint (weights, configuration,
    vocabulary, recipe, step); `CheckpointError` naming the folder if it is not one, `DamagedCheckpoint` if a file
    does not match its digest."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    try:
        config = read_artifact(folder / CONFIG, "model")
    except (OSError, ValueError) as err:  # FormatError is a ValueError
        raise CheckpointError(f"{folder}: not a readable model folder ({err})") from None
    required = {"config", "src_vocab", "tgt_vocab", "vocab", "weights_sha256", "tokenizer_sha256"}
    if missing := required - set(config):
        raise CheckpointError(f"{folder / CONFIG}: incomplete, it lacks {', '.join(sorted(missing))}")
    if not isinstance(config["vocab"], dict):
        raise CheckpointError(f"{folder / CONFIG}: its vocabulary is not a mapping of names to values")
    try:
        with safe_open(folder / WEIGHTS, framework="pt") as f:
            aliases, weights = f.metadata() or {}, {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{folder / WEIGHTS}: not readable ({type(err).__name__}: {err})") from None
    weights.update({name: weights[kept] for name, kept in aliases.items() if kept in weights})  # shared, again
    if weights_digest(weights) != config["weights_sha256"]:
        raise DamagedCheckpoint(f"{folder / WEIGHTS}: the weights do not match their digest in {CONFIG}: the folder "
                                "is damaged; save it again")
    in_files = {key: value["file"] for key, value in config["vocab"].items()
                if isinstance(value, dict) and value.get("file") == TOKENIZER_FILES.get(key)}
    files = {}
    for name in in_files.values():
        try:
            files[name] = (folder / name).read_bytes()
        except OSError as err:
            raise CheckpointError(f"{folder / name}: not readable ({err.strerror or err})") from None
    if _tokenizer_digest(files) != config["tokenizer_sha256"]:  # before reading them: a damaged file is named so
        raise DamagedCheckpoint(f"{folder}: the tokenizer's files do not match their digest in {CONFIG}: the folder "
                                "is damaged; save it again")
    vocab = {key: value if key not in in_files else files[in_files[key]] if key.endswith("model")
             else json.loads(files[in_files[key]]) for key, value in config["vocab"].items()}
    known = {key: config[key] for key in ("package_version", "recipe") if config.get(key) is not None}
    return Checkpoint(format=stamped("checkpoint", {})["format"], config=config["config"], src_vocab=config["src_vocab"],
                      tgt_vocab=config["tgt_vocab"], vocab=vocab, model=weights, step=config.get("step"),
                      averaged=config.get("averaged", []), weights_sha256=config["weights_sha256"], **known)


def _vocab_digest(vocab: dict) -> str:
    "The sha256 of a vocabulary's entries (bytes as they are, the rest as JSON), as a model file stores it."
    digest = hashlib.sha256()
    for key, value in sorted(vocab.items()):
        digest.update(key.encode() + b"\0" + (value if isinstance(value, bytes) else json.dumps(value).encode()) + b"\0")
    return digest.hexdigest()


def _header_digest(header: dict) -> str:
    "The sha256 of a model file's header but its own `sha256`, as sorted JSON (version 2)."
    rest = {key: value for key, value in header.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def read_model_file(path) -> Checkpoint:
    """The model file of versions 1 and 2 at `path`, one .safetensors file (weights, with the vocabulary's bytes as
    uint8 tensors, and the rest as JSON in its header), as the keys of a checkpoint; `CheckpointError` if it is not
    one, `DamagedCheckpoint` if it does not match its digests."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(path, framework="pt") as f:
            metadata, tensors = f.metadata() or {}, {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path}: not a readable model file ({type(err).__name__}: {err})") from None
    try:
        header = {key: json.loads(value) for key, value in metadata.items()}
    except ValueError:  # another program's safetensors file: its header is not ours
        header = {"format": metadata.get("format")}
    try:
        version = format_of(header)[1]
        upgrade("model", header, path)  # refuses another kind, or a newer version
    except FormatError:
        raise CheckpointError(f"{path}: a safetensors file, but not a model file of this package (its header says "
                              f"format {header.get('format')!r}); a model of this version is a folder") from None
    required = {"config", "vocab", "aliases", "step", "src_vocab", "tgt_vocab", "weights_sha256", "vocab_sha256"}
    if missing := required - set(header) | ({"sha256"} - set(header) if version >= 2 else set()):
        raise CheckpointError(f"{path}: incomplete model file, its header lacks {', '.join(sorted(missing))}")
    if version >= 2 and header["sha256"] != _header_digest(header):
        raise DamagedCheckpoint(f"{path}: its header does not match its digest: the file is damaged or was edited; "
                                "export it again")
    vocab, aliases, config = header["vocab"], header["aliases"], header["config"]
    names = [value["bytes"] for value in vocab.values() if isinstance(value, dict) and "bytes" in value] \
        if isinstance(vocab, dict) else []
    if not (isinstance(vocab, dict) and isinstance(aliases, dict) and isinstance(config, dict)
            and all(isinstance(n, str) and n in tensors and tensors[n].dtype == torch.uint8 and tensors[n].dim() == 1
                    for n in names)
            and all(isinstance(a, str) and isinstance(f, str) and f in tensors and f not in names
                    for a, f in aliases.items())):
        raise CheckpointError(f"{path}: a model file whose header does not describe its tensors (vocabulary bytes or "
                              "shared weights that it does not hold); export it again")
    vocab = {key: bytes(tensors.pop(value["bytes"]).numpy()) if isinstance(value, dict) and "bytes" in value
             else value for key, value in vocab.items()}
    if _vocab_digest(vocab) != header["vocab_sha256"]:
        raise DamagedCheckpoint(f"{path}: the vocabulary does not match its digest: the file is damaged; export it again")
    tensors.update({name: tensors[first] for name, first in aliases.items()})  # shared weights, shared again
    if weights_digest(tensors) != header["weights_sha256"]:
        raise DamagedCheckpoint(f"{path}: the weights do not match their digest: the file is damaged; export it again")
    known = {key: header[key] for key in ("package_version", "recipe") if header.get(key) is not None}
    return Checkpoint(format=stamped("checkpoint", {})["format"], config=header["config"], src_vocab=header["src_vocab"],
                      tgt_vocab=header["tgt_vocab"], vocab=vocab, model=tensors, step=header["step"],
                      averaged=header.get("averaged", []), weights_sha256=header["weights_sha256"], **known)


def model_state(model: EncoderDecoder, vocab: dict | None = None, **about) -> Checkpoint:
    """The keys of a checkpoint for `model` as it is now, with `vocab` (what its ids mean) and what else is known of
    it (`recipe`, `step`, `averaged`), as `save_pretrained` takes them."""
    config = dataclasses.asdict(model.config)
    return Checkpoint(format=stamped("checkpoint", {})["format"], config=config,
                      src_vocab=model.src_embed[0].lut.num_embeddings, tgt_vocab=model.generator.proj.out_features,
                      model=model.state_dict(), step=about.pop("step", None), **({"vocab": vocab} if vocab else {}),
                      **about)


def read_model(paths) -> Checkpoint:
    """The model that `paths` hold, as the keys of a checkpoint: one model folder (`save_pretrained`), one model file
    of an earlier version (.safetensors), one checkpoint, or several checkpoints of one run, averaged (§6.1)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("read_model needs at least one path")
    shared = [p for p in paths if p.suffix == ".safetensors" or is_model_folder(p)]
    if shared and len(paths) > 1:
        raise CheckpointError(f"{shared[0]}: a shared model is read alone; checkpoints of one run are averaged")
    if shared:
        return read_model_folder(paths[0]) if paths[0].is_dir() else read_model_file(paths[0])
    return average_checkpoints(paths) if len(paths) > 1 else load_checkpoint(paths[0])


class Transformer(EncoderDecoder):
    """The paper's model (the `EncoderDecoder` that `make_model` builds) with a folder to share it in:
    `save_pretrained(folder)` writes it, `Transformer.from_pretrained(folder)` reads it back. `Transformer.of(model)`
    gives a model built by `make_model` these two methods, its modules and weights shared, not copied."""

    @classmethod
    def of(cls, model: EncoderDecoder) -> "Transformer":
        "`model` as a `Transformer`: the same modules and weights, not copies, in the same mode (training or not)."
        built = cls(model.encoder, model.decoder, model.src_embed, model.tgt_embed, model.generator, model.config)
        return built.train(model.training)  # a new module starts in training mode; its parts may not be

    @classmethod
    def from_pretrained(cls, folder, device="cpu") -> "Transformer":
        "The model in a model folder (or any path `read_model` reads), in evaluation mode, on `device`."
        return cls.of(model_from_state(read_model([folder]), folder, device))

    def save_pretrained(self, folder, vocab: dict | None = None) -> Path:
        "Write this model to the model folder `folder`, with `vocab` (what its ids mean) if given; returns the folder."
        return save_pretrained(model_state(self, vocab), folder)
