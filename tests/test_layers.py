"""Feed-forward network, residual sub-layer and the two layer kinds (book/03_feed_forward.ipynb)."""

import torch
from torch import nn

from annotated_transformer import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadedAttention,
    PositionwiseFeedForward,
    SublayerConnection,
    subsequent_mask,
)


def test_feed_forward_is_equation_2():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 32, dropout=0.0)
    x = torch.randn(3, 5, 8)
    expected = torch.clamp(x @ ffn.w_1.weight.T + ffn.w_1.bias, min=0) @ ffn.w_2.weight.T + ffn.w_2.bias
    torch.testing.assert_close(ffn(x), expected)


def test_feed_forward_equals_two_kernel_size_1_convolutions():
    torch.manual_seed(1)
    ffn = PositionwiseFeedForward(8, 32).eval()
    c1, c2 = nn.Conv1d(8, 32, 1), nn.Conv1d(32, 8, 1)
    with torch.no_grad():
        c1.weight.copy_(ffn.w_1.weight[:, :, None])
        c1.bias.copy_(ffn.w_1.bias)
        c2.weight.copy_(ffn.w_2.weight[:, :, None])
        c2.bias.copy_(ffn.w_2.bias)
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(ffn(x), c2(c1(x.transpose(1, 2)).relu()).transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_post_norm_is_the_default_and_matches_the_paper():
    torch.manual_seed(2)
    block = SublayerConnection(8, dropout=0.0)
    sub = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    assert block.norm_first is False
    torch.testing.assert_close(
        block(x, sub), nn.functional.layer_norm(x + sub(x), (8,), block.norm.weight, block.norm.bias)
    )


def test_pre_norm_option():
    torch.manual_seed(3)
    block = SublayerConnection(8, dropout=0.0, norm_first=True)
    sub = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    torch.testing.assert_close(block(x, sub), x + sub(block.norm(x)))


def test_dropout_touches_only_the_sublayer_output():
    "With a sub-layer that outputs zeros, dropout has nothing to drop: post-norm gives exactly LayerNorm(x)."
    block = SublayerConnection(8, dropout=0.5).train()
    x = torch.randn(16, 8)
    torch.testing.assert_close(block(x, torch.zeros_like), block.norm(x), rtol=0, atol=0)
    pre = SublayerConnection(8, dropout=0.5, norm_first=True).train()
    torch.testing.assert_close(pre(x, torch.zeros_like), x, rtol=0, atol=0)


def test_feed_forward_dropout_acts_on_the_hidden_layer_in_training():
    torch.manual_seed(6)
    ffn = PositionwiseFeedForward(8, 64, dropout=0.5)
    x = torch.randn(4, 8)
    hidden = ffn.w_1(x).relu()
    torch.manual_seed(7)
    out = ffn(x)
    torch.manual_seed(7)
    expected = ffn.w_2(torch.nn.functional.dropout(hidden, 0.5, training=True))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(ffn.eval()(x), ffn.w_2(hidden))


def test_residual_dropout_applies_to_the_sublayer_output_only_in_training():
    torch.manual_seed(4)
    block = SublayerConnection(8, dropout=0.5)
    sub = nn.Linear(8, 8)
    x = torch.randn(16, 8)
    block.eval()
    torch.testing.assert_close(block(x, sub), block(x, sub), rtol=0, atol=0)
    block.train()
    assert not torch.allclose(block(x, sub), block(x, sub))


def make_layers(d=16, h=4, norm_first=False):
    torch.manual_seed(5)
    enc = EncoderLayer(d, MultiHeadedAttention(h, d), PositionwiseFeedForward(d, 32), 0.1, norm_first)
    dec = DecoderLayer(
        d, MultiHeadedAttention(h, d), MultiHeadedAttention(h, d), PositionwiseFeedForward(d, 32), 0.1, norm_first
    )
    return enc.eval(), dec.eval()


def test_encoder_layer_ignores_padded_source_positions():
    enc, _ = make_layers()
    x = torch.randn(1, 6, 16)
    mask = (torch.arange(6) < 4)[None, None, :]
    changed = x.clone()
    changed[0, 4:] = torch.randn(2, 16)
    torch.testing.assert_close(enc(x, mask)[0, :4], enc(changed, mask)[0, :4])


def test_decoder_layer_is_causal_and_reads_the_memory():
    _, dec = make_layers()
    y, memory = torch.randn(1, 5, 16), torch.randn(1, 7, 16)
    src_mask = torch.ones(1, 1, 7, dtype=torch.bool)
    out = dec(y, memory, src_mask, subsequent_mask(5))
    later = y.clone()
    later[0, 3:] = torch.randn(2, 16)
    torch.testing.assert_close(dec(later, memory, src_mask, subsequent_mask(5))[0, :3], out[0, :3])
    assert not torch.allclose(dec(y, memory + 1, src_mask, subsequent_mask(5)), out)


def test_layers_have_the_paper_structure():
    enc, dec = make_layers(norm_first=True)
    assert len(enc.sublayer) == 2 and len(dec.sublayer) == 3
    assert all(s.norm_first for s in (*enc.sublayer, *dec.sublayer)) and enc.norm_first and dec.norm_first
