"""LFTR's training losses, one ``nn.Module`` per term, composed by `LFTRLoss` (as sentence-transformers' losses).

For a query b with samples ``y_{b,1..K}`` (`LFTR.sample`) and candidate item x, ``s(b, x) = max_k <y_{b,k}, x>``.
With its positive ``p_b`` (one GT item drawn uniformly per step), ``R`` random items shared by the batch and ``M``
hard negatives ``n_{b,1..M}`` (`retrieval.lftr.batches`)::

    L_nce(b)    = -log softmax_j( s(b, c_j) / tau )[p_b]        c = [p_b, random_1..R, hard_{b,1..M}]
    L_ground(b) = mean_d (normalise(P(mu_h)) - g_b)_d^2       g_b = GT centroid (default) or target-state prototype
    L_inter(b)  = mean_{t < h} mean_d (normalise(P(mu_t)) - proto(s_{b,t}))_d^2   (states passed through; Table 16)
    L           = mean_b L_nce(b) + grounding_weight * mean_b L_ground(b) + intermediate_weight * mean L_inter

Candidates that are items of the query's target state or of any of its GT pools (other than ``p_b``) are masked out
of the softmax. When the whole item set is no larger than ``1 + R + M`` (a small semantic space) every item is a
candidate (a full softmax, same masks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from retrieval.lftr.batches import Batch, TrainBatches
from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.model import LFTR


class MaxSimInfoNCE(nn.Module):
    """``mean_b L_nce(b)``: InfoNCE over max-over-samples similarities, masked candidates (module docstring)."""

    def __init__(self, batches: TrainBatches, tau: float, n_random: int):
        super().__init__()
        self.batches, self.tau, self.n_random = batches, tau, n_random

    def forward(self, samples: torch.Tensor, b: Batch, generator: torch.Generator) -> torch.Tensor:
        """``samples``: ``(B, K, d_out)``; draws the batch's ``R`` random negatives with ``generator``."""
        logits, labels = self._full(samples, b) if self.batches.full_softmax else self._sampled(samples, b, generator)
        return F.cross_entropy(logits / self.tau, labels)

    def _full(self, samples: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.batches
        B = samples.shape[0]
        logits = torch.einsum("bkd,nd->bkn", samples, d.items).amax(1)  # (B, n_items)
        every = torch.arange(d.n_items, device=d.device).expand(B, -1)
        masked = d.never_negative(b.rows, b.target_state, every)
        masked[torch.arange(B, device=d.device), b.positive] = False
        return logits.masked_fill(masked, -torch.inf), b.positive

    def _sampled(self, samples: torch.Tensor, b: Batch, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.batches
        B = samples.shape[0]
        # row gathers by F.embedding: the same values as ``items[idx]``, and the fastest of torch's gathers on CPU
        pos = torch.einsum("bkd,bd->bk", samples, F.embedding(b.positive, d.items)).amax(1, keepdim=True)
        parts, masks = [pos], [torch.zeros_like(pos, dtype=torch.bool)]
        if self.n_random:
            rnd = torch.randint(0, d.n_items, (self.n_random,), generator=generator).to(d.device)
            parts.append(torch.einsum("bkd,rd->bkr", samples, F.embedding(rnd, d.items)).amax(1))
            masks.append(d.never_negative(b.rows, b.target_state, rnd.expand(B, -1)))
        if b.hard is not None:
            hard = F.embedding(b.hard.clamp(min=0), d.items)
            parts.append(torch.einsum("bkd,bmd->bkm", samples, hard).amax(1))
            masks.append(b.hard < 0)
        logits = torch.cat(parts, 1).masked_fill(torch.cat(masks, 1), -torch.inf)
        return logits, torch.zeros(B, dtype=torch.int64, device=d.device)


class GroundingMSE(nn.Module):
    """``mean_b L_ground(b)``: the paper's grounding MSE of the projected read mean (mean over dims)."""

    def __init__(self, model: LFTR):
        super().__init__()
        self.model = model

    def forward(self, mu_read: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``mu_read``: ``(B, D)``; ``target``: ``(B, d_out)``."""
        return F.mse_loss(self.model.project_mean(mu_read), target)


class IntermediateStateMSE(nn.Module):
    """Mean over (query, step t) of ``|| normalise(P(mu_t)) - proto(s_t) ||^2`` for the states ``s_1, s_2, ...`` the
    query's object passes through before its target (steps beyond H are dropped); 0 when there are none."""

    def __init__(self, model: LFTR, batches: TrainBatches):
        super().__init__()
        self.model, self.batches = model, batches

    def forward(self, mu: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``mu``: ``(B, H, D)`` rollout means of the query ``rows``."""
        d = self.batches
        start, count = d.inter_ptr[rows], d.inter_ptr[rows + 1] - d.inter_ptr[rows]
        total = int(count.sum())
        if total == 0:
            return mu.sum() * 0.0
        b = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), count)
        step = torch.arange(total, device=rows.device) - torch.repeat_interleave(count.cumsum(0) - count, count)
        state = d.inter_state[torch.repeat_interleave(start, count) + step]
        keep = (step < mu.shape[1]) & (state >= 0)
        if not bool(keep.any()):
            return mu.sum() * 0.0
        b, step, state = b[keep], step[keep], state[keep]
        return F.mse_loss(self.model.project_mean(mu[b, step]), d.proto[state])


class LFTRLoss(nn.Module):
    """``L`` of the module docstring for a batch: one rollout of ``model``, then each term."""

    def __init__(self, model: LFTR, batches: TrainBatches, cfg: LFTRConfig):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.nce = MaxSimInfoNCE(batches, cfg.tau, cfg.n_random_negatives)
        self.ground = GroundingMSE(model)
        self.inter = IntermediateStateMSE(model, batches) if cfg.intermediate_weight else None

    def forward(self, b: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """The total loss and its terms (floats, for the history: ``nce``, ``ground``, ``inter`` when used)."""
        model, cfg = self.model, self.cfg
        mu = model.rollout(model.context(b.prefix, b.qtype, b.horizon, b.question))  # (B, H, D)
        mu_r = mu[torch.arange(mu.shape[0], device=mu.device), model.read_step(b.horizon, "matched")]
        nce = self.nce(model.sample(mu_r, b.horizon), b, generator)
        ground = self.ground(mu_r, b.ground)
        loss = nce + cfg.grounding_weight * ground if cfg.grounding_weight else nce
        terms = {"nce": float(nce.detach()), "ground": float(ground.detach())}
        if self.inter is not None:
            inter = self.inter(mu, b.rows)
            loss = loss + cfg.intermediate_weight * inter
            terms["inter"] = float(inter.detach())
        return loss, terms
