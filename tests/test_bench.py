"""The benchmark (`annotated_transformer.lib.bench`) and the paths it times: each fast path computes what the book's
explicit one does, beams share their sentence's memory, and the profiler's split of decoding adds up."""

import contextlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from annotated_transformer import (
    DecoderCache,
    TransformerConfig,
    explicit_attention,
    make_model,
    make_optimizer,
    subsequent_mask,
)
from annotated_transformer.lib.bench import (
    bench_training,
    bench_translation,
    decoding_time_split,
    peak_flops,
    run_benchmark,
    straightforward_batches,
    traced_calls,
    training_flops,
)
from annotated_transformer.lib.devices import bf16_supported, device_slug
from annotated_transformer.lib.measure import bench_table, matmul_peak
from annotated_transformer.lib.translate import decode_batches
from annotated_transformer.training import BOS, EOS, PAD, Batch, LabelSmoothing, copy_task, pad_sequences, padding_mask
from helpers import sharp_model

TINY = TransformerConfig(N=1, d_model=32, d_ff=64, h=2)


@pytest.fixture
def small_peak(monkeypatch):
    "The benchmark measures its peak on products of 256 x 256 matrices, for tests that need no true peak."
    import annotated_transformer.lib.bench as bench

    monkeypatch.setattr(bench, "matmul_peak", lambda device, dtype: matmul_peak(device, dtype, size=256))


@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_and_straightforward_paths_give_the_same_loss_and_gradients(norm_first):
    torch.manual_seed(0)
    model = make_model(40, 40, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first).double().eval()
    batch = Batch(pad_sequences([[5, 6, 7, EOS], [8, EOS]]), pad_sequences([[BOS, 9, 10, 11, EOS], [BOS, 12, EOS]]))
    criterion = LabelSmoothing(40, PAD, 0.1)
    found = []
    for scope in (explicit_attention, contextlib.nullcontext):  # the book's attention, then PyTorch's fused kernel
        model.zero_grad()
        with scope():
            log_probs = model.generator(model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask))
        loss = criterion(log_probs.reshape(-1, 40), batch.tgt_y.reshape(-1))
        loss.backward()
        found.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(found[0][0], found[1][0], atol=1e-12, rtol=1e-12)
    for a, b in zip(found[0][1], found[1][1]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_beams_share_their_sentence_memory_and_match_a_full_pass():
    model = sharp_model(3)
    src = pad_sequences([[5, 6, 7, EOS], [8, 9, 10, 11, 12, 13, EOS]])
    src_mask = padding_mask(src)
    beam = 3
    tgt = torch.randint(3, 30, (2 * beam, 6), generator=torch.Generator().manual_seed(4))
    tgt[:, 0] = BOS
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # one row per sentence; the cache serves `beam` rows from each
        rows = torch.arange(2).repeat_interleave(beam)
        cache = DecoderCache(len(model.decoder.layers))
        for t in range(3):
            model.decode(memory, src_mask, tgt[:, t : t + 1], None, cache)
        assert cache.layers[0]["source"]["keys"].size(0) == 2  # the memory's keys: once per sentence
        # Reorder the beams inside each sentence, then drop the first sentence.
        order = [2, 0, 1, 5, 5, 3]
        cache.select(torch.tensor(order))
        again = model.generator(
            model.decode(memory[rows[order]], src_mask[rows[order]], tgt[order], subsequent_mask(6))
        )
        step = model.generator(model.decode(memory, src_mask, tgt[order, 3:4], None, cache))[:, -1]
        torch.testing.assert_close(step, again[:, 3], atol=1e-10, rtol=1e-10)
        cache.select(torch.tensor([3, 4, 5]), torch.tensor([1]))
        kept = [order[i] for i in (3, 4, 5)]
        step = model.generator(model.decode(memory[[1]], src_mask[[1]], tgt[kept, 4:5], None, cache))[:, -1]
        torch.testing.assert_close(step, again[3:, 4], atol=1e-10, rtol=1e-10)
        assert cache.layers[0]["source"]["keys"].size(0) == 1 and cache.layers[0]["self"]["keys"].size(0) == 3


@pytest.mark.parametrize("order", [[5, 4, 0, 1], [2, 3, 4, 5, 0, 1]])  # one sentence leaves; all three move
def test_selecting_sentences_in_another_order_moves_their_memory(order):
    model = sharp_model(7)
    src = pad_sequences([[5, 6, 7, EOS], [8, 9, 10, 11, 12, 13, EOS], [14, EOS]])
    src_mask = padding_mask(src)
    tgt = torch.randint(3, 30, (6, 4), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        rows = torch.arange(3).repeat_interleave(2)
        full = model.generator(model.decode(memory[rows[order]], src_mask[rows[order]], tgt[order], subsequent_mask(4)))
        cache = DecoderCache(len(model.decoder.layers))
        for t in range(2):
            model.decode(memory, src_mask, tgt[:, t : t + 1], None, cache)
        sentences = torch.tensor(order[::2]) // 2  # the sentence of each kept pair of rows
        cache.select(torch.tensor(order), sentences)
        step = model.generator(model.decode(memory[sentences], src_mask[sentences], tgt[order, 2:3], None, cache))
        torch.testing.assert_close(step[:, -1], full[:, 2], atol=1e-10, rtol=1e-10)


def test_straightforward_batches_cover_every_sentence_once_in_random_order():
    batches = straightforward_batches(103, 10, seed=7)
    assert [len(b) for b in batches] == [10] * 10 + [3]
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(103)) and flat != list(range(103))
    assert batches == straightforward_batches(103, 10, seed=7) != straightforward_batches(103, 10, seed=8)


def test_device_names_and_peaks():
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert device_slug("AMD EPYC, 2 CPU cores") == "amd-epyc-2-cpu-cores" and device_slug("???") == "unknown"
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and peak_flops("AMD EPYC, 2 CPU cores") is None


def test_training_flops_count_what_runs_forward_and_backward():
    torch.manual_seed(0)
    model = make_model(50, 60, N=2, d_model=32, d_ff=64, h=4, share_embeddings=False)
    for src_len, tgt_len in ((9, 7), (3, 15), (20, 2)):
        batch = Batch(torch.randint(4, 50, (3, src_len)), torch.randint(4, 60, (3, tgt_len)))  # no padding
        counter = FlopCounterMode(display=False)
        with counter, explicit_attention():  # the explicit path: every product is a matmul the counter sees
            log_probs = model.generator(model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask))
            log_probs.sum().backward()
        assert counter.get_total_flops() == pytest.approx(
            training_flops(model, [src_len] * 3, [tgt_len - 1] * 3), rel=1e-9
        )


def copy_pairs(n: int):
    return copy_task(n, vocab=13, seed=0)


@pytest.mark.parametrize(
    "path, batching", [("straightforward", None), ("fast", None), ("fast", "random"), ("bf16", None)]
)
def test_training_benchmark_reports_real_tokens_and_padding(path, batching, monkeypatch):
    import annotated_transformer.lib.bench as bench

    made = []

    def recorded(model, d_model, *args, **kwargs):  # the training chapter's optimizer, seen being built
        made.append(make_optimizer(model, d_model, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(bench, "make_optimizer", recorded)
    pairs = copy_pairs(400)
    r = bench_training(
        TINY, pairs, 13, 13, path, "cpu", max_tokens=200, batching=batching, updates=2, warmup=1, repeats=2
    )
    optimizer, scheduler = made[0]
    assert len(made) == 1 and scheduler.last_epoch == 1 + 2 * 2  # every update (warm-up, 2 x 2 timed) stepped it
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.98) and r["fused_adam"] is False
    batching = batching or ("random" if path == "straightforward" else "length")  # each path's own by default
    assert r["path"] == path and r["batching"] == batching and r["tokens_per_s"]["n"] == 2
    assert r["mfu"] is None and r["bf16_autocast"] is (path == "bf16" and bf16_supported("cpu"))
    tokens = r["real_tokens_per_update"]
    assert 0 < tokens <= 200 and r["flops_per_token"] > 6 * 32 * 32
    if batching == "length":
        assert r["padding_fraction"]["target"] < 0.1 and r["padding_fraction"]["timed_target"] < 0.1
    else:
        assert r["padding_fraction"]["target"] > 0.2 and r["padding_fraction"]["timed_target"] > 0.05


def test_training_benchmark_refuses_unknown_paths_and_too_few_batches():
    with pytest.raises(ValueError, match="path must be"):
        bench_training(TINY, copy_pairs(50), 13, 13, "turbo", "cpu", max_tokens=200)
    with pytest.raises(ValueError, match="batching must be 'random' or 'length'"):
        bench_training(TINY, copy_pairs(50), 13, 13, "fast", "cpu", max_tokens=200, batching="sorted")
    with pytest.raises(ValueError, match="fewer than the 11 updates"):
        bench_training(TINY, copy_pairs(50), 13, 13, "fast", "cpu", max_tokens=200, updates=10, warmup=1)


@pytest.mark.slow
def test_translation_benchmark_compares_identical_outputs():
    model = sharp_model(6).float()
    sources = [
        torch.randint(4, 30, (n,), generator=torch.Generator().manual_seed(n)).tolist() + [EOS]
        for n in (3, 9, 5, 12, 7)
    ]
    # Beams of 2 only: the random model never ends a sentence, and counting FLOPs of full-length decoding is slow.
    # (Greedy decoding, cached and not, gives the same outputs in the whole benchmark's test below.)
    cases = bench_translation(model, sources, "cpu", batch_sizes=(1, 4), beam_sizes=(2,), repeats=1, sentences={1: 2})
    assert [(c["batch_size"], c["beam_size"], c["cache"]) for c in cases] == [
        (b, 2, cache) for b in (1, 4) for cache in (True, False)
    ]
    for cached, uncached in zip(cases[::2], cases[1::2]):
        assert cached["same_as_other_path"] == uncached["same_as_other_path"] == 1.0
        assert cached["output_tokens"] == uncached["output_tokens"] and cached["sentences"] == (
            2 if cached["batch_size"] == 1 else 5
        )
        assert cached["flops"] < uncached["flops"]


def _sources():
    return [
        torch.randint(4, 30, (n,), generator=torch.Generator().manual_seed(n)).tolist() + [EOS]
        for n in (3, 9, 5, 12, 7)
    ]


@pytest.mark.parametrize("cache", [True, False])
def test_the_profiler_sees_each_call_of_each_part(cache):
    """Greedy decoding of 5 sentences, 4 per batch: per batch one encoder call, one decoder call and one output layer
    per position of its longest translation (with </s>), and with the cache one select after every step but the
    last."""
    model = sharp_model(6).float()
    sources = _sources()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        outputs = decode_batches(model, sources, 4, 1, cache=cache)
    calls = traced_calls(prof.profiler.kineto_results.events(), model)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # how decode_batches batches them
    steps = [max(len(outputs[i]) + 1 for i in order[start : start + 4]) for start in (0, 4)]
    assert {kind: len(durations) for kind, durations in calls.items()} == {
        "encoder": 2,
        "decoder": sum(steps),
        "output_layer": sum(steps),
        "select": sum(steps) - 2 if cache else 0,
    }
    assert all(d >= 0 for durations in calls.values() for d in durations)


@pytest.mark.parametrize("cache", [True, False])
def test_the_time_split_adds_up_and_leaves_everything_as_it_was(cache):
    """The parts are non-negative and add up to the total; each part the run has is non-zero; afterwards (also
    after a run that fails) the model, its modules and the decoder class are unchanged, no profiler is left
    running, and decoding gives what it gave before."""
    model = sharp_model(6).float()
    sources = _sources()
    expected = decode_batches(model, sources, 4, 2, cache=cache)
    classes = dict(vars(DecoderCache))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    split = decoding_time_split(model, sources, 4, 2, cache)
    assert list(split) == ["encoder", "decoder", "output_layer", "search", "total"]
    assert all(split[part] > 0 for part in split)
    assert sum(split[part] for part in ("encoder", "decoder", "output_layer", "search")) == pytest.approx(
        split["total"]
    )

    def broken(x):
        raise RuntimeError("the output layer failed")

    model.generator.forward = broken
    with pytest.raises(RuntimeError, match="output layer failed"):
        decoding_time_split(model, sources, 4, 2, cache)
    del model.generator.forward
    assert not torch.autograd.profiler._is_profiler_enabled
    assert dict(vars(DecoderCache)) == classes
    assert all(not m._forward_hooks and not m._forward_pre_hooks and "forward" not in vars(m) for m in model.modules())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert decode_batches(model, sources, 4, 2, cache=cache) == expected


def test_traced_calls_attribute_calls_by_name():
    """Events named as the profiler names them land in their kinds, whatever the path before the file name;
    other calls (another module, another function of the same file) are left out."""

    class Event:
        def __init__(self, name, ns):
            self._name, self._ns = name, ns

        def name(self):
            return self._name

        def duration_ns(self):
            return self._ns

    model = sharp_model(0)
    select = DecoderCache.select.__code__
    events = [
        Event("nn.Module: Encoder_0", 5_000),
        Event("nn.Module: EncoderLayer_0", 1),
        Event("nn.Module: Decoder_0", 4_000),
        Event("nn.Module: DecoderLayer_1", 1),
        Event(f"/somewhere/annotated_transformer/decoding.py({select.co_firstlineno}): select", 7_000),
        Event(f"annotated_transformer\\decoding.py({select.co_firstlineno}): select", 3_000),
        Event(f"decoding.py({select.co_firstlineno + 1}): select", 1),
        Event("nn.Module: Generator_0", 2_000),
        Event("aten::mm", 1),
    ]
    assert traced_calls(events, model) == {
        "encoder": [5e-6],
        "decoder": [4e-6],
        "output_layer": [2e-6],
        "select": [7e-6, 3e-6],
    }


@pytest.mark.slow
def test_a_compiler_failure_is_recorded_and_the_rest_measured(monkeypatch, small_peak):
    def broken(model):
        raise RuntimeError("no C compiler found\nmore details")

    monkeypatch.setattr(torch, "compile", broken)
    result = run_benchmark(
        device="cpu", repeats=1, updates=1, compile=True, models={"tiny": (TINY, 300)}, progress=lambda line: None
    )
    bf16 = ["bf16"] if bf16_supported("cpu") else []
    paths = ["straightforward", "fast", *bf16, "straightforward", "fast", "compiled"]  # compiled last
    assert [r["path"] for r in result["training"]] == paths
    compiled = result["training"][paths.index("compiled")]
    assert compiled["error"] == "RuntimeError: no C compiler found" and "compile" not in result
    assert "| tiny | compiled | length | failed: RuntimeError: no C compiler found |" in bench_table(result)


@pytest.mark.parametrize("supported", [True, False])
def test_the_bf16_path_autocasts_only_where_the_device_has_bf16_and_mfu_takes_the_given_peak(supported, monkeypatch):
    from annotated_transformer.lib import bench

    monkeypatch.setattr(bench, "bf16_supported", lambda device: supported)
    r = bench_training(TINY, copy_pairs(400), 13, 13, "bf16", "cpu", max_tokens=200, updates=1, repeats=1, peak=1e12)
    assert r["bf16_autocast"] is supported and r["mfu"] == pytest.approx(r["achieved_flops"] / 1e12)
