"""Embeddings and positional encodings (book/04_encoding.ipynb)."""

import math

import pytest
import torch

from annotated_transformer import (
    Embeddings,
    LearnedPositionalEmbedding,
    MultiHeadedAttention,
    PositionalEncoding,
    sinusoidal_encoding,
)


def test_sinusoids_follow_the_formula():
    pe = sinusoidal_encoding(50, 16, dtype=torch.float64)
    for pos in (0, 1, 17, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


@pytest.mark.parametrize("k", [1, 3, 40, 999])
def test_an_offset_is_one_rotation_at_every_position(k):
    d = 32
    table = sinusoidal_encoding(3000, d, dtype=torch.float64)
    omega = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(omega * k), torch.sin(omega * k)
    sin_next = table[:, 0::2] * c + table[:, 1::2] * s  # sin(a+b) = sin a cos b + cos a sin b
    cos_next = table[:, 1::2] * c - table[:, 0::2] * s  # cos(a+b) = cos a cos b - sin a sin b
    torch.testing.assert_close(sin_next[: 3000 - k], table[k:, 0::2], rtol=0, atol=1e-10)
    torch.testing.assert_close(cos_next[: 3000 - k], table[k:, 1::2], rtol=0, atol=1e-10)


def test_the_encoding_extends_beyond_max_len():
    long = sinusoidal_encoding(12000, 64)
    torch.testing.assert_close(long[:5000], PositionalEncoding(64, 0.0).pe[0], rtol=0, atol=0)
    torch.testing.assert_close(long.norm(dim=1), torch.full((12000,), math.sqrt(32)), rtol=1e-5, atol=1e-5)


def test_positional_encoding_adds_the_table_and_refuses_too_long_inputs():
    layer = PositionalEncoding(16, dropout=0.0, max_len=10)
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(layer(x), x + sinusoidal_encoding(7, 16))
    assert "pe" not in layer.state_dict()  # a fixed function, not a parameter
    with pytest.raises(ValueError, match="larger max_len"):
        layer(torch.randn(1, 11, 16))


def test_odd_d_model_is_refused():
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(10, 15)


def test_embeddings_are_scaled_by_sqrt_d_model():
    emb = Embeddings(64, 1000)
    tokens = torch.randint(0, 1000, (4, 9))
    torch.testing.assert_close(emb(tokens), emb.lut.weight[tokens] * 8.0)
    assert emb.lut.weight.std().item() == pytest.approx(64**-0.5, rel=0.05)


def test_self_attention_is_permutation_equivariant_until_positions_are_added():
    torch.manual_seed(0)
    mha = MultiHeadedAttention(4, 32).eval()
    x, perm = torch.randn(1, 7, 32), torch.randperm(7)
    torch.testing.assert_close(mha(x, x, x)[:, perm], mha(x[:, perm], x[:, perm], x[:, perm]), rtol=1e-5, atol=1e-6)
    for position in (PositionalEncoding(32, 0.0), LearnedPositionalEmbedding(32, 0.0)):
        a, b = position(x), position(x[:, perm])
        assert not torch.allclose(mha(a, a, a)[:, perm], mha(b, b, b), atol=1e-3)


def test_learned_positions_are_trainable_and_bounded():
    layer = LearnedPositionalEmbedding(8, dropout=0.0, max_len=5)
    x = torch.zeros(1, 5, 8)
    layer(x).sum().backward()
    assert layer.embedding.weight.grad is not None
    with pytest.raises(ValueError, match="max_len=5"):
        layer(torch.zeros(1, 6, 8))


@pytest.mark.parametrize("kind", [PositionalEncoding, LearnedPositionalEmbedding])
def test_a_slice_fed_at_its_start_gets_the_same_positions_as_in_the_whole(kind):
    layer = kind(8, dropout=0.0, max_len=10)
    x = torch.randn(2, 10, 8)
    whole = layer(x)
    torch.testing.assert_close(layer(x[:, 4:7], start=4), whole[:, 4:7])
    torch.testing.assert_close(layer(x[:, 9:], start=9), whole[:, 9:])
    with pytest.raises(ValueError, match="max_len"):
        layer(x[:, :2], start=9)  # positions 9 and 10: one beyond the table
