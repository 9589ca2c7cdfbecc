"""The state-level path of `eval.scoring.score_stream`, for sources whose corpus rows take their state's score.

A state-space source (`eval.scoring.DenseSource` with ``item_rows``: a semantic space scores ``m`` canonical states
and every segment of a state gets its state's score) has a ``(queries x states)`` score block. Everything the stream
computes over the corpus follows from it and from each state's rows, never expanding it to ``queries x corpus``:

- a state's rows count ``cnt[r]`` times in the rank counts, and the tie-break counts the rows of the tied states
  below the first tied positive's row (`eval.scoring._states.state_counts`);
- the top-k takes the best states until they hold k rows outside the query's own video, then the lowest rows of the
  states tied with the k-th score (`eval.scoring._states.state_topk`);
- positives, probes and own-video rows read their scores from the block.

The results are those of the tile stream (`eval.scoring.block.score_block`) bit for bit: the same float32 scores
(the tiles gather them from this block), the same counts and the same order. Cost per query block: one pass over
the ``m`` states per distinct threshold instead of one over the whole corpus, no gather of ``q_block x n_corpus``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eval.scoring.block import (
    BlockContext,
    BlockResult,
    Thresholds,
    TileCounts,
    TopK,
    pool_statistics,
    probe_statistics,
    ranked_positives,
)


@dataclass(frozen=True)
class StateIndex:
    """Corpus rows by state: ``item_rows`` int64 ``(n_corpus,)`` (row -> state), ``cnt`` int64 ``(m,)`` rows per state,
    ``state_ptr`` int64 ``(m + 1,)`` / ``state_rows`` int64 ``(n_corpus,)`` the CSR of each state's rows, ascending."""

    item_rows: np.ndarray
    cnt: np.ndarray
    state_ptr: np.ndarray
    state_rows: np.ndarray

    @classmethod
    def of(cls, item_rows: np.ndarray, m: int) -> StateIndex:
        item_rows = np.ascontiguousarray(item_rows, np.int64)
        order = np.argsort(item_rows, kind="stable").astype(np.int64)
        cnt = np.bincount(item_rows, minlength=m).astype(np.int64)
        ptr = np.zeros(m + 1, np.int64)
        np.cumsum(cnt, out=ptr[1:])
        return cls(item_rows, cnt, ptr, order)


def _check_finite(S: np.ndarray, index: StateIndex, ctx: BlockContext, source: Any) -> None:
    """Refuse a non-finite score of a state that has corpus rows, naming the query and the corpus row the tile
    stream would name (the first tile holding one, its first query with one, that query's first such row)."""
    if np.isfinite(S).all():
        return
    bad = ~np.isfinite(S) & (index.cnt > 0)[None, :]
    if not bad.any():
        return
    first_row = np.where(index.cnt > 0, index.state_rows[np.minimum(index.state_ptr[:-1], len(index.state_rows) - 1)],
                         np.iinfo(np.int64).max)
    per_query = np.where(bad, first_row[None, :], np.iinfo(np.int64).max).min(axis=1)
    tile = np.where(per_query < np.iinfo(np.int64).max, per_query // ctx.c_chunk, np.iinfo(np.int64).max)
    i = int(np.flatnonzero(tile == tile.min())[0])
    j = int(per_query[i])
    raise ctx.labels.nonfinite(source, ctx.queries.start + i, j, float(S[i, index.item_rows[j]]))


def score_block_states(source: Any, S: np.ndarray, index: StateIndex, ctx: BlockContext, bar: Any) -> BlockResult:
    """One query block from its state score block ``S`` (float32 ``(nb, m)``): what `eval.scoring.block.score_block`
    returns for the same source, computed at the state level (module docstring)."""
    from eval.scoring._states import state_counts, state_topk

    S = np.ascontiguousarray(S, dtype=np.float32)
    rows_of = index.item_rows
    positive = {name: S[g.query, rows_of[g.rows]] for name, g in ctx.pools.items()}
    for name, g in ctx.pools.items():
        bad = np.flatnonzero(~np.isfinite(positive[name]))
        if bad.size:  # as the tile stream's pass A: the first pool's first bad positive
            x = int(bad[0])
            raise ctx.labels.nonfinite(source, ctx.queries.start + int(g.query[x]), int(g.rows[x]),
                                       float(positive[name][x]))
    _check_finite(S, index, ctx, source)
    for g in (*ctx.pools.values(), *ctx.probes.values(), ctx.excluded):
        g.scores[:] = S[g.query, rows_of[g.rows]]
    thresholds = Thresholds.of(ctx, positive)
    best = thresholds.best
    pool_order = np.argsort(best, axis=1, kind="stable").astype(np.int64)
    counts = TileCounts.zeros(best.shape)
    state_counts(S, index.cnt, index.state_ptr, index.state_rows, best, pool_order, thresholds.first_row,
                 counts.above, counts.tied, counts.tied_before_first)
    top = TopK.empty(ctx.size, ctx.k)
    ex_offsets, ex_rows = ctx.exclusion_csr()
    state_topk(S, index.cnt, rows_of, index.state_ptr, index.state_rows, ex_offsets, np.ascontiguousarray(ex_rows),
               top.scores, top.rows, top.unlisted)
    bar.update(-(-ctx.n_items // ctx.c_chunk))
    stats = {name: pool_statistics(ctx, name, p, thresholds, counts) for p, name in enumerate(ctx.pools)}
    stats.update({name: probe_statistics(g, ctx.size) for name, g in ctx.probes.items()})
    return BlockResult(stats, top, ranked_positives(ctx, top))
