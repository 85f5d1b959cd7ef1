"""Decoding (`annotated_transformer.decoding`, book/07_decoding.ipynb): one position at a time with the model's
cache, beam search with the length penalty against an exhaustive oracle, the limits it keeps."""

import itertools

import pytest
import torch

from annotated_transformer.attention import subsequent_mask
from annotated_transformer.decoding import DecoderCache, beam_search, length_penalty
from annotated_transformer.training import BOS, EOS, PAD, greedy_decode, pad_sequences, padding_mask
from helpers import sharp_model


def random_sources(seed: int, vocab: int, lengths):
    g = torch.Generator().manual_seed(seed)
    src = pad_sequences([torch.randint(3, vocab, (n,), generator=g).tolist() + [EOS] for n in lengths])
    return src, padding_mask(src)


@pytest.mark.parametrize("settings", [{}, {"norm_first": True}, {"positional": "learned"}, {"share_embeddings": False}])
def test_incremental_steps_equal_a_full_forward_pass(settings):
    model = sharp_model(0, **settings)
    src, src_mask = random_sources(1, 30, [4, 9, 1])
    tgt = torch.randint(3, 30, (3, 8))
    tgt[:, 0] = BOS
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.generator(model.decode(memory, src_mask, tgt, subsequent_mask(8)))
        cache = DecoderCache(len(model.decoder.layers))
        steps = torch.stack(
            [model.generator(model.decode(memory, src_mask, tgt[:, t : t + 1], None, cache))[:, -1] for t in range(8)],
            dim=1,
        )
    torch.testing.assert_close(steps, full, atol=1e-10, rtol=1e-10)
    assert cache.length == 8


def test_selecting_rows_reorders_the_cache():
    model = sharp_model(2)
    src, src_mask = random_sources(3, 30, [5, 6, 7])
    tgt = torch.randint(3, 30, (3, 5))
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = DecoderCache(len(model.decoder.layers))
        for t in range(3):
            model.decode(memory, src_mask, tgt[:, t : t + 1], None, cache)
        kept = torch.tensor([2, 0])
        cache.select(kept, kept)  # rows 2 and 0, and their sentences' memory
        last = model.generator(model.decode(memory[kept], src_mask[kept], tgt[kept, 3:4], None, cache))[:, -1]
        full = model.generator(model.decode(memory[kept], src_mask[kept], tgt[kept, :4], subsequent_mask(4)))
    torch.testing.assert_close(last, full[:, -1], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam_size", [1, 2, 4, 6])
def test_cached_and_uncached_search_agree(seed, beam_size):
    model = sharp_model(seed)
    src, src_mask = random_sources(seed, 30, [3, 8, 5, 1, 12])
    cached = beam_search(model, src, src_mask, beam_size=beam_size, extra_len=6)
    uncached = beam_search(model, src, src_mask, beam_size=beam_size, extra_len=6, cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    for a, b in zip(cached, uncached):
        assert a.score == pytest.approx(b.score, abs=1e-9) and a.log_prob == pytest.approx(b.log_prob, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_one_beam_is_greedy_decoding(seed):
    model = sharp_model(seed)
    src, src_mask = random_sources(seed, 30, [3, 8, 5, 12])

    def greedy(**options):  # banning nothing: greedy_decode may choose any token
        return [h.tokens for h in beam_search(model, src, src_mask, beam_size=1, extra_len=5, banned=(), **options)]

    assert greedy() == greedy(cache=False)
    greedy = greedy()
    reference = greedy_decode(model, src, src_mask, max_len=src.size(1) + 5)
    for g, r, n in zip(greedy, reference, src_mask.sum(dim=(1, 2)).tolist()):
        assert g == r[: len(g)]
        assert len(g) == len(r) or len(g) == n + 5 - 1  # stopped at </s>, or at its own length limit


def test_scores_are_length_normalised_log_probabilities():
    model = sharp_model(5)
    src, src_mask = random_sources(5, 30, [4, 6])
    memory = model.encode(src, src_mask)
    for alpha in (0.0, 0.6, 1.0):
        for i, hyp in enumerate(beam_search(model, src, src_mask, beam_size=3, alpha=alpha, extra_len=6)):
            tgt = torch.tensor([[BOS] + hyp.tokens])
            with torch.no_grad():
                log_probs = model.generator(
                    model.decode(memory[i : i + 1], src_mask[i : i + 1], tgt, subsequent_mask(tgt.size(1)))
                )[0]
            targets = hyp.tokens + [EOS]
            log_prob = sum(log_probs[t, tok].item() for t, tok in enumerate(targets))
            assert hyp.log_prob == pytest.approx(log_prob, abs=1e-9)
            assert hyp.score == pytest.approx(log_prob / length_penalty(len(targets), alpha), abs=1e-9)


def test_a_beam_wide_enough_finds_the_best_translation_exactly():
    model = sharp_model(7, vocab=5)
    src, src_mask = random_sources(7, 5, [1])  # two source positions, so at most 2 + 1 output tokens
    memory = model.encode(src, src_mask)
    best = None
    for n in range(3):  # every output: n tokens other than </s>, then </s>; the third token must be </s>
        for prefix in itertools.product([t for t in range(5) if t != EOS], repeat=n):
            tgt = torch.tensor([[BOS, *prefix]])
            with torch.no_grad():
                lp = model.generator(model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1))))[0]
            log_prob = sum(lp[t, tok].item() for t, tok in enumerate([*prefix, EOS]))
            score = log_prob / length_penalty(n + 1, 0.6)
            best = max(best or (score, list(prefix)), (score, list(prefix)))
    hyp = beam_search(model, src, src_mask, beam_size=25, alpha=0.6, extra_len=1, banned=())[0]
    assert hyp.tokens == best[1] and hyp.score == pytest.approx(best[0], abs=1e-9)


def reference_beam_search(model, src, src_mask, k, alpha, limit):
    "The same search rules, one sentence at a time, re-running the decoder over each prefix: an oracle for the batch."
    memory = model.encode(src, src_mask)
    beams, finished = [([], 0.0)], []
    for length in range(1, limit + 1):
        candidates = []
        for tokens, score in beams:
            tgt = torch.tensor([[BOS, *tokens]])
            with torch.no_grad():
                lp = model.generator(model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1))))[0, -1]
            for token in range(lp.size(0)):
                if token in (PAD, BOS) or (length == limit and token != EOS):
                    continue
                candidates.append((score + lp[token].item(), tokens, token))
        candidates.sort(key=lambda c: -c[0])
        alive = []
        for rank, (score, tokens, token) in enumerate(candidates[: 2 * k]):
            if token == EOS:
                if rank < k:
                    finished.append((score / length_penalty(length, alpha), tokens))
            elif len(alive) < k:
                alive.append((tokens + [token], score))
        if len(finished) >= k or not alive:
            break
        beams = alive
    return max(finished)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("beam_size", [2, 3])
def test_batched_beam_search_follows_the_one_sentence_oracle(seed, beam_size):
    model = sharp_model(seed, vocab=12)
    src, src_mask = random_sources(seed + 10, 12, [2, 6, 4])
    hyps = beam_search(model, src, src_mask, beam_size=beam_size, alpha=0.6, extra_len=4)
    for i, hyp in enumerate(hyps):
        limit = int(src_mask[i].sum()) + 4
        score, tokens = reference_beam_search(model, src[i : i + 1], src_mask[i : i + 1], beam_size, 0.6, limit)
        assert hyp.tokens == tokens and hyp.score == pytest.approx(score, abs=1e-9)


def test_padding_and_start_symbols_are_never_produced():
    model = sharp_model(11, vocab=8)
    with torch.no_grad():
        model.generator.proj.bias[[PAD, BOS]] = 50.0  # a model that loves them
    src, src_mask = random_sources(11, 8, [3, 5])
    for hyp in beam_search(model, src, src_mask, beam_size=3, extra_len=5):
        assert PAD not in hyp.tokens and BOS not in hyp.tokens
    unbanned = beam_search(model, src, src_mask, beam_size=1, extra_len=5, banned=())
    assert any(BOS in h.tokens or PAD in h.tokens for h in unbanned)


def test_translations_respect_the_length_limit_and_the_model_positions():
    model = sharp_model(8, max_len=12)
    src, src_mask = random_sources(8, 30, [2, 10])
    for hyp, n in zip(beam_search(model, src, src_mask, beam_size=3, extra_len=50), [3, 11]):
        assert len(hyp.tokens) + 1 <= min(n + 50, 11)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_scores_that_come_out_nan_stop_the_search_with_an_error(beam_size):
    "Finite weights so large that the output layer overflows: the search would otherwise run to the length limit."
    model = sharp_model(0).float()
    with torch.no_grad():
        model.generator.proj.weight.mul_(1e37)  # finite, but the logits are +-inf and their log-softmax NaN
    assert all(torch.isfinite(p).all() for p in model.parameters())
    src, src_mask = random_sources(1, 30, [4, 9])
    with pytest.raises(FloatingPointError, match="the model's scores are NaN"):
        beam_search(model, src, src_mask, beam_size=beam_size, extra_len=400_000)
