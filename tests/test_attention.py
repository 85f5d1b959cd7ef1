"""Scaled dot-product attention (book/01_attention.ipynb) against an independent reference."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from annotated_transformer import attention, subsequent_mask


def reference(q, k, v, mask=None):
    "Equation (1) in float64 NumPy, one query row at a time; a query with no allowed key gives zeros."
    q, k, v = (t.detach().double().numpy() for t in (q, k, v))
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = np.ones(lead + (n_q, n_k), bool) if mask is None else np.broadcast_to(mask.numpy(), lead + (n_q, n_k))
    q, k, v = (np.broadcast_to(t, lead + t.shape[-2:]) for t in (q, k, v))
    out = np.zeros(lead + (n_q, v.shape[-1]))
    weights = np.zeros(lead + (n_q, n_k))
    for idx in np.ndindex(*lead, n_q):
        *b, i = idx
        b = tuple(b)
        keep = allowed[b + (i,)]
        if not keep.any():
            continue
        scores = k[b] @ q[b + (i,)] / math.sqrt(q.shape[-1])
        e = np.where(keep, np.exp(scores - scores[keep].max()), 0.0)
        weights[b + (i,)] = e / e.sum()
        out[b + (i,)] = weights[b + (i,)] @ v[b]
    return out, weights


SHAPES = [  # (query shape, key shape, value shape)
    ((3, 4), (5, 4), (5, 2)),
    ((2, 5, 8), (2, 7, 8), (2, 7, 3)),
    ((2, 3, 6, 4), (2, 3, 9, 4), (2, 3, 9, 5)),
    ((2, 3, 6, 4), (1, 3, 9, 4), (1, 3, 9, 4)),  # broadcasting over the batch
]


def random_mask(gen, shape):
    return torch.rand(shape, generator=gen) > 0.3


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("masked", [False, True])
def test_matches_reference(shapes, masked):
    gen = torch.Generator().manual_seed(len(shapes[0]) + masked)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    mask = random_mask(gen, q.shape[:-1] + k.shape[-2:-1]) if masked else None
    out, weights = attention(q, k, v, mask)
    ref_out, ref_weights = reference(q, k, v, mask)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=1e-10, atol=1e-12)


def test_masked_weights_are_exactly_zero_and_rows_sum_to_one():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(4, 6, 8, generator=gen),
        torch.randn(4, 9, 8, generator=gen),
        torch.randn(4, 9, 8, generator=gen),
    )
    mask = random_mask(gen, (4, 6, 9))
    mask[:, :, 0] = True  # every query may see at least one key
    _, weights = attention(q, k, v, mask)
    assert torch.all(weights[~mask] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, 6))


def test_padding_mask_broadcasts_over_queries():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(2, 5, 8, generator=gen),
        torch.randn(2, 7, 8, generator=gen),
        torch.randn(2, 7, 8, generator=gen),
    )
    pad = (torch.arange(7) < torch.tensor([7, 3])[:, None])[:, None, :]  # (batch, 1, n_k)
    out, weights = attention(q, k, v, pad)
    assert torch.all(weights[1, :, 3:] == 0)
    # the padded keys are invisible: changing them changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[1, 3:], v2[1, 3:] = 100.0, -100.0
    out2, _ = attention(q, k2, v2, pad)
    torch.testing.assert_close(out, out2, rtol=0, atol=0)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    mask = torch.ones(1, 3, 5, dtype=torch.bool)
    mask[0, 1] = False
    out, weights = attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()
    assert torch.all(weights[0, 1] == 0) and torch.all(out[0, 1] == 0)
    torch.testing.assert_close(weights[0, [0, 2]].sum(-1), torch.ones(2))


def test_gradients_are_finite_with_a_fully_masked_row():
    q, k, v = (torch.randn(1, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[[True, False, True], [False, False, False], [True, True, True]]])
    out, _ = attention(q, k, v, mask)
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_non_boolean_mask_is_refused_with_advice():
    q = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="boolean"):
        attention(q, q, q, mask=torch.ones(2, 3, 3))


def test_dropout_only_in_training():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 6, 8, generator=gen),
        torch.randn(2, 6, 8, generator=gen),
        torch.randn(2, 6, 8, generator=gen),
    )
    plain, plain_weights = attention(q, k, v)
    dropout = torch.nn.Dropout(p=0.5)

    dropout.eval()
    out, weights = attention(q, k, v, dropout=dropout)
    torch.testing.assert_close(out, plain, rtol=0, atol=0)

    dropout.train()
    torch.manual_seed(0)
    out, weights = attention(q, k, v, dropout=dropout)
    assert not torch.allclose(out, plain)
    # the returned weights are those before dropout
    torch.testing.assert_close(weights, plain_weights, rtol=0, atol=0)


def test_bfloat16_inputs():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(2, 4, 6, 16, generator=gen),
        torch.randn(2, 4, 7, 16, generator=gen),
        torch.randn(2, 4, 7, 16, generator=gen),
    )
    mask = subsequent_mask(7)[:, :6]
    out, weights = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert out.dtype == weights.dtype == torch.bfloat16
    ref, _ = attention(q, k, v, mask)
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=3e-2)
    assert torch.all(weights[~mask.expand_as(weights)] == 0)


@pytest.mark.parametrize("case", ["none", "padding", "causal", "fully masked row"])
def test_agrees_with_torch_sdpa(case):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (
        torch.randn(2, 4, 6, 8, generator=gen),
        torch.randn(2, 4, 9, 8, generator=gen),
        torch.randn(2, 4, 9, 8, generator=gen),
    )
    masks = {
        "none": None,
        "padding": (torch.arange(9) < torch.tensor([9, 4])[:, None])[:, None, None, :],
        "causal": torch.ones(6, 9, dtype=torch.bool).tril(),
        "fully masked row": torch.ones(6, 9, dtype=torch.bool).index_fill(0, torch.tensor([2]), False),
    }
    mask = masks[case]
    ours, _ = attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_subsequent_mask():
    m = subsequent_mask(6)
    assert m.shape == (1, 6, 6) and m.dtype == torch.bool
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(m[0], j <= i)


def test_subsequent_mask_makes_attention_causal():
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 5, 8, generator=gen)
    out, _ = attention(x, x, x, subsequent_mask(5))
    later = x.clone()
    later[0, 3:] = torch.randn(2, 8, generator=gen)  # change the future
    out2, _ = attention(later, later, later, subsequent_mask(5))
    torch.testing.assert_close(out[0, :3], out2[0, :3], rtol=0, atol=0)
    assert not torch.allclose(out[0, 3:], out2[0, 3:])
