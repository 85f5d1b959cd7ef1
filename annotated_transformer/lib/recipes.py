"""A training run's settings in one checked, frozen dataclass (`Recipe`), the table of the package's recipes, and
`Task`, the data a recipe's task loads (the `tasks` module loads it)."""

import dataclasses
import math
import re
from dataclasses import dataclass

from ..model import TransformerConfig
from .artifacts import upgrade
from .files import read_json


# What a name read from a file (a recipe's, a direction, a split) may be where it becomes part of a path: a plain name,
# never a path of its own (`/x`, `../x`), so that nothing is written outside the folder it names something in.
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# A translation direction, source-target: two language names of letters, digits and '_' (de-en, pt_br-en).
DIRECTION = re.compile(r"[A-Za-z0-9_]+-[A-Za-z0-9_]+")


def _flat(recipe: dict) -> dict:
    "A recipe's settings (as `Recipe.to_dict` gives them) in one dictionary, the model's included."
    return {**{k: v for k, v in recipe.items() if k != "model"}, **recipe.get("model", {})}


def _unknown_settings(unknown: list[str]) -> str:
    "What to say of settings a recipe does not have: their names, and the names it has."
    recipe_fields = {f.name for f in dataclasses.fields(Recipe)} - {"name", "task", "model"}
    model_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    hint = ""
    if {"lr", "learning_rate"} & set(unknown):  # PyTorch's usual name for what the schedule decides here
        hint = " (the learning rate follows equation (3): set factor, its scale, and warmup, where it peaks)"
    return (f"unknown setting(s) {', '.join(unknown)}{hint}; recipe settings: {', '.join(sorted(recipe_fields))}; "
            f"model settings: {', '.join(sorted(model_fields))}")


def stored_recipe(path) -> dict:
    """The recipe in a run's config.json (any version, `artifacts.upgrade`), or in a file holding only a recipe, as
    `to_dict` gave it; ValueError if none."""
    data = read_json(path)
    if isinstance(data, dict) and "recipe" in data:  # a run's config.json
        data = upgrade("config", data, path)["recipe"]
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds no recipe")
    return data


@dataclass(frozen=True)
class Recipe:
    """A training run: the model's configuration plus the data, batching and schedule settings.

    max_tokens: tokens per batch on each side (§5.1); accum_steps: batches per optimizer update;
    steps: optimizer updates in all; warmup and factor: the learning-rate schedule, equation (3);
    clip_norm: gradient clipping (None: off); eval_every and checkpoint_every: in updates;
    keep_checkpoints: how many recent checkpoints to keep; seed: for data order, dropout and initialisation.
    Data settings, for the tasks that use them: direction, e.g. "de-en" (source-target languages);
    min_freq: how often a word must occur in the training data to get its own vocabulary entry;
    subwords: the size of one subword vocabulary for both languages, learned from the training data (SentencePiece;
    None: a word vocabulary per language, by min_freq); shared_subwords: False learns one vocabulary of `subwords`
    pieces per language instead, each from that language's training sentences (the source embedding is then a
    matrix of its own, the target embedding and the output layer still one);
    average_checkpoints: how many of the last checkpoints an evaluation of the run averages (§6.1).
    Scale settings: tokens_per_update, when set, decides the batches per update in place of accum_steps
    (which must then stay 1): as many as each process needs for all processes together to reach that many tokens
    a side per update (`accumulation_steps`);
    checkpoint_minutes, when set, also saves a checkpoint whenever that much time has passed since the last one;
    data: a folder of prepared data, for tasks that read one (the WMT data; None: the task's default).
    """

    name: str
    task: str
    model: TransformerConfig
    max_tokens: int
    steps: int
    warmup: int
    factor: float = 1.0
    accum_steps: int = 1
    clip_norm: float | None = None
    eval_every: int = 100
    checkpoint_every: int = 100
    keep_checkpoints: int = 5
    seed: int = 0
    direction: str | None = None
    min_freq: int = 1
    average_checkpoints: int = 1
    tokens_per_update: int | None = None
    checkpoint_minutes: float | None = None
    data: str | None = None
    subwords: int | None = None
    shared_subwords: bool = True

    def __post_init__(self):
        if not (isinstance(self.name, str) and PLAIN_NAME.fullmatch(self.name)):
            raise ValueError(f"name must be a plain name (letters, digits, '.', '_', '-'; no path), got {self.name!r}: "
                             "it names the run's folder (runs/NAME) and its results files")
        for name in ("max_tokens", "steps", "warmup", "accum_steps", "eval_every", "checkpoint_every", "keep_checkpoints",
                     "min_freq", "average_checkpoints"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        def positive_number(value):
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0

        if not positive_number(self.factor):
            raise ValueError(f"factor must be a positive number, got {self.factor!r}")
        for name in ("clip_norm", "checkpoint_minutes"):
            if getattr(self, name) is not None and not positive_number(getattr(self, name)):
                raise ValueError(f"{name} must be a positive number or None, got {getattr(self, name)!r}")
        for name in ("tokens_per_update", "subwords"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.tokens_per_update is not None and self.accum_steps != 1:  # one would silently override the other
            raise ValueError(f"accum_steps ({self.accum_steps}) and tokens_per_update ({self.tokens_per_update}) both set "
                             "the batches per update; keep one: tokens_per_update=None to choose accum_steps yourself")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be a whole number from 0 to 2**63 - 1, got {self.seed!r}")
        if not isinstance(self.shared_subwords, bool):
            raise ValueError(f"shared_subwords must be True or False, got {self.shared_subwords!r}")
        if not self.shared_subwords and self.subwords is None:
            raise ValueError("shared_subwords=False learns a subword vocabulary per language: it needs subwords, the "
                             "size of each (e.g. subwords=4000), or shared_subwords=True")
        if self.data is not None and not isinstance(self.data, str):
            raise ValueError(f"data must be a folder's path or None, got {self.data!r}")
        if self.average_checkpoints > self.keep_checkpoints:
            raise ValueError(f"average_checkpoints ({self.average_checkpoints}) cannot exceed keep_checkpoints "
                             f"({self.keep_checkpoints}): only the kept checkpoints can be averaged")
        if self.direction is not None and not (isinstance(self.direction, str) and DIRECTION.fullmatch(self.direction)):
            raise ValueError(f"direction must look like 'de-en' (source-target), got {self.direction!r}")

    def replace(self, **overrides) -> "Recipe":
        """A copy with fields changed by name; model fields (e.g. `d_model`) go to the model configuration."""
        model_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
        own_fields = {f.name for f in dataclasses.fields(Recipe)} - {"name", "task", "model"}
        unknown = sorted(set(overrides) - model_fields - own_fields)
        if unknown:
            raise ValueError(_unknown_settings(unknown))
        model = dataclasses.replace(self.model, **{k: v for k, v in overrides.items() if k in model_fields})
        return dataclasses.replace(self, model=model, **{k: v for k, v in overrides.items() if k in own_fields})

    def to_dict(self) -> dict:
        "The recipe as plain values (what config.json and every checkpoint store)."
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Recipe":
        "The recipe that `to_dict` gave (a run's config.json stores it); ValueError for settings this version lacks."
        values = dict(values)
        model = values.pop("model", {})
        if not isinstance(model, dict):
            raise ValueError(f"not a recipe of this version: its model settings are {type(model).__name__}, not a "
                             "mapping of names to values")
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(Recipe)}
                         | set(model) - {f.name for f in dataclasses.fields(TransformerConfig)})
        if unknown:
            raise ValueError(f"not a recipe of this version: {_unknown_settings(unknown)}")
        try:
            return cls(model=TransformerConfig(**model), **values)
        except TypeError as err:  # a required setting missing
            raise ValueError(f"not a recipe of this version ({err})") from None

    def differences(self, other: dict) -> list[str]:
        """The names of the settings in which this recipe differs from `other`, a recipe as `to_dict` gives it. A
        setting that `other` lacks has its default value there: it was stored before the setting existed."""
        mine, theirs = _flat(self.to_dict()), {**_DEFAULTS, **_flat(other)}
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))

    def trains_differently(self, other: dict) -> list[str]:
        """`differences`, less `keep_checkpoints`: the settings that change what a run trains or how it is scored. How
        many checkpoints a run keeps on disk changes neither (a run may keep more, to compare averages)."""
        return [k for k in self.differences(other) if k != "keep_checkpoints"]

    def check_continues(self, stored: dict, source) -> None:
        """Refuse, naming `source` and each setting, to continue with this recipe the run of `stored` (a recipe as
        `to_dict` gives it, read from `source`) when their settings differ: a resumed run keeps its own, except
        `steps`, which may grow to train a finished run on."""
        mine, theirs = _flat(self.to_dict()), {**_DEFAULTS, **_flat(stored)}
        if changed := [k for k in self.differences(stored) if k != "steps"]:
            given = ", ".join(f"{k}={mine.get(k)!r} (the run has {theirs.get(k)!r})" for k in changed)
            raise ValueError(f"{source}: a resumed run keeps its settings, and these differ: {given}; only steps "
                             "may grow")


# What a setting meant before a recipe stored it: its default (a recipe's own fields and its model's).
_DEFAULTS = {f.name: f.default for cls in (Recipe, TransformerConfig) for f in dataclasses.fields(cls)
             if f.default is not dataclasses.MISSING}


# The training recipes, by name (`annotated-transformer train NAME`).
RECIPES = {
    # Copying needs no regularisation from dropout; label smoothing stays at the paper's 0.1. 1,200 updates: at 1,000,
    # a change of float rounding alone moved held-out exact copies between 98.8% and 100%.
    "copy": Recipe(name="copy", task="copy", model=TransformerConfig(N=2, d_model=64, d_ff=128, h=4, dropout=0.0),
                   max_tokens=640, steps=1200, warmup=200, factor=0.5, eval_every=200, checkpoint_every=200),
    # The paper's base model on one GPU. Multi30k is small: a shorter warm-up and far fewer updates than WMT.
    "multi30k-gpu": Recipe(
        name="multi30k-gpu", task="multi30k", direction="de-en", min_freq=2, model=TransformerConfig(),
        max_tokens=8192, steps=6000, warmup=1000, factor=1.0, clip_norm=1.0, eval_every=250, checkpoint_every=250,
        keep_checkpoints=5, average_checkpoints=5),
    # Sized for a 2-core CPU in under 30 minutes of wall time with bf16 autocast. What mattered, measured on the
    # validation split: small batches (many updates per epoch), a short warm-up, a peak learning rate of about 1.5e-3
    # (factor 0.35: with 0.25, three seeds scored 1.1 BLEU lower, and with 0.5 one seed scored 1.5 lower), one shared
    # vocabulary of 4,000 subwords (one embedding matrix, and an output layer small enough for fast updates), label
    # smoothing 0.2 instead of the paper's 0.1, and the average of the last 10 checkpoints. Then dropout and length
    # together: in float32's 2,200 updates (8 epochs) dropout only slowed the learning and none was best; bf16's
    # faster updates buy 4,700 with the paper's dropout of 0.1 (17 epochs), which scored 1.2 BLEU higher on the
    # validation split (seed 0). See the results chapter and "how the recipe was chosen".
    "multi30k-cpu": Recipe(
        name="multi30k-cpu", task="multi30k", direction="de-en", subwords=4000,
        model=TransformerConfig(N=3, d_model=256, d_ff=512, h=4, dropout=0.1, label_smoothing=0.2),
        max_tokens=2000, steps=4700, warmup=200, factor=0.35, clip_norm=1.0, eval_every=100, checkpoint_every=50,
        keep_checkpoints=10, average_checkpoints=10),
    # The book's live run (results and attention chapters): two layers of width 128, word vocabularies and 500
    # updates, a few minutes on two CPU cores. It trains every line of the pipeline; it does not translate well.
    "multi30k-tiny": Recipe(
        name="multi30k-tiny", task="multi30k", direction="de-en", min_freq=2,
        model=TransformerConfig(N=2, d_model=128, d_ff=256, h=4, dropout=0.1),
        max_tokens=2000, steps=500, warmup=150, factor=0.25, clip_norm=1.0, eval_every=100, checkpoint_every=50,
        keep_checkpoints=5, average_checkpoints=5),
    # Tatoeba's Chinese-English pairs, both directions (the Chinese translator chapter): multi30k-cpu's model, batches
    # and schedule, the best of what was compared on the validation split after 1,800 updates of Chinese to English
    # (greedy sacreBLEU 18.6; dropout 0.3: 1.3; dropout 0.2 or 0.3 with 8,000 subwords: 0.7 and 0.0: within 1,800
    # updates, more regularisation slowed the learning), trained for 1,900 updates: 25 minutes of two CPU cores
    # without bf16 instructions (float32, validation included). The score was still rising there: see that chapter.
    # Chinese to English has a vocabulary of 4,000 pieces per language (shared_subwords=False), which scored higher
    # into English on the validation split than one shared vocabulary: 25.04 against 22.56 on average over three seeds
    # on one GPU in bf16 (one decoding), 25.25 against 23.72 over two on this CPU in float32 (each run's best of four
    # decodings). English to Chinese shares one: into Chinese, 24.37 against 25.93 on the GPU. See that chapter.
    **{direction: Recipe(
        name=direction, task="tatoeba", direction=direction, subwords=4000,
        shared_subwords={"zh-en": False, "en-zh": True}[direction],
        model=TransformerConfig(N=3, d_model=256, d_ff=512, h=4, dropout=0.1, label_smoothing=0.2),
        max_tokens=2000, steps=1900, warmup=200, factor=0.35, clip_norm=1.0, eval_every=100, checkpoint_every=50,
        keep_checkpoints=10, average_checkpoints=5) for direction in ("zh-en", "en-zh")},
    # The paper's two models on WMT14 (§5.1-5.3, Table 3). A batch holds at most 3,125 tokens a side (padding
    # included), and an update 25,000 a side on 1, 2, 4 or 8 GPUs: one batch each on 8 GPUs, 8 in a row on one
    # (`accumulation_steps`). Checkpoints every 10 minutes, as in §6.1; evaluation averages the last 5 (base) or 20 (big).
    "wmt14-base": Recipe(
        name="wmt14-base", task="wmt14", direction="en-de", data="wmt14-en-de", model=TransformerConfig(),
        max_tokens=3125, tokens_per_update=25_000, steps=100_000, warmup=4000, factor=1.0, eval_every=1000,
        checkpoint_every=100_000, checkpoint_minutes=10, keep_checkpoints=5, average_checkpoints=5),
    "wmt14-big": Recipe(
        name="wmt14-big", task="wmt14", direction="en-de", data="wmt14-en-de",
        model=TransformerConfig(d_model=1024, d_ff=4096, h=16, dropout=0.3),
        max_tokens=3125, tokens_per_update=25_000, steps=300_000, warmup=4000, factor=1.0, eval_every=1000,
        checkpoint_every=300_000, checkpoint_minutes=10, keep_checkpoints=20, average_checkpoints=20),
    # The 10,000-pair sample, a small model, two processes on a 2-core CPU in a few minutes: it runs every line of
    # the WMT and distributed paths, but does not learn to translate.
    "wmt14-sample-tiny": Recipe(
        name="wmt14-sample-tiny", task="wmt14", direction="en-de", data="wmt14-en-de-sample",
        model=TransformerConfig(N=2, d_model=128, d_ff=256, h=4, dropout=0.1),
        max_tokens=1000, tokens_per_update=2000, steps=200, warmup=100, factor=0.5, clip_norm=1.0, eval_every=100,
        checkpoint_every=50, keep_checkpoints=5, average_checkpoints=5),
}


# What each recipe is and how long it trains, for `annotated-transformer train --help`. Kept beside the recipes rather
# than in them: a description is no setting, and config.json and the checkpoints store only settings.
RECIPE_DESCRIPTIONS = {
    "copy": "the training chapter's copy task, a small model; under a minute on a 2-core CPU",
    "multi30k-gpu": "the paper's base model on Multi30k, German to English; for a GPU (on a CPU: multi30k-cpu)",
    "multi30k-cpu": ("the results chapter's translator, Multi30k German to English, 4,000 shared subwords; about "
                     "24 minutes on 2 CPU cores with bf16 instructions (longer without them)"),
    "multi30k-tiny": "a small model of word vocabularies (2 layers of width 128, 500 updates), the book's live run; a "
                     "few minutes on 2 CPU cores (it does not translate well)",
    "zh-en": "the Chinese translator chapter's model, Tatoeba Chinese to English, 4,000 subwords per language; "
             "about 25 minutes on 2 CPU cores without bf16 instructions",
    "en-zh": "the same architecture, Tatoeba English to Chinese, 4,000 shared subwords; about 25 minutes on 2 CPU cores "
             "without bf16 instructions",
    "wmt14-base": "the paper's base model on WMT14 English to German (after `prepare wmt14-en-de`); for GPUs (the "
                  "paper: 12 hours on 8 P100s)",
    "wmt14-big": "the paper's big model on WMT14 English to German (after `prepare wmt14-en-de`); for GPUs (the "
                 "paper: 3.5 days on 8 P100s)",
    "wmt14-sample-tiny": "a small model on the 10,000-pair WMT14 sample (after `prepare wmt14-en-de --corpus sample`), "
                         "to try the WMT path on a CPU (it does not learn to translate); a few minutes in two processes",
}


@dataclass
class Task:
    "What a recipe trains on: sentence pairs of token ids, vocabulary sizes, and a final evaluation."

    train: list
    valid: list
    src_vocab: int
    tgt_vocab: int
    vocab: dict  # what the token ids mean, stored in every checkpoint
    evaluate: object  # callable(model, device) -> dict of final metrics
