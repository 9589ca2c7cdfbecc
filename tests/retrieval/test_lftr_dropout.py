"""`retrieval.lftr.model.MaskDropout`: ``nn.Dropout``'s contract with a NumPy-drawn mask, seeded by torch's generator;
`retrieval.lftr.model.SelfAttention`: ``nn.MultiheadAttention``'s function with that dropout on its weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.model import LFTR, MaskDropout, SelfAttention


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


def test_the_heads_encoder_uses_it_for_every_dropout_and_its_attention_is_written_out():
    model = LFTR(LFTRConfig(d_model=32, n_heads=4, n_layers=2, dropout=0.2), d_in=8, d_out=8)
    layers = list(model.encoder.layers)
    assert len(layers) == 2
    for layer in layers:
        for name in ("dropout", "dropout1", "dropout2"):
            m = getattr(layer, name)
            assert isinstance(m, MaskDropout) and m.p == 0.2
        assert isinstance(layer.self_attn, SelfAttention) and layer.self_attn.weights_dropout.p == 0.2
    assert not any(type(m) is nn.Dropout for m in model.modules())
    # no parameter or buffer of its own: checkpoints keep nn.MultiheadAttention's keys
    assert not any("weights_dropout" in k for k in model.state_dict())


def _attention_pair(dropout: float) -> tuple[SelfAttention, nn.MultiheadAttention]:
    torch.manual_seed(0)
    ours = SelfAttention(32, 4, dropout)
    ref = nn.MultiheadAttention(32, 4, dropout=dropout, batch_first=True)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def test_written_out_attention_is_torchs_function_with_its_gradients():
    ours, ref = _attention_pair(0.3)
    ours.train().weights_dropout = nn.Identity()  # the written-out pass, without its mask
    ref.eval()  # torch's, without dropout
    x = torch.randn(6, 11, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, w = ours(x, x, x, need_weights=False)
    y_ref, _ = ref(x2, x2, x2, need_weights=False)
    assert w is None and torch.allclose(y, y_ref, atol=1e-6)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)
    for (name, p), p_ref in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad, p_ref.grad, atol=1e-5), name


def test_written_out_attention_drops_weights_and_defers_to_torch_otherwise():
    ours, ref = _attention_pair(0.5)
    x = torch.randn(4, 9, 32)
    ours.train()
    torch.manual_seed(1)
    a, b = ours(x, x, x, need_weights=False)[0], ours(x, x, x, need_weights=False)[0]
    torch.manual_seed(1)
    assert torch.equal(a, ours(x, x, x, need_weights=False)[0]) and not torch.equal(a, b)
    assert not torch.allclose(a, ref.eval()(x, x, x, need_weights=False)[0], atol=1e-3)
    # eval mode, or attention weights asked for: nn.MultiheadAttention's own pass
    ours.eval()
    assert torch.equal(ours(x, x, x, need_weights=False)[0], ref(x, x, x, need_weights=False)[0])
    y, w = ours.train()(x, x, x, need_weights=True)
    assert w is not None and w.shape == (4, 9, 9)


def test_attention_at_the_first_token_is_the_full_attentions_first_row_with_its_gradients():
    ours, ref = _attention_pair(0.3)
    ours.train().weights_dropout = nn.Identity()
    ref.eval()
    x = torch.randn(5, 12, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y = ours.attend_first(x)
    y_ref = ref(x2, x2, x2, need_weights=False)[0][:, :1]
    assert y.shape == (5, 1, 32) and torch.allclose(y, y_ref, atol=1e-6)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)  # every token still gets its key / value gradient
    for (name, p), p_ref in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad, p_ref.grad, atol=1e-5), name
    ours.train().weights_dropout = MaskDropout(0.5)
    torch.manual_seed(2)
    a, b = ours.attend_first(x), ours.attend_first(x)
    assert not torch.allclose(a, b)  # the weights are dropped out in training


@pytest.mark.parametrize("train", [False, True])
def test_the_context_is_the_full_encoders_output_at_the_context_token(train):
    """`LFTR.context` computes the last layer for the context token only: the same function (and gradients) as
    running every token through every layer and reading token 0."""
    torch.manual_seed(0)
    cfg = LFTRConfig(d_model=32, n_heads=4, n_layers=3, dropout=0.0 if train else 0.1)
    model = LFTR(cfg, d_in=8, d_out=8, d_text=6).train(train)
    prefix, qtype, horizon = torch.randn(7, 8, 8), torch.randint(0, 4, (7,)), torch.randint(1, 6, (7,))
    question = torch.randn(7, 6)
    full_calls = []
    model.encoder.register_forward_hook(lambda m, args, out: full_calls.append(1))
    c = model.context(prefix, qtype, horizon, question)
    assert not full_calls  # the encoder module as a whole is never run
    with torch.no_grad() if not train else torch.enable_grad():
        tokens = [model.ctx_token.expand(7, -1, -1), model.qtype_emb(qtype)[:, None], model.text_proj(question)[:, None],
                  model.horizon_emb(horizon)[:, None], model.in_proj(prefix) + model.frame_pos]
        ref = model.ctx_norm(model.encoder(torch.cat(tokens, 1))[:, 0])
    assert c.shape == (7, 32) and torch.allclose(c, ref, atol=1e-5)
    if train:
        g = torch.randn_like(c)
        grads = torch.autograd.grad(c, list(model.parameters()), g, allow_unused=True)
        grads_ref = torch.autograd.grad(ref, list(model.parameters()), g, allow_unused=True)
        for (name, _), a, b in zip(model.named_parameters(), grads, grads_ref, strict=True):
            assert (a is None) == (b is None), name
            if a is not None and b is not None:
                # float32 sums in another order: the error grows with the gradient's scale (ctx_token's entries reach
                # about 50, summed over the batch, and differ by 1e-4 with AVX2 kernels); a wrong function differs
                # by the gradient's own size
                scale = max(1.0, float(b.abs().max()))
                assert float((a - b).abs().max()) <= 1e-5 * scale, name
