"""`bench` and `variations`: the speed of training and translating measured on this machine, and the paper's Table 3
trained and scored in miniature."""

import argparse
import hashlib
import json
import sys
from pathlib import Path

from ..lib.artifacts import RESULTS, RUNS
from ..lib.recipes import RECIPES
from .arguments import UsageError, device_option, parse_override, positive_int
from .models import resolve_checkpoints


def add_bench(commands) -> None:
    "The `bench` command's arguments."
    bench_cmd = commands.add_parser(
        "bench",
        help="measure training and translation speed on this machine",
        description="Measure training throughput (straightforward, fast and, where the device supports it, bf16 "
        "paths, with MFU against the device's measured matrix-product peak) and translation throughput (with and "
        "without the incremental cache), and write OUT/bench-<device>.json and .md.",
    )
    bench_cmd.add_argument(
        "--checkpoint",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="a trained Multi30k translator for the translation part: checkpoint(s) or a run "
        "directory (default: runs/multi30k-cpu)",
    )
    bench_cmd.add_argument("--no-translation", action="store_true", help="measure training only")
    bench_cmd.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    bench_cmd.add_argument("--repeats", type=positive_int, default=3, help="repetitions of each measurement (default 3)")
    bench_cmd.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="also measure the bf16 path under torch.compile (default: on CUDA only)",
    )
    bench_cmd.add_argument(
        "--out", type=Path, default=RESULTS, help=f"folder for the results (default: {RESULTS})"
    )


def bench_command(args) -> dict:
    "Run `bench`: measure, write the results files, print the table; returns the results."
    from ..lib.bench import run_benchmark
    from ..lib.measure import bench_table, write_benchmark

    checkpoint = None
    if not args.no_translation:
        if args.checkpoint is None and not (RUNS / "multi30k-cpu").exists():
            raise UsageError(
                "the translation benchmark needs a trained Multi30k translator: train one with "
                "`annotated-transformer train multi30k-cpu` (about 24 minutes on 2 CPU cores), pass "
                "--checkpoint, or measure training only with --no-translation"
            )
        checkpoint, _ = resolve_checkpoints(args.checkpoint or [RUNS / "multi30k-cpu"], None)
    result = run_benchmark(
        device=device_option(args.device),
        checkpoint=checkpoint,
        repeats=args.repeats,
        compile=args.compile,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    paths = write_benchmark(result, args.out)
    print(bench_table(result))
    print(f"\nwritten: {paths[0]} and {paths[1]}")
    return result


def add_variations(commands) -> None:
    "The `variations` command's arguments."
    from ..lib.variations import DEFAULT_BASE

    variations_cmd = commands.add_parser(
        "variations",
        help="train and score the paper's Table 3 in miniature",
        usage="annotated-transformer variations [options] [KEY=VALUE ...]",
        description="Train a base recipe and one variation per row of the paper's Table 3 (heads, d_k, layers, "
        "widths, dropout, label smoothing, learned positions; the base with several seeds), one run directory each "
        "under --out; score each on the Multi30k validation split (perplexity, beam-search BLEU) and write "
        "--results/variations-<device>.json (with another base, settings or seeds: a name that says so). Run again, "
        "it resumes: scored rows are read back, an interrupted one "
        "continues from its newest checkpoint. KEY=VALUE words change the base recipe.",
    )
    variations_cmd.add_argument("--base", default=DEFAULT_BASE,
                                choices=[name for name, r in RECIPES.items() if r.task == "multi30k"],
                                help=f"the base recipe (default: {DEFAULT_BASE}; on a GPU, multi30k-cpu or multi30k-gpu)")
    variations_cmd.add_argument("--seeds", type=positive_int, default=3, help="seeds of the base row (default 3)")
    variations_cmd.add_argument("--only", nargs="+", metavar="ROW",
                                help="train only these rows now, e.g. base A-h1 (the table keeps every row done)")
    variations_cmd.add_argument("--out", type=Path, help="folder of the rows' run directories (default: "
                                "runs/variations-BASE, with a digest of any KEY=VALUE settings)")
    variations_cmd.add_argument("--results", type=Path, default=RESULTS,
                                help="folder for the results file (default: results)")
    variations_cmd.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    variations_cmd.add_argument("--quiet", action="store_true", help="no progress output (bar or lines)")


def variations_command(args, settings: dict) -> dict:
    "Run `variations`: every row trained and scored, the table written and printed; returns the table."
    from ..lib.devices import check_device, device_name, device_slug
    from ..lib.variations import DEFAULT_BASE, run_variations, table3_rows, variations_table

    only = [word for word in args.only or [] if "=" not in word] or None
    settings = {**settings, **dict(parse_override(word) for word in args.only or [] if "=" in word)}  # after --only
    try:
        base = RECIPES[args.base].replace(**settings)
    except ValueError as err:
        raise UsageError(str(err)) from None
    rows = table3_rows(base, args.seeds)
    if only and (unknown := sorted(set(only) - {r.name for r in rows})):
        raise UsageError(f"--only: no row named {', '.join(unknown)}; the rows are {', '.join(r.name for r in rows)}")
    device = check_device(device_option(args.device))

    def digest(values: dict) -> str:  # other settings, another table: its own folder and results file
        return "-" + hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8] if values else ""

    base_name = "" if args.base == DEFAULT_BASE else f"-{args.base}"  # the book's table has the short name
    seeds = {"seeds": args.seeds} if args.seeds != 3 else {}
    results = (args.results / f"variations{base_name}{digest({**settings, **seeds})}-"
               f"{device_slug(device_name(str(device)))}.json")
    out = args.out or RUNS / f"variations-{args.base}{digest(settings)}"
    table = run_variations(base, out, rows, only=only, results=results, device=device, progress=not args.quiet)
    print(variations_table(table))
    print(f"\nwritten: {results}" + ("" if table["complete"] else " (not every row is done yet)"))
    return table
