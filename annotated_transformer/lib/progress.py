"""What the package shows while it works: progress bars for long loops (a corpus being tokenized, a download) on a
terminal only, and the progress of a training run (`ProgressReport`)."""

import contextlib
import contextvars
import os
import shutil
import sys
import time

from tqdm import tqdm

from .recipes import Recipe


_showing_progress = contextvars.ContextVar("showing_progress", default=True)


@contextlib.contextmanager
def progress_shown(show: bool):
    """Within the block, `with_progress` shows its bars only if `show` is true (a training run with `progress=False`
    reads its data inside `progress_shown(False)`); the previous setting returns when the block ends."""
    token = _showing_progress.set(show)
    try:
        yield
    finally:
        _showing_progress.reset(token)


def with_progress(items, desc: str, unit: str = "it", shown: bool = True, **options):
    """`items`, unchanged, with a progress bar on stderr while they are gone through (a corpus being tokenized, say):
    on a terminal only, never in a file that output is redirected to, and neither within `progress_shown(False)` nor
    if not `shown`. The bar counts up to `len(items)` where it exists (or `total`, among tqdm's `options`), and
    disappears when done. With `items=None` it is a bar to `update` by hand (a download)."""
    disable = None if shown and _showing_progress.get() else True  # None: tqdm's own test for a terminal
    return tqdm(items, desc=desc, unit=unit, leave=False, disable=disable, **options)


def _columns(stream) -> int:
    "The width of the terminal that `stream` writes to; where it has none, `COLUMNS` or 80 (`shutil`'s answer)."
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # no file descriptor, or not a terminal
        return shutil.get_terminal_size().columns


class ProgressReport:
    """What a training run shows on stderr while it runs, if `show` (under `torchrun`: process 0 only).

    On a terminal, a progress bar over the updates with the training loss, the learning rate, the tokens per second
    and the newest validation loss and perplexity; elsewhere (a file, a notebook), one line per evaluation, since a
    bar redrawn at every update would fill a log. `loading()` surrounds the reading of the data, which can be slow
    the first time: a line before and after it. Used as `with ProgressReport(recipe, show) as report:`, which closes
    the bar however the block ends."""

    def __init__(self, recipe: Recipe, show: bool = True):
        self.name, self.steps, self.show = recipe.name, recipe.steps, show
        self.terminal = show and sys.stderr.isatty()
        self.bar, self.started = None, False  # the bar is made at the first update, where a resumed run stands
        self.training, self.validation = (), ""  # the bar's numbers: of the newest update, of the newest evaluation

    def __enter__(self) -> "ProgressReport":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def _line(self, text: str) -> None:
        if self.show:
            print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def loading(self):
        "Around the reading of the data: a line before and after it; the data module's bars only if shown."
        self._line("reading the data")
        started = time.perf_counter()
        with progress_shown(self.show):
            yield
        self._line(f"data ready in {time.perf_counter() - started:.1f} s")

    def finished(self, summary: dict) -> dict:
        "A resumed run that had finished: it says so, and trains nothing; returns its summary."
        self._line(f"finished its {summary['steps']} updates already: nothing to do (a larger steps= trains on)")
        return summary

    def update(self, step: int, loss: float, lr: float, tokens_per_s: float) -> None:
        """Update `step` is done, with `loss` per token at learning rate `lr`; on a terminal, the bar moves on. The first
        update of a resumed run says where it resumed."""
        if not self.started and step > 1:
            self._line(f"resuming after update {step - 1} of {self.steps}")
        self.started = True
        if self.terminal:
            if self.bar is None:  # as wide as the terminal; the numbers short, so that the bar keeps some room
                self.bar = tqdm(total=self.steps, initial=step - 1, desc=self.name, unit="update",
                                ncols=_columns(sys.stderr),
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                           "[{elapsed}<{remaining}]{postfix}")
            self.training = (f"loss {loss:.3f}", f"{tokens_per_s:,.0f} tok/s", f"lr {lr:.1e}")
            self.bar.set_postfix_str(self._numbers(), refresh=False)
            self.bar.update(step - self.bar.n)

    def _numbers(self) -> str:
        "The bar's numbers, the most telling first, as many as fit in the terminal beside a bar of 8 characters."
        room = self.bar.ncols - len(self.name) - 2 * len(str(self.steps)) - 38  # the rest of the line, its clock too
        shown = []
        for part in (self.validation, *self.training):
            if part and len(" | ".join([*shown, part])) <= room:
                shown.append(part)
        return " | ".join(shown)

    def evaluation(self, metrics: dict) -> None:
        "An evaluation's metrics, as `RunDir.log` writes them: into the bar on a terminal, as a line elsewhere."
        ppl = "inf" if metrics["valid_ppl"] is None else f"{metrics['valid_ppl']:.2f}"  # None: too large a float
        if self.terminal:
            self.validation = f"valid {metrics['valid_loss']:.3f} ppl {ppl}"
            if self.bar is not None:
                self.bar.set_postfix_str(self._numbers())
        else:
            self._line(f"step {metrics['step']}/{self.steps} train_loss={metrics['train_loss']:.3f} "
                       f"valid_loss={metrics['valid_loss']:.3f} valid_ppl={ppl} lr={metrics['lr']:.2e} "
                       f"tokens_per_s={metrics['tokens_per_s']:.0f}")
