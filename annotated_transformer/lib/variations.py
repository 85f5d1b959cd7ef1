"""Table 3 of the paper in miniature (§6.2): the base recipe against one change at a time, each row trained and scored
on the development split as Table 3 is (perplexity; BLEU with beam 4), the table written after every row and resumed
where it stopped."""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .artifacts import RunFiles, read_artifact, write_artifact
from .checkpoints import checkpoints_to_average
from .devices import check_device, device_name
from .evaluate import evaluate_translator
from .recipes import Recipe
from .results import commit
from .tasks import load_task
from .trainer import train
from ..training import validation_loss
from .translate import Translator


# Table 3 of the paper: English-German, newstest2013, beam search without checkpoint averaging. Each row lists what
# differs from the base model; perplexity is per wordpiece; parameters in millions (left blank where the paper does).
PAPER_TABLE3 = [
    {"row": "base", "changes": {}, "dev_ppl": 4.92, "dev_bleu": 25.8, "params_m": 65},
    {"row": "A", "changes": {"h": 1, "d_k": 512}, "dev_ppl": 5.29, "dev_bleu": 24.9, "params_m": None},
    {"row": "A", "changes": {"h": 4, "d_k": 128}, "dev_ppl": 5.00, "dev_bleu": 25.5, "params_m": None},
    {"row": "A", "changes": {"h": 16, "d_k": 32}, "dev_ppl": 4.91, "dev_bleu": 25.8, "params_m": None},
    {"row": "A", "changes": {"h": 32, "d_k": 16}, "dev_ppl": 5.01, "dev_bleu": 25.4, "params_m": None},
    {"row": "B", "changes": {"d_k": 16}, "dev_ppl": 5.16, "dev_bleu": 25.1, "params_m": 58},
    {"row": "B", "changes": {"d_k": 32}, "dev_ppl": 5.01, "dev_bleu": 25.4, "params_m": 60},
    {"row": "C", "changes": {"N": 2}, "dev_ppl": 6.11, "dev_bleu": 23.7, "params_m": 36},
    {"row": "C", "changes": {"N": 4}, "dev_ppl": 5.19, "dev_bleu": 25.3, "params_m": 50},
    {"row": "C", "changes": {"N": 8}, "dev_ppl": 4.88, "dev_bleu": 25.5, "params_m": 80},
    {"row": "C", "changes": {"d_model": 256, "d_k": 32}, "dev_ppl": 5.75, "dev_bleu": 24.5, "params_m": 28},
    {"row": "C", "changes": {"d_model": 1024, "d_k": 128}, "dev_ppl": 4.66, "dev_bleu": 26.0, "params_m": 168},
    {"row": "C", "changes": {"d_ff": 1024}, "dev_ppl": 5.12, "dev_bleu": 25.4, "params_m": 53},
    {"row": "C", "changes": {"d_ff": 4096}, "dev_ppl": 4.75, "dev_bleu": 26.2, "params_m": 90},
    {"row": "D", "changes": {"dropout": 0.0}, "dev_ppl": 5.77, "dev_bleu": 24.6, "params_m": None},
    {"row": "D", "changes": {"dropout": 0.2}, "dev_ppl": 4.95, "dev_bleu": 25.5, "params_m": None},
    {"row": "D", "changes": {"label_smoothing": 0.0}, "dev_ppl": 4.67, "dev_bleu": 25.3, "params_m": None},
    {"row": "D", "changes": {"label_smoothing": 0.2}, "dev_ppl": 5.47, "dev_bleu": 25.7, "params_m": None},
    {"row": "E", "changes": {"positional": "learned"}, "dev_ppl": 4.92, "dev_bleu": 25.7, "params_m": None},
    {"row": "big", "changes": {"d_model": 1024, "d_ff": 4096, "h": 16, "dropout": 0.3, "steps": "300K"},
     "dev_ppl": 4.33, "dev_bleu": 26.4, "params_m": 213},
]


DEFAULT_BASE = "multi30k-tiny"  # the book's live recipe: every row trains in minutes on a 2-core CPU


@dataclass(frozen=True)
class Variation:
    """One row of Table 3 in miniature: the paper's row label (`row`: "base", "A" ... "E"), a `name` (also the name
    of its run directory) and the `changes` from the base recipe, (setting, value) pairs of `Recipe.replace`."""

    row: str
    name: str
    changes: tuple = ()

    def recipe(self, base: Recipe) -> Recipe:
        "The base recipe with this row's changes."
        return base.replace(**dict(self.changes))


def table3_rows(base: Recipe, seeds: int = 3) -> list[Variation]:
    """The rows of Table 3 around the model of the recipe `base`, one change at a time, as the paper varies its base.

    base: the base itself with `seeds` seeds, its own and the next ones (the noise every other row is read
    against). (A) 1, 4, 8 and 16 heads other than the base's, where d_model divides, at constant computation
    (d_k = d_v = d_model / h); (B) d_k halved and quartered (values keep d_model / h); (C) half and twice the
    layers, d_model (heads kept, so d_k follows) and d_ff; (D) dropout and label smoothing, each of 0, 0.1 and 0.2
    other than the base's (the paper's 0 and 0.2 around its 0.1); (E) learned positional embeddings.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    seed, config = base.seed, base.model
    d_k = config.d_k or config.d_model // config.h
    reset = (("d_k", None),) if config.d_k else ()  # rows (A) and (C) keep d_k = d_model / h
    rows = [Variation("base", "base" if s == 0 else f"base-seed{seed + s}", (("seed", seed + s),) if s else ())
            for s in range(seeds)]
    rows += [Variation("A", f"A-h{h}", (("h", h), *reset)) for h in (1, 4, 8, 16)
             if h != config.h and config.d_model % h == 0]
    rows += [Variation("B", f"B-dk{k}", (("d_k", k),)) for k in (d_k // 2, d_k // 4) if k >= 1]
    rows += [Variation("C", f"C-N{n}", (("N", n),)) for n in sorted({max(1, config.N // 2), 2 * config.N} - {config.N})]
    rows += [Variation("C", f"C-d{d}", (("d_model", d), *reset)) for d in (config.d_model // 2, 2 * config.d_model)
             if d % config.h == 0 and d % 2 == 0]
    rows += [Variation("C", f"C-ff{f}", (("d_ff", f),)) for f in (config.d_ff // 2, 2 * config.d_ff) if f >= 1]
    rows += [Variation("D", f"D-dropout{p}", (("dropout", p),)) for p in (0.0, 0.1, 0.2) if p != config.dropout]
    rows += [Variation("D", f"D-ls{e}", (("label_smoothing", e),)) for e in (0.0, 0.1, 0.2)
             if e != config.label_smoothing]
    if config.positional == "sinusoidal":
        rows.append(Variation("E", "E-learned", (("positional", "learned"),)))
    return rows


def score_run(recipe: Recipe, run_dir, average: int = 1, device=None) -> dict:
    """Development perplexity and BLEU of a trained run, as Table 3 measures them: the validation split, beam search
    (§6.1's beam and α) and, with `average=1`, the last checkpoint alone (the paper averaged none for Table 3);
    `average=k` scores the mean of the last k checkpoints instead. Also the model's parameter count."""
    device = check_device(device)
    paths = checkpoints_to_average(run_dir, average)
    translator = Translator.from_checkpoint(*paths, device=device)
    task = load_task(recipe)  # the validation pairs as token ids, by the rule that built the run's vocabulary
    if translator.vocab != task.vocab:
        raise ValueError(f"{run_dir}: the run's vocabulary differs from the one its recipe builds from the data today")
    loss = validation_loss(translator.model, task.valid, recipe.max_tokens, device)
    scores = evaluate_translator(translator, "valid")
    return {"checkpoints": [p.name for p in paths], "params": sum(p.numel() for p in translator.model.parameters()),
            "dev_ppl": math.exp(loss), "dev_bleu": scores["bleu"], "bleu_signature": scores["bleu_signature"],
            "dev_chrf": scores["chrf"]}


def run_variations(base: Recipe, out_dir, rows: list[Variation] | None = None, *, only=None, results=None, device=None,
                   progress: bool = True) -> dict:
    """Train and score the rows of Table 3 in miniature (default: `table3_rows(base)`), one run directory
    each, out_dir/<row name>; returns the table, also written to the JSON file `results` after every row.

    Each row is scored by `score_run` on its last checkpoint, as Table 3 is; the base rows also on the average
    of their last `base.average_checkpoints` checkpoints (§6.1). Resumable: a row trained and scored with the same
    settings (out_dir/<name>/variation.json) is read back, not trained again, and an interrupted row resumes from
    its newest checkpoint. `only`: the names of the rows to train now; the table still lists every row done.
    """
    device = check_device(device)
    if isinstance(only, str):
        raise TypeError(f"only must be a list of row names, e.g. [{only!r}]")
    rows = table3_rows(base) if rows is None else list(rows)
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"row names must differ, got {names}")
    if only is not None and (unknown := sorted(set(only) - set(names))):
        raise ValueError(f"no row named {', '.join(unknown)}; the rows are {', '.join(names)}")
    table = {"base_recipe": base.name, "base": base.to_dict(), "split": "valid", "device": str(device),
             "device_name": device_name(str(device)), "torch_version": torch.__version__, "commit": commit(),
             "rows": [], "complete": False}
    if results is not None:
        Path(results).parent.mkdir(parents=True, exist_ok=True)
    for variation in rows:
        recipe, run_dir = variation.recipe(base), Path(out_dir) / variation.name
        scored = run_dir / "variation.json"
        if scored.exists() and not recipe.differences((entry := read_artifact(scored, "variation")).get("settings", {})):
            entry.pop("format")
            if (trained_on := read_artifact(RunFiles(run_dir).summary, "summary")["device"]) != str(device):
                raise ValueError(f"{run_dir} was trained on {trained_on}, not on {device}: a table is of one device; "
                                 "give this one another folder (--out)")
            table["rows"].append(entry)
        elif only is None or variation.name in only:
            # float32 on every device, as the recorded table was trained: rows of one table compare like for like
            summary = train(recipe, run_dir, device=device, resume=RunFiles(run_dir).config.exists(),
                            progress=progress, bf16=False)
            if summary["steps"] != recipe.steps:  # a finished run with more updates is left as it is by `train`
                raise ValueError(f"{run_dir} holds a run of {summary['steps']} updates, not the {recipe.steps} of this "
                                 "table; give this table another folder (--out)")
            started = time.perf_counter()
            entry = {"row": variation.row, "name": variation.name, "changes": dict(variation.changes),
                     "seed": recipe.seed, "steps": summary["steps"], "wall_time_s": summary["wall_time_s"],
                     "threads": torch.get_num_threads(), **score_run(recipe, run_dir, 1, device)}
            if variation.row == "base":
                entry["averaged"] = score_run(recipe, run_dir, recipe.average_checkpoints, device)
            entry["scoring_s"], entry["settings"] = time.perf_counter() - started, recipe.to_dict()
            write_artifact(scored, "variation", entry)
            table["rows"].append(entry)
        if results is not None:
            write_artifact(results, "variations", table)
    table["complete"] = len(table["rows"]) == len(rows)
    if results is not None:
        write_artifact(results, "variations", table)
    return table


def describe_changes(changes: dict) -> str:
    "A row's changes as the table prints them: 'h=1', 'positional=learned', or 'seed 1' for the base's repeats."
    return ", ".join(f"seed {v}" if k == "seed" else f"{k}={v}" for k, v in changes.items()) or "-"


def variations_table(table: dict) -> str:
    "The rows of a `run_variations` table as text: change, parameters, dev perplexity and BLEU, training minutes."
    lines = [f"{'row':<5} {'change':<22} {'params':>10} {'dev PPL':>8} {'dev BLEU':>9} {'train min':>10}"]
    for r in table["rows"]:
        lines.append(f"{r['row']:<5} {describe_changes(r['changes']):<22} {r['params']:>10,} {r['dev_ppl']:>8.2f} "
                     f"{r['dev_bleu']:>9.2f} {r['wall_time_s'] / 60:>10.1f}")
    return "\n".join(lines)
