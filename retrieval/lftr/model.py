"""The LFTR head: a question- and horizon-conditioned latent rollout read into a frozen retrieval space.

Shapes (B queries, F=8 prefix frames, D = ``d_model``, H = ``rollout_depth``, K = ``n_samples``):

1. context: prefix tokens ``(B, F, d_in)`` -> the frames ``cfg.frames`` selects (``all``: the 8; ``last``: the last
   one; ``K``: the K last; `LFTRConfig.frame_index`) -> linear -> ``(B, F', D)`` + the position embedding of each
   kept frame's own time position (the last frame keeps position 8 under ``last``); prepended by a learned
   context token and the conditioning tokens (question type, horizon, projected question-text embedding);
   a pre-norm Transformer encoder (``n_layers``, ``n_heads``, feed-forward ``ff_mult * D``); ``c`` = the output
   at the context token, ``(B, D)`` (the last layer computes only that token's output; the other tokens are its
   keys and values).
2. rollout: ``z_0 = c``; ``z_t = z_{t-1} + Phi([z_{t-1}; e_t])`` for t = 1..H, with ``Phi`` an MLP of
   ``transition_depth`` layers and ``e_t`` a learned step embedding; ``mu_t = z_t``; ``mu`` is ``(B, H, D)``.
3. read: ``mu_r`` at the read step r (the query's horizon clipped to H for the matched read).
4. samples: ``sigma_r = softplus(S([mu_r; e_h])) + 1e-4`` (horizon-conditioned sigma head); ``z_k = mu_r + sigma_r *
   eps_k`` with ``eps_1 = 0`` (the mean is always a sample) and ``eps_k ~ N(0, I)`` otherwise, k = 1..K;
   without the sigma head K = 1.
5. projection: ``y_k = normalise(P(z_k))`` into the target space, ``(B, K, d_out)``; the score of an item x is
   ``max_k <y_k, x>`` (cosine; items are L2-normalised).

At the paper's sizes (d_in = d_out = 1024, D = 512) this is about 12M parameters (`count_parameters`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eval.schema import MAX_HORIZON, PREFIX_FRAMES, QUESTION_TYPES
from retrieval.lftr.config import LFTRConfig


def _mlp(d_in: int, d_hidden: int, d_out: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = d_in
    for _ in range(depth - 1):
        layers += [nn.Linear(d, d_hidden), nn.GELU()]
        d = d_hidden
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


class MaskDropout(nn.Module):
    """Inverted dropout (``nn.Dropout``'s contract) whose CPU mask comes from NumPy's generator.

    On CPU, torch's dropout draws its mask with ``bernoulli_``, a slow kernel that took a large share of an LFTR
    training step at the demo's sizes (`scripts/bench_lftr_step.py` measures the step with either dropout). Here
    each call draws 16 random bits per element (``numpy.random.Generator.integers`` of dtype uint16: several times
    faster than its ``bytes``) and keeps an element when they fall below ``round((1 - p) * 65536)`` (the keep
    probability rounded to 1/65536: 0.899994 for ``p`` = 0.1); the mask is built in NumPy's float32. Kept
    elements are scaled by ``1 / (1 - p)``. The generator of each call is seeded from torch's global generator, so a seeded run
    draws the same masks, and so does a resumed one (its checkpoint restores torch's state). Off the CPU (where
    torch's kernel is fast), and in eval mode, it is ``F.dropout``."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        self.threshold = int(round((1.0 - self.p) * 65536))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        seed = int(torch.randint(0, 2**62, (1,)))
        bits = np.random.default_rng(seed).integers(0, 65536, x.numel(), dtype=np.uint16)
        mask = (bits < self.threshold).astype(np.float32)
        mask *= np.float32(1.0 / (1.0 - self.p))
        return x * torch.from_numpy(mask).view(x.shape).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class SelfAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` (batch first; the same parameters, so the same checkpoints) whose training pass on
    the CPU is written out: softmax as ``exp(s - max) / sum`` and dropout of the attention weights by `MaskDropout`.

    The LFTR head attends over about a dozen tokens. For rows that short torch's CPU softmax kernel and the
    ``bernoulli_`` mask of its attention dropout took about a tenth of a training step at the demo's sizes
    (`scripts/bench_lftr_step.py` measures the step with either attention). The written-out pass computes the same
    function (the dropout masks are drawn as `MaskDropout` draws them). Off the CPU, in eval mode, without dropout, or
    with masks or attention weights asked for, it is ``nn.MultiheadAttention``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float):
        super().__init__(embed_dim, num_heads, dropout=dropout, batch_first=True)
        self.weights_dropout = MaskDropout(dropout)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if (not self.training or self.dropout == 0.0 or query.device.type != "cpu" or need_weights
                or key_padding_mask is not None or attn_mask is not None or is_causal
                or not (query is key is value) or query.dim() != 3):
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        B, T, D = query.shape
        h = self.num_heads
        qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias).view(B, T, 3, h, D // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, h, T, D/h) each; unbind, whose backward stacks (select zero-fills per part)
        s = torch.matmul(q * (D // h) ** -0.5, k.transpose(-1, -2))
        e = (s - s.amax(-1, keepdim=True).detach()).exp()
        w = self.weights_dropout(e / e.sum(-1, keepdim=True))
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, D)
        return F.linear(o, self.out_proj.weight, self.out_proj.bias), None

    def attend_first(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, 1, D)``: the attention output at token 0 only, all ``T`` tokens as keys and values
        (``forward(x, x, x)[0][:, :1]``, with the queries, scores and output projection of the other tokens never
        computed). In training the attention weights are dropped out as in `forward` (`MaskDropout` on the CPU)."""
        B, T, D = x.shape
        h = self.num_heads
        w, b = self.in_proj_weight, self.in_proj_bias
        q = F.linear(x[:, :1], w[:D], None if b is None else b[:D]).view(B, 1, h, D // h).transpose(1, 2)
        kv = F.linear(x, w[D:], None if b is None else b[D:]).view(B, T, 2, h, D // h).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)  # (B, h, T, D/h) each
        s = torch.matmul(q * (D // h) ** -0.5, k.transpose(-1, -2))  # (B, h, 1, T)
        if self.training and self.dropout > 0.0 and x.device.type == "cpu":
            e = (s - s.amax(-1, keepdim=True).detach()).exp()
            a = self.weights_dropout(e / e.sum(-1, keepdim=True))
        else:
            a = F.dropout(s.softmax(-1), self.dropout if self.training else 0.0, self.training)
        o = torch.matmul(a, v).transpose(1, 2).reshape(B, 1, D)
        return F.linear(o, self.out_proj.weight, self.out_proj.bias)


def _context_token_layer(layer: nn.TransformerEncoderLayer, x: torch.Tensor) -> torch.Tensor:
    """``(B, T, D)`` -> ``(B, 1, D)``: a pre-norm encoder ``layer``'s output at token 0 (``layer(x)[:, :1]``), its
    attention and feed-forward computed for that token only."""
    y = x[:, :1] + layer.dropout1(layer.self_attn.attend_first(layer.norm1(x)))
    return y + layer._ff_block(layer.norm2(y))


class LFTR(nn.Module):
    """LFTR head (see the module docstring). ``d_in``: prefix token width; ``d_out``: target space width;
    ``d_text``: question-text embedding width (0 = no question text)."""

    def __init__(self, cfg: LFTRConfig, d_in: int, d_out: int, d_text: int = 0):
        super().__init__()
        self.cfg, self.d_in, self.d_out, self.d_text = cfg, d_in, d_out, d_text
        D = cfg.d_model
        self.in_proj = nn.Linear(d_in, D)
        self.frame_pos = nn.Parameter(torch.zeros(1, PREFIX_FRAMES, D))
        self.ctx_token = nn.Parameter(torch.zeros(1, 1, D))
        self.qtype_emb = nn.Embedding(len(QUESTION_TYPES), D)
        self.horizon_emb = nn.Embedding(MAX_HORIZON + 1, D)  # index = horizon (1..7); 0 unused
        self.text_proj = nn.Linear(d_text, D) if d_text else None
        layer = nn.TransformerEncoderLayer(D, cfg.n_heads, cfg.ff_mult * D, cfg.dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        layer.dropout, layer.dropout1, layer.dropout2 = (MaskDropout(cfg.dropout) for _ in range(3))
        layer.self_attn = SelfAttention(D, cfg.n_heads, cfg.dropout)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.ctx_norm = nn.LayerNorm(D)
        self.step_emb = nn.Parameter(torch.zeros(cfg.rollout_depth, D))
        self.transition = _mlp(2 * D, D, D, cfg.transition_depth)
        self.sigma_head = _mlp(2 * D, D, D, 2) if cfg.use_sigma else None
        self.out_proj = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, d_out))
        for p in (self.frame_pos, self.ctx_token, self.step_emb):
            nn.init.normal_(p, std=0.02)

    @property
    def n_samples(self) -> int:
        return self.cfg.n_samples if self.cfg.use_sigma else 1

    def context(self, prefix: torch.Tensor, qtype: torch.Tensor, horizon: torch.Tensor,
                question: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, F, d_in)`` prefix tokens (all 8; ``cfg.frames`` picks the ones read), ``(B,)`` question type index,
        ``(B,)`` horizon -> ``(B, D)`` context."""
        B = prefix.shape[0]
        tokens = [self.ctx_token.expand(B, -1, -1)]
        if self.cfg.condition_question:
            tokens.append(self.qtype_emb(qtype)[:, None])
            if self.text_proj is not None and question is not None:
                tokens.append(self.text_proj(question)[:, None])
        if self.cfg.condition_horizon:
            tokens.append(self.horizon_emb(horizon)[:, None])
        idx = list(self.cfg.frame_index)  # the same selection in training, validation and prediction
        if len(idx) < prefix.shape[1]:
            prefix = prefix[:, idx]
        tokens.append(self.in_proj(prefix) + self.frame_pos[:, idx])
        # Only the context token's output is read: the last layer computes that token alone (`_context_token_layer`);
        # the same function as ``self.encoder(x)[:, :1]``, about a quarter of the encoder's work less.
        x = torch.cat(tokens, dim=1)
        *first, last = self.encoder.layers
        for layer in first:
            x = layer(x)
        return self.ctx_norm(_context_token_layer(last, x)[:, 0])

    def rollout(self, c: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` context -> ``(B, H, D)`` latent trajectory ``mu_1..mu_H``."""
        z, mus = c, []
        for t in range(self.cfg.rollout_depth):
            z = z + self.transition(torch.cat([z, self.step_emb[t].expand_as(z)], dim=-1))
            mus.append(z)
        return torch.stack(mus, dim=1)

    def read_step(self, horizon: torch.Tensor, rule: str) -> torch.Tensor:
        """``(B,)`` 0-based rollout step read for each query under a horizon-only rule (matched / fixed1)."""
        if rule == "fixed1":
            return torch.zeros_like(horizon)
        return (horizon.clamp(min=1) - 1).clamp(max=self.cfg.rollout_depth - 1)

    def noise(self, batch: int, device, dtype=torch.float32, generator: torch.Generator | None = None
              ) -> torch.Tensor:
        """``(B, K, D)`` standard normal sampling noise with ``eps[:, 0] = 0`` (sample 1 is the mean)."""
        eps = torch.randn(batch, self.n_samples, self.cfg.d_model, dtype=dtype, generator=generator)
        eps[:, 0] = 0
        return eps.to(device)

    def sample(self, mu: torch.Tensor, horizon: torch.Tensor, eps: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """``(B, D)`` read latent -> ``(B, K, d_out)`` L2-normalised samples ``normalise(P(mu + sigma * eps_k))``.

        ``eps`` ``(B, K, D)`` defaults to fresh `noise`; without the sigma head the only sample is the mean."""
        if self.sigma_head is None or self.n_samples == 1:
            z = mu[:, None]
        else:
            if eps is None:
                eps = self.noise(mu.shape[0], mu.device, mu.dtype, generator)
            e_h = self.horizon_emb(horizon)
            sigma = F.softplus(self.sigma_head(torch.cat([mu, e_h], dim=-1))) + 1e-4
            z = mu[:, None] + sigma[:, None] * eps
        return F.normalize(self.out_proj(z), dim=-1)

    def project_mean(self, mu: torch.Tensor) -> torch.Tensor:
        """``(..., D)`` latents -> ``(..., d_out)`` L2-normalised target-space vectors (no sampling)."""
        return F.normalize(self.out_proj(mu), dim=-1)

    def forward(self, prefix, qtype, horizon, question=None, *, rule: str = "matched",
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(samples (B, K, d_out), mu_read (B, D))`` for a horizon-only read rule."""
        mu = self.rollout(self.context(prefix, qtype, horizon, question))
        step = self.read_step(horizon, rule)
        mu_r = mu[torch.arange(mu.shape[0], device=mu.device), step]
        return self.sample(mu_r, horizon, generator=generator), mu_r


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
