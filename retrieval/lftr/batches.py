"""LFTR's training data on the training device: the batches of query rows and the masks of their candidates.

`TrainBatches` holds `retrieval.lftr.data.LFTRData` as tensors on the device and draws, per batch of query rows, one
positive per query (a GT item, uniformly) and its hard negatives (the nearest items to the positive that are in none of
the query's GT pools). It answers which candidate items may never be negatives of a query (`never_negative`); the
losses of `retrieval.lftr.losses` read its tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.data import HardNegatives, LFTRData

if TYPE_CHECKING:
    from retrieval.lftr.train import PrefixAdapter


@dataclass
class Batch:
    """One training batch of ``B`` query rows (tensors on the training device)."""

    rows: torch.Tensor  # (B,) int64 query rows of LFTRData
    prefix: torch.Tensor  # (B, 8, d_in) prefix tokens
    qtype: torch.Tensor  # (B,)
    horizon: torch.Tensor  # (B,)
    question: torch.Tensor | None  # (B, d_text) question-text embeddings, or None
    target_state: torch.Tensor  # (B,) target state row, -1 = none
    positive: torch.Tensor  # (B,) item row of the drawn positive
    ground: torch.Tensor  # (B, d_out) grounding target
    hard: torch.Tensor | None  # (B, n_hard) item rows of the hard negatives (-1 = none), or None


class TrainBatches:
    """The training data on ``device``: batches (`batch`) and the candidate masks of the losses."""

    def __init__(self, cfg: LFTRConfig, data: LFTRData, hard: HardNegatives | None, train_rows: np.ndarray,
                 device: str, adapter: PrefixAdapter | None = None):
        self.cfg, self.data, self.device, self.adapter = cfg, data, device, adapter
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        self.prefix, self.prefix_row = t(data.prefix), t(data.prefix_row)
        self.qtype, self.horizon, self.target_state = t(data.qtype), t(data.horizon), t(data.target_state)
        self.question = t(data.question) if data.question is not None else None
        self.pos_ptr, self.pos_items = t(data.pos_ptr), t(data.pos_items)
        self.items, self.item_state = t(data.items), t(data.item_state)
        self.n_items = self.items.shape[0]
        if cfg.grounding_target == "prototype":
            proto = t(data.state_proto)
            self.ground = proto[self.target_state.clamp(min=0)] * (self.target_state >= 0)[:, None]
        else:
            self.ground = t(data.centroid)
        empty = np.zeros(1, np.int64)
        self.excl_ptr = t(data.excl_ptr if data.excl_ptr is not None else np.zeros(len(data.qtype) + 1, np.int64))
        self.excl_items = t(data.excl_items if data.excl_items is not None and data.excl_items.size else empty[:0])
        self.proto = t(data.state_proto) if data.state_proto is not None else None
        self.inter_ptr = t(data.inter_ptr) if data.inter_ptr is not None else None
        self.inter_state = t(data.inter_state) if data.inter_state is not None else None
        self.train_rows = train_rows
        self.full_softmax = self.n_items <= 1 + cfg.n_random_negatives + cfg.n_hard_negatives
        self.hard_slot = self.hard_nb = None
        if hard is not None and hard.neighbours.shape[1] > 0 and cfg.n_hard_negatives and not self.full_softmax:
            self.hard_slot, self.hard_nb = t(hard.slot), t(hard.neighbours.astype(np.int64))

    def excluded(self, rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """``(B, M)`` bool: candidate item ``cand[b, j]`` is an item of a GT pool of query ``rows[b]``
        (membership by binary search in the batch's sorted (row, item) keys)."""
        start, count = self.excl_ptr[rows], self.excl_ptr[rows + 1] - self.excl_ptr[rows]
        total = int(count.sum())
        if total == 0:
            return torch.zeros(cand.shape, dtype=torch.bool, device=cand.device)
        b = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), count)
        within = torch.arange(total, device=rows.device) - torch.repeat_interleave(count.cumsum(0) - count, count)
        keys = b * self.n_items + self.excl_items[torch.repeat_interleave(start, count) + within]
        q = torch.arange(len(rows), device=rows.device)[:, None] * self.n_items + cand.clamp(min=0)
        pos = torch.searchsorted(keys, q).clamp(max=total - 1)
        return keys[pos] == q

    def never_negative(self, rows: torch.Tensor, target_state: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """``(B, M)`` bool: ``cand`` items that may not be negatives of the batch's queries (target state or GT)."""
        return (self.item_state[cand.clamp(min=0)] == target_state[:, None]) | self.excluded(rows, cand)

    def hard_negatives(self, rows: torch.Tensor, target_state: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        """``(B, n_hard)`` item rows (-1 = none): the nearest neighbours of each query's positive that are not
        excluded for the query, best first."""
        nb = self.hard_nb[self.hard_slot[positive].clamp(min=0)]  # (B, n_candidates)
        ok = (nb >= 0) & (self.hard_slot[positive] >= 0)[:, None] & ~self.never_negative(rows, target_state, nb)
        order = torch.argsort((~ok).to(torch.int8), dim=1, stable=True)[:, :self.cfg.n_hard_negatives]
        picked = nb.gather(1, order)
        return torch.where(ok.gather(1, order), picked, torch.full_like(picked, -1))

    def batch(self, rows: np.ndarray, generator: torch.Generator) -> Batch:
        """The batch of query ``rows``; draws one positive per query with ``generator``."""
        r = torch.from_numpy(rows).to(self.device)
        start, count = self.pos_ptr[r], self.pos_ptr[r + 1] - self.pos_ptr[r]
        u = torch.rand(len(rows), generator=generator).to(self.device)
        pick = start + (u * count).long().clamp(max=count - 1)
        positive = self.pos_items[pick]
        target_state = self.target_state[r]
        hard = self.hard_negatives(r, target_state, positive) if self.hard_nb is not None else None
        return Batch(
            rows=r, prefix=self.prefix_tokens(self.prefix_row[r]), qtype=self.qtype[r], horizon=self.horizon[r],
            question=self.question[r] if self.question is not None else None, target_state=target_state,
            positive=positive, ground=self.ground[r], hard=hard)

    def prefix_tokens(self, prefix_rows: torch.Tensor) -> torch.Tensor:
        """``(B, 8, d_in)`` prefix tokens: the precomputed table (frozen encoder) or the adapter's encoder output."""
        if self.adapter is not None:
            return self.adapter.tokens(prefix_rows)
        return self.prefix.index_select(0, prefix_rows)
