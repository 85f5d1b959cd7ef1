"""How fast the package trains and translates on this machine, and why: the straightforward path (the book's explicit
attention, random batches) against length-bucketed batches, PyTorch's fused attention, bf16 and `torch.compile`,
with MFU; decoding with and without the incremental cache; `annotated-transformer bench`."""

import contextlib
import dataclasses
import random
import re
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ..decoding import DecoderCache
from ..model import EncoderDecoder, TransformerConfig, make_model
from ..multi_head import explicit_attention
from ..training import (PAD, LabelSmoothing, accumulate_gradients, batches_of, make_optimizer, optimizer_step,
                        padding_fraction, token_batches)
from .datasets import load_multi30k
from .devices import bf16_supported, check_device, device_name
from .measure import PeakMemory, count_flops, matmul_peak, spread, summarize, sync, time_updates, typical_batches
from .recipes import RECIPES
from .results import commit
from .tasks import load_task
from .translate import Translator, decode_batches


def straightforward_batches(n_pairs: int, sentences_per_batch: int, seed: int) -> list[list[int]]:
    "How a first implementation batches: all sentences in random order, `sentences_per_batch` at a time."
    order = list(range(n_pairs))
    random.Random(seed).shuffle(order)
    return [order[i:i + sentences_per_batch] for i in range(0, n_pairs, sentences_per_batch)]


# What the benchmark measures: the results chapter's translator, the multi30k-cpu recipe as it is now (its model, its
# subword data and its token budget), and the paper's base model on the same batches.
BENCH_RECIPE = RECIPES["multi30k-cpu"]


# Dense bf16 peak of the tensor cores, FLOP/s, from NVIDIA's data sheets (without sparsity). Name fragments are
# tried in order, so the PCIe and NVL H100s are matched before the SXM one, and the L40 cards before the L4.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12,
                   "L40S": 362e12, "L40": 181e12, "L4": 121e12}


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak FLOP/s of a GPU known by its name, e.g. 'NVIDIA H100 80GB HBM3'; else None.

    MFU is reported against this peak for every path, the float32 one included: it says how much of the
    device's best arithmetic rate the path turns into useful work."""
    return next((peak for fragment, peak in PEAK_BF16_FLOPS.items() if fragment in device_name), None)


def training_flops(model: EncoderDecoder, src_lengths, tgt_lengths) -> float:
    """Model FLOPs of one training update (forward and backward) on sentences of the given real lengths.

    The usual count (Kaplan et al., 2020; PaLM's MFU): 6 FLOPs per entry of a weight matrix per token it
    multiplies (2 forward, 4 backward), plus the attention's QKᵀ and weighted sum, 6 · h · (d_k + d_v) · n_q · n_k per
    attention layer (12 · d_model · n_q · n_k when d_k = d_v = d_model / h). The encoder's matrices, and the
    W^K, W^V of the decoder's encoder-decoder attention, multiply source tokens; the rest of the decoder and the output layer multiply target tokens. Padding is not
    counted: it is work, but not useful work. Biases, layer norms and embedding lookups are not matrix
    products and are left out.
    """
    c = model.config

    def matrices(*modules) -> int:
        return sum(p.numel() for m in modules for p in m.parameters() if p.dim() == 2)

    src_attn = [layer.src_attn for layer in model.decoder.layers]
    per_src = matrices(model.encoder, *(a.w_k for a in src_attn), *(a.w_v for a in src_attn))
    per_tgt = matrices(model.decoder, model.generator) - matrices(*(a.w_k for a in src_attn), *(a.w_v for a in src_attn))
    s, t = torch.as_tensor(src_lengths, dtype=torch.float64), torch.as_tensor(tgt_lengths, dtype=torch.float64)
    d_v = c.d_model // c.h
    attention = 6 * c.h * ((c.d_k or d_v) + d_v) * c.N * float((s * s + t * t + t * s).sum())
    return 6 * (per_src * float(s.sum()) + per_tgt * float(t.sum())) + attention


def _training_step(config: TransformerConfig, src_vocab: int, tgt_vocab: int, path: str, device: torch.device,
                   seed: int):
    """A fresh model on `path`, and a function that trains it on one batch and returns the batch's real target
    tokens: the label-smoothed loss, backward, and `make_optimizer`'s Adam and schedule (fused on CUDA), as the
    training chapter's `optimizer_step` applies them. The straightforward path attends in the book's explicit
    `attention` (`explicit_attention`); the bf16 and compiled paths use bf16 autocast where the device supports it
    (`bf16_supported`). Returns (model, step, {"bf16_autocast", "fused_adam"})."""
    torch.manual_seed(seed)
    model = make_model(src_vocab, tgt_vocab, config).to(device).train()
    run = torch.compile(model) if path == "compiled" else model
    optimizer, scheduler = make_optimizer(model, config.d_model)
    criterion = LabelSmoothing(tgt_vocab, PAD, config.label_smoothing)
    autocast = path in ("bf16", "compiled") and bf16_supported(device)

    def step(b) -> int:
        with explicit_attention() if path == "straightforward" else contextlib.nullcontext():
            _, ntokens = accumulate_gradients(run, [b], criterion, autocast)
        optimizer_step(model, optimizer, scheduler)
        return ntokens

    return model, step, {"bf16_autocast": autocast, "fused_adam": bool(optimizer.defaults.get("fused"))}


def bench_training(config: TransformerConfig, pairs, src_vocab: int, tgt_vocab: int, path: str, device, *,
                   max_tokens: int, batching: str | None = None, updates: int = 2, warmup: int = 1, repeats: int = 3,
                   seed: int = 0, peak: float | None = None) -> dict:
    """Training throughput of one configuration: real (non-padding) target tokens per second, median of `repeats`.

    `path` is "straightforward" (the book's explicit attention, float32, sentences in random order padded to each
    batch's longest), "fast" (PyTorch's fused attention kernel, length-bucketed token-budget batches), "bf16" (fast, with bf16 autocast where supported) or "compiled" (bf16,
    with `torch.compile`). MFU is taken against `peak` FLOP/s (by default a GPU's data-sheet bf16 peak).
    Every path uses the training chapter's `make_optimizer` (a fused Adam on CUDA). `batching` ("random" or
    "length", by default the path's own) sets the batches apart from the path, to separate the two effects; both
    hold the same number of sentences per batch on average, about `max_tokens` real tokens. Each repetition times the same
    `updates` typical updates after `warmup` untimed ones (and, when compiled, an untimed pass over the timed
    batches). Padding is reported for the epoch and for the timed batches.
    """
    if path not in ("straightforward", "fast", "bf16", "compiled"):
        raise ValueError(f"path must be 'straightforward', 'fast', 'bf16' or 'compiled', got {path!r}")
    batching = batching or ("random" if path == "straightforward" else "length")
    if batching not in ("random", "length"):
        raise ValueError(f"batching must be 'random' or 'length', got {batching!r}")
    device = torch.device(device)
    src_lengths, tgt_lengths = [len(s) for s, _ in pairs], [len(t) - 1 for _, t in pairs]
    buckets = token_batches(src_lengths, tgt_lengths, max_tokens, seed)
    batches = (buckets if batching == "length"
               else straightforward_batches(len(pairs), round(len(pairs) / len(buckets)), seed))
    if len(batches) < warmup + updates:
        raise ValueError(f"{len(pairs)} sentence pairs make {len(batches)} batches, fewer than the {warmup + updates} "
                         "updates asked for")
    warm, picked = typical_batches(batches, tgt_lengths, updates, warmup)
    chosen = [batches_of(pairs, b).to(device) for b in warm + picked]
    with PeakMemory(device) as memory:
        model, step, settings = _training_step(config, src_vocab, tgt_vocab, path, device, seed)
        warmup_s, rates = time_updates(step, chosen, warmup, repeats, path == "compiled", device)
    timed = chosen[warmup:]
    flops = sum(training_flops(model, b.src_mask.sum((1, 2)).tolist(), (b.tgt_y != PAD).sum(1).tolist()) for b in timed)
    tokens = sum(b.ntokens for b in timed)
    peak = peak or (peak_flops(device_name(str(device))) if device.type == "cuda" else None)
    achieved = flops / tokens * statistics.median(rates)
    return {"path": path, "batching": batching, "tokens_per_s": summarize(rates), "warmup_s": warmup_s,
            "real_tokens_per_update": tokens / len(timed),
            "sentences_per_update": sum(b.src.size(0) for b in timed) / len(timed),
            "padding_fraction": {"source": padding_fraction(batches, src_lengths),
                                 "target": padding_fraction(batches, tgt_lengths),
                                 "timed_target": padding_fraction(picked, tgt_lengths)},
            "flops_per_token": flops / tokens, "achieved_flops": achieved, "mfu": achieved / peak if peak else None,
            "peak_memory_bytes": memory.bytes, **settings}


def _call_name(function) -> str:
    "The end of the name the profiler gives a call of the Python `function`: 'decoding.py(172): select'."
    code = function.__code__
    return f"{Path(code.co_filename).name}({code.co_firstlineno}): {code.co_name}"


def traced_calls(events, model: EncoderDecoder) -> dict[str, list[float]]:
    """The durations in seconds of the calls a decoding run is timed by, from the events of a
    `torch.profiler.profile(with_stack=True)` around it (its `.profiler.kineto_results.events()`). By kind: "encoder",
    "decoder" and "output_layer" (calls of `model.encoder`, `model.decoder` and `model.generator`), and "select" (the
    `DecoderCache` keeping the rows a search keeps)."""
    functions = {_call_name(DecoderCache.select): "select"}
    # The profiler names a module's call after its class and a number per instance: "nn.Module: Encoder_0".
    modules = {f"nn.Module: {type(model.encoder).__name__}_": "encoder",
               f"nn.Module: {type(model.decoder).__name__}_": "decoder",
               f"nn.Module: {type(model.generator).__name__}_": "output_layer"}
    calls = {kind: [] for kind in ("encoder", "decoder", "output_layer", "select")}
    for event in events:
        name = event.name()
        kind = functions.get(re.split(r"[/\\]", name)[-1])
        kind = kind or next((k for prefix, k in modules.items() if name.startswith(prefix)), None)
        if kind is not None:
            calls[kind].append(event.duration_ns() / 1e9)
    return calls


def decoding_time_split(model: EncoderDecoder, sources, batch_size: int, beam_size: int, cache: bool) -> dict:
    """Where the time of one `decode_batches` run goes, in seconds, from PyTorch's profiler (`traced_calls`).

    "encoder": the encoder's layers. "decoder": the decoder's layers (over the whole prefix at every step without the
    cache; with it, over the newest position, the memory's keys and values projected at the first step) and the
    cache's keeping and reordering of rows. "output_layer": the projection to the target vocabulary and its
    log-softmax. "search": the rest (choosing the next tokens, keeping the hypotheses, padding each batch, the
    embeddings). "total": the whole run; the four parts add up to it. Only the decoder's part differs between the
    paths. The profiler adds a small cost to every operation, so read the split for its proportions; on a GPU the
    parts are the host's times, and device work still running when a part returns is counted where the host waits
    for it (the search, which reads the scores at every step)."""
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        start = time.perf_counter()
        _decode(model, sources, batch_size, beam_size, cache)
        total = time.perf_counter() - start
    seconds = {kind: sum(durations) for kind, durations in traced_calls(prof.profiler.kineto_results.events(), model).items()}
    decoder = seconds["decoder"] + seconds["select"]
    return {"encoder": seconds["encoder"], "decoder": decoder, "output_layer": seconds["output_layer"],
            "search": total - seconds["encoder"] - decoder - seconds["output_layer"], "total": total}


def _decode(model: EncoderDecoder, sources, batch_size: int, beam_size: int, cache: bool) -> list[list[int]]:
    "`decode_batches` with §6.1's settings, finished on the device before it returns (so that timing it means something)."
    out = decode_batches(model, sources, batch_size, beam_size, cache=cache)
    sync(next(model.parameters()).device)
    return out


def bench_translation(model: EncoderDecoder, sources, device, batch_sizes=(1, 64), beam_sizes=(1, 4),
                      repeats: int = 3, sentences: dict | None = None) -> list[dict]:
    """Translation throughput with and without the incremental cache, for each batch size and beam size.

    `sources` are token ids of source sentences ending in </s>; `sentences` maps a batch size to how many of
    them to decode (default: all). Output tokens (with </s>) per second and sentences per second, the median
    of `repeats`, with the cached and uncached runs of each setting interleaved, so that a slow spell of the
    machine hits both. Tokenization is left out: it is the same for both. Also records the FLOPs of one run
    (counted by PyTorch's `FlopCounterMode`), the peak memory, whether both paths produced the same
    translations, and where the time of one more run went (`decoding_time_split`).
    """
    device = torch.device(device)
    model = model.to(device).eval()
    cases = [(b, k, cache) for b in batch_sizes for k in beam_sizes for cache in (True, False)]
    subset = {b: sources[:(sentences or {}).get(b, len(sources))] for b in batch_sizes}
    outputs, memory, times = {}, {}, {case: [] for case in cases}
    for case in cases:  # first run of each: warm-up, outputs, peak memory
        with PeakMemory(device) as peak:
            outputs[case] = _decode(model, subset[case[0]], *case)
        memory[case] = peak.bytes
    for _ in range(repeats):
        for case in cases:
            start = time.perf_counter()
            _decode(model, subset[case[0]], *case)
            times[case].append(time.perf_counter() - start)
    results = []
    for b, k, cache in cases:
        with count_flops() as counter:
            _decode(model, subset[b], b, k, cache)
        tokens = sum(len(o) + 1 for o in outputs[b, k, cache])  # + </s>
        n = len(subset[b])
        results.append({"batch_size": b, "beam_size": k, "cache": cache, "sentences": n, "output_tokens": tokens,
                        "tokens_per_s": summarize(tokens / s for s in times[b, k, cache]),
                        "sentences_per_s": summarize(n / s for s in times[b, k, cache]),
                        "flops": counter.get_total_flops(), "peak_memory_bytes": memory[b, k, cache],
                        "same_as_other_path": sum(x == y for x, y in zip(outputs[b, k, True], outputs[b, k, False])) / n,
                        "seconds": decoding_time_split(model, subset[b], b, k, cache)})
    return results


def _measure_training(models: dict, task, device: torch.device, cases: dict, progress, **options) -> list[dict]:
    """`bench_training` for each of `models` (name -> (config, max_tokens)) in each of its `cases` (name -> a list
    of (path, batching), the straightforward path first), with each result's speed-up over that first one. A
    compiled path that fails (no compiler, say) is recorded, not raised."""
    training = []
    for model_name, (config, max_tokens) in models.items():
        straightforward = None
        for path, batching in cases[model_name]:
            progress(f"training {model_name}: {path}, {batching} batches")
            entry = {"model": model_name, "config": dataclasses.asdict(config), "max_tokens": max_tokens}
            try:
                r = bench_training(config, task.train, task.src_vocab, task.tgt_vocab, path, device,
                                   max_tokens=max_tokens, batching=batching, **options)
            except Exception as err:  # noqa: BLE001 - e.g. torch.compile without a compiler: record it, go on
                if path != "compiled":
                    raise
                training.append({**entry, "path": path, "batching": batching, "error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"})
                continue
            finally:
                if path == "compiled":  # its compiled code goes: later peak memory is not its
                    torch._dynamo.reset()
            straightforward = straightforward or r["tokens_per_s"]["median"]
            training.append({**entry, **r, "speedup": r["tokens_per_s"]["median"] / straightforward})
    return training


def _measure_translation(translator: Translator, device: torch.device, counts: dict, repeats: int,
                         progress) -> list[dict]:
    """`bench_translation` on test sentences spread over the test set (batch size -> how many), with each cached
    case's speed-up, FLOPs saved and the most any cache could give: the uncached run's time over what the cached
    run would take if its decoder cost nothing (both from the time splits)."""
    test = [s for s, _ in load_multi30k("test", translator.direction)]
    ids = [x for x in translator.encode(test) if x]
    translation = []
    for batch_size, n in counts.items():
        progress(f"translation: batch size {batch_size}, {min(n, len(ids))} sentences")
        cases = bench_translation(translator.model, spread(ids, n), device, batch_sizes=(batch_size,), repeats=repeats)
        for case in cases:
            other = next(c for c in cases if c["beam_size"] == case["beam_size"] and not c["cache"])
            case["speedup"] = case["tokens_per_s"]["median"] / other["tokens_per_s"]["median"]
            case["flop_ratio"] = other["flops"] / case["flops"]
            shared = case["seconds"]["total"] - case["seconds"]["decoder"]
            case["speedup_bound"] = other["seconds"]["total"] / shared if case["cache"] else None
        translation += cases
    return translation


def run_benchmark(device=None, checkpoint=None, repeats: int = 3, updates: int | None = None,
                  sentences: dict | None = None, compile: bool | None = None, models: dict | None = None,
                  progress=print) -> dict:
    """Measure training and translation throughput on one machine; returns the results (see `write_benchmark`).

    Training, on Multi30k's batches, for each of `models` (name -> (TransformerConfig, max_tokens); default the
    recipe's model and the base model): the straightforward, fast and (where supported) bf16 paths, the compiled
    one when `compile` (default: on CUDA), with MFU against the device's peak (`matmul_peak`; a known GPU: its data
    sheet's); for the first model also each path with the other's batches. Translation, given `checkpoint` (paths
    of a Multi30k translator, averaged): greedy and beam 4 at batch sizes 1 and 64, with and without the cache, on
    `sentences` (batch size -> count; default 32 and 256 on a CPU, 100 and 1,000 on a GPU) test sentences.
    `progress` receives a line per case."""
    device = check_device(device)
    on_gpu = device.type == "cuda"
    recipe = BENCH_RECIPE
    if models is None:
        models = {recipe.name: (recipe.model, recipe.max_tokens),
                  "base": (TransformerConfig.base(), RECIPES["multi30k-gpu"].max_tokens if on_gpu else recipe.max_tokens)}
    compile = on_gpu if compile is None else compile
    updates, warmup = updates or (10 if on_gpu else 2), 3 if on_gpu else 1
    # A bad checkpoint fails now, not after minutes of measuring.
    translator = Translator.from_checkpoint(*checkpoint, device=device) if checkpoint is not None else None
    name = device_name(str(device))
    if device.type not in ("cpu", "cuda"):
        name = f"{device.type.upper()} ({name})"  # e.g. Apple's GPU: its own results file, not the CPU's
    result = {"device": str(device), "device_name": name, "threads": torch.get_num_threads(),
              "torch_version": torch.__version__, "commit": commit(), "date": time.strftime("%Y-%m-%d"),
              "settings": {"repeats": repeats, "updates_per_repeat": updates, "warmup_updates": warmup,
                           "data": "multi30k de-en train (training), test2016 (translation)"}}
    if not compile:
        result["compile"] = ("not measured: off by default on CPUs, where compiling takes minutes (see the book's "
                             "chapter on speed); pass compile=True (--compile) to measure it") if not on_gpu \
            else "not measured (compile=False)"
    bf16 = bf16_supported(device)
    result["matmul_peak"] = {"float32": matmul_peak(device, torch.float32),
                             "bfloat16": matmul_peak(device, torch.bfloat16) if bf16 else None}
    # MFU: against the bf16 rate where there is one (a known GPU: its data sheet's), else the float32 rate
    result["mfu_peak"] = ((peak_flops(name) if on_gpu else None) or result["matmul_peak"]["bfloat16"]
                          or result["matmul_peak"]["float32"])
    paths = [("straightforward", "random"), ("fast", "length")] + ([("bf16", "length")] if bf16 else [])
    ablation = [("straightforward", "length"), ("fast", "random")]  # each change alone, for the first model
    compiled = [("compiled", "length")] if compile else []  # last: what compiling leaves does not weigh on the rest
    cases = {name: paths + (ablation if i == 0 else []) + compiled for i, name in enumerate(models)}
    result["training"] = _measure_training(models, load_task(recipe), device, cases, progress, updates=updates,
                                           warmup=warmup, repeats=repeats, peak=result["mfu_peak"])
    if translator is None:
        result["translation"] = "not measured: no trained checkpoint was given"
        return result
    counts = sentences or ({1: 100, 64: 1000} if on_gpu else {1: 32, 64: 256})
    result["translation"] = _measure_translation(translator, device, counts, repeats, progress)
    result["translation_model"] = {"checkpoint": [str(p) for p in checkpoint], "config": translator.model.config.__dict__,
                                   "tgt_vocab": len(translator.codec.token_texts()),
                                   "src_vocab": len(translator.codec.token_texts(source=True))}
    return result
