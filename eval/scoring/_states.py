"""Numba kernels of the state-level scoring path (`eval.scoring.states`; compiled once, cached on disk).

A state-space source gives every corpus row of a state the state's score, so the corpus-wide counts and the
top-k follow from the ``(queries x states)`` score block and each state's rows, without expanding the block to the
corpus. ``S`` float32 ``(nb, m)``; ``cnt`` int64 ``(m,)`` rows per state; ``state_ptr`` / ``state_rows`` the CSR of
each state's corpus rows, ascending.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

NEG_INF = np.float32(-np.inf)
POS_INF = np.float32(np.inf)


@njit(cache=True, nogil=True)
def _lower_bound(a, lo, hi, x):
    """First index in ``[lo, hi)`` of the ascending ``a`` whose value is not below ``x`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _rows_below(state_rows, lo, hi, bound):
    """Rows of ``state_rows[lo:hi]`` (ascending) below ``bound``."""
    return _lower_bound(state_rows, lo, hi, bound) - lo


@njit(parallel=True, cache=True, nogil=True)
def state_counts(S, cnt, state_ptr, state_rows, best, pool_order, first_row, above, tied, tied_before_first):
    """The tile kernel's counts over the whole corpus, from the state block: per query i and pool p with threshold
    ``t = best[i, p]``, corpus rows scoring ``> t`` (``above``), ``== t`` (``tied``) and ``== t`` with a row below
    ``first_row[i, p]`` (``tied_before_first``); accumulated into the int64 ``(nb, P)`` arrays. ``pool_order``: pools by
    ascending threshold (+inf = empty pool, never counted); pools sharing a threshold share its counts."""
    nb, m = S.shape
    n_pools = best.shape[1]
    for i in prange(nb):
        s = S[i]
        prev = NEG_INF
        g = 0
        e = 0
        for pi in range(n_pools):
            p = pool_order[i, pi]
            t = best[i, p]
            if t == POS_INF:
                break
            if pi == 0 or t != prev:
                g = 0
                e = 0
                for r in range(m):
                    v = s[r]
                    g += cnt[r] * (v > t)
                    e += cnt[r] * (v == t)
                prev = t
            if g == 0 and e == 0:
                break
            above[i, p] += g
            if e:
                tied[i, p] += e
                fr = first_row[i, p]
                n = 0
                for r in range(m):
                    if s[r] == t and cnt[r]:
                        n += _rows_below(state_rows, state_ptr[r], state_ptr[r + 1], fr)
                tied_before_first[i, p] += n


@njit(cache=True, nogil=True)
def _excluded(ex_rows, lo, hi, row):
    """``row`` is one of the sorted ``ex_rows[lo:hi]``."""
    a = _lower_bound(ex_rows, lo, hi, row)
    return a < hi and ex_rows[a] == row


@njit(cache=True, nogil=True)
def _swap(keys, vals, a, b):
    keys[a], keys[b] = keys[b], keys[a]
    vals[a], vals[b] = vals[b], vals[a]


@njit(cache=True, nogil=True)
def _sift_down(keys, vals, n, pos):
    """Min-heap on ``keys[:n]`` (payload ``vals``): restore the heap below ``pos``."""
    while True:
        a = 2 * pos + 1
        if a >= n:
            return
        if a + 1 < n and keys[a + 1] < keys[a]:
            a += 1
        if not keys[a] < keys[pos]:
            return
        _swap(keys, vals, a, pos)
        pos = a


@njit(cache=True, nogil=True)
def _push(keys, vals, n, key, val):
    """Push ``(key, val)`` into the min-heap ``keys[:n]``; returns the new size."""
    pos = n
    keys[pos], vals[pos] = key, val
    while pos > 0:
        parent = (pos - 1) // 2
        if not keys[pos] < keys[parent]:
            break
        _swap(keys, vals, pos, parent)
        pos = parent
    return n + 1


@njit(cache=True, nogil=True)
def _sort_pairs(scores, rows, n):
    """Insertion sort of ``(scores, rows)[:n]`` by score descending, then row ascending."""
    for a in range(1, n):
        v, w = scores[a], rows[a]
        b = a - 1
        while b >= 0 and (scores[b] < v or (scores[b] == v and rows[b] > w)):
            scores[b + 1] = scores[b]
            rows[b + 1] = rows[b]
            b -= 1
        scores[b + 1] = v
        rows[b + 1] = w


@njit(parallel=True, cache=True, nogil=True)
def state_topk(S, cnt, item_rows, state_ptr, state_rows, ex_offsets, ex_rows, top_scores, top_rows, unlisted):
    """The running top-k of the tile kernel, in one go: per query, the ``k`` best corpus rows by (score desc, row
    asc) outside its own-video rows (``ex_rows[ex_offsets[i]:ex_offsets[i + 1]]``, ascending), padded with -1 /
    -inf, and ``unlisted`` = rows outside the list tied with the k-th score (0 when the list is not full)."""
    nb, m = S.shape
    k = top_scores.shape[1]
    for i in prange(nb):
        s = S[i]
        lo, hi = ex_offsets[i], ex_offsets[i + 1]
        w = cnt.copy()  # rows of each state left once the query's own video is removed
        for x in range(lo, hi):
            w[item_rows[ex_rows[x]]] -= 1
        # the k best states (each holds >= 1 row): every state above the k-th row's score is among them
        hs = np.empty(k, np.float32)
        hr = np.empty(k, np.int64)
        n = 0
        for r in range(m):
            if w[r] <= 0:
                continue
            v = s[r]
            if n < k:
                n = _push(hs, hr, n, v, r)
            elif v > hs[0]:
                hs[0] = v
                hr[0] = r
                _sift_down(hs, hr, k, 0)
        order = np.argsort(-hs[:n], kind="mergesort")  # scores are finite here (checked before)
        total = 0
        kth = NEG_INF
        full = False
        for a in range(n):
            total += w[hr[order[a]]]
            if total >= k:
                kth = hs[order[a]]
                full = True
                break
        out_s = np.empty(k, np.float32)
        out_r = np.empty(k, np.int64)
        c = 0
        # rows strictly above the k-th score (every row when fewer than k exist): fewer than k, all listed
        bound = kth if full else NEG_INF
        for a in range(n):
            r = hr[a]
            if s[r] > bound:
                for x in range(state_ptr[r], state_ptr[r + 1]):
                    row = state_rows[x]
                    if not _excluded(ex_rows, lo, hi, row):
                        out_s[c] = s[r]
                        out_r[c] = row
                        c += 1
        if not full:
            _sort_pairs(out_s, out_r, c)
            for a in range(k):
                top_scores[i, a] = out_s[a] if a < c else NEG_INF
                top_rows[i, a] = out_r[a] if a < c else -1
            unlisted[i] = 0
            continue
        need = k - c
        # rows tied with the k-th score: the `need` lowest rows are listed (row tie-break), the rest are unlisted;
        # a max-heap of rows, as a min-heap keyed by -row
        neg = np.empty(need, np.int64)
        heap = np.empty(need, np.int64)
        nh = 0
        tied_total = 0
        for r in range(m):
            if w[r] <= 0 or s[r] != kth:
                continue
            tied_total += w[r]
            for x in range(state_ptr[r], state_ptr[r + 1]):
                row = state_rows[x]
                if nh == need and row >= heap[0]:
                    break  # the state's rows ascend: none of the rest can enter
                if _excluded(ex_rows, lo, hi, row):
                    continue
                if nh < need:
                    nh = _push(neg, heap, nh, -row, row)
                else:
                    neg[0], heap[0] = -row, row
                    _sift_down(neg, heap, nh, 0)
        for a in range(nh):
            out_s[c] = s[item_rows[heap[a]]]  # its own score: +0.0 and -0.0 tie but are listed as they are
            out_r[c] = heap[a]
            c += 1
        _sort_pairs(out_s, out_r, c)
        for a in range(k):
            top_scores[i, a] = out_s[a]
            top_rows[i, a] = out_r[a]
        unlisted[i] = tied_total - need
