"""Builders that the tests of several modules share (fixtures live in conftest.py)."""

import torch

from annotated_transformer import make_model


def sharp_model(seed: int, vocab: int = 30, **settings):
    "A small model in float64 whose distributions are sharper than at initialisation, so beams and steps differ."
    torch.manual_seed(seed)
    model = make_model(vocab, vocab, **{"N": 2, "d_model": 32, "d_ff": 64, "h": 4, **settings}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.5)
    return model.double()  # float64: equal computations in a different order agree to ~1e-12, so ties cannot flip
