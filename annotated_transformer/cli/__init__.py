"""`annotated-transformer` (also `python -m annotated_transformer`): the package's commands, for use outside notebooks."""

import argparse
import json
import os
import shlex
import signal
import sys
import threading
import traceback
import warnings

import torch

from .. import __version__
from ..lib.artifacts import RUNS, RunFiles
from ..lib.devices import bf16_by_default, bf16_supported, default_device
from ..lib.processes import torchrun_rank
from .arguments import ENVIRONMENT, CommandParser, UsageError, help_section, parse_override, positive_int
from .models import add_evaluate, add_export, add_translate, evaluate_command, export_command, translate_command
from .studies import add_bench, add_variations, bench_command, variations_command
from .train import add_prepare, add_train, prepare_command, train_command


class _Version(argparse.Action):
    """`--version`: the package's version, PyTorch's, and what PyTorch computes on here (with bfloat16 or not);
    then the program ends."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        device = default_device()
        autocast = "by default" if bf16_by_default(device) else "only with train --bf16"
        print(f"annotated-transformer {__version__}\nPyTorch {torch.__version__}, default device {device}, "
              f"{torch.get_num_threads()} CPU threads\nbfloat16 {'native' if bf16_supported(device) else 'not native'} "
              f"on {device}: training autocasts to it {autocast}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    "The `annotated-transformer` argument parser."
    parser = CommandParser(
        prog="annotated-transformer",
        description="Train and use the Transformer of 'Attention Is All You Need'.",
        epilog=help_section("environment", ENVIRONMENT),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the versions of the package and of PyTorch, and exit")
    debug = "on a failure, also print its traceback (for a bug report)"
    parser.add_argument("--debug", action="store_true", help=debug)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    parser.commands = commands.choices  # name -> its parser, for the hint after a mistake
    for add_command in (add_train, add_prepare, add_translate, add_evaluate, add_export, add_bench,
                        add_variations):
        add_command(commands)
    for name, command in commands.choices.items():  # the options several commands share, after their own
        if name != "prepare":  # the commands that compute with PyTorch
            command.add_argument("--threads", type=positive_int, metavar="N", help="CPU threads for PyTorch (default: "
                                 "PyTorch's own choice, which follows OMP_NUM_THREADS)")
        # SUPPRESS: not given after the command, it leaves the value given before it
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug)
    return parser


class _Terminated(KeyboardInterrupt):
    "SIGTERM (a container stopped, a scheduler's time limit): handled as Ctrl-C is, at the next consistent point."


def _on_sigterm(signum, frame):
    # One stop is enough: a second SIGTERM (a supervisor that sends two) must not break the first one's clean stop,
    # which may be in the middle of leaving a file whole.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    "Warnings as the command line's other messages: one line on stderr, without the source line."
    print(f"annotated-transformer: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _help_hint(argv, commands) -> str:
    "Where to read how a command is used: `annotated-transformer COMMAND --help`, or the list of `commands`."
    words = sys.argv[1:] if argv is None else list(argv)
    command = next((w for w in words if w in commands), None)
    return f"see annotated-transformer {command} --help" if command else "see annotated-transformer --help"


def main(argv=None) -> int:
    """The command line: `annotated-transformer train | prepare | translate | evaluate | export | bench | variations ...` (see `--help`).

    Every failure prints one line on stderr, without a traceback (`--debug` or `AT_DEBUG=1` prints the traceback
    before it): exit code 2 for mistakes in the arguments or settings, 1 for anything that goes wrong while running,
    130 after Ctrl-C and 143 after SIGTERM. `--help` and `--version` return 0.
    """
    args, parser = None, build_parser()
    debug = os.environ.get("AT_DEBUG", "") not in ("", "0")
    threads = torch.get_num_threads()  # --threads changes the whole process: restored at the end
    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may handle signals
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            try:
                args, rest = parser.parse_known_args(argv)
            except SystemExit as done:  # --help or --version: printed, and nothing to run
                return done.code or 0
            debug = debug or args.debug
            if args.command == "train" and args.recipe and "=" in args.recipe:  # a setting where RECIPE may stand
                rest, args.recipe = [args.recipe, *rest], None
            if args.command not in ("train", "variations") and rest:
                raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
            settings = dict(parse_override(word) for word in rest)  # KEY=VALUE words, before or after the options
            if getattr(args, "threads", None):
                torch.set_num_threads(args.threads)
            if args.command == "train":
                summary = train_command(args, settings)
                if torchrun_rank() == 0:  # under torchrun, the first process speaks for all
                    print(json.dumps(summary, indent=2))
            elif args.command == "prepare":
                print(json.dumps(prepare_command(args), indent=2))
            elif args.command == "translate":
                translate_command(args)
            elif args.command == "evaluate":
                evaluate_command(args)
            elif args.command == "export":
                print(json.dumps(export_command(args), indent=2))
            elif args.command == "variations":
                variations_command(args, settings)
            else:
                bench_command(args)
    except UsageError as err:
        print(f"annotated-transformer: error: {err} ({_help_hint(argv, parser.commands)})", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        if debug:  # where the program was when it was stopped
            traceback.print_exc()
        how = "stopped by SIGTERM" if isinstance(err, _Terminated) else "interrupted"
        resume = ""
        if args and args.command == "train" and args.recipe:
            out = args.out or RUNS / args.recipe
            given = f" --threads {args.threads}" if getattr(args, "threads", None) else ""  # the same threads again
            resume = (f"; continue with: annotated-transformer train --out {shlex.quote(str(out))} --resume{given}"
                      if RunFiles(out).config.exists() else "; nothing was trained yet: run the same command again")
        elif args and args.command == "variations":
            resume = "; run the same command again to continue (scored rows are kept, the stopped one resumes)"
        print(f"annotated-transformer: {how}{resume}", file=sys.stderr)
        return 143 if isinstance(err, _Terminated) else 130
    except Exception as err:  # noqa: BLE001 - the command line reports, the library raises
        if debug:
            traceback.print_exc()
        print(f"annotated-transformer: error: {err}", file=sys.stderr)
        return 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    return 0
