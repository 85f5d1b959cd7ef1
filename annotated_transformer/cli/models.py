"""`translate`, `evaluate` and `export`: a trained translator chosen by its checkpoints (or a shared model folder),
then decoded, scored or written to a folder to share."""

import argparse
import contextlib
import itertools
import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from ..lib.artifacts import RESULTS, RunFiles, kind_of_file
from ..lib.files import atomic_file
from ..lib.results import record_result
from .arguments import UsageError, device_option, non_negative, positive_int


def decoding_options(parser: argparse.ArgumentParser) -> None:
    "The arguments of the commands that translate: the checkpoints and the decoding settings."
    from ..decoding import ALPHA, BEAM_SIZE, EXTRA_LEN

    parser.add_argument(
        "--checkpoint",
        nargs="+",
        required=True,
        type=Path,
        metavar="PATH",
        help="a checkpoint, several (averaged), a run directory (its last checkpoints, averaged), or a model folder "
        "that export wrote (or a .safetensors model file of earlier versions)",
    )
    parser.add_argument(
        "--beam-size", type=positive_int, default=BEAM_SIZE, help=f"beams per sentence; 1 is greedy (default {BEAM_SIZE})"
    )
    parser.add_argument(
        "--alpha", type=non_negative(float), default=ALPHA, help=f"length penalty exponent (default {ALPHA})"
    )
    parser.add_argument(
        "--extra-len",
        type=non_negative(int),
        default=EXTRA_LEN,
        help=f"how much longer than its source a translation may be (default {EXTRA_LEN})",
    )
    parser.add_argument(
        "--average",
        type=positive_int,
        help="with a run directory: how many of its last checkpoints to "
        "average (default: the recipe's average_checkpoints)",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")


def resolve_checkpoints(paths: list[Path], average: int | None,
                         option: str = "--checkpoint") -> tuple[list[Path], Path | None]:
    """The checkpoint files to load, and the run directory they belong to (None when they are loose files): those of
    `checkpoints_to_read`, a run holding fewer checkpoints than asked for giving those it holds, with a warning."""
    from ..lib.checkpoints import checkpoints_to_read

    if average is not None and not (len(paths) == 1 and paths[0].is_dir()):
        raise UsageError(f"--average needs a run directory as {option}")
    if average is not None and kind_of_file(RunFiles(paths[0]).config) == "model":
        raise UsageError(f"--average needs a run directory as {option}; {str(paths[0])!r} is a model folder")
    for path in paths:
        if not (path.is_file() or len(paths) == 1 and path.is_dir()):
            raise UsageError(f"{option} {str(path)!r}: no such file" + (" (a run directory comes alone)"
                                                                       if path.is_dir() else ""))
    return checkpoints_to_read(paths, average, option="--average")


def add_translate(commands) -> None:
    "The `translate` command's arguments."
    translate_cmd = commands.add_parser(
        "translate",
        help="translate sentences from stdin",
        description="Translate standard input, one sentence per line, to standard output: one line out for each "
        "line in, in the same order (an empty line gives an empty line), written a batch at a time as the input "
        "comes. The input is UTF-8; a byte-order mark at its start is skipped, and bytes that are not UTF-8 are "
        "replaced, with a warning naming the line.",
    )
    decoding_options(translate_cmd)


def input_lines() -> Iterator[str]:
    """The lines of standard input as they come, split at "\\n" only, a "\\r" before it dropped. UTF-8 whatever the
    locale says, without a byte-order mark at the start; bytes that are not UTF-8 become U+FFFD, with one warning
    per line."""
    text = not hasattr(sys.stdin, "buffer")  # a replaced sys.stdin (e.g. in a notebook) is already text
    for number, raw in enumerate(sys.stdin if text else sys.stdin.buffer, 1):
        if number == 1:
            raw = raw.removeprefix("\ufeff" if text else b"\xef\xbb\xbf")
        raw = raw.removesuffix("\n" if text else b"\n")
        if not text:
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                warnings.warn(f"line {number} of standard input is not valid UTF-8; its undecodable bytes were "
                              "replaced by U+FFFD", stacklevel=2)
                raw = raw.decode("utf-8", errors="replace")
        yield raw.removesuffix("\r")


# Characters that a terminal obeys rather than shows (escape sequences that recolour, move the cursor, retitle
# the window): a model's vocabulary may hold them, and they never belong in a translation. Tab stays.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def output_line(translation: str) -> str:
    "A translation as one line of output: a line break inside becomes a space, a control character U+FFFD."
    return _CONTROL.sub("\ufffd", " ".join(translation.splitlines())) + "\n"


def translate_command(args) -> None:
    """Run `translate`: standard input to standard output, one line out for each line in, in UTF-8. It streams: the
    lines are translated a batch at a time (a line at a time from a terminal), each batch written out before the
    next is read, so that memory stays that of a batch however long the input."""
    from ..lib.translate import Translator

    paths, _ = resolve_checkpoints(args.checkpoint, args.average)
    translator = Translator.from_checkpoint(*paths, device=device_option(args.device))
    batch = 1 if sys.stdin.isatty() else translator.batch_size
    lines, first = input_lines(), 1
    while chunk := list(itertools.islice(lines, batch)):
        # what the translator says counts this batch's inputs: after the first batch, say where it starts
        where = f"lines {first}-{first + len(chunk) - 1} of standard input (inputs counted from line {first}): " \
            if first > 1 else ""
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                translations = translator.translate(chunk, args.beam_size, args.alpha, args.extra_len)
            except ValueError as err:
                raise ValueError(f"{where}{err}") from None
        for warning in said:
            warnings.warn(f"{where}{warning.message}", warning.category, stacklevel=2)
        out = "".join(output_line(t) for t in translations)
        try:
            if hasattr(sys.stdout, "buffer"):
                sys.stdout.flush()
                sys.stdout.buffer.write(out.encode("utf-8"))
                sys.stdout.buffer.flush()
            else:
                sys.stdout.write(out)
                sys.stdout.flush()
        except BrokenPipeError:  # the reader has stopped (`| head`): stop too, quietly, as command-line tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
            return
        first += len(chunk)


def add_evaluate(commands) -> None:
    "The `evaluate` command's arguments."
    evaluate_cmd = commands.add_parser(
        "evaluate",
        help="BLEU of a trained model on a Multi30k or Tatoeba split, or on newstest2014",
        description="Translate a split of the model's data set, Multi30k or Tatoeba (a WMT14 model: newstest2014), "
        "with beam search and print sacreBLEU "
        "(with its signature) and chrF. "
        "With a checkpoint of a run, the scores also go into the run's summary.json and into --results.",
    )
    decoding_options(evaluate_cmd)
    evaluate_cmd.add_argument(
        "--split",
        default="test",
        choices=["valid", "test"],
        help="default: test (Multi30k's test2016); a WMT14 model is always scored on newstest2014",
    )
    evaluate_cmd.add_argument(
        "--results", type=Path, default=RESULTS, help=f"folder for the results file (default: {RESULTS})"
    )
    evaluate_cmd.add_argument("--hypotheses", type=Path, help="also write the translations to this file")


def _write_text(path: Path, text: str) -> None:
    "Write `text` (UTF-8) to the file `path`: whole or not at all, or into a device or pipe that a user named."
    if path.exists() and not path.is_file():  # /dev/stdout, a named pipe: written into, never replaced
        with open(path, "wb") as f:
            f.write(text.encode("utf-8"))
    else:
        with atomic_file(path) as f:
            f.write(text.encode("utf-8"))


def evaluate_command(args) -> dict:
    """Run `evaluate`: translate the test set, print the scores and record them with the run; returns them. With the
    checkpoints of a run, it holds the run's lock throughout (no training writes there meanwhile), and checks that
    the scores can be recorded before it translates."""
    from ..lib.devices import check_device
    from ..lib.evaluate import decoding_variant, evaluate_translator
    from ..lib.pretrained import read_model
    from ..lib.results import result_path
    from ..lib.runs import RunDir, RunDirBusy
    from ..lib.translate import Translator
    from ..lib.wmt import evaluate_wmt14

    paths, run_dir = resolve_checkpoints(args.checkpoint, args.average)
    if args.hypotheses and not args.hypotheses.parent.is_dir():
        raise UsageError(f"--hypotheses {str(args.hypotheses)!r}: no folder {str(args.hypotheses.parent)!r} to write it in")
    with contextlib.ExitStack() as held:
        if run_dir is not None:
            without = "or copy the checkpoints out of the run to score them without recording the scores"
            try:
                held.enter_context(RunDir(run_dir))
            except RunDirBusy:
                raise RunDirBusy(f"{run_dir} is in use: a training or another evaluation writes there; evaluate it "
                                 f"when that ends, {without}") from None
            except PermissionError:
                raise PermissionError(f"{run_dir}: this folder cannot be written, and evaluate records the scores "
                                      f"there; make it writable, {without}") from None
        device = check_device(device_option(args.device))
        state = read_model(paths)
        translator = Translator.from_state(state, paths[-1], device)
        if translator.dataset is None:  # a model of symbols: the copy task's own score is in its run's summary.json
            raise ValueError(f"{paths[-1]}: a model of no data set with a test split (such as the copy task); "
                             "evaluate scores translators of Multi30k, Tatoeba or WMT14")
        split = "newstest2014" if translator.dataset == "wmt14" else args.split
        if run_dir is not None:  # whatever would stop the recording stops the command now, not after the work
            result_path(run_dir, translator.direction, split, decoding_variant(args.beam_size, args.alpha,
                                                                                args.extra_len), args.results)
        what = "newstest2014" if translator.dataset == "wmt14" else f"{translator.dataset.capitalize()} {split}"
        print(f"annotated-transformer: translating {what} with beam {args.beam_size}, alpha {args.alpha}, on "
              f"{translator.device} (minutes on a CPU)", file=sys.stderr, flush=True)  # nothing else shows for a while
        if translator.dataset == "wmt14":  # a WMT14 model: newstest2014, full and filtered
            evaluation = evaluate_wmt14(translator, args.beam_size, args.alpha, args.extra_len)
            report = (
                f"newstest2014, sacreBLEU: {evaluation['bleu_full']} (wmt14/full, 3003 lines), "
                f"{evaluation['bleu_filtered']} (wmt14, 2737 lines) ({evaluation['bleu_signature']})\n"
                f"tokenized BLEU with compounds split (the paper's kind; not comparable with sacreBLEU): "
                f"{evaluation['tokenized_bleu_filtered']}"
            )
        else:
            evaluation = evaluate_translator(translator, split, args.beam_size, args.alpha, args.extra_len)
            report = (
                f"{evaluation['bleu_detail']} ({evaluation['bleu_signature']})\n"
                f"chrF {evaluation['chrf']} ({evaluation['chrf_signature']})"
            )
            if "tokenized_lowercase_bleu" in evaluation:  # none for Chinese: spaCy's words are not how it is read
                report += ("\ntokenized, lowercased BLEU (older tutorials' number; not comparable): "
                           f"{evaluation['tokenized_lowercase_bleu']}")
        evaluation["checkpoints"], evaluation["steps"] = [p.name for p in paths], state["step"]  # what was scored
        if "elapsed_s" in state:  # one checkpoint of a run: the training time it took to reach it
            evaluation["training_wall_time_s"] = state["elapsed_s"]
        print(report, flush=True)
        if run_dir is not None:  # the record first: the translations are a copy for the user
            print(f"recorded in {RunFiles(run_dir).summary} and {record_result(run_dir, evaluation, args.results)}")
        if args.hypotheses:
            _write_text(args.hypotheses, "".join(h + "\n" for h in evaluation["hypotheses"]))
    return evaluation


def add_export(commands) -> None:
    "The `export` command's arguments."
    export_cmd = commands.add_parser(
        "export",
        help="write a trained model as a folder to share",
        description="Write the model of a run (its last checkpoints, averaged as its recipe says) or of checkpoint "
        "files (several: their average) as a model folder: config.json, model.safetensors (the weights) and the "
        "tokenizer's files; no optimizer and no pickle. translate and evaluate read it as --checkpoint, and "
        "Translator.from_pretrained in Python.",
    )
    export_cmd.add_argument("checkpoint", type=Path, nargs="+", help="a run directory, or checkpoint file(s)")
    export_cmd.add_argument("--out", type=Path, required=True, help="the folder to write, e.g. multi30k-de-en")
    export_cmd.add_argument("--average", type=positive_int, help="with a run directory: how many of its last "
                            "checkpoints to average (default: the recipe's average_checkpoints)")


def export_command(args) -> dict:
    "Run `export`: the (averaged) checkpoints as one model folder; returns what was written."
    from ..lib.pretrained import read_model, save_pretrained

    if args.out.suffix == ".safetensors":
        raise UsageError(f"--out {str(args.out)!r}: a model is written as a folder (config.json, model.safetensors and "
                         "the tokenizer's files); give the folder's name, e.g. --out multi30k-de-en")
    paths, _ = resolve_checkpoints(args.checkpoint, args.average, option="export's CHECKPOINT")
    state = read_model(paths)
    if "vocab" not in state:
        raise ValueError(f"{paths[-1]}: a checkpoint without a vocabulary cannot be exported: a model folder must say "
                         "what its ids mean")
    out = save_pretrained(state, args.out)
    return {"out": str(out), "bytes": sum(p.stat().st_size for p in out.iterdir()),
            "checkpoints": [str(p) for p in paths], "step": state["step"]}
