"""The fused per-tile kernel of `eval.scoring.score_stream` (numba; compiled once, cached on disk).

One pass over a (queries x corpus chunk) score tile does everything the stream needs, so the scorer costs little
more than the matrix product that made the tile:

- rank counting: for every pool p with threshold ``t = best[i, p]`` (the query's best positive score), count items
  with score ``> t`` (``n_above``), ``== t`` (``n_tied``) and ``== t`` with corpus row below ``first_row[i, p]``
  (``n_tied_before_first``). Positives and own-video rows are counted too; the caller subtracts them from their
  gathered scores (`eval.scoring.block.pool_statistics`).
- the running top-k per query, sorted by (score desc, corpus row asc), skipping own-video rows, with ``unlisted``
  = number of seen items tied with the k-th score that did not fit.

Work is organised in blocks of `BLOCK` columns so that the common cases are branch-free vectorised counts.

Also `above_and_tied`: step 5's counts of where each listed positive falls in its query's top-k
(`eval.scoring.block.ranked_positives`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def _insert(top_scores, top_rows, i, v, col, unlisted):
    """Insert (v, col) into row i of the sorted top-k (col is larger than every row already seen)."""
    k = top_scores.shape[1]
    kth = top_scores[i, k - 1]
    if top_rows[i, k - 1] >= 0 and v <= kth:
        if v == kth:
            unlisted[i] += 1
        return
    pos = k - 1
    while pos > 0 and top_scores[i, pos - 1] < v:
        pos -= 1
    dropped, dropped_row = top_scores[i, k - 1], top_rows[i, k - 1]
    for m in range(k - 1, pos, -1):
        top_scores[i, m] = top_scores[i, m - 1]
        top_rows[i, m] = top_rows[i, m - 1]
    top_scores[i, pos] = v
    top_rows[i, pos] = col
    if dropped_row >= 0:
        if top_scores[i, k - 1] == dropped:
            unlisted[i] += 1
        else:
            unlisted[i] = 0


NEG_INF = np.float32(-np.inf)
POS_INF = np.float32(np.inf)
#: Columns examined together: a block is skipped after one vectorised count when nothing in it can matter.
BLOCK = 256


# Counts are accumulated in int32 (a block holds at most `BLOCK` items): numba widens ``int32 + int32`` to int64
# unless the sum is cast back, and int32 lanes vectorise twice as wide (0.16 vs 0.30 ns an item and comparison).
@njit(cache=True, nogil=True)
def _count_ge(blk, x):
    c = np.int32(0)
    for j in range(blk.shape[0]):
        c = np.int32(c + np.int32(blk[j] >= x))
    return c


@njit(cache=True, nogil=True)
def _count_ge_finite(blk, x):
    """(#items >= x, #finite items): one extra comparison per item finds NaN and +-inf alike."""
    a = np.int32(0)
    b = np.int32(0)
    for j in range(blk.shape[0]):
        v = blk[j]
        a = np.int32(a + np.int32(v >= x))
        b = np.int32(b + np.int32(abs(v) < POS_INF))
    return a, b


@njit(cache=True, nogil=True)
def _count_gt_eq(blk, x):
    g = np.int32(0)
    e = np.int32(0)
    for j in range(blk.shape[0]):
        v = blk[j]
        g = np.int32(g + np.int32(v > x))
        e = np.int32(e + np.int32(v == x))
    return g, e


@njit(parallel=True, cache=True, nogil=True)
def tile_pass(scores, cols, best, pool_order, first_row, floor, n_above, n_tied, n_tied_before_first, top_scores,
              top_rows, unlisted, ex_offsets, ex_rows, ex_cursor, n_nonfinite):
    """Process one tile. ``scores`` float32 C-contiguous (nb, nc); ``cols`` int64 (nc,) corpus rows of the columns
    (increasing); ``best``, ``first_row`` (nb, P) thresholds; ``pool_order`` (nb, P) pools by ascending ``best``;
    ``floor`` (nb,) = min_p best (+inf when no pool has positives); ``n_above``, ``n_tied``, ``n_tied_before_first``
    int64 (nb, P) accumulators; ``top_scores`` / ``top_rows`` (nb, k) the running top-k; ``unlisted`` (nb,);
    ``ex_offsets`` / ``ex_rows`` CSR of sorted own-video rows per query with cursor ``ex_cursor`` (nb,);
    ``n_nonfinite`` (nb,) accumulates the non-finite scores (NaN, +-inf) of each row: the caller refuses them (a
    +-inf positive would break the counts).

    Per block of `BLOCK` columns: one vectorised count of items >= min(floor, kth) (and of non-finite items); if
    any, one vectorised (> t, == t) count per pool, a scalar pass for the row tie-break only when some item equals
    t, and a scalar top-k insertion pass only when some item reaches the k-th score.
    """
    nb, nc = scores.shape
    n_pools = best.shape[1]
    k = top_scores.shape[1]
    for i in prange(nb):
        row = scores[i]
        fl = floor[i]
        cursor = ex_cursor[i]
        end = ex_offsets[i + 1]
        for j0 in range(0, nc, BLOCK):
            j1 = min(nc, j0 + BLOCK)
            kth = top_scores[i, k - 1] if top_rows[i, k - 1] >= 0 else NEG_INF
            blk = row[j0:j1]
            n_ge, n_fin = _count_ge_finite(blk, min(fl, kth))
            n_nonfinite[i] += blk.shape[0] - n_fin
            if n_ge == 0:
                continue
            prev = NEG_INF
            g = e = np.int32(0)
            for pi in range(n_pools):  # pools by ascending threshold: stop at the first with nothing >= t
                p = pool_order[i, pi]
                tp = best[i, p]
                if tp == POS_INF:
                    break
                if pi == 0 or tp != prev:  # pools sharing a threshold share its counts
                    g, e = _count_gt_eq(blk, tp)
                    prev = tp
                if g == 0 and e == 0:
                    break
                n_above[i, p] += g
                if e:
                    n_tied[i, p] += e
                    first = first_row[i, p]
                    for j in range(j0, j1):
                        if row[j] == tp and cols[j] < first:
                            n_tied_before_first[i, p] += 1
            if _count_ge(blk, kth) == 0:
                continue
            for j in range(j0, j1):
                v = row[j]
                if not v >= kth:
                    continue
                col = cols[j]
                while cursor < end and ex_rows[cursor] < col:
                    cursor += 1
                if cursor < end and ex_rows[cursor] == col:
                    continue
                _insert(top_scores, top_rows, i, v, col, unlisted)
                kth = top_scores[i, k - 1] if top_rows[i, k - 1] >= 0 else NEG_INF
        ex_cursor[i] = cursor


@njit(cache=True, nogil=True)
def above_and_tied(top_scores, query, score):
    """For each listed positive ``i``: how many of its query's top-k scores (``top_scores[query[i]]``) are ``>
    score[i]`` and how many ``== score[i]`` (int64 each). The same counts as comparing each positive's score with its
    whole row in NumPy, without the (positives x k) boolean arrays, which dominated the step when a state space ties
    hundreds of positives per query at the top."""
    n = query.shape[0]
    k = top_scores.shape[1]
    above = np.empty(n, np.int64)
    tied = np.empty(n, np.int64)
    for i in range(n):
        row = top_scores[query[i]]
        v = score[i]
        a = 0
        t = 0
        for j in range(k):
            x = row[j]
            if x > v:
                a += 1
            elif x == v:
                t += 1
        above[i] = a
        tied[i] = t
    return above, tied
