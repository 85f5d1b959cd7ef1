"""How the benchmark measures and reports: repeated timings and their spread, peak memory on a CPU and a GPU, the
matrix-product peak of a device, FLOPs counted, the typical batches it times, and the results files and tables that
`annotated-transformer bench` writes."""

import ctypes
import gc
import re
import statistics
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula, sdpa_flop_count

from .artifacts import RESULTS, write_artifact
from .devices import device_slug
from .files import atomic_file


def summarize(values) -> dict:
    "Median, minimum, maximum and count of repeated measurements."
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _resident_peak() -> int | None:
    "The process's peak resident set size in bytes since it was last reset (Linux), or None."
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(found.group(1)) * 1024 if found else None


class PeakMemory:
    """The peak memory of what runs inside the `with` block, in bytes, as `.bytes` afterwards.

    On a GPU: CUDA's largest allocated memory (`torch.cuda.max_memory_allocated`), reset on entry. On a CPU:
    the whole process's peak resident set size, reset on entry through Linux's /proc/self/clear_refs after
    handing freed memory back to the system (glibc's `malloc_trim`), so it includes what is in use before
    (the interpreter, PyTorch, the data) but not what earlier work freed. None where it cannot be measured.
    """

    def __init__(self, device):
        self.device, self.bytes, self._reset = torch.device(device), None, False

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the system, out of the resident size
            except (OSError, AttributeError):
                pass  # not glibc: the peak may include memory freed earlier
            try:
                Path("/proc/self/clear_refs").write_text("5")  # "5" resets the peak resident size (Linux >= 4.0)
                self._reset = True
            except OSError:
                self._reset = False
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device)
        elif self._reset:
            self.bytes = _resident_peak()


def matmul_peak(device, dtype: torch.dtype, size: int | None = None, repeats: int = 5) -> float:
    """The FLOP/s that `device` reaches on products of two large square matrices of `dtype` (size 8192 on a CUDA GPU,
    else 2048; all the CPU threads PyTorch uses): the best of three timings of `repeats` products, after an untimed
    one. The rate a model's own products can at best approach, so the benchmark reports MFU against it."""
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 2048)
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    best = float("inf")
    for trial in range(4):  # the first: untimed warm-up
        sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        elapsed = time.perf_counter() - start
        if trial:
            best = min(best, elapsed)
    return 2 * size**3 * repeats / best


def sync(device: torch.device) -> None:
    "Wait for the device to finish queued work, so that a clock reading means something."
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def typical_batches(batches: list[list[int]], tgt_lengths, updates: int, warmup: int) -> tuple[list, list]:
    "The `warmup` and the `updates` batches whose real target tokens are nearest the median (the latter nearest)."
    real = [sum(tgt_lengths[i] for i in b) for b in batches]
    typical = statistics.median(real)
    order = sorted(range(len(batches)), key=lambda i: (abs(real[i] - typical), i))
    return [batches[i] for i in order[updates:updates + warmup]], [batches[i] for i in order[:updates]]


def time_updates(step, batches: list, warmup: int, repeats: int, compiled: bool, device: torch.device):
    """Seconds of the warm-up (the first `warmup` batches, and all of them when `compiled`), then the real target
    tokens per second of each of `repeats` passes over the rest."""
    sync(device)
    start = time.perf_counter()
    # Compiling happens in the first calls, once per new batch shape: a compiled run sees the timed batches once
    # during the warm-up, so that the timing measures the compiled code and not the compiler.
    for b in batches[:warmup] + (batches[warmup:] if compiled else []):
        step(b)
    sync(device)
    warmup_s, rates = time.perf_counter() - start, []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = sum(step(b) for b in batches[warmup:])
        sync(device)
        rates.append(tokens / (time.perf_counter() - start))
    return warmup_s, rates


def spread(items: list, n: int) -> list:
    "n items spread evenly over `items` (all of them when n >= len(items)), in their order."
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


_CPU_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops() -> FlopCounterMode:
    """PyTorch's `FlopCounterMode`, as `with count_flops() as counter:` then `counter.get_total_flops()`, which also
    counts attention on a CPU: the formula of the CPU attention kernel, missing from PyTorch's table, is added to it
    the first time."""
    if _CPU_ATTENTION not in flop_registry:
        register_flop_formula(_CPU_ATTENTION)(_cpu_attention_flops)
    return FlopCounterMode(display=False)


def _number(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


def _rate(stats: dict) -> str:
    return f"{_number(stats['median'])} ({_number(stats['min'])}–{_number(stats['max'])})"


def _bytes(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def _case(r: dict) -> str:
    "The first cells of a translation row: batch size, decoding, cache."
    decoding = "greedy" if r["beam_size"] == 1 else f"beam {r['beam_size']}"
    return f"| {r['batch_size']} | {decoding} | {'yes' if r['cache'] else 'no'} |"


def _training_table(result: dict) -> list[str]:
    "The training table's lines: one row per model, path and batching, a failed path with its error."
    lines = ["| model | path | batches | real target tokens/s | × straightforward | padding (target) "
             "| real target tokens / update | peak memory | MFU |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["training"]:
        batching = r.get("batching", "random" if r["path"] == "straightforward" else "length")  # older results
        if "error" in r:
            lines.append(f"| {r['model']} | {r['path']} | {batching} | failed: {r['error']} | | | | | |")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "–"
        lines.append(f"| {r['model']} | {r['path']} | {batching} | {_rate(r['tokens_per_s'])} | {r['speedup']:.2f}× | "
                     f"{100 * r['padding_fraction']['target']:.0f}% | {r['real_tokens_per_update']:,.0f} | "
                     f"{_bytes(r['peak_memory_bytes'])} | {mfu} |")
    return lines


def _translation_tables(translation: list[dict]) -> list[str]:
    "The translation table's lines, then the time splits' table."
    lines = ["| batch | decoding | cache | target tokens/s | sentences/s | × uncached | GFLOP | FLOPs saved "
             "| same translations | peak memory |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in translation:
        lines.append(f"{_case(r)} {_rate(r['tokens_per_s'])} | {_rate(r['sentences_per_s'])} | "
                     f"{r['speedup']:.2f}× | {r['flops'] / 1e9:,.1f} | {r['flop_ratio']:.1f}× | "
                     f"{100 * r['same_as_other_path']:.0f}% | {_bytes(r['peak_memory_bytes'])} |")
    lines += ["", "One more run of each case, split into its parts, in seconds (only the decoder's work differs "
              "between the paths). The last column is the most any cache could give: the uncached total over the "
              "cached one without its decoder.", "",
              "| batch | decoding | cache | encoder | decoder | output layer | search | total | × uncached, at most |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in translation:
        s = r["seconds"]
        bound = f"{r['speedup_bound']:.1f}×" if r["cache"] else "–"
        lines.append(f"{_case(r)} {s['encoder']:.2f} | {s['decoder']:.2f} | {s['output_layer']:.2f} | "
                     f"{s['search']:.2f} | {s['total']:.2f} | {bound} |")
    return lines


def bench_table(result: dict) -> str:
    "`run_benchmark`'s result as Markdown tables: medians with (min–max), ratios between paths of the same run."
    lines = [f"Measured on **{result['device_name']}** ({result['device']}, {result['threads']} threads), "
             f"PyTorch {result['torch_version']}, {result['date']}; median (min–max) of "
             f"{result['settings']['repeats']} repetitions.", "", *_training_table(result)]
    if "mfu_peak" in result:  # older results took a GPU's data-sheet peak, and none on a CPU
        measured = ", ".join(f"{dtype} {_number(flops / 1e9)}" for dtype, flops in result["matmul_peak"].items() if flops)
        lines += ["", f"MFU against {_number(result['mfu_peak'] / 1e9)} GFLOP/s; matrix products measured on this "
                      f"device, GFLOP/s: {measured}."]
    if isinstance(result.get("compile"), str):
        lines += ["", f"torch.compile: {result['compile']}."]
    lines.append("")
    if isinstance(result["translation"], str):
        return "\n".join(lines + [f"Translation: {result['translation']}."])
    return "\n".join(lines + _translation_tables(result["translation"]))


def write_benchmark(result: dict, out_dir=RESULTS) -> tuple[Path, Path]:
    "Write `result` as out_dir/bench-<device>.json and the tables as bench-<device>.md; returns both paths."
    text = bench_table(result) + "\n"  # first: a result the table cannot show is refused before anything is written
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"bench-{device_slug(result['device_name'])}"
    write_artifact(stem.with_suffix(".json"), "benchmark", result)
    table = stem.with_suffix(".md")
    with atomic_file(table) as f:
        f.write(text.encode())
    return stem.with_suffix(".json"), table
