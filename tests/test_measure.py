"""Measuring speed (`annotated_transformer.lib.measure`, book/a09_bench.ipynb): repeated measurements, peak memory, the
typical batches, and the tables of a benchmark's result."""

from pathlib import Path

import pytest
import torch

from annotated_transformer.lib.measure import PeakMemory, bench_table, spread, summarize, typical_batches


def test_repeated_measurements_are_summarized_by_median_and_range():
    assert summarize([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert summarize(x for x in (5.0,)) == {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1}  # any iterable


def test_the_timed_batches_are_those_nearest_the_median_and_the_warm_up_ones_the_next():
    lengths = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    batches = [[i] for i in range(10)]  # one sentence each: its length is the batch's tokens
    warm, timed = typical_batches(batches, lengths, updates=2, warmup=1)
    assert timed == [[4], [5]] and warm == [[3]]  # tokens 5 and 6 around the median 5.5, then 4
    assert spread(list(range(10)), 3) == [0, 3, 6] and spread([1, 2], 5) == [1, 2]


def test_peak_memory_sees_an_allocation_and_is_reset():
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak resident size can be reset only on Linux")
    with PeakMemory("cpu") as big:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del block
    with PeakMemory("cpu") as small:
        pass
    if big.bytes is None:
        pytest.skip("this kernel does not allow resetting the peak resident size")
    assert big.bytes - small.bytes > 48 * 2**20


def test_a_table_without_translation_says_why():
    result = {
        "device": "cpu",
        "device_name": "Some CPU",
        "threads": 2,
        "torch_version": "x",
        "date": "d",
        "settings": {"repeats": 3},
        "training": [],
        "translation": "not measured: no trained checkpoint was given",
    }
    assert bench_table(result).endswith("Translation: not measured: no trained checkpoint was given.")


def test_flops_of_the_cpu_attention_kernel_are_counted():
    from annotated_transformer.lib.measure import count_flops

    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8)
    with torch.inference_mode(), count_flops() as counter:
        torch.nn.functional.scaled_dot_product_attention(q, k, k)
    assert counter.get_total_flops() == 4 * 2 * 4 * 5 * 7 * 8


def test_importing_the_benchmark_leaves_pytorchs_flop_formulas_as_they_are():
    import subprocess
    import sys

    code = (
        "import torch\nfrom torch.utils.flop_counter import flop_registry\n"
        "before = dict(flop_registry)\n"
        "import annotated_transformer.lib.bench, annotated_transformer.lib.measure as m\n"
        "from torch.utils.flop_counter import flop_registry\n"
        "print(dict(flop_registry) == before); m.count_flops(); print(m._CPU_ATTENTION in flop_registry)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["True", "True"]  # untouched by the import; counting knows the CPU kernel


def test_the_matrix_product_peak_is_a_rate_of_the_products_asked_for(monkeypatch):
    "A rate, never asserted against a speed: 2 n^3 FLOPs per product, over the best timing."
    import torch

    from annotated_transformer.lib import measure

    # trials of 0.5 s (the untimed warm-up), 3 s, 2 s and 4 s: the best timed one counts
    clock = iter([0, 0.5, 10, 13, 20, 22, 30, 34])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    assert measure.matmul_peak("cpu", torch.float32, size=64, repeats=3) == 2 * 64**3 * 3 / 2.0
