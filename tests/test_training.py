"""The training chapter's code (`annotated_transformer.training`, book/06_training.ipynb): batches and masks, batching
by length, the schedule, label smoothing, accumulation, greedy decoding, the copy task's data."""

import pytest
import torch
import torch.nn.functional as F

from annotated_transformer import make_model
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.tasks import load_task
from annotated_transformer.training import (
    BOS,
    EOS,
    PAD,
    LabelSmoothing,
    accumulate_gradients,
    batches_of,
    copy_task,
    greedy_decode,
    make_optimizer,
    padding_fraction,
    rate,
    token_batches,
)


def batch_of(pairs):
    return batches_of(pairs, range(len(pairs)))


def test_batch_shifts_targets_and_builds_masks():
    b = batch_of([([5, 6, 7, EOS], [BOS, 5, 6, 7, EOS]), ([8, EOS], [BOS, 8, EOS])])
    assert b.tgt_in.tolist() == [[BOS, 5, 6, 7], [BOS, 8, EOS, PAD]]
    assert b.tgt_y.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert b.src_mask.shape == (2, 1, 4) and b.src_mask[1, 0].tolist() == [True, True, False, False]
    assert b.tgt_mask.shape == (2, 4, 4) and b.tgt_mask.dtype == torch.bool
    assert b.tgt_mask[1].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert b.ntokens == 6


def test_padded_positions_do_not_reach_the_loss():
    criterion = LabelSmoothing(12, PAD, 0.1)
    b = batch_of([([5, 6, EOS], [BOS, 5, 6, 7, 8, EOS]), ([8, EOS], [BOS, 8, EOS])])
    log_probs = torch.randn(2, 5, 12).log_softmax(-1)
    changed = log_probs.clone()
    changed[1, 2:] = torch.randn(3, 12).log_softmax(-1)  # predictions at sentence 2's padded positions
    loss = criterion(log_probs.reshape(-1, 12), b.tgt_y.reshape(-1))
    torch.testing.assert_close(criterion(changed.reshape(-1, 12), b.tgt_y.reshape(-1)), loss, rtol=0, atol=0)


def test_token_batches_use_every_sentence_once_within_the_budget():
    data = copy_task(3000, seed=1)
    src, tgt = [len(s) for s, _ in data], [len(t) - 1 for _, t in data]
    batches = token_batches(src, tgt, max_tokens=200, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(3000))
    for b in batches:
        assert len(b) * max(src[i] for i in b) <= 200 and len(b) * max(tgt[i] for i in b) <= 200
    assert token_batches(src, tgt, 200, seed=3) == batches
    assert token_batches(src, tgt, 200, seed=4) != batches
    shuffled = list(range(3000))
    size = round(3000 / len(batches))
    random_batches = [shuffled[i : i + size] for i in range(0, 3000, size)]
    assert padding_fraction(batches, src) < 0.05 < padding_fraction(random_batches, src)


def test_token_batches_errors():
    with pytest.raises(ValueError, match="does not fit"):
        token_batches([3, 50], [3, 4], max_tokens=20, seed=0)
    with pytest.raises(ValueError, match="target lengths"):
        token_batches([3, 4], [3], max_tokens=20, seed=0)


def test_rate_is_equation_3():
    assert rate(0, 512) == 0.0
    assert rate(100, 512, 1.0, 4000) == pytest.approx(512**-0.5 * 100 * 4000**-1.5)
    assert rate(10_000, 512, 2.0, 4000) == pytest.approx(2 * 512**-0.5 * 10_000**-0.5)
    rates = [rate(s, 512, 1.0, 4000) for s in range(1, 8001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000


def test_the_scheduler_gives_update_k_the_rate_of_step_k():
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = make_optimizer(model, d_model=64, factor=0.5, warmup=10)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    for k in range(1, 25):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(rate(k, 64, 0.5, 10))
        optimizer.step()
        scheduler.step()


def test_smoothed_targets():
    t = LabelSmoothing(10, PAD, 0.2).smoothed_targets(torch.tensor([3, PAD, 9]))
    torch.testing.assert_close(t[[0, 2]].sum(-1), torch.ones(2))
    assert t[0, 3].item() == pytest.approx(0.8) and t[0, 5].item() == pytest.approx(0.2 / 8)
    assert torch.all(t[:, PAD] == 0) and torch.all(t[1] == 0)


def test_relation_to_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64)
    target = torch.tensor([1, 4, PAD, 10, 3, PAD, 7])
    smooth = LabelSmoothing(11, PAD, 0.1)
    t = smooth.smoothed_targets(target).double()
    entropy = -torch.where(t > 0, t * t.log(), 0.0).sum()
    # ours = cross-entropy against our smoothed distribution, minus its entropy (a KL divergence)
    torch.testing.assert_close(
        smooth(logits.log_softmax(-1), target).double(), F.cross_entropy(logits, t, reduction="sum") - entropy
    )
    # without smoothing, ours is the plain cross-entropy that ignores padding
    torch.testing.assert_close(
        LabelSmoothing(11, PAD, 0.0)(logits.log_softmax(-1), target).double(),
        F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum"),
    )
    # PyTorch's built-in smoothing spreads epsilon over all V entries, the target and padding included
    keep = target != PAD
    theirs = (1 - 0.1) * F.one_hot(target[keep], 11).double() + 0.1 / 11
    builtin = F.cross_entropy(logits, target, label_smoothing=0.1, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(builtin, F.cross_entropy(logits[keep], theirs, reduction="sum"))
    # so the two differ exactly by where the target puts its mass, and by our entropy term
    log_p = logits.log_softmax(-1)[keep]
    ours = smooth(logits.log_softmax(-1), target).double()
    torch.testing.assert_close(ours, builtin + ((theirs - t[keep]) * log_p).sum() - entropy)


def test_label_smoothing_stays_finite_and_is_zero_at_the_target():
    smooth = LabelSmoothing(6, PAD, 0.1)
    target = torch.tensor([2, 5, PAD])
    log_probs = torch.randn(3, 6).log_softmax(-1)
    log_probs[:, PAD] = float("-inf")  # the model gives padding no probability at all
    log_probs.requires_grad_()
    loss = smooth(log_probs, target)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()
    # no probability at all on a right token: the divergence is infinite (not NaN)
    assert smooth(log_probs.detach(), torch.tensor([PAD, 5, PAD])).item() < float("inf")
    assert smooth(log_probs.detach(), torch.tensor([PAD, 5, 3])).item() < float("inf")
    hopeless = log_probs.detach().clone()
    hopeless[1, 5] = float("-inf")
    assert smooth(hopeless, torch.tensor([2, 5, PAD])).item() == float("inf")
    perfect = smooth.smoothed_targets(target[:2]).log()  # -inf where the target is 0
    assert smooth(perfect, target[:2]).item() == pytest.approx(0.0, abs=1e-6)


def test_label_smoothing_errors():
    with pytest.raises(ValueError, match="expected log-probabilities"):
        LabelSmoothing(6, PAD)(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least 3"):
        LabelSmoothing(2, PAD)


def test_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    model = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4, dropout=0.0)
    criterion = LabelSmoothing(13, PAD, 0.1)
    pairs = copy_task(20, seed=9)
    accumulate_gradients(model, [batch_of(pairs)], criterion)
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    accumulate_gradients(model, [batch_of(pairs[:3]), batch_of(pairs[3:11]), batch_of(pairs[11:])], criterion)
    for p, g in zip(model.parameters(), whole):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)


class Scripted:
    "A stand-in model whose generator emits a fixed script per sentence (then repeats its last token)."

    def __init__(self, scripts, vocab=10):
        self.scripts, self.vocab = scripts, vocab

    def encode(self, src, src_mask):
        return torch.zeros(src.size(0), 1, 1)

    def decode(self, memory, src_mask, ys, tgt_mask):
        assert torch.all(ys[:, 0] == BOS), "decoding must start from <s>"
        self.position = ys.size(1) - 1
        return torch.zeros(ys.size(0), ys.size(1), 1)

    def generator(self, states):
        tokens = [s[min(self.position, len(s) - 1)] for s in self.scripts]
        return F.one_hot(torch.tensor(tokens), self.vocab).float().log()


def test_greedy_decode_stops_each_sentence_at_eos_and_respects_max_len():
    model = Scripted([[5, 6, EOS], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7], [EOS]])
    src = torch.ones(3, 4, dtype=torch.long)
    out = greedy_decode(model, src, torch.ones(3, 1, 4, dtype=torch.bool), max_len=6)
    assert out == [[5, 6], [7] * 6, []]


def test_held_out_and_validation_data_are_never_trained_on():
    task = load_task(RECIPES["copy"])
    trained = {tuple(s) for s, _ in task.train}
    assert not any(tuple(s) in trained for s, _ in task.valid)
    assert not any(tuple(s) in trained for s, _ in copy_task(500, seed=2, exclude=task.train))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_closed_form_equals_the_kl_divergence_from_the_full_target(smoothing, dtype):
    torch.manual_seed(3)
    smooth = LabelSmoothing(9, PAD, smoothing)
    target = torch.tensor([4, PAD, 8, 1, 2, PAD, 3])
    log_probs = torch.randn(7, 9, dtype=torch.float64).log_softmax(-1)
    t = smooth.smoothed_targets(target).double()
    explicit = torch.where(t > 0, t * (torch.where(t > 0, t, 1.0).log() - log_probs), 0.0).sum()
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    torch.testing.assert_close(smooth(log_probs.to(dtype), target).double(), explicit, **tolerance)
    # and the gradients too
    lp = log_probs.to(dtype).requires_grad_()
    smooth(lp, target).backward()
    torch.testing.assert_close(lp.grad.double(), torch.where(target[:, None] != PAD, -t, 0.0), **tolerance)
