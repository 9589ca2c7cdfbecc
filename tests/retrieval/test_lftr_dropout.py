"""`retrieval.lftr.model.MaskDropout`: ``nn.Dropout``'s contract with a NumPy-drawn mask, seeded by torch's generator."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.model import LFTR, MaskDropout


def test_keeps_one_minus_p_and_scales_the_kept():
    d = MaskDropout(0.1).train()
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = d(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 1e6 draws: the std of the share is 3e-4
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    assert y.shape == x.shape and y.dtype == x.dtype


def test_eval_mode_and_p_zero_are_the_identity():
    x = torch.randn(4, 5)
    assert MaskDropout(0.3).eval()(x) is x
    assert MaskDropout(0.0).train()(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        MaskDropout(1.0)


def test_masks_follow_torchs_generator_and_differ_between_calls():
    d, x = MaskDropout(0.5).train(), torch.ones(64, 64)
    torch.manual_seed(3)
    a, b = d(x), d(x)
    torch.manual_seed(3)
    a2 = d(x)
    assert torch.equal(a, a2) and not torch.equal(a, b)


def test_gradient_is_the_scaled_mask():
    d = MaskDropout(0.25).train()
    x = torch.randn(32, 16, requires_grad=True)
    y = d(x)
    y.sum().backward()
    assert torch.allclose(x.grad, (y.detach() != 0).float() / 0.75)


def test_the_heads_encoder_uses_it_for_every_dropout_but_the_attentions():
    model = LFTR(LFTRConfig(d_model=32, n_heads=4, n_layers=2, dropout=0.2), d_in=8, d_out=8)
    layers = list(model.encoder.layers)
    assert len(layers) == 2
    for layer in layers:
        for name in ("dropout", "dropout1", "dropout2"):
            m = getattr(layer, name)
            assert isinstance(m, MaskDropout) and m.p == 0.2
    assert not any(type(m) is nn.Dropout for m in model.modules())
