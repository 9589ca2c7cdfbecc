r"""The PSR canonicalization rule: greedy embedding clustering of raw state phrases, and its literal reference loop.

The rule (PSR appendix, "State extraction and canonicalization"). Phrases are visited in a fixed order (most
frequent first, `visit_order`: count ties by first occurrence in the input, or by phrase text). When phrase ``i`` is
visited, let ``C_i`` be the seeds that exist at that moment (earlier phrases that founded a cluster) with
``sim(i, k) >= t``. If ``C_i`` is empty, ``i`` seeds a new cluster; otherwise it joins ``argmax_{k in C_i} sim(i, k)``,
ties going to the earliest seed. Clusters are numbered in seed order (cluster 0 is founded by the first phrase
visited).

Similarity (`retrieval.canon.cluster.similarity`). ``x_i`` is row ``i`` of the embeddings as float32 unit vectors
(`unit_rows`: a row whose squared norm is within ``UNIT_TOL`` of 1, what any float32 normaliser returns, is used as
given, bit for bit; any other row is divided by its float64 norm and rounded to float32). ``sim(i, k)`` is their
float64 cosine: the exact real dot product rounded once to the nearest float64 (`exact_dots`). It does not depend
on a summation order, so the fast path (`retrieval.canon.cluster.fast`) and the straightforward loop
(`greedy_cluster_loop`, here) agree bit for bit, ties and values on the threshold included, and ``sim >= t`` is
decided exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eval.errors import InputError
from retrieval.canon.cluster.similarity import check_threshold, exact_dots, unit_rows

#: Visiting-order rules for phrases of equal count (`visit_order`).
TIES = ("first", "text")


@dataclass
class Clustering:
    """Result of a greedy clustering of ``n`` phrases (rows in input order).

    Attributes:
        labels: ``(n,)`` int64, the cluster of each phrase; clusters are numbered in seed order.
        seeds: ``(n_clusters,)`` int64, the input row of each cluster's seed.
        seed_sim: ``(n,)`` float64, the similarity (module docstring) of each phrase to its cluster's seed (for a
            seed, its own squared norm: 1 within ``UNIT_TOL``).
        order: ``(n,)`` int64, the visiting order (input rows).
        threshold: the threshold ``t``.
    """

    labels: np.ndarray
    seeds: np.ndarray
    seed_sim: np.ndarray
    order: np.ndarray
    threshold: float

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    @property
    def n_clusters(self) -> int:
        return int(self.seeds.shape[0])

    def sizes(self) -> np.ndarray:
        """``(n_clusters,)`` int64: phrases per cluster."""
        return np.bincount(self.labels, minlength=self.n_clusters).astype(np.int64)

    def members(self) -> list[np.ndarray]:
        """Per cluster, its input rows in visiting order (seed first)."""
        rank = np.empty(self.n, np.int64)
        rank[self.order] = np.arange(self.n)
        by = np.lexsort((rank, self.labels))
        bounds = np.cumsum(self.sizes())[:-1]
        return np.split(by, bounds)


def visit_order(counts: Sequence[int] | np.ndarray, phrases: Sequence[str] | None = None,
                ties: str = "first") -> np.ndarray:
    """The paper's visiting order: count descending; phrases of equal count by ``ties``:

    - ``"first"`` (default): their input order (stable; for a vocabulary in first-seen order, first occurrence);
    - ``"text"``: phrase text ascending (code-point order), then input order (needs ``phrases``).

    Returns ``(n,)`` int64 input rows."""
    counts = np.asarray(counts, np.int64)
    if ties not in TIES:
        raise InputError(f"ties must be one of {TIES}, got {ties!r}")
    if ties == "first":
        return np.argsort(-counts, kind="stable").astype(np.int64)
    if phrases is None or len(counts) != len(phrases):
        raise InputError(f"ties='text' needs one phrase per count ({len(counts)} counts, "
                         f"{'no' if phrases is None else len(phrases)} phrases)")
    text_rank = np.empty(len(phrases), np.int64)
    text_rank[np.argsort(np.asarray(phrases, dtype=object), kind="stable")] = np.arange(len(phrases))
    return np.lexsort((text_rank, -counts)).astype(np.int64)


def check_order(order: np.ndarray | None, n: int) -> np.ndarray:
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise InputError(f"order must be a permutation of the {n} rows")
    return order


def greedy_cluster_loop(emb: np.ndarray, threshold: float = 0.85, order: np.ndarray | None = None, *,
                        exact: bool = True, start: int = 0, stop: int | None = None,
                        initial_seeds: np.ndarray | None = None) -> Clustering:
    """The straightforward reference: one phrase at a time against every current seed.

    ``exact=True`` compares the exact similarities of the module docstring (the definition, for tests);
    ``exact=False`` uses float32 matrix-vector products (the fastest plain loop, for timing). ``start``/``stop``
    visit only positions ``start:stop`` of the order, starting from ``initial_seeds`` (input rows of the seeds
    founded before ``start``, in seed order); rows outside the range get label -1.
    """
    x = unit_rows(emb)
    n, dim = x.shape
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    t = check_threshold(threshold)
    stop = n if stop is None else min(stop, n)
    init = np.zeros(0, np.int64) if initial_seeds is None else np.asarray(initial_seeds, np.int64)
    labels = np.full(n, -1, np.int64)
    sims = np.full(n, np.nan)
    cap = max(len(init) + max(stop - start, 0), 1)
    seed_rows = np.empty(cap, np.int64)
    seed_rows[: len(init)] = init
    mat = None if exact else np.empty((cap, dim), np.float32)
    if mat is not None:
        mat[: len(init)] = x[init]
    s = len(init)
    for i in range(start, stop):
        row = int(order[i])
        if s:
            dots = (exact_dots(x, np.full(s, row), seed_rows[:s]) if exact else mat[:s] @ x[row])
            k = int(np.argmax(dots))  # the first maximum: the earliest seed
            if dots[k] >= t:
                labels[row] = k
                sims[row] = float(dots[k])
                continue
        seed_rows[s] = row
        if mat is not None:
            mat[s] = x[row]
        labels[row] = s
        sims[row] = float(exact_dots(x, [row], [row])[0]) if exact else float(x[row] @ x[row])
        s += 1
    return Clustering(labels=labels, seeds=seed_rows[:s].copy(), seed_sim=sims, order=order, threshold=t)


