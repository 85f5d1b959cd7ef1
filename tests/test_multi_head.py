"""Multi-head attention (`annotated_transformer.multi_head`, book/02_multi_head.ipynb): the fused and the explicit path
compute one function, the recording scope keeps weights only where asked, and attending one new position at a time
(`incremental`) equals attending over the whole sequence."""

import pytest
import torch

from annotated_transformer import MultiHeadedAttention, attention, explicit_attention, record_attention, subsequent_mask


class Explicit(MultiHeadedAttention):
    "The same module, always on the explicit path: every call inside `explicit_attention()`."

    def forward(self, *args, **kwargs):
        with explicit_attention():
            return super().forward(*args, **kwargs)


def masks(batch=2, n_q=5, n_k=7):
    padding = (torch.arange(n_k) < torch.tensor([n_k, 3])[:, None])[:, None, :]  # (batch, 1, n_k)
    causal = padding[:, :, :n_q] & subsequent_mask(n_q) if n_q == n_k else None
    return {"none": None, "padding": padding, "causal": causal}


def pair(h=4, d_model=32):
    torch.manual_seed(0)
    fast = MultiHeadedAttention(h, d_model, dropout=0.1)
    slow = Explicit(h, d_model, dropout=0.1)
    slow.load_state_dict(fast.state_dict())
    return fast.eval(), slow.eval()


@pytest.mark.parametrize("kind", ["none", "padding", "causal"])
def test_fast_and_explicit_paths_agree_in_outputs_and_gradients(kind):
    fast, slow = pair()
    n_k = 6 if kind == "causal" else 7
    mask = masks(n_q=6 if kind == "causal" else 5, n_k=n_k)[kind]
    q = torch.randn(2, 6 if kind == "causal" else 5, 32)
    kv = q if kind == "causal" else torch.randn(2, n_k, 32)
    out_fast, out_slow = fast(q, kv, kv, mask), slow(q, kv, kv, mask)
    torch.testing.assert_close(out_fast, out_slow, rtol=1e-5, atol=1e-6)
    out_fast.square().sum().backward()
    out_slow.square().sum().backward()
    for (name, a), b in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_equals_the_paper_formula_with_separate_head_matrices():
    "MultiHead = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."
    fast, _ = pair(h=4, d_model=32)
    q, kv = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 7, 32, dtype=torch.float64)
    mask = masks()["padding"]
    fast = fast.double()
    heads = []
    for i in range(4):
        rows = slice(8 * i, 8 * (i + 1))
        project = lambda lin, x: x @ lin.weight[rows].T + lin.bias[rows]
        head, _ = attention(project(fast.w_q, q), project(fast.w_k, kv), project(fast.w_v, kv), mask)
        heads.append(head)
    expected = torch.cat(heads, dim=-1) @ fast.w_o.weight.T + fast.w_o.bias
    torch.testing.assert_close(fast(q, kv, kv, mask), expected, rtol=1e-10, atol=1e-12)


def test_a_fully_masked_query_gives_the_same_on_both_paths():
    fast, slow = pair()
    x = torch.randn(1, 4, 32)
    mask = torch.ones(1, 4, 4, dtype=torch.bool)
    mask[0, 2] = False
    torch.testing.assert_close(fast(x, x, x, mask), slow(x, x, x, mask), rtol=1e-5, atol=1e-6)


def test_weights_are_kept_only_inside_the_recording_scope():
    fast, _ = pair()
    q, kv = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    mask = masks()["padding"]
    out = fast(q, kv, kv, mask)
    assert fast.attn is None
    with record_attention():
        recorded = fast(q, kv, kv, mask)
        assert fast.attn.shape == (2, 4, 5, 7)
        assert not fast.attn.requires_grad
    torch.testing.assert_close(recorded, out, rtol=1e-5, atol=1e-6)
    assert torch.all(fast.attn[1, :, :, 3:] == 0)  # padded keys of sentence 2
    torch.testing.assert_close(fast.attn.sum(-1), torch.ones(2, 4, 5))
    fast(q, kv, kv, mask)
    assert fast.attn is None


def test_recorded_weights_are_those_of_each_head():
    "Head i of the module equals attention on the i-th slice of the projections."
    fast, _ = pair()
    x = torch.randn(1, 5, 32)
    with record_attention():
        fast(x, x, x)
    q, k = fast.split_heads(fast.w_q(x)), fast.split_heads(fast.w_k(x))
    _, expected = attention(q, k, q)
    torch.testing.assert_close(fast.attn, expected.detach())


def test_dropout_on_the_weights_only_in_training():
    fast, slow = pair()
    x = torch.randn(2, 5, 32)
    for layer in (fast, slow):
        layer.train()
        a, b = layer(x, x, x), layer(x, x, x)
        assert not torch.allclose(a, b)  # dropout is random in training
        layer.eval()
        torch.testing.assert_close(layer(x, x, x), layer(x, x, x), rtol=0, atol=0)


def test_d_model_must_be_divisible_by_h():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadedAttention(h=3, d_model=32)


def test_a_non_boolean_mask_is_refused_on_both_paths():
    "SDPA would add a float mask to the scores instead of masking: refuse it, as `attention` does."
    fast, slow = pair()
    x = torch.randn(2, 5, 32)
    for layer in (fast, slow):
        with pytest.raises(TypeError, match="boolean"):
            layer(x, x, x, torch.ones(2, 1, 5))


def test_a_mask_of_the_wrong_rank_is_refused():
    fast, _ = pair()
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="mask must have shape"):
        fast(x, x, x, torch.ones(2, 1, 1, 5, dtype=torch.bool))


def test_parameters_do_not_depend_on_the_number_of_heads():
    counts = {sum(p.numel() for p in MultiHeadedAttention(h, 64).parameters()) for h in (1, 2, 4, 8, 16)}
    assert counts == {4 * (64 * 64 + 64)}


def test_narrower_keys_than_values_are_the_paper_formula_on_both_paths():
    "Table 3, row B: d_k below d_v = d_model / h. Head i reads its own d_k rows of W^Q, W^K and d_v rows of W^V."
    torch.manual_seed(0)
    fast = MultiHeadedAttention(4, 32, dropout=0.0, d_k=3).double().eval()
    slow = Explicit(4, 32, dropout=0.0, d_k=3).double().eval()
    slow.load_state_dict(fast.state_dict())
    assert (fast.d_k, fast.d_v, fast.w_q.out_features, fast.w_k.out_features, fast.w_v.out_features) == (
        3,
        8,
        12,
        12,
        32,
    )
    q, kv = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 7, 32, dtype=torch.float64)
    mask = masks()["padding"]
    heads = []
    for i in range(4):
        k_rows, v_rows = slice(3 * i, 3 * (i + 1)), slice(8 * i, 8 * (i + 1))
        project = lambda lin, x, rows: x @ lin.weight[rows].T + lin.bias[rows]
        head, _ = attention(
            project(fast.w_q, q, k_rows), project(fast.w_k, kv, k_rows), project(fast.w_v, kv, v_rows), mask
        )
        heads.append(head)
    expected = torch.cat(heads, dim=-1) @ fast.w_o.weight.T + fast.w_o.bias
    torch.testing.assert_close(fast(q, kv, kv, mask), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(slow(q, kv, kv, mask), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d_k", [0, -2, 2.5, True])
def test_a_d_k_that_is_no_positive_integer_is_refused(d_k):
    with pytest.raises(ValueError, match="d_k must be a positive integer or None"):
        MultiHeadedAttention(4, 32, d_k=d_k)


def test_explicit_attention_is_a_scope_and_the_book_s_path_is_four_separate_products(monkeypatch):
    mha = MultiHeadedAttention(4, 32, dropout=0.0).eval()
    x = torch.randn(2, 5, 32)
    calls, real = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    fused = mha(x, x, x)
    assert calls == [1] and mha.attn is None
    with explicit_attention():
        explicit = mha(x, x, x)
    assert calls == [1] and mha.attn is None  # the book's equation (1), no weights kept
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-6)
    mha(x, x, x)
    assert calls == [1, 1]  # outside the scope, the fused kernel again


def test_incremental_self_attention_equals_the_causal_attention_over_the_prefix():
    torch.manual_seed(2)
    mha = MultiHeadedAttention(4, 32, dropout=0.3).eval()  # evaluation: dropout off
    x = torch.randn(3, 6, 32)
    full = mha(x, x, x, subsequent_mask(6).expand(3, 6, 6))
    cache = {}
    steps = torch.cat([mha.incremental(x[:, t : t + 1], cache) for t in range(6)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-6)
    assert cache["keys"].shape == (3, 4, 6, 8) and cache["values"].shape == (3, 4, 6, 8)


def test_incremental_source_attention_projects_the_memory_once_and_serves_each_sentence_s_rows(monkeypatch):
    torch.manual_seed(3)
    mha = MultiHeadedAttention(4, 32, dropout=0.0).eval()
    memory, beams = torch.randn(2, 7, 32), 3  # two sentences, three rows (beams) each
    src_mask = (torch.arange(7) < torch.tensor([7, 4])[:, None])[:, None, :]  # (2, 1, 7)
    y = torch.randn(2 * beams, 1, 32)
    expected = mha(
        y, memory.repeat_interleave(beams, 0), memory.repeat_interleave(beams, 0), src_mask.repeat_interleave(beams, 0)
    )
    cache, projected = {}, []
    real = mha.w_k.forward
    monkeypatch.setattr(mha.w_k, "forward", lambda t: projected.append(t.shape) or real(t))
    first = mha.incremental(y, cache, memory, src_mask)
    again = mha.incremental(y, cache, memory, src_mask)
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(again, first)
    assert projected == [(2, 7, 32)]  # the memory's keys, once, one row per sentence


def test_recording_in_one_thread_leaves_another_on_the_fast_path():
    "The recording scope is a context variable: each thread has its own."
    import threading

    mha = MultiHeadedAttention(2, 8, dropout=0.0).eval()
    other = MultiHeadedAttention(2, 8, dropout=0.0).eval()
    x = torch.randn(1, 3, 8)
    inside, outside = threading.Event(), threading.Event()

    def record():
        with record_attention():
            mha(x, x, x)
            inside.set()
            outside.wait(timeout=60)

    thread = threading.Thread(target=record)
    thread.start()
    assert inside.wait(timeout=60)
    other(x, x, x)  # while the other thread is inside its scope
    outside.set()
    thread.join()
    assert mha.attn is not None and other.attn is None


def test_the_recording_switch_does_not_break_a_compiled_graph():
    "torch.compile traces one graph through a layer: the context variable is not read while compiling."
    import torch._dynamo

    mha = MultiHeadedAttention(2, 8, dropout=0.0).eval()
    x = torch.randn(1, 3, 8)
    assert torch._dynamo.explain(mha)(x, x, x).graph_break_count == 0


def test_under_bf16_autocast_on_a_cpu_the_heads_attend_in_float32_and_agree_with_float32(monkeypatch):
    "PyTorch's CPU attention is slow to backpropagate in bfloat16: the products around it stay bf16, the heads do not."
    seen, real = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda q, *a, **kw: seen.append(q.dtype) or real(q, *a, **kw),
    )
    torch.manual_seed(0)
    mha = MultiHeadedAttention(4, 32, dropout=0.0)
    x = torch.randn(2, 5, 32, requires_grad=True)
    mask = subsequent_mask(5).expand(2, 5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x, x, x, mask)
    out.float().sum().backward()
    assert seen == [torch.float32] and out.dtype == torch.bfloat16  # the heads in float32, W^O in bfloat16
    grad = x.grad.clone()
    x.grad = None
    mha(x, x, x, mask).sum().backward()  # all in float32: the same, to bfloat16's precision
    assert seen == [torch.float32, torch.float32]
    assert torch.allclose(out.float(), mha(x, x, x, mask), atol=0.05) and torch.allclose(grad, x.grad, atol=0.1)


def test_a_bfloat16_model_on_a_cpu_attends_in_float32_and_stays_bfloat16_without_autocast():
    torch.manual_seed(0)
    mha = MultiHeadedAttention(4, 32, dropout=0.0)
    x = torch.randn(2, 5, 32)
    out = mha.bfloat16()(x.bfloat16(), x.bfloat16(), x.bfloat16())  # a model cast whole, no autocast
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), mha.float()(x, x, x), atol=0.05)
