"""`train` and `prepare`: a recipe trained into a run directory (a new run, one started from another's settings, or a
resumed one), and the WMT14 data prepared for the recipes that read it."""

import argparse
import dataclasses
import json
import shutil
import sys
import textwrap
import warnings
from pathlib import Path

from ..lib.artifacts import RUNS, RunFiles
from ..lib.processes import process_group, torchrun_rank
from ..lib.recipes import RECIPE_DESCRIPTIONS, RECIPES, Recipe, stored_recipe
from ..lib.runs import RunDir, RunDirBusy
from ..model import TransformerConfig
from .arguments import ENVIRONMENT, UsageError, device_option, help_section, positive_int


def _settings_help() -> str:
    """The epilog of `train --help`, generated from `RECIPES`, `RECIPE_DESCRIPTIONS` and the fields of `Recipe` and
    `TransformerConfig`, so that it cannot drift from them: each recipe with what it is and the settings in which it
    differs from the defaults, then every setting with its default."""

    def word(value):  # a value as KEY=VALUE writes it
        return value if isinstance(value, str) else json.dumps(value)

    def defaults(cls):
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    own = {f.name for f in dataclasses.fields(Recipe)} - {"name", "task", "model"}
    shared = {**defaults(Recipe), **defaults(TransformerConfig)}
    recipes = []
    for name, recipe in RECIPES.items():
        values = recipe.to_dict()
        values = {**values.pop("model"), **{k: v for k, v in values.items() if k in own}}
        changed = " ".join(f"{k}={word(v)}" for k, v in values.items() if k not in shared or shared[k] != v)
        recipes.append((name, [RECIPE_DESCRIPTIONS.get(name, ""), changed]))  # a recipe added later may have none
    per_recipe = [f.name for f in dataclasses.fields(Recipe) if f.name in own and f.name not in shared]
    settings = [
        ("recipe", [f"{' '.join(per_recipe)} (each recipe's own) " +
                    " ".join(f"{k}={word(v)}" for k, v in defaults(Recipe).items() if k in own)]),
        ("model", [" ".join(f"{k}={word(v)}" for k, v in defaults(TransformerConfig).items())]),
        ("their meaning", ["help(annotated_transformer.Recipe) and help(annotated_transformer.TransformerConfig). "
                           "There is no lr: the learning rate follows equation (3), scaled by factor and peaking "
                           "after warmup updates."]),
    ]
    return "\n\n".join([
        help_section("recipes (what each is, how long it trains, its settings that differ from the defaults)",
                      recipes),
        help_section("settings (KEY=VALUE) and their defaults", settings),
        help_section("environment", ENVIRONMENT),
        "In several processes: torchrun --nproc-per-node=N -m annotated_transformer train RECIPE ...\n"
        "(one process per GPU; gloo on CPUs)",
    ])


def add_train(commands) -> None:
    "The `train` command's arguments."
    train_cmd = commands.add_parser(
        "train",
        help="train a recipe",
        usage="annotated-transformer train RECIPE [options] [KEY=VALUE ...]\n"
        "       annotated-transformer train --config FILE | --from RUN_DIR [options] [KEY=VALUE ...]\n"
        "       annotated-transformer train --out RUN_DIR --resume [options] [steps=N]",
        description=textwrap.fill(
            "Train a recipe into a run directory. KEY=VALUE words change a recipe or model setting, e.g. steps=200 "
            "d_model=128 clip_norm=null. --config or --from starts a new run with the settings of another.",
            max(shutil.get_terminal_size().columns - 2, 60),
            break_on_hyphens=False,
        ),
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's columns, as help_section lays them out
    )
    train_cmd.add_argument("recipe", nargs="?", help="a recipe's name (listed below); none with --config or --from, "
                           "nor needed with --resume, the run in --out naming its own")
    source = train_cmd.add_mutually_exclusive_group()
    source.add_argument("--config", type=Path, metavar="FILE",
                        help="start a new run with the recipe stored in FILE, a run's config.json")
    source.add_argument("--from", dest="run_from", type=Path, metavar="RUN_DIR",
                        help="start a new run with the recipe of the run in RUN_DIR (its config.json)")
    train_cmd.add_argument("--out", type=Path, help="run directory (default: runs/NAME, NAME being the recipe's)")
    train_cmd.add_argument("--resume", action="store_true",
                           help="continue the run in --out from its newest checkpoint, with the settings in its "
                           "config.json (KEY=VALUE may only raise steps)")
    train_cmd.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    train_cmd.add_argument("--quiet", action="store_true", help="no progress output (bar or lines)")
    train_cmd.add_argument("--compile", action="store_true", help="compile the model with torch.compile (for GPUs)")
    train_cmd.add_argument("--bf16", action=argparse.BooleanOptionalAction,
                           help="the forward pass in bfloat16 autocast, or not (default: a resumed run's own setting, "
                           "else this machine's default, which --version prints)")
    train_cmd.add_argument("--tensorboard", action="store_true",
                           help="also log for TensorBoard (pip install 'annotated-transformer[tensorboard]')")


def _base_recipe(args) -> tuple[Recipe, Path | None]:
    """The recipe that `train` starts from: the one named, or the one in the file of --config or --from (a run's
    config.json, or a file holding only a recipe, as `Recipe.to_dict` writes it); and that file's folder (None for a
    named recipe)."""
    if not (args.config or args.run_from):
        if args.recipe is None and args.resume and args.out is not None:  # the run in --out names its own recipe
            config = RunFiles(args.out).config
            if not config.is_file():
                raise FileNotFoundError(f"nothing to resume in --out {str(args.out)!r}: it holds no config.json")
            try:  # `_resumed_recipe` reads it again, with the settings given, as for any resume
                return Recipe.from_dict(stored_recipe(config)), None
            except ValueError as err:
                raise ValueError(f"{config}: {err}") from None
        if args.recipe is None:
            raise UsageError(f"the following arguments are required: recipe (one of {', '.join(RECIPES)}), or "
                             "--config FILE or --from RUN_DIR")
        if args.recipe not in RECIPES:
            raise UsageError(f"unknown recipe {args.recipe!r}; the recipes are: {', '.join(RECIPES)}")
        return RECIPES[args.recipe], None
    option = f"--config {str(args.config)!r}" if args.config else f"--from {str(args.run_from)!r}"
    if args.recipe is not None:
        raise UsageError(f"give a recipe's name or {option.split()[0]}, not both: {option} holds the recipe to "
                         "start from")
    if args.resume:
        raise UsageError(f"{option.split()[0]} starts a new run with another run's settings and --resume continues the "
                         "run in --out with its own; give one of the two")
    path = args.config or RunFiles(args.run_from).config
    if not path.is_file():
        raise UsageError(f"{option}: {path} is not a file; --config takes a run's config.json, --from its folder")
    try:
        return Recipe.from_dict(stored_recipe(path)), path.parent
    except ValueError as err:
        raise UsageError(f"{option}: {err}") from None


def _resumed_recipe(out: Path, name: str, settings: dict) -> Recipe:
    """The recipe of the run in `out`, from its config.json: a resumed run keeps its own settings, so that they need
    not be typed again. A setting given that differs from the run's is refused by name; only `steps` may grow."""
    config = RunFiles(out).config
    if not config.is_file():
        raise FileNotFoundError(f"nothing to resume in --out {str(out)!r}: it holds no config.json")
    stored = stored_recipe(config)
    if stored.get("name") != name:
        raise UsageError(f"--out {str(out)!r} holds a run of the recipe {stored.get('name')!r}, not {name!r}")
    try:
        recipe = Recipe.from_dict(stored)
    except ValueError as err:  # a run of another version of the package
        raise ValueError(f"{config}: {err}") from None
    try:
        asked = recipe.replace(**settings)
        asked.check_continues(stored, config)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return asked


def train_command(args, settings: dict) -> dict:
    "Run `train`: the recipe with its KEY=VALUE settings, trained into its run directory; returns the summary."
    from ..lib.trainer import train

    base, source = _base_recipe(args)
    out = args.out or RUNS / base.name
    if source is not None and out.resolve() == source.resolve():
        raise UsageError(f"--out {str(out)!r} is the folder the settings come from; give the new run another --out")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file; give a folder for the run")
    if not args.resume and RunDir(out).holds_a_run() and not RunDir(out).in_use():  # refused before the data is read
        raise UsageError(f"--out {str(out)!r} already holds a run: continue it with --resume, or choose another --out")
    if args.resume:  # the run's own settings, not those of the recipe as it is today
        recipe = _resumed_recipe(out, base.name, settings)
    else:
        try:
            recipe = base.replace(**settings)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if recipe.steps < recipe.warmup:
        warnings.warn(f"steps={recipe.steps} is below warmup={recipe.warmup}: the learning rate rises for the whole "
                      "run and never reaches its peak (equation (3)); lower warmup or raise steps")
    args.recipe, args.out = base.name, out  # what `main` names when it says how to continue an interrupted run
    device = device_option(args.device)  # a wrong name is refused before the folder is made
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {str(out)!r}: cannot create the folder ({err.strerror})") from None
    try:
        with process_group(device) as device:  # under torchrun: one of several processes
            return train(recipe, out, device=device, resume=args.resume, progress=not args.quiet,
                         compile=args.compile, tensorboard=args.tensorboard, bf16=args.bf16)
    except RunDirBusy:  # another launch holds the folder: it is not ours to remove
        raise
    except BaseException:
        # Failed before the run began: leave no folder behind (the writing process alone, as it alone writes).
        if made and torchrun_rank() == 0 and not RunFiles(out).config.exists():
            shutil.rmtree(out, ignore_errors=True)
        raise


def add_prepare(commands) -> None:
    "The `prepare` command's arguments."
    from ..lib.wmt14_files import WMT14_CORPORA

    prepare_cmd = commands.add_parser(
        "prepare",
        help="download and prepare WMT14 English-German for training",
        description="Download the WMT14 English-German training corpora (checksummed, resumed when cut short; "
        "from $AT_MIRROR/wmt14 when set), clean them, learn one SentencePiece BPE vocabulary for both "
        "languages, and write the memory-mapped token files that the wmt14 recipes train on.",
    )
    prepare_cmd.add_argument("dataset", choices=["wmt14-en-de"], help="the data set: wmt14-en-de")
    prepare_cmd.add_argument(
        "--out",
        type=Path,
        help="folder (default: $AT_DATA_DIR/wmt14-en-de, or wmt14-en-de-sample with --corpus sample)",
    )
    prepare_cmd.add_argument(
        "--corpus",
        nargs="+",
        choices=[*WMT14_CORPORA, "sample"],
        default=list(WMT14_CORPORA),
        help="corpora to train on (default: all three, about 4.5M pairs; sample: 10,000 pairs)",
    )
    prepare_cmd.add_argument("--direction", default="en-de", choices=["en-de", "de-en"], help="default: en-de")
    prepare_cmd.add_argument("--vocab-size", type=positive_int, default=37_000, help="subword vocabulary (default 37000)")
    prepare_cmd.add_argument(
        "--subword-sentences",
        type=positive_int,
        default=2_000_000,
        help="sentences sampled to learn the subwords from (default 2000000)",
    )
    prepare_cmd.add_argument("--quiet", action="store_true", help="no progress bars")


def prepare_command(args) -> dict:
    "Run `prepare`: the WMT14 data, downloaded, cleaned and encoded into a folder; returns its manifest."
    from ..lib.wmt import prepare_wmt14, prepared_folder

    default = prepared_folder("wmt14-en-de-sample" if args.corpus == ["sample"] else None)
    manifest = prepare_wmt14(
        args.out or default,
        corpora=tuple(args.corpus),
        direction=args.direction,
        vocab_size=args.vocab_size,
        subword_sentences=args.subword_sentences,
        progress=not args.quiet,
    )
    print(f"prepared in {args.out or default}", file=sys.stderr)
    return manifest
