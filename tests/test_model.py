"""The full model (book/05_model.ipynb): structure, sharing, parameter counts and the properties of a translator."""

import math

import pytest
import torch
from torch import nn

from annotated_transformer import (
    EncoderDecoder,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    TransformerConfig,
    make_model,
    subsequent_mask,
)


def small(src_vocab=13, tgt_vocab=13, **overrides):
    torch.manual_seed(0)
    return make_model(src_vocab, tgt_vocab, **{"N": 2, "d_model": 32, "d_ff": 64, "h": 4, **overrides}).eval()


def batch(src_vocab=13, tgt_vocab=13):
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(1, src_vocab, (3, 8), generator=gen)
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(1, tgt_vocab, (3, 6), generator=gen)
    tgt[2, 4:] = 0
    src_mask = (src != 0)[:, None, :]
    tgt_mask = (tgt != 0)[:, None, :] & subsequent_mask(6)
    return src, tgt, src_mask, tgt_mask


def test_shapes_and_log_probabilities():
    model = small(13, 17)
    src, tgt, src_mask, tgt_mask = batch(13, 17)
    states = model(src, tgt, src_mask, tgt_mask)
    assert states.shape == (3, 6, 32)
    log_probs = model.generator(states)
    assert log_probs.shape == (3, 6, 17)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 6))


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_decoder_is_causal(norm_first):
    model = small(norm_first=norm_first)
    src, tgt, src_mask, tgt_mask = batch()
    out = model(src, tgt, src_mask, tgt_mask)
    for j in range(1, 6):
        changed = tgt.clone()
        changed[0, j] = (changed[0, j] % 12) + 1
        new = model(src, changed, src_mask, tgt_mask)
        torch.testing.assert_close(new[0, :j], out[0, :j], rtol=0, atol=0)
        assert not torch.allclose(new[0, j], out[0, j])


def test_source_padding_is_invisible():
    model = small()
    src, tgt, src_mask, tgt_mask = batch()
    out = model(src, tgt, src_mask, tgt_mask)
    garbage = src.clone()
    garbage[1, 5:] = torch.tensor([3, 4, 5])
    garbage[2, 2:] = 7
    torch.testing.assert_close(model(garbage, tgt, src_mask, tgt_mask), out, rtol=0, atol=0)


def test_eval_is_deterministic_and_training_is_not():
    model = small()
    src, tgt, src_mask, tgt_mask = batch()
    torch.testing.assert_close(model(src, tgt, src_mask, tgt_mask), model(src, tgt, src_mask, tgt_mask), rtol=0, atol=0)
    model.train()
    assert not torch.allclose(model(src, tgt, src_mask, tgt_mask), model(src, tgt, src_mask, tgt_mask))


def test_three_way_sharing_with_a_shared_vocabulary():
    model = small(20, 20)
    lut = model.tgt_embed[0].lut.weight
    assert model.src_embed[0].lut.weight is lut and model.generator.proj.weight is lut
    shared = sum(p.numel() for p in model.parameters())
    unshared = sum(p.numel() for p in small(20, 20, share_embeddings=False).parameters())
    assert unshared - shared == 2 * 20 * 32


def test_two_way_sharing_with_separate_vocabularies():
    model = small(20, 30)
    assert model.generator.proj.weight is model.tgt_embed[0].lut.weight
    assert model.src_embed[0].lut.weight is not model.tgt_embed[0].lut.weight


def test_two_vocabularies_of_one_size_keep_their_own_source_embedding():
    model = small(20, 20, shared_vocab=False)
    assert model.generator.proj.weight is model.tgt_embed[0].lut.weight
    assert model.src_embed[0].lut.weight is not model.tgt_embed[0].lut.weight
    tied = small(20, 20, shared_vocab=True)
    assert tied.src_embed[0].lut.weight is tied.tgt_embed[0].lut.weight
    with pytest.raises(ValueError, match=r"one vocabulary \(shared_vocab=True\) has one size, got 20 source and 30"):
        small(20, 30, shared_vocab=True)


def test_no_sharing_when_switched_off():
    model = small(20, 20, share_embeddings=False)
    weights = [model.src_embed[0].lut.weight, model.tgt_embed[0].lut.weight, model.generator.proj.weight]
    assert len({id(w) for w in weights}) == 3


def test_sharing_survives_an_optimizer_step():
    model = small(20, 20).train()
    src, tgt, src_mask, tgt_mask = batch(20, 20)
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()
    model.generator(model(src, tgt, src_mask, tgt_mask)).sum().backward()
    before = model.generator.proj.weight.detach().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(before, model.generator.proj.weight)
    assert torch.equal(model.src_embed[0].lut.weight, model.generator.proj.weight)


@pytest.mark.parametrize("config, paper", [(TransformerConfig.base(), 65e6), (TransformerConfig.big(), 213e6)])
def test_parameter_counts_match_table_3(config, paper):
    with torch.device("meta"):
        model = make_model(37000, 37000, config)
    total = sum(p.numel() for p in model.parameters())
    assert abs(total - paper) / paper < 0.05


def test_table_3_configurations():
    base, big = TransformerConfig.base(), TransformerConfig.big()
    assert (base.N, base.d_model, base.d_ff, base.h, base.dropout, base.label_smoothing) == (6, 512, 2048, 8, 0.1, 0.1)
    assert (big.N, big.d_model, big.d_ff, big.h, big.dropout, big.label_smoothing) == (6, 1024, 4096, 16, 0.3, 0.1)
    assert base.norm_first is False and base.share_embeddings is True and base.positional == "sinusoidal"
    assert TransformerConfig.big(N=2).N == 2 and TransformerConfig.big(N=2).d_model == 1024


def test_overrides_and_their_errors():
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2)
    assert model.config == TransformerConfig(N=1, d_model=16, d_ff=32, h=2)
    assert len(model.encoder.layers) == 1 and len(model.decoder.layers) == 1
    with pytest.raises(TypeError, match="unknown configuration field.*d_modle"):
        make_model(10, 10, d_modle=16)
    with pytest.raises(ValueError, match="divisible"):
        make_model(10, 10, d_model=30, h=4)
    with pytest.raises(ValueError, match="positional"):
        TransformerConfig(positional="rotary")
    with pytest.raises(ValueError, match="dropout"):
        TransformerConfig(dropout=1.5)
    with pytest.raises(ValueError, match="N must be a positive integer"):
        TransformerConfig(N=0)
    with pytest.raises(ValueError, match="norm_first must be True or False"):
        TransformerConfig(norm_first="no")
    with pytest.raises(ValueError, match="share_embeddings must be True or False"):
        TransformerConfig(share_embeddings=0)
    with pytest.raises(ValueError, match="dropout must be a number"):
        TransformerConfig(dropout="0.1")
    with pytest.raises(ValueError, match="even"):
        TransformerConfig(d_model=9, h=3)
    assert TransformerConfig(d_model=9, h=3, positional="learned").d_model == 9
    with pytest.raises(TypeError, match="config must be a TransformerConfig"):
        make_model(10, 10, {"N": 1})
    with pytest.raises(ValueError, match="tgt_vocab must be a positive number"):
        make_model(10, 0)


def test_norm_placement_and_positional_kind():
    post, pre = small(), small(norm_first=True)
    assert isinstance(post.encoder.norm, nn.Identity) and isinstance(post.decoder.norm, nn.Identity)
    assert isinstance(pre.encoder.norm, nn.LayerNorm) and isinstance(pre.decoder.norm, nn.LayerNorm)
    assert isinstance(post.src_embed[1], PositionalEncoding)
    assert isinstance(small(positional="learned").src_embed[1], LearnedPositionalEmbedding)


def test_initialisation():
    model = make_model(50, 50, N=1, d_model=64, d_ff=256, h=4)
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight is not model.generator.proj.weight:
            bound = math.sqrt(6 / (module.in_features + module.out_features))
            assert module.weight.abs().max() <= bound and module.weight.abs().max() > 0.8 * bound
            assert torch.all(module.bias == 0)
    assert model.tgt_embed[0].lut.weight.std().item() == pytest.approx(64**-0.5, rel=0.1)
    assert isinstance(model, EncoderDecoder)
