"""How the words of a command become arguments: settings as KEY=VALUE, numbers checked where they are parsed, and
one kind of error for every mistake in them."""

import argparse
import json
import math
import shutil
import textwrap

import torch


class UsageError(Exception):
    "A mistake in the command's arguments."


def parse_override(text: str) -> tuple[str, object]:
    "KEY=VALUE from the command line; the value is read as JSON (numbers, true/false, null) or else kept as text."
    key, sep, raw = text.partition("=")
    if not sep or not key or key.startswith("-"):
        raise UsageError(f"unrecognized argument {text!r} (settings are given as KEY=VALUE)")
    words = {"True": True, "False": False, "None": None}
    if raw in words:
        return key, words[raw]
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


class CommandParser(argparse.ArgumentParser):
    "An argument parser that raises `UsageError` where argparse would print its usage and exit."

    def error(self, message):
        raise UsageError(message)


def non_negative(kind):
    "An argparse type: a finite number of `kind` (int or float) that is not negative."

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = -1
        if not (value >= 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number >= 0, got {text!r}")
        return value

    return convert


def positive_int(text: str) -> int:
    "An argparse type: a whole number of at least 1."
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def device_option(name: str | None):
    "The `--device` option as a torch.device; None (not given) lets the code called choose the best one."
    try:
        return torch.device(name) if name else None
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a device name (cpu, cuda, cuda:N, mps)") from None


def help_section(title: str, entries) -> str:
    """A section of help text: `title`, then each (name, paragraphs) entry with its name in a column and each of its
    paragraphs wrapped to the terminal's width, as argparse wraps the rest of the help."""
    width = max(shutil.get_terminal_size().columns - 2, 60)
    lines = [f"{title}:"]
    for name, paragraphs in entries:
        body = [line for text in paragraphs if text
                for line in textwrap.wrap(text, width - 21, break_on_hyphens=False)]
        lines += [f"  {name if i == 0 else '':<18} {line}" for i, line in enumerate(body)]
    return "\n".join(lines)


# The environment variables that the commands read (AT_DATA_DIR and AT_MIRROR: `data_dir` and `fetch` of the data page).
ENVIRONMENT = [
    ("AT_DATA_DIR", ["where data sets are downloaded and prepared, and where the chapters cache their trained runs "
                     "(default: ~/.cache/annotated_transformer)"]),
    ("AT_MIRROR", ["a folder or URL base that replaces the data sets' download locations, laid out as "
                   "<mirror>/<dataset>/<file>"]),
    ("AT_DEBUG=1", ["as --debug: a failure also prints its traceback"]),
    ("OMP_NUM_THREADS", ["the CPU threads PyTorch computes with when --threads is not given"]),
]
