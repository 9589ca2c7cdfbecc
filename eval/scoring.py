"""Streaming full-corpus scoring: score sources, the tile scorer `score_stream`, and `score_benchmark`.

A *score source* gives the score of query ``i`` against corpus row ``j`` on demand, in blocks; nothing here ever
holds an ``n_queries x n_corpus`` matrix. `score_stream` walks (query block x corpus chunk) tiles once and keeps,
per query:

- the top-k corpus rows of the ranking (own-video rows removed; ties broken by corpus row, ascending), and the
  number of *unlisted* items tied with the k-th score;
- per GT pool ``p`` the rank statistics that tie-aware metrics need (see `eval.metrics`), counted over the whole
  corpus, never read from the top-k list, so nothing is capped at k:

  ===============  ===========================================================================================
  ``n_pos``        pool size (positives that take part in the ranking of ``p``)
  ``n_above``      negatives scoring strictly above the best positive ``t = max_{j in P} s_j``
  ``n_tie_neg``    negatives with score exactly ``t``
  ``n_tie_pos``    positives with score exactly ``t`` (>= 1 when ``n_pos > 0``)
  ``n_tie_neg_first``  tied negatives whose corpus row is below the lowest tied positive's row (row tie-break)
  ``best``         ``t`` (float32, NaN when the pool is empty)
  ===============  ===========================================================================================

- for the tie-aware nDCG: every positive (of any pool, in the main ranking) scoring at least the k-th score, with
  its pool-membership bitmask, the number of ranked items strictly above it and the size of its tie group; and
  per query the counts of positives by bitmask (`RankedPositives`).

Exact ties. Positives' scores are gathered from the very tiles in which the negatives are counted, so a positive
and a negative with bitwise-equal scores are always recognised as tied. Each query block first scores the union of
its positive rows in one call ("pass A") to fix the thresholds (best positive per pool); the stream then counts
against them in one fused pass per tile (`eval._tile`). If a positive's tile score differs from its pass-A score
in any bit (a BLAS path that rounds differently), the block is streamed again with the thresholds taken from the
tiles, so counts always refer to one consistent set of scores. State-space sources (`DenseSource` with
``item_rows``) compute each query block once at the state level and gather, so segments sharing a state receive
bitwise identical scores in every call.

Protocol (PSR paper §3.1, App. M): the query's own-video segments (``exclude``) are removed from the ranking of
every cross-instance pool and from the top-k list; pools named in ``no_exclude_pools`` (the ``in_video`` tier)
are ranked over the full corpus.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow.compute as pc
import torch

from eval.errors import InputError
from eval.runs import RankedPositives
from eval.schema import GT_DEFINITION_FIELDS, GT_DEFINITIONS, Query

#: Default tile: 512 queries x 16,384 corpus items (32 MiB of float32 scores).
DEFAULT_Q_BLOCK = 512
DEFAULT_C_CHUNK = 16384
#: Queries per pass-A call for sources without a per-block cache (see `_pass_a`).
PASS_A_QUERIES = 64
#: Largest (query rows x samples) matrix multiplied at once by `DenseSource` for K > 1.
_MAX_QK_ROWS = 1024

#: Tiers `score_benchmark` scores besides the GT definitions (`eval.schema.GT_DEFINITIONS`).
BENCHMARK_TIERS = ("in_dataset", "cross_dataset", "bge_similar", "in_video")
#: Pool names `score_benchmark` scores, in report order (a GT definition no query has is left out).
BENCHMARK_POOLS = GT_DEFINITIONS + BENCHMARK_TIERS
#: Probe groups scored by `score_benchmark` for the triplet diagnostics (best score only, no rank counting).
TRIPLET_PROBES = ("triplet_temporal", "triplet_semantic")
STAT_FIELDS = ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first", "best")


# --------------------------------------------------------------------------------------------------------------
# Score sources
# --------------------------------------------------------------------------------------------------------------
@runtime_checkable
class ScoreSource(Protocol):
    """Scores of queries against corpus rows, computed on demand.

    ``scores(q, items)`` returns float32 ``(q.stop - q.start, n_sel)``: row ``a`` is query ``q.start + a``, column
    ``b`` is corpus row ``items[b]`` (or ``items.start + b`` for a slice). Higher is better. A source must be
    deterministic: the same (query, item) pair gets the same score whichever call computes it (up to float
    rounding for plain dense sources, which `score_stream` tolerates; see the module docstring).

    A source may also implement ``moments(q: slice) -> (mean, std)`` (float64, per query, over all ``n_items``)
    when it has a closed form; `FusionSource` streams them otherwise.
    """

    n_queries: int
    n_items: int

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray: ...


def source_name(source: Any) -> str:
    """How messages name a score source: its ``name`` attribute when it has one, else its class."""
    return str(getattr(source, "name", "") or type(source).__name__)


@dataclass(frozen=True)
class _Names:
    """How `score_stream`'s errors name the source, a query (source row) and a corpus item (corpus row)."""

    source: str
    query_ids: Sequence[str] | None = None
    item_ids: Sequence[str] | None = None

    def query(self, i: int) -> str:
        return f"query {self.query_ids[i]!r} (source row {i})" if self.query_ids is not None else f"query row {i}"

    def item(self, j: int) -> str:
        return f"corpus item {self.item_ids[j]!r} (row {j})" if self.item_ids is not None else f"corpus row {j}"


def _culprit(source: Any, i: int, j: int) -> str:
    """For a fusion, which input gave query ``i`` a non-finite score for item ``j`` (only called on an error)."""
    if not isinstance(source, FusionSource):
        return ""
    for k, src in enumerate(source.sources):
        v = float(np.asarray(src.scores(slice(i, i + 1), np.array([j])))[0, 0])
        if not np.isfinite(v):
            return f" (fusion input {k}, {source.names[k]}, gave {v})"
    return " (every fusion input is finite there: the fused z-score overflowed)"


def _nonfinite(source: Any, names: _Names, i: int, j: int, value: float) -> InputError:
    return InputError(f"score source {names.source}{_culprit(source, i, j)} gave {names.query(i)} the score {value} "
                      f"for {names.item(j)}: scores must be finite (NaN and +-inf break the rank counts)",
                      fix="check the method's query and item vectors (or score function) for NaN/inf")


def _as_index(items: slice | np.ndarray, n: int) -> slice | np.ndarray:
    if isinstance(items, slice):
        start, stop, step = items.indices(n)
        if step != 1:
            return np.arange(start, stop, step, dtype=np.int64)
        return slice(start, stop)
    idx = np.asarray(items, dtype=np.int64)
    if idx.ndim != 1:
        raise ValueError(f"items must be a slice or a 1-d index array, got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"item rows out of range [0, {n})")
    return idx


def _torch_view(a: np.ndarray) -> torch.Tensor:
    """A zero-copy torch view of a float32 array (read-only memmaps included; we never write through it)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "array is not writable": we only read
        return torch.from_numpy(a)


class DenseSource:
    """Inner-product scores of query vectors against item vectors (cosine when both are L2-normalised).

    - ``queries``: ``(n_q, d)`` or ``(n_q, K, d)`` float32; with K samples per query the score is
      ``s(i, j) = max_k <q_{i,k}, x_j>`` (``reduce="max"``, LFTR's K samples, multi-phrase forecasters) or the mean
      over samples (``reduce="mean"``).
    - ``items``: ``(m, d)`` float32 (may be a read-only memmap: it is never copied as a whole).
    - ``item_rows``: optional ``(n_corpus,)`` int array, corpus row -> row of ``items`` (state-space expansion:
      every segment of a state gets its state's score). Scores are then computed for a whole query block against
      all ``m`` items once (cached for the block) and gathered, so tied segments are bitwise identical.

    ``n_items`` is ``n_corpus`` with ``item_rows``, else ``m``.
    """

    def __init__(self, queries: np.ndarray, items: np.ndarray, item_rows: np.ndarray | None = None,
                 reduce: str = "max"):
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 2:
            q = q[:, None, :]
        if q.ndim != 3:
            raise ValueError(f"queries must be (n_q, d) or (n_q, K, d), got shape {np.shape(queries)}")
        if items.ndim != 2 or items.shape[1] != q.shape[2]:
            raise ValueError(f"items must be (m, {q.shape[2]}), got shape {items.shape}")
        if reduce not in ("max", "mean"):
            raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        self._q = _torch_view(q)
        self._items_np = items
        self._items = _torch_view(items) if items.dtype == np.float32 and items.flags.c_contiguous else None
        self.reduce = reduce
        self.K = int(q.shape[1])
        self.n_queries = int(q.shape[0])
        self.m = int(items.shape[0])
        if item_rows is not None:
            item_rows = np.asarray(item_rows, dtype=np.int64)
            if item_rows.ndim != 1:
                raise ValueError("item_rows must be 1-d (n_corpus,)")
            if item_rows.size and (item_rows.min() < 0 or item_rows.max() >= self.m):
                raise ValueError(f"item_rows must index rows of items in [0, {self.m}); "
                                 "map segments with unknown states explicitly")
        self.item_rows = item_rows
        self.n_items = int(len(item_rows)) if item_rows is not None else self.m
        #: a query block's state-level scores are cached: calls on any rows of the same block cost a gather
        self.cached_blocks = item_rows is not None
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None
        self._moments: tuple[np.ndarray, np.ndarray] | None = None

    def _item_block(self, sel: slice | np.ndarray) -> torch.Tensor:
        if self._items is not None and isinstance(sel, slice):
            return self._items[sel]
        # numpy's row gather is ~50x faster than torch indexing on CPU
        rows = self._items_np[sel] if isinstance(sel, slice) else np.take(self._items_np, sel, axis=0)
        return _torch_view(np.asarray(rows, dtype=np.float32))

    def _raw(self, q: slice, sel: slice | np.ndarray) -> np.ndarray:
        """Scores against rows ``sel`` of ``items`` (no expansion): float32 (n_q, n_sel)."""
        x = self._item_block(sel)
        qv = self._q[q]
        nq = qv.shape[0]
        if self.K == 1:
            return (qv[:, 0, :] @ x.T).numpy()
        out = np.empty((nq, x.shape[0]), dtype=np.float32)
        step = max(1, _MAX_QK_ROWS // self.K)
        for a in range(0, nq, step):
            b = min(nq, a + step)
            s = (qv[a:b].reshape(-1, qv.shape[2]) @ x.T).view(b - a, self.K, -1)
            out[a:b] = (s.amax(1) if self.reduce == "max" else s.mean(1)).numpy()
        return out

    def _state_block(self, q: slice) -> np.ndarray:
        key = (q.start, q.stop)
        if self._cache is None or self._cache[0] != key:
            self._cache = None  # free the old block first
            self._cache = (key, self._raw(q, slice(0, self.m)))
        return self._cache[1]

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        q = slice(*q.indices(self.n_queries)[:2])
        items = _as_index(items, self.n_items)
        if self.item_rows is None:
            return self._raw(q, items)
        return np.take(self._state_block(q), self.item_rows[items], axis=1)

    def moments(self, q: slice) -> tuple[np.ndarray, np.ndarray]:
        """Per-query mean and std of the scores over all ``n_items`` corpus rows, float64 (n_q,), exact for K = 1.

        With ``c_r`` the number of corpus rows mapped to item ``r`` (1 without expansion), ``n = sum_r c_r``, a
        shift ``x0`` (the mean of the first chunk of items) and ``y_r = x_r - x0``: ``mu = x0 + (1/n) sum_r c_r y_r``,
        ``C = (1/n) sum_r c_r y_r y_r^T - (mu - x0)(mu - x0)^T`` (the d x d covariance of the items), and for a query
        vector ``u``: ``mean = <u, mu>``, ``std = sqrt(max(u^T C u, 0))``. The shift keeps the rounding error of
        ``C`` relative to the items' spread, not to their magnitude: identical items give ``C = 0`` exactly, so a
        constant source has std 0 (an unshifted ``E[s^2] - mean^2`` leaves ~1e-4 of the magnitude in float32).
        Only defined for K = 1 (a max over samples is not linear); `FusionSource` streams those.
        """
        if self.K != 1:
            raise NotImplementedError("closed-form moments need K = 1; stream them instead")
        if self._moments is None:
            counts = (np.bincount(self.item_rows, minlength=self.m).astype(np.float64)
                      if self.item_rows is not None else np.ones(self.m))
            d = self._q.shape[2]
            # float32 shift: x - x0 is exact wherever x and x0 are close (Sterbenz), where cancellation would bite
            x0 = self._item_block(slice(0, min(self.m, DEFAULT_C_CHUNK))).double().mean(0).float()
            s1 = np.zeros(d)
            s2 = np.zeros((d, d))
            for a in range(0, self.m, DEFAULT_C_CHUNK):
                b = min(self.m, a + DEFAULT_C_CHUNK)
                y = self._item_block(slice(a, b)) - x0
                w = torch.from_numpy(counts[a:b].astype(np.float32))
                s1 += (w @ y).double().numpy()
                s2 += (y.T @ (y * w[:, None])).double().numpy()
            n = counts.sum()
            shift = s1 / n
            self._moments = (x0.double().numpy() + shift, s2 / n - np.outer(shift, shift))
        mu, cov = self._moments
        u = self._q[q][:, 0, :].double().numpy()
        return u @ mu, np.sqrt(np.maximum(np.einsum("id,de,ie->i", u, cov, u), 0.0))


def stream_moments(source: ScoreSource, q: slice, c_chunk: int = DEFAULT_C_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Per-query mean and std (population) of ``source`` scores over all items, by one streaming pass (float64).

    Sums are taken of ``s - s_0`` (``s_0`` the query's score of item 0), so a constant source has std 0 exactly
    and the rounding of ``E[(s-s_0)^2] - E[s-s_0]^2`` is relative to the spread of the scores, not their size."""
    nq = q.stop - q.start
    s1 = np.zeros(nq)
    s2 = np.zeros(nq)
    shift = None
    for a in range(0, source.n_items, c_chunk):
        s = source.scores(q, slice(a, min(source.n_items, a + c_chunk))).astype(np.float64)
        if shift is None:
            shift = s[:, :1].copy()
        s -= shift
        s1 += s.sum(1)
        s2 += np.einsum("ij,ij->i", s, s)
    n = source.n_items
    mean = s1 / n
    with np.errstate(invalid="ignore"):  # inf scores give NaN moments, which `FusionSource` refuses by name
        return mean + shift[:, 0], np.sqrt(np.maximum(s2 / n - mean * mean, 0.0))


#: A fusion input whose per-query score spread is at most this fraction of the scores' magnitude (their root mean
#: square) counts as constant for that query and gets weight 0. Scores are float32: a spread below 2^-16 of the
#: magnitude spans at most ~2^8 float32 steps, so its z-scores would mostly amplify rounding (an unshifted float32
#: second moment leaves a spread of pure rounding error, ~1e-4 of the magnitude, worth a weight of ~10^4).
SPREAD_RTOL = 2.0 ** -16


class FusionSource:
    """Z-score fusion of several sources over the same queries and corpus.

    ``s(i, j) = sum_k w_k (s_k(i, j) - mu_k(i)) / sigma_k(i)`` where ``mu_k(i)``, ``sigma_k(i)`` are the mean and
    (population) std of source k's scores of query i over all ``n_items`` corpus rows (the PSR paper's score-level
    fusion). Moments come from a source's closed form (``moments``) when it has one, otherwise from one streaming
    pass over the corpus per query block. A source whose scores are constant for query i (``sigma_k(i) <=
    SPREAD_RTOL * rms_k(i)``, `SPREAD_RTOL`) contributes 0 to that query; a source constant for every query, or
    with a non-finite mean or std, is refused (`eval.errors.InputError` naming it). ``weights`` default to 1;
    ``names`` name the sources in messages. Computed elementwise in float32, so tied inputs stay tied.
    """

    def __init__(self, sources: Sequence[ScoreSource], weights: Sequence[float] | None = None,
                 c_chunk: int = DEFAULT_C_CHUNK, q_block: int = DEFAULT_Q_BLOCK, names: Sequence[str] | None = None):
        if not sources:
            raise ValueError("FusionSource needs at least one source")
        nq = {s.n_queries for s in sources}
        ni = {s.n_items for s in sources}
        if len(nq) != 1 or len(ni) != 1:
            raise ValueError(f"sources disagree on shape: n_queries {sorted(nq)}, n_items {sorted(ni)}")
        self.sources = list(sources)
        self.weights = np.ones(len(sources)) if weights is None else np.asarray(weights, dtype=np.float64)
        if self.weights.shape != (len(sources),):
            raise ValueError(f"{len(sources)} sources but {self.weights.size} weights")
        self.names = [source_name(s) for s in self.sources] if names is None else list(names)
        self.n_queries, self.n_items = nq.pop(), ni.pop()
        self._c_chunk, self._q_block = c_chunk, q_block
        self.cached_blocks = any(getattr(s, "cached_blocks", False) for s in self.sources)
        self._coef: tuple[np.ndarray, np.ndarray] | None = None
        #: bool (n_sources, n_q): the source was constant for that query (weight 0); set by `coefficients`
        self.constant: np.ndarray | None = None

    def _moments_of(self, src: ScoreSource) -> tuple[np.ndarray, np.ndarray]:
        mean, std = np.empty(self.n_queries), np.empty(self.n_queries)
        for a in range(0, self.n_queries, self._q_block):
            q = slice(a, min(self.n_queries, a + self._q_block))
            try:
                m, s = src.moments(q)  # type: ignore[attr-defined]
            except (AttributeError, NotImplementedError):
                m, s = stream_moments(src, q, self._c_chunk)
            mean[q], std[q] = m, s
        return mean, std

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """``(a, b)``: float32 (n_sources, n_q) slopes ``w_k / sigma_k`` (0 where source k is constant for the
        query) and float32 (n_q,) offset ``sum_k a_k mu_k``, so that ``s = sum_k a_k s_k - b``."""
        if self._coef is None:
            a = np.zeros((len(self.sources), self.n_queries))
            b = np.zeros(self.n_queries)
            constant = np.zeros(a.shape, bool)
            for k, src in enumerate(self.sources):
                mean, std = self._moments_of(src)
                bad = ~(np.isfinite(mean) & np.isfinite(std))
                if bad.any():
                    raise InputError(f"fusion input {k} ({self.names[k]}) has a non-finite score mean or std for "
                                     f"query row {int(np.flatnonzero(bad)[0])} ({int(bad.sum())} queries): its "
                                     "scores hold NaN or inf", fix="check that input's query and item vectors")
                constant[k] = std <= SPREAD_RTOL * np.sqrt(mean * mean + std * std)
                if self.n_queries and constant[k].all():
                    raise InputError(f"fusion input {k} ({self.names[k]}) gives every query constant scores (spread "
                                     f"<= 2^-16 of their magnitude, largest std {float(std.max()):.3g}): it carries "
                                     "no ranking information", fix="leave it out of the fusion")
                ok = ~constant[k]
                a[k, ok] = self.weights[k] / std[ok]
                b += a[k] * mean
            self.constant = constant
            self._coef = (a.astype(np.float32), b.astype(np.float32))
        return self._coef

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        q = slice(*q.indices(self.n_queries)[:2])
        a, b = self.coefficients()
        out = None
        for k, src in enumerate(self.sources):
            s = src.scores(q, items)
            s *= a[k, q][:, None]
            out = s if out is None else np.add(out, s, out=out)
        out -= b[q][:, None]
        return out


_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLD
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class RandomSource:
    """The random baseline: ``s(i, j) = U[0, 1)`` from a counter-based hash of ``(seed, i, j)`` (splitmix64,
    24-bit float32), so a query's scores do not depend on how the corpus is chunked."""

    def __init__(self, n_queries: int, n_items: int, seed: int = 0):
        self.n_queries, self.n_items, self.seed = int(n_queries), int(n_items), int(seed)
        self._key = _splitmix64(np.array([self.seed], dtype=np.uint64))[0]

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        q = slice(*q.indices(self.n_queries)[:2])
        items = _as_index(items, self.n_items)
        cols = (np.arange(items.start, items.stop, dtype=np.uint64) if isinstance(items, slice)
                else items.astype(np.uint64))
        rows = np.arange(q.start, q.stop, dtype=np.uint64) * np.uint64(self.n_items)
        x = _splitmix64((rows[:, None] + cols[None, :]) ^ self._key)
        return ((x >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------
# Streaming scorer
# --------------------------------------------------------------------------------------------------------------
@dataclass
class StreamResult:
    """What `score_stream` returns (also unpackable as ``topk_rows, topk_scores, stats``).

    ``topk_rows`` int64 (n_q, k) (-1 pads a ranking shorter than k), ``topk_scores`` float32 (n_q, k) (-inf pads),
    ``stats[pool][field]`` per query (fields in `STAT_FIELDS`; probes hold ``n_pos`` and ``best``),
    ``kth_tie_unlisted`` int64 (n_q,): items tied with the k-th score that are not in the list,
    ``ranked`` the tie-aware graded-metric information.
    """

    topk_rows: np.ndarray
    topk_scores: np.ndarray
    stats: dict[str, dict[str, np.ndarray]]
    kth_tie_unlisted: np.ndarray
    ranked: RankedPositives

    def __iter__(self):
        return iter((self.topk_rows, self.topk_scores, self.stats))


def _flatten(lists: Sequence[np.ndarray], a: int, b: int, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of queries a..b-1 as (local query index, row), deduplicated, sorted by row."""
    parts = [np.asarray(lists[i], dtype=np.int64).ravel() for i in range(a, b)]
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=b - a)
    rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= n_items):
        bad = int(np.flatnonzero((rows < 0) | (rows >= n_items))[0])
        qi = int(np.searchsorted(np.cumsum(sizes), bad, side="right")) + a
        raise IndexError(f"query {qi}: corpus row {int(rows[bad])} out of range [0, {n_items})")
    qloc = np.repeat(np.arange(b - a, dtype=np.int64), sizes)
    key = np.unique(qloc * n_items + rows)
    qloc, rows = key // n_items, key % n_items
    order = np.argsort(rows, kind="stable")
    return qloc[order], rows[order]


class _Group:
    """Rows of one pool (or the exclusion set) for one query block, sorted by corpus row."""

    def __init__(self, qloc: np.ndarray, rows: np.ndarray, n_items: int):
        self.qloc, self.rows = qloc, rows
        self.keys = np.sort(qloc * n_items + rows)
        self.vals = np.full(len(rows), -np.inf, dtype=np.float32)

    def gather(self, s: np.ndarray, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray]:
        i0, i1 = np.searchsorted(self.rows, [c0, c1])
        if i1 > i0:
            self.vals[i0:i1] = s[self.qloc[i0:i1], self.rows[i0:i1] - c0]
        return i0, i1

    def contains(self, keys: np.ndarray) -> np.ndarray:
        if not len(self.keys) or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return self.keys[pos] == keys


def _segment_max(qloc: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, -np.inf, dtype=np.float32)
    np.maximum.at(out, qloc, vals)
    return out


def score_stream(source: ScoreSource, pools: dict[str, Sequence[np.ndarray]], exclude: Sequence[np.ndarray] | None,
                 k: int = 50, q_block: int = DEFAULT_Q_BLOCK, c_chunk: int = DEFAULT_C_CHUNK, progress: bool = True,
                 no_exclude_pools: Sequence[str] = ("in_video",),
                 probes: dict[str, Sequence[np.ndarray]] | None = None, checkpoint: str | os.PathLike | None = None,
                 fingerprint: str = "", query_ids: Sequence[str] | None = None,
                 item_ids: Sequence[str] | None = None, source_label: str | None = None) -> StreamResult:
    """Rank the whole corpus for every query in bounded memory; return the top-k and per-pool rank statistics.

    ``pools[name][i]``: corpus rows of query i's positives in pool ``name``; ``exclude[i]``: corpus rows removed from
    query i's ranking (own video) for every pool not in ``no_exclude_pools`` and from the top-k list.
    ``probes[name][i]``: corpus rows whose best score is recorded (``best``, ``n_pos``) without rank counting
    (triplet diagnostics); probes ignore ``exclude``.

    Work: one ``source.scores`` call per tile (``q_block`` x ``c_chunk``) plus one per query block on the union of
    its positive rows. Memory: O(q_block x c_chunk) plus the pools. A query with an empty pool gets ``n_pos = 0``
    and zeros elsewhere (``best`` NaN).

    Resuming: with ``checkpoint`` (a directory), each finished query block is saved there atomically and a rerun
    loads the finished blocks instead of scoring them again. ``fingerprint`` (e.g. a hash of the method's config)
    is stored with the shapes, pool names and a hash of the pools; a checkpoint written for anything else is an
    error, never silently reused. The scores themselves cannot be checked: change the fingerprint when the source
    changes.

    Scores must be finite: a NaN or +-inf score anywhere (counted in the tile kernel at no measurable cost, and in
    the positives' pass A) raises `eval.errors.InputError` naming the source (``source_label``, default
    `source_name`),
    the query (``query_ids[i]`` when given) and the corpus item (``item_ids[j]``).
    """
    from tqdm.auto import tqdm

    nq, n_items = int(source.n_queries), int(source.n_items)
    for name, lists in {**pools, **(probes or {})}.items():
        if len(lists) != nq:
            raise ValueError(f"pool {name!r} has {len(lists)} queries, the source has {nq}")
    if exclude is not None and len(exclude) != nq:
        raise ValueError(f"exclude has {len(exclude)} queries, the source has {nq}")
    names, probe_names = list(pools), list(probes or {})
    if len(names) > 62:
        raise ValueError("at most 62 pools (they are bits of an int64 mask)")
    k = int(min(k, n_items))
    if k < 1:
        raise ValueError("k must be >= 1 and the corpus non-empty")
    q_block, c_chunk = max(1, int(q_block)), max(1, int(c_chunk))
    stats = {n: {f: np.zeros(nq, np.int64) for f in STAT_FIELDS[:-1]} for n in names}
    for n in names:
        stats[n]["best"] = np.full(nq, np.nan, np.float32)
    for n in probe_names:
        stats[n] = {"n_pos": np.zeros(nq, np.int64), "best": np.full(nq, np.nan, np.float32)}
    topk_rows = np.full((nq, k), -1, np.int64)
    topk_scores = np.full((nq, k), -np.inf, np.float32)
    unlisted = np.zeros(nq, np.int64)
    ranked_parts: list[tuple] = []
    n_chunks = math.ceil(n_items / c_chunk)
    bar = tqdm(total=math.ceil(nq / q_block) * n_chunks, desc="scoring", unit="tile", disable=not progress)
    ckpt = _Checkpoint(checkpoint, {"fingerprint": fingerprint, "n_queries": nq, "n_items": n_items, "k": k,
                                    "q_block": q_block, "pools": names, "probes": probe_names,
                                    "no_exclude_pools": sorted(no_exclude_pools),
                                    "groups": _groups_hash(pools, exclude, probes or {})}) if checkpoint else None
    labels = _Names(source_label or source_name(source), query_ids, item_ids)
    for a in range(0, nq, q_block):
        b = min(nq, a + q_block)
        part = ckpt.load(a, b, names, probe_names) if ckpt else None
        if part is None:
            part = _score_block(source, pools, exclude, probes or {}, names, probe_names, set(no_exclude_pools),
                                a, b, k, c_chunk, n_items, bar, labels)
            if ckpt:
                ckpt.save(a, b, part)
        else:
            bar.update(n_chunks)
        for n, d in part["stats"].items():
            for f, v in d.items():
                stats[n][f][a:b] = v
        topk_rows[a:b], topk_scores[a:b], unlisted[a:b] = part["top"]
        ranked_parts.append(part["ranked"])
    bar.close()
    return StreamResult(topk_rows, topk_scores, stats, unlisted, _concat_ranked(names, ranked_parts))


def _groups_hash(*groups) -> str:
    h = hashlib.sha256()
    for g in groups:
        items = g.items() if isinstance(g, dict) else [("exclude", g if g is not None else [])]
        for name, lists in items:
            h.update(name.encode())
            for x in lists:
                a = np.asarray(x, np.int64)
                h.update(len(a).to_bytes(8, "little"))
                h.update(a.tobytes())
    return h.hexdigest()[:16]


class _Checkpoint:
    """Finished query blocks of one `score_stream` call: ``meta.json`` + ``block_<a>_<b>.npz`` (atomic writes)."""

    _RANKED = ("top_off", "mask", "above", "tie", "count_off", "pos_mask", "pos_count")

    def __init__(self, root: str | os.PathLike, meta: dict):
        from eval.io import read_json, write_json

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        meta_path = self.root / "meta.json"
        if meta_path.exists():
            old = read_json(meta_path)
            if old != meta:
                diff = sorted(k for k in set(old) | set(meta) if old.get(k) != meta.get(k))
                raise ValueError(f"checkpoint {self.root} was written for another scoring job (differs in {diff}); "
                                 "delete it or use another directory")
        else:
            write_json(meta_path, meta)

    def _path(self, a: int, b: int) -> Path:
        return self.root / f"block_{a:08d}_{b:08d}.npz"

    def save(self, a: int, b: int, part: dict) -> None:
        from eval.io import atomic_path

        arrays = {f"stats/{n}/{f}": v for n, d in part["stats"].items() for f, v in d.items()}
        arrays.update(dict(zip(("top/rows", "top/scores", "top/unlisted"), part["top"], strict=True)))
        arrays.update({f"ranked/{n}": v for n, v in zip(self._RANKED, part["ranked"], strict=True)})
        with atomic_path(self._path(a, b)) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)

    def load(self, a: int, b: int, names, probe_names) -> dict | None:
        p = self._path(a, b)
        if not p.exists():
            return None
        with np.load(p) as z:
            stats = {n: {f: z[f"stats/{n}/{f}"] for f in (STAT_FIELDS if n in names else ("n_pos", "best"))}
                     for n in (*names, *probe_names)}
            return {"stats": stats, "top": (z["top/rows"], z["top/scores"], z["top/unlisted"]),
                    "ranked": tuple(z[f"ranked/{n}"] for n in self._RANKED)}


def _score_block(source, pools, exclude, probes, names, probe_names, no_excl, a, b, k, c_chunk, n_items, bar,
                 labels: _Names):
    nb = b - a
    qs = slice(a, b)
    ex = _Group(*_flatten(exclude, a, b, n_items), n_items) if exclude is not None else _Group(
        np.zeros(0, np.int64), np.zeros(0, np.int64), n_items)
    groups: dict[str, _Group] = {}
    for n in names:
        qloc, rows = _flatten(pools[n], a, b, n_items)
        if n not in no_excl and len(ex.keys):
            keep = ~ex.contains(qloc * n_items + rows)
            qloc, rows = qloc[keep], rows[keep]
        groups[n] = _Group(qloc, rows, n_items)
    probe_groups = {n: _Group(*_flatten(probes[n], a, b, n_items), n_items) for n in probe_names}

    vals_a = _pass_a(source, qs, groups, c_chunk)
    for n, g in groups.items():
        bad = np.flatnonzero(~np.isfinite(vals_a[n]))
        if bad.size:  # a +-inf positive would make its pool look empty or tie with nothing
            x = int(bad[0])
            raise _nonfinite(source, labels, a + int(g.qloc[x]), int(g.rows[x]), float(vals_a[n][x]))
    ex_off = np.searchsorted(ex.keys // n_items, np.arange(nb + 1)).astype(np.int64)
    ex_rows = ex.keys % n_items
    for _attempt in range(2):
        counts, top = _stream_block(source, qs, groups, probe_groups, ex, ex_off, ex_rows, vals_a, names, k,
                                    c_chunk, n_items, bar, labels)
        if all(np.array_equal(groups[n].vals, vals_a[n]) for n in names):
            break
        # the source gave a positive a different score in the union call than in its tile (last-bit BLAS
        # differences): re-stream the block with thresholds taken from the tiles themselves
        vals_a = {n: groups[n].vals.copy() for n in names}
    else:
        raise RuntimeError("the score source is not deterministic: a positive's score changed between two "
                           "identical passes over the corpus")
    l_s, l_r, u = top
    out_stats = {n: _resolve_pool(groups[n], ex, n not in no_excl, counts, p, nb) for p, n in enumerate(names)}
    for n, g in probe_groups.items():
        best = _segment_max(g.qloc, g.vals, nb)
        out_stats[n] = {"n_pos": np.bincount(g.qloc, minlength=nb).astype(np.int64),
                        "best": np.where(np.isfinite(best), best, np.nan).astype(np.float32)}
    ranked = _ranked_block(names, groups, no_excl, l_s, u, nb, n_items)
    return {"stats": out_stats, "top": (l_r, l_s, u), "ranked": ranked}


def _pass_a(source, qs: slice, groups: dict, c_chunk: int) -> dict[str, np.ndarray]:
    """The positives' scores from calls on the union of their rows; they fix the thresholds of the stream.

    The cost is (queries x union of their positives); for sources without a per-block cache it is paid in
    sub-blocks of `PASS_A_QUERIES` queries, whose unions are much smaller than the whole block's."""
    nb = qs.stop - qs.start
    vals = {n: np.full(len(g.rows), -np.inf, np.float32) for n, g in groups.items()}
    step = nb if getattr(source, "cached_blocks", False) else PASS_A_QUERIES
    bounds = list(range(0, nb, step)) + [nb]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < PASS_A_QUERIES // 4:
        del bounds[-2]  # no tiny last sub-block (BLAS may round a 1-2 row product differently)
    for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True):
        sel = {n: np.flatnonzero((g.qloc >= s0) & (g.qloc < s1)) for n, g in groups.items()}
        union = np.unique(np.concatenate([groups[n].rows[i] for n, i in sel.items()] + [np.zeros(0, np.int64)]))
        for u0 in range(0, len(union), c_chunk):
            urows = union[u0:u0 + c_chunk]
            sa = np.asarray(source.scores(slice(qs.start + s0, qs.start + s1), urows), dtype=np.float32)
            for n, idx in sel.items():
                g = groups[n]
                rows = g.rows[idx]
                inside = (rows >= urows[0]) & (rows <= urows[-1])
                j = idx[inside]
                vals[n][j] = sa[g.qloc[j] - s0, np.searchsorted(urows, g.rows[j])]
    return vals


def _thresholds(groups, vals, names, nb):
    """Per query and pool: the best positive score ``t`` (+inf without positives) and the lowest corpus row among
    the positives scoring ``t``."""
    t = np.full((nb, max(1, len(names))), np.inf, np.float32)
    first = np.full((nb, max(1, len(names))), np.iinfo(np.int64).max, np.int64)
    for p, n in enumerate(names):
        g = groups[n]
        best = _segment_max(g.qloc, vals[n], nb)
        has = np.isfinite(best)
        t[has, p] = best[has]
        tied = vals[n] == t[g.qloc, p]
        np.minimum.at(first[:, p], g.qloc[tied], g.rows[tied])
    return t, first


def _stream_block(source, qs, groups, probe_groups, ex, ex_off, ex_rows, vals_a, names, k, c_chunk, n_items, bar,
                  labels: _Names):
    from eval._tile import tile_pass

    nb = qs.stop - qs.start
    t, first_row = _thresholds(groups, vals_a, names, nb)
    floor = t.min(axis=1)
    order = np.argsort(t, axis=1, kind="stable").astype(np.int64)
    shape = t.shape
    gt, eq, first = np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    l_s = np.full((nb, k), -np.inf, np.float32)
    l_r = np.full((nb, k), -1, np.int64)
    unlisted = np.zeros(nb, np.int64)
    ex_ptr = ex_off[:-1].copy()
    bad_count = np.zeros(nb, np.int64)
    for c0 in range(0, n_items, c_chunk):
        c1 = min(n_items, c0 + c_chunk)
        s = np.ascontiguousarray(source.scores(qs, slice(c0, c1)), dtype=np.float32)
        if s.shape != (nb, c1 - c0):
            raise ValueError(f"the source returned scores of shape {s.shape}, expected {(nb, c1 - c0)}")
        for g in (*groups.values(), *probe_groups.values(), ex):
            g.gather(s, c0, c1)
        tile_pass(s, np.arange(c0, c1, dtype=np.int64), t, order, first_row, floor, gt, eq, first, l_s, l_r, unlisted,
                  ex_off, ex_rows, ex_ptr, bad_count)
        if bad_count.any():
            i = int(np.flatnonzero(bad_count)[0])
            j = int(np.flatnonzero(~np.isfinite(s[i]))[0])
            raise _nonfinite(source, labels, qs.start + i, c0 + j, float(s[i, j]))
        bar.update(1)
    return {"t": t, "first_row": first_row, "gt": gt, "eq": eq, "first": first}, (l_s, l_r, unlisted)


def _resolve_pool(g: _Group, ex: _Group, excluded: bool, counts: dict, p: int, nb: int) -> dict[str, np.ndarray]:
    """A pool's statistics: the tile counts minus the positives' and (for cross-instance pools) the own-video
    rows' contributions, both known from their gathered scores."""
    n_pos = np.bincount(g.qloc, minlength=nb).astype(np.int64)
    has = n_pos > 0
    t, fr = counts["t"][:, p], counts["first_row"][:, p]
    pos_tie = g.vals == t[g.qloc]
    n_tie_pos = np.bincount(g.qloc[pos_tie], minlength=nb).astype(np.int64)
    n_above = counts["gt"][:, p].copy()  # positives never score above t
    n_tie_neg = counts["eq"][:, p] - n_tie_pos
    n_first = counts["first"][:, p].copy()  # no tied positive lies below the first tied positive
    if excluded and len(ex.rows):
        te = t[ex.qloc]
        n_above -= np.bincount(ex.qloc[ex.vals > te], minlength=nb)
        tie_e = ex.vals == te
        n_tie_neg -= np.bincount(ex.qloc[tie_e], minlength=nb)
        n_first -= np.bincount(ex.qloc[tie_e & (ex.rows < fr[ex.qloc])], minlength=nb)
    z = np.zeros(nb, np.int64)
    return {"n_pos": n_pos, "n_above": np.where(has, n_above, z), "n_tie_neg": np.where(has, n_tie_neg, z),
            "n_tie_pos": n_tie_pos, "n_tie_neg_first": np.where(has, n_first, z),
            "best": np.where(has, t, np.nan).astype(np.float32)}


def _ranked_block(names, groups, no_excl, l_s, u, nb, n_items) -> tuple:
    """Positives of the main ranking with their masks; those at or above the k-th score with (above, tie)."""
    parts_k, parts_m, parts_v = [], [], []
    for bit, n in enumerate(names):
        if n in no_excl:
            continue  # its positives are removed from the main ranking
        g = groups[n]
        parts_k.append(g.qloc * n_items + g.rows)
        parts_m.append(np.full(len(g.rows), 1 << bit, np.int64))
        parts_v.append(g.vals)
    keys = np.concatenate(parts_k) if parts_k else np.zeros(0, np.int64)
    masks = np.concatenate(parts_m) if parts_m else np.zeros(0, np.int64)
    vals = np.concatenate(parts_v) if parts_v else np.zeros(0, np.float32)
    order = np.argsort(keys, kind="stable")
    keys, masks, vals = keys[order], masks[order], vals[order]
    if len(keys):
        first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        masks = np.bitwise_or.reduceat(masks, first)
        keys, vals = keys[first], vals[first]
    qloc = keys // n_items
    # counts of positives by mask
    pair = np.stack([qloc, masks], axis=1) if len(qloc) else np.zeros((0, 2), np.int64)
    uniq, cnt = np.unique(pair, axis=0, return_counts=True) if len(pair) else (pair, np.zeros(0, np.int64))
    count_q = uniq[:, 0] if len(uniq) else np.zeros(0, np.int64)
    count_off = np.searchsorted(count_q, np.arange(nb + 1))
    # positives in the top region
    kth = l_s[:, -1]
    top = vals >= kth[qloc]
    tq, tm, tv = qloc[top], masks[top], vals[top]
    above = (l_s[tq] > tv[:, None]).sum(1).astype(np.int64)
    tie = (l_s[tq] == tv[:, None]).sum(1).astype(np.int64) + np.where(tv == kth[tq], u[tq], 0)
    # ragged order: by query, then best first
    o = np.lexsort((above, tq))
    tq, tm, above, tie = tq[o], tm[o], above[o], tie[o]
    top_off = np.searchsorted(tq, np.arange(nb + 1))
    return (top_off, tm, above, tie, count_off, uniq[:, 1] if len(uniq) else np.zeros(0, np.int64), cnt)


def _concat_ranked(names, parts) -> RankedPositives:
    def cat(i_off, idx_vals):
        offs, vals = [np.zeros(1, np.int64)], [[] for _ in idx_vals]
        base = 0
        for p in parts:
            o = np.asarray(p[i_off], np.int64)
            offs.append(o[1:] + base)
            base += int(o[-1])
            for slot, vi in enumerate(idx_vals):
                vals[slot].append(np.asarray(p[vi], np.int64))
        return (np.concatenate(offs), *[np.concatenate(v) if v else np.zeros(0, np.int64) for v in vals])
    to, m, a, t = cat(0, (1, 2, 3))
    co, pm, pc = cat(4, (5, 6))
    return RankedPositives(list(names), to, m, a, t, co, pm, pc)


# --------------------------------------------------------------------------------------------------------------
# Benchmark scoring
# --------------------------------------------------------------------------------------------------------------
def gt_definitions_present(bench: Any) -> list[str]:
    """The GT definitions (`eval.schema.GT_DEFINITION_FIELDS`) that some query of ``bench`` has: the main pool
    always, every other definition when its fields exist and at least one query's list is non-empty."""
    from eval.fingerprint import _column

    table = bench.queries_ds.data.table
    names = list(GT_DEFINITION_FIELDS)  # read at call time: a definition added to the mapping is picked up
    out = names[:1]
    for name in names[1:]:
        cols = [_column(table, f) for f in GT_DEFINITION_FIELDS[name]]
        if all(c is not None for c in cols) and any(
                int(pc.sum(pc.fill_null(pc.list_value_length(c), 0)).as_py() or 0) > 0 for c in cols):
            out.append(name)
    return out


def benchmark_groups(bench: Any, queries: Sequence[Any]) -> tuple[dict[str, list[np.ndarray]], list[np.ndarray],
                                                                   dict[str, list[np.ndarray]]]:
    """The pools, own-video exclusions and triplet probes of ``queries`` in ``bench`` (all as corpus rows).

    Pools: the GT definitions the benchmark has (`gt_definitions_present`: ``type2-all`` = the main pool =
    in_dataset + cross_dataset, ``type2-consensus``, ``type1-all``, ...), and the tiers ``in_dataset``,
    ``cross_dataset``, ``bge_similar``, ``in_video``. Exclusion: every segment of the query's own video. Probes
    (see `eval.triplets`): ``triplet_temporal`` = segments of the queried object (same ``video_id`` and
    ``object_id``) in a state other than the target; ``triplet_semantic`` = segments of other videos in the target
    (type2) state whose subject+predicate (type1) state differs from the target's.
    """
    pools = {d: bench.gt_rows(queries, d) for d in gt_definitions_present(bench)}
    for tier in BENCHMARK_TIERS:
        pools[tier] = bench.gt_rows(queries, tier=tier)
    cds = bench.corpus_ds
    video = np.asarray(cds["video_id"][:], dtype=object)
    obj = np.asarray(cds["object_id"][:], dtype=object)
    state = np.asarray(cds["state_id"][:], dtype=object)
    type1 = np.asarray(cds["state_type1"][:], dtype=object)

    def index(col: np.ndarray) -> dict[str, np.ndarray]:
        uniq, inv = np.unique(col.astype(str), return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
        return {str(x): order[bounds[i]:bounds[i + 1]] for i, x in enumerate(uniq)}

    obj = np.asarray([f"{v}\x00{o}" for v, o in zip(video, obj, strict=True)], dtype=object)  # ids may be per-video
    by_video, by_obj, by_state = index(video), index(obj), index(state)
    empty = np.zeros(0, np.int64)
    exclude, temporal, semantic = [], [], []
    for q in queries:
        exclude.append(by_video.get(q.video_id, empty))
        o = by_obj.get(f"{q.video_id}\x00{q.object_id}", empty)
        temporal.append(o[state[o] != q.target_state_id])
        s = by_state.get(q.target_state_id, empty)
        semantic.append(s[(video[s] != q.video_id) & (type1[s] != q.target_state_type1)])
    return pools, exclude, {"triplet_temporal": temporal, "triplet_semantic": semantic}


def score_benchmark(bench: Any, source: ScoreSource, query_rows: np.ndarray | Sequence[int], *, method: str,
                    config: dict[str, Any] | None = None, k: int = 50, q_block: int = DEFAULT_Q_BLOCK,
                    c_chunk: int = DEFAULT_C_CHUNK, progress: bool = True,
                    checkpoint: str | os.PathLike | None = None, missed: np.ndarray | None = None) -> Any:
    """Score ``source`` on the benchmark queries at ``query_rows`` (source query i = benchmark row query_rows[i])
    over the whole corpus, for every GT definition and tier (`BENCHMARK_POOLS`) plus the triplet probes, under
    the PSR protocol (own video excluded except for ``in_video``). Returns an `eval.runs.Run` stamped with the
    benchmark's fingerprint (`eval.fingerprint`). With ``checkpoint``
    (a directory) finished query blocks are kept there and a rerun of the same method + config resumes.
    ``missed`` (bool, one per query) flags queries the method gave no answer for: they are scored as misses
    (`eval.runs.Run.mark_missed`: every positive after every ranked negative), whatever the source scored."""
    from eval.runs import Run

    query_rows = np.asarray(query_rows, dtype=np.int64)
    if source.n_queries != len(query_rows):
        raise ValueError(f"the source has {source.n_queries} queries but {len(query_rows)} query rows were given")
    if source.n_items != len(bench.corpus_ds):
        raise ValueError(f"the source scores {source.n_items} items but the corpus has {len(bench.corpus_ds)}")
    queries = [Query.from_dict(r) for r in bench.queries_ds.select(query_rows)]
    pools, exclude, probes = benchmark_groups(bench, queries)
    fingerprint = hashlib.sha256(json.dumps({"method": method, "config": config or {}, "benchmark": bench.name},
                                            sort_keys=True, default=str).encode()).hexdigest()[:16]
    ids = np.asarray(bench.corpus_ids, dtype=object)
    res = score_stream(source, pools, exclude, k=k, q_block=q_block, c_chunk=c_chunk, progress=progress,
                       no_exclude_pools=("in_video",), probes=probes, checkpoint=checkpoint, fingerprint=fingerprint,
                       query_ids=[q.id for q in queries], item_ids=ids,
                       source_label=f"{method!r} ({source_name(source)})")
    topk_ids = [[ids[r] if r >= 0 else "" for r in row] for row in res.topk_rows]
    run = Run(method=method, config=dict(config or {}), query_ids=[q.id for q in queries], topk_ids=topk_ids,
              topk_scores=res.topk_scores, stats=res.stats, benchmark=bench.name,
              kth_tie_unlisted=res.kth_tie_unlisted, ranked=res.ranked, fingerprint=getattr(bench, "fingerprint", None))
    if missed is not None:
        n_items = source.n_items
        n_excl = np.fromiter((len(e) for e in exclude), dtype=np.int64, count=len(exclude))
        n_ranked = {p: np.full(len(queries), n_items, np.int64) if p == "in_video" else n_items - n_excl
                    for p in run.pools}
        run.mark_missed(np.asarray(missed, bool), n_ranked)
    return run


def expected_pool_sizes(bench: Any, query_ids: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per pool and probe of `benchmark_groups`, the ``n_pos`` that `score_benchmark` gives each of ``query_ids``
    (distinct positives, minus the own-video rows for cross-instance pools), and the number of own-video rows each
    query's cross-instance rankings leave out (int64 arrays aligned with ``query_ids``)."""
    index = bench.query_index
    queries = [Query.from_dict(r) for r in bench.queries_ds.select([index[q] for q in query_ids])]
    pools, exclude, probes = benchmark_groups(bench, queries)
    out = {}
    for name, lists in pools.items():
        excl = name != "in_video"
        out[name] = np.fromiter((len(np.setdiff1d(rows, ex)) if excl else len(np.unique(rows))
                                 for rows, ex in zip(lists, exclude, strict=True)), np.int64, count=len(queries))
    for name, lists in probes.items():
        out[name] = np.fromiter((len(np.unique(rows)) for rows in lists), np.int64, count=len(queries))
    return out, np.fromiter((len(np.unique(ex)) for ex in exclude), np.int64, count=len(queries))
