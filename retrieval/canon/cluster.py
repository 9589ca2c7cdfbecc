r"""Greedy embedding clustering of raw state phrases: the PSR canonicalization rule, exact and fast.

The rule (PSR appendix, "State extraction and canonicalization"). Phrases are visited in a fixed order (most
frequent first, `visit_order`: count ties by first occurrence in the input, or by phrase text). When phrase ``i`` is
visited, let ``C_i`` be the seeds that exist at that moment (earlier phrases that founded a cluster) with
``sim(i, k) >= t``. If ``C_i`` is empty, ``i`` seeds a new cluster; otherwise it joins ``argmax_{k in C_i} sim(i, k)``,
ties going to the earliest seed. Clusters are numbered in seed order (cluster 0 is founded by the first phrase
visited).

Similarity. ``x_i`` is row ``i`` of the embeddings as float32 unit vectors (`unit_rows`: a row whose squared norm is
within ``UNIT_TOL`` of 1, what any float32 normaliser returns, is used as given, bit for bit; any other row is divided
by its float64 norm and rounded to float32). ``sim(i, k)`` is their float64 cosine: the exact real dot product
``S = sum_j x_ij x_kj`` rounded once to the nearest float64 (ties to even), the value ``math.fsum`` returns on the
float64 products (a product of two float32 numbers is exact in float64). It does not depend on a summation order, so
the fast path and the straightforward loop (`greedy_cluster_loop`) agree bit for bit, ties and values on the
threshold included, and ``sim >= t`` is decided exactly.

Exact dot products (`exact_dots`, numba, vectorised over pairs). The products are added with error-free
transformations (TwoSum; Ogita, Rump & Oishi, "Accurate sum and dot product", SIAM J. Sci. Comput. 26, 2005) in four
interleaved chains, so that ``S = s + sum(errors)`` exactly; the errors are added in float64 into ``c`` with
``|c - sum(errors)| <= eta = gamma_{d+4}^2 M`` (``gamma_n = n u / (1 - n u)``, ``u = 2^-53``,
``M = sum_j |x_ij x_kj|``, accumulated alongside and doubled for its own rounding). ``r = fl(s + c)`` and its exact
residual ``e`` (TwoSum) give ``S in [r + e - eta, r + e + eta]``: ``r`` is the correctly rounded ``S`` when that
interval lies strictly inside ``r``'s rounding interval (``|e| + eta < ulp / 2`` on each side). Pairs that fail the
test (in practice an exact sum sitting on a rounding midpoint, about 1% of random pairs) are summed again with
`math.fsum`.

Fast path (`greedy_cluster`), blocks of ``B`` phrases in visiting order:

1. screen: approximate scores of the block against the seeds that exist, in tiles of ``C`` seeds, keeping every
   pair with ``S >= t - 2^-52`` (the least ``S`` whose rounding can reach ``t``, ``|t| <= 1``) by a rigorous bound:

   - ``screen="int8"`` (default): every unit row is quantised once with one global scale ``Q = max|x| / 127``,
     ``x = Q x^ + e`` with ``|e_k| <= Q/2``; tiles are exact int32 products ``x^ . y^`` (``torch._int_mm``: VNNI /
     AVX2 integer kernels, half the time of a float32 product and a quarter of its memory). Then
     ``|x.y - Q^2 x^.y^| <= (Q/2)(|x|_1 + |y|_1 + d Q) + d Q^2/4 =: B_x`` (with ``|y|_1`` bounded by its maximum over
     all rows), and a pair is a candidate iff ``x^.y^ >= floor((t' - B_x) / Q^2) - 1`` (an integer compare per row);
   - ``screen="float32"``: BLAS float32 tiles; a float32 dot product of vectors of norm at most ``r`` is within
     ``gamma_d r^2`` of the exact value (``u = 2^-24``; Higham, *Accuracy and Stability of Numerical Algorithms*,
     3.1), for any summation order: candidates are the pairs with score ``>= t' - 2 gamma_d r^2``.
2. refine: exact similarities of the candidate pairs (`exact_dots`); keep ``sim >= t``.
3. resolve the block: phrases with no old seed at ``>= t`` may found clusters. Their exact pairs with earlier
   phrases of the block (screened and refined the same way) feed one sequential pass (numba) over those phrases:
   a phrase becomes a seed iff none of the block's earlier new seeds is at ``>= t``.
4. assign: each other phrase joins the best of its old-seed pairs and of its pairs with the block's new seeds
   that precede it (similarity descending, seed number ascending).

Cost: the product of each phrase with the seeds that exist when its block starts, at most ``n x S_final x d``
multiply-adds: the cost of one dense product of all phrases against the final seed set (see
`retrieval.canon.speed` for the measured comparison), plus work linear in the candidate pairs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

#: Rows whose squared norm is within this of 1 are unit rows as given (float32 normalisers stay far inside it).
UNIT_TOL = 1e-5
#: Visiting-order rules for phrases of equal count (`visit_order`).
TIES = ("first", "text")
#: Default block of phrases and chunk of seeds of the fast path (B x C float32 scores = 64 MiB).
DEFAULT_BLOCK = 2048
DEFAULT_SEED_CHUNK = 8192
#: Rows converted at once (bounded temporary memory).
_ROW_CHUNK = 16384
#: Screens keep every pair with exact dot >= t - _SCREEN_SLACK: below it no rounding reaches t (|t| <= 1).
_SCREEN_SLACK = 2.0**-52


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
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    if ties == "first":
        return np.argsort(-counts, kind="stable").astype(np.int64)
    if phrases is None or len(counts) != len(phrases):
        raise ValueError(f"ties='text' needs one phrase per count ({len(counts)} counts, "
                         f"{'no' if phrases is None else len(phrases)} phrases)")
    text_rank = np.empty(len(phrases), np.int64)
    text_rank[np.argsort(np.asarray(phrases, dtype=object), kind="stable")] = np.arange(len(phrases))
    return np.lexsort((text_rank, -counts)).astype(np.int64)


def unit_rows(emb: np.ndarray) -> np.ndarray:
    """``(n, d)`` float32 unit rows (module docstring, "Similarity"): rows with ``|sum x^2 - 1| <= UNIT_TOL`` (float64
    sum of the float32 values) as given, other rows divided by their float64 norm and rounded to float32.

    Raises `ValueError` for non-finite values or zero rows."""
    x = np.asarray(emb)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be (n, d), got shape {x.shape}")
    out = np.empty(x.shape, np.float32)
    for s in range(0, len(x), _ROW_CHUNK):
        c = np.asarray(x[s:s + _ROW_CHUNK], np.float32)
        sq = np.einsum("ij,ij->i", c, c, dtype=np.float64)
        bad = ~np.isfinite(sq)
        if bad.any():
            raise ValueError(f"embeddings hold NaN/inf values (first bad row {s + int(np.flatnonzero(bad)[0])})")
        if (sq == 0).any():
            raise ValueError(f"embedding row {s + int(np.flatnonzero(sq == 0)[0])} is zero: cannot normalise")
        out[s:s + _ROW_CHUNK] = c
        off = np.flatnonzero(np.abs(sq - 1.0) > UNIT_TOL)
        if len(off):
            out[s + off] = (c[off].astype(np.float64) / np.sqrt(sq[off])[:, None]).astype(np.float32)
    return out


def check_threshold(threshold: float) -> float:
    """``threshold`` as a float in ``[-1, 1]`` (a cosine), else `ValueError`."""
    t = float(threshold)
    if not -1.0 <= t <= 1.0:
        raise ValueError(f"threshold must lie in [-1, 1], got {threshold}")
    return t


@njit(cache=True, nogil=True)
def _dd_dots(xa, xb, a, b, out, unsure):  # pragma: no cover - compiled
    """Exact-sum dot products of rows ``a[p]`` of ``xa`` and ``b[p]`` of ``xb`` (float32): ``out[p]`` is
    ``fl(s + c)`` and ``unsure[p]`` says it may not be the correctly rounded sum (module docstring)."""
    d = xa.shape[1]
    u = 2.0**-53
    g = (d + 4) * u / (1.0 - (d + 4) * u)
    for p in range(a.shape[0]):
        x, y = xa[a[p]], xb[b[p]]
        s0 = s1 = s2 = s3 = 0.0
        c0 = c1 = c2 = c3 = 0.0
        m = 0.0
        j = 0
        while j + 4 <= d:  # four independent TwoSum chains (instruction-level parallelism)
            q0 = np.float64(x[j]) * np.float64(y[j])
            q1 = np.float64(x[j + 1]) * np.float64(y[j + 1])
            q2 = np.float64(x[j + 2]) * np.float64(y[j + 2])
            q3 = np.float64(x[j + 3]) * np.float64(y[j + 3])
            t = s0 + q0
            z = t - s0
            c0 += (s0 - (t - z)) + (q0 - z)
            s0 = t
            t = s1 + q1
            z = t - s1
            c1 += (s1 - (t - z)) + (q1 - z)
            s1 = t
            t = s2 + q2
            z = t - s2
            c2 += (s2 - (t - z)) + (q2 - z)
            s2 = t
            t = s3 + q3
            z = t - s3
            c3 += (s3 - (t - z)) + (q3 - z)
            s3 = t
            m += (abs(q0) + abs(q1)) + (abs(q2) + abs(q3))
            j += 4
        while j < d:
            q0 = np.float64(x[j]) * np.float64(y[j])
            t = s0 + q0
            z = t - s0
            c0 += (s0 - (t - z)) + (q0 - z)
            s0 = t
            m += abs(q0)
            j += 1
        c = (c0 + c1) + (c2 + c3)
        s = s0
        for v in (s1, s2, s3):  # fold the chains, errors into c
            t = s + v
            z = t - s
            c += (s - (t - z)) + (v - z)
            s = t
        r = s + c
        z = r - s
        e = (s - (r - z)) + (c - z)  # r + e == s + c exactly
        out[p] = r
        eta = 2.0 * g * g * m + 1e-300  # m: the float sum of |products|, within a factor 1 + g of the exact one
        up = np.nextafter(r, np.inf) - r
        down = r - np.nextafter(r, -np.inf)
        unsure[p] = not (e + eta < 0.5 * up and e - eta > -0.5 * down)


_PAIR_CHUNK = 65536


def exact_dots(x: np.ndarray, a: np.ndarray, b: np.ndarray, x_b: np.ndarray | None = None) -> np.ndarray:
    """``(len(a),)`` float64: the exact dot product, rounded once to float64 (module docstring), of rows ``a[i]`` of
    ``x`` and ``b[i]`` of ``x_b`` (default ``x``), both float32 (`unit_rows` for ``sim``), vectorised over pairs."""
    a, b = np.ascontiguousarray(a, np.int64), np.ascontiguousarray(b, np.int64)
    x_b = x if x_b is None else x_b
    out = np.empty(len(a), np.float64)
    if not len(a):
        return out
    unsure = np.empty(len(a), np.bool_)
    for s in range(0, len(a), _PAIR_CHUNK):
        e = min(s + _PAIR_CHUNK, len(a))
        _dd_dots(x, x_b, a[s:e], b[s:e], out[s:e], unsure[s:e])
    for p in np.flatnonzero(unsure):  # rare: the exact sum sits on (or next to) a rounding midpoint
        out[p] = math.fsum((x[a[p]].astype(np.float64) * x_b[b[p]].astype(np.float64)).tolist())
    return out


def screen_margin(dim: int, max_norm: float) -> float:
    """``delta = 2 gamma_d r^2``: the float32 screen keeps every pair whose exact similarity is ``>= t``."""
    u = 2.0**-24
    gamma = dim * u / (1.0 - dim * u)
    return 2.0 * gamma * max_norm * max_norm


SCREENS = ("int8", "float32")


@functools.lru_cache(maxsize=1)
def int8_screen_available() -> bool:
    """Whether this torch build multiplies int8 matrices (``torch._int_mm``, a private op: probed, never assumed)."""
    try:
        import torch

        a, b = torch.ones((32, 64), dtype=torch.int8), torch.ones((64, 32), dtype=torch.int8)
        return int(torch._int_mm(a, b)[0, 0]) == 64
    except (AttributeError, RuntimeError, TypeError, NotImplementedError):
        return False


def resolve_screen(kind: str) -> str:
    """``"auto"`` -> ``"int8"`` where `int8_screen_available`, else ``"float32"`` (same result, slower)."""
    if kind == "auto":
        return "int8" if int8_screen_available() else "float32"
    if kind not in SCREENS:
        raise ValueError(f"screen must be 'auto' or one of {SCREENS}, got {kind!r}")
    return kind


class _Screen:
    """Candidate pairs at a threshold, in one of `SCREENS` (module docstring, step 1), for rows of ``units``
    (every unit-row matrix whose rows will be compared: the quantisation scale and the norm bounds cover them all)."""

    def __init__(self, units: Sequence[np.ndarray], threshold: float, kind: str = "int8"):
        if kind not in SCREENS:
            raise ValueError(f"screen must be one of {SCREENS}, got {kind!r}")
        self.kind, self.t = kind, float(threshold) - _SCREEN_SLACK
        nonempty = [g for g in units if len(g)]
        self.dim = nonempty[0].shape[1] if nonempty else 1
        if kind == "float32":
            r = max((float(np.sqrt(_sq_norms(g).max())) for g in nonempty), default=1.0)
            self.lo = float(np.float32(self.t - screen_margin(self.dim, r)))
            return
        self.scale = max((max(float(np.abs(c).max(initial=0.0)) for c in _chunks(g)) for g in nonempty),
                         default=1.0) / 127.0 or 1.0
        self.l1_max = max((float(_l1(g).max()) for g in nonempty), default=0.0)

    def encode(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | float]:
        """``(codes, per-row limit)``: float32 rows and the scalar ``lo``, or int8 codes and int64 row thresholds."""
        if self.kind == "float32":
            return rows, self.lo
        codes = np.rint(rows.astype(np.float64) / self.scale).astype(np.int8)
        s = self.scale
        bound = (s / 2) * (_l1(rows) + self.l1_max + self.dim * s) + self.dim * s * s / 4
        limit = np.floor((self.t - bound) / (s * s)) - 1  # conservative: only ever adds candidates
        return codes, np.clip(limit, -(2**31), 2**31 - 1).astype(np.int64)

    def pairs(self, codes: np.ndarray, limit, targets: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidate pairs (row of ``codes``, row of ``targets``), tile by tile (``chunk`` targets at a time)."""
        rows, cols = [], []
        if len(codes) == 0 or len(targets) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.kind == "int8":
            import torch

            a = torch.from_numpy(np.ascontiguousarray(codes))
            lim = np.asarray(limit, np.int32)
        for s in range(0, len(targets), chunk):
            t = targets[s:s + chunk]
            if self.kind == "int8":
                hit = torch._int_mm(a, torch.from_numpy(np.ascontiguousarray(t)).T).numpy() >= lim[:, None]
            else:
                hit = np.matmul(codes, t.T) >= limit
            r, c = np.divmod(np.flatnonzero(hit.ravel()), len(t))  # one pass over a contiguous tile
            if r.size:
                rows.append(r)
                cols.append(c + s)
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(cols)


def _sq_norms(g: np.ndarray) -> np.ndarray:
    """Squared row norms, float64 accumulation (over row chunks: bounded temporary memory)."""
    return np.concatenate([np.einsum("ij,ij->i", c, c, dtype=np.float64) for c in _chunks(g)])


def _l1(g: np.ndarray) -> np.ndarray:
    """Row L1 norms, float64 accumulation (rounded up by a relative 1e-12 to stay an upper bound)."""
    return np.concatenate([np.abs(c).sum(axis=1, dtype=np.float64) for c in _chunks(g)]) * (1 + 1e-12)


def _chunks(g: np.ndarray):
    return (g[s:s + _ROW_CHUNK] for s in range(0, max(len(g), 1), _ROW_CHUNK))


@njit(cache=True, nogil=True)
def _sequential_seeds(indptr, indices):  # pragma: no cover - compiled
    """Potential seeds in visiting order; ``indices[indptr[i]:indptr[i+1]]`` are the earlier potential seeds at
    ``>= t`` from ``i``. ``i`` becomes a seed iff none of those became one."""
    n = indptr.shape[0] - 1
    is_seed = np.zeros(n, np.bool_)
    for i in range(n):
        ok = True
        for a in range(indptr[i], indptr[i + 1]):
            if is_seed[indices[a]]:
                ok = False
                break
        is_seed[i] = ok
    return is_seed


def _best_per_row(rows: np.ndarray, values: np.ndarray, seed_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per distinct row: the pair with the largest value, ties by the smallest seed id."""
    by = np.lexsort((seed_ids, -values, rows))
    rows, values, seed_ids = rows[by], values[by], seed_ids[by]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else np.zeros(0, np.int64)
    return rows[first], values[first], seed_ids[first]


class _SeedBuffer:
    """The growing matrix of the seeds' screen codes (capacity doubling) and the seeds' visiting positions."""

    def __init__(self, dim: int, dtype, capacity: int = 1024):
        self.codes = np.empty((capacity, dim), dtype)
        self.pos = np.empty(capacity, np.int64)
        self.n = 0

    def add(self, codes: np.ndarray, positions: np.ndarray) -> None:
        m = len(positions)
        if self.n + m > len(self.pos):
            cap = max(2 * len(self.pos), self.n + m)
            grown = np.empty((cap, self.codes.shape[1]), self.codes.dtype)
            grown[: self.n] = self.codes[: self.n]
            pos = np.empty(cap, np.int64)
            pos[: self.n] = self.pos[: self.n]
            self.codes, self.pos = grown, pos
        self.codes[self.n:self.n + m] = codes
        self.pos[self.n:self.n + m] = positions
        self.n += m


def _check_order(order: np.ndarray | None, n: int) -> np.ndarray:
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order must be a permutation of the {n} rows")
    return order


def greedy_cluster(emb: np.ndarray, threshold: float = 0.85, order: np.ndarray | None = None, *,
                   block: int = DEFAULT_BLOCK, seed_chunk: int = DEFAULT_SEED_CHUNK, screen: str = "auto",
                   progress: bool = False) -> Clustering:
    """Cluster ``emb`` (``(n, d)``; rows are taken to unit norm by `unit_rows`) with the greedy rule of the module
    docstring.

    ``order``: visiting order as input rows (default: row order; use `visit_order` for most-frequent-first);
    ``screen``: the candidate screen, ``"int8"``, ``"float32"`` (same result, different speed) or ``"auto"`` (int8 when
    torch multiplies int8 matrices, else float32).
    Returns a `Clustering` whose rows refer to the input rows. The result equals `greedy_cluster_loop` exactly.
    """
    x = unit_rows(emb)
    order = _check_order(order, len(x))
    label, value, seed_pos = _greedy(x, order, threshold, 0, block=block, seed_chunk=seed_chunk, screen=screen,
                                     progress=progress)
    out_labels, out_sim = np.empty(len(x), np.int64), np.empty(len(x), np.float64)
    out_labels[order], out_sim[order] = label, value
    return Clustering(labels=out_labels, seeds=order[seed_pos], seed_sim=out_sim, order=order,
                      threshold=float(threshold))


@dataclass
class Extension:
    """New phrases clustered after a finished clustering (`extend_clustering`), rows in the new phrases' order.

    Attributes:
        labels: ``(n,)`` int64: ``< n_fixed`` an existing cluster (seed row ``labels`` of the seed matrix), else the
            new cluster ``n_fixed + j`` founded by row ``new_seeds[j]``.
        new_seeds: ``(m,)`` int64, the rows that founded new clusters, in cluster order.
        seed_sim: ``(n,)`` float64, the similarity of each row to its cluster's seed.
        order: ``(n,)`` int64, the visiting order of the new rows.
        n_fixed: the number of existing clusters (seeds).
        threshold: the threshold ``t``.
    """

    labels: np.ndarray
    new_seeds: np.ndarray
    seed_sim: np.ndarray
    order: np.ndarray
    n_fixed: int
    threshold: float


def extend_clustering(seed_emb: np.ndarray, emb: np.ndarray, threshold: float, order: np.ndarray | None = None, *,
                      block: int = DEFAULT_BLOCK, seed_chunk: int = DEFAULT_SEED_CHUNK,
                      screen: str = "auto") -> Extension:
    """Continue a greedy pass: the rows of ``seed_emb`` are the seeds of the clusters ``0 .. S-1`` that exist, then
    the rows of ``emb`` are visited in ``order`` with the rule of the module docstring (joining the best seed, old or
    new, at ``>= threshold``, else founding cluster ``S, S+1, ...``). Equal to clustering the seeds first and these
    phrases after them, when the seeds are pairwise below ``threshold`` (as the seeds of one clustering are)."""
    seeds, new = unit_rows(seed_emb), unit_rows(emb)
    if len(seeds) and len(new) and seeds.shape[1] != new.shape[1]:
        raise ValueError(f"embeddings of dimension {new.shape[1]} against seeds of dimension {seeds.shape[1]}")
    order = _check_order(order, len(new))
    k = len(seeds)
    x = np.concatenate([seeds, new]) if len(seeds) else new
    label, value, seed_pos = _greedy(x, order + k, threshold, k, block=block, seed_chunk=seed_chunk, screen=screen)
    labels, sims = np.empty(len(new), np.int64), np.empty(len(new), np.float64)
    labels[order], sims[order] = label[k:], value[k:]
    return Extension(labels=labels, new_seeds=order[seed_pos[seed_pos >= k] - k], seed_sim=sims, order=order,
                     n_fixed=k, threshold=float(threshold))


def _greedy(x: np.ndarray, order: np.ndarray, threshold: float, n_fixed: int, *, block: int, seed_chunk: int,
            screen: str, progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fast path over unit rows ``x``: rows ``0 .. n_fixed-1`` are seeds already (clusters in row order), then
    ``order`` (the other rows) is visited. Returns, by visiting position (fixed seeds first): ``(cluster, similarity
    to its seed, positions of the seeds in seed order)``."""
    from tqdm.auto import tqdm

    t = check_threshold(threshold)
    if block < 1 or seed_chunk < 1:
        raise ValueError("block and seed_chunk must be positive")
    units = np.ascontiguousarray(x[np.concatenate([np.arange(n_fixed, dtype=np.int64), order])])
    n = len(units)
    screen = resolve_screen(screen)
    scr = _Screen([units], t, screen)
    seeds = _SeedBuffer(units.shape[1], np.int8 if screen == "int8" else np.float32, max(1024, n_fixed))
    label = np.empty(n, np.int64)  # cluster (= seed number) of each position
    value = np.empty(n, np.float64)  # exact similarity to the cluster's seed
    fixed = np.arange(n_fixed, dtype=np.int64)
    label[:n_fixed], value[:n_fixed] = fixed, exact_dots(units, fixed, fixed)
    for a in range(0, n_fixed, _ROW_CHUNK):
        b = min(a + _ROW_CHUNK, n_fixed)
        seeds.add(scr.encode(units[a:b])[0], fixed[a:b])
    bar = tqdm(total=n - n_fixed, desc=f"greedy clustering t={t:g}", unit="phrase", disable=not progress)
    for a in range(n_fixed, n, block):
        b = min(a + block, n)
        _cluster_block(units, a, b, scr, seeds, label, value, t, seed_chunk)
        bar.update(b - a)
        bar.set_postfix(clusters=seeds.n, refresh=False)
    bar.close()
    return label, value, seeds.pos[: seeds.n].copy()


def _cluster_block(units, a, b, scr: _Screen, seeds: _SeedBuffer, label, value, t, seed_chunk) -> None:
    """Steps 1-4 of the module docstring for positions ``a:b``; appends the block's new seeds to ``seeds``."""
    codes, limit = scr.encode(units[a:b])
    n_old = seeds.n
    # 1-2: old seeds
    r, c = scr.pairs(codes, limit, seeds.codes[:n_old], seed_chunk)
    v = exact_dots(units, r + a, seeds.pos[c])
    keep = v >= t
    old_r, old_v, old_s = r[keep], v[keep], c[keep]
    has_old = np.zeros(b - a, bool)
    has_old[old_r] = True
    # 3: the block's potential seeds and every block row's pairs with earlier potential seeds
    pot = np.flatnonzero(~has_old)  # block-local rows, ascending = visiting order
    r2, c2 = scr.pairs(codes, limit, codes[pot], seed_chunk)  # c2 indexes `pot`
    before = pot[c2] < r2
    r2, c2 = r2[before], c2[before]
    v2 = exact_dots(units, r2 + a, pot[c2] + a)
    keep = v2 >= t
    r2, c2, v2 = r2[keep], c2[keep], v2[keep]
    pot_index = np.full(b - a, -1, np.int64)
    pot_index[pot] = np.arange(len(pot))
    in_pot = pot_index[r2] >= 0  # pairs among potential seeds, for the sequential pass
    pr, pc = pot_index[r2[in_pot]], c2[in_pot]
    srt = np.lexsort((pc, pr))
    indptr = np.zeros(len(pot) + 1, np.int64)
    np.cumsum(np.bincount(pr, minlength=len(pot)), out=indptr[1:])
    is_seed = _sequential_seeds(indptr, pc[srt].astype(np.int64))
    new_local = pot[is_seed]
    new_id = np.full(len(pot), -1, np.int64)
    new_id[is_seed] = n_old + np.arange(len(new_local))
    # 4: assign every non-seed to its best seed (old, or new and earlier in the block)
    to_new = new_id[c2] >= 0
    rows = np.concatenate([old_r, r2[to_new]])
    vals = np.concatenate([old_v, v2[to_new]])
    sids = np.concatenate([old_s, new_id[c2[to_new]]])
    rows_new = np.zeros(b - a, bool)
    rows_new[new_local] = True
    sel = ~rows_new[rows]
    br, bv, bs = _best_per_row(rows[sel], vals[sel], sids[sel])
    label[a + br] = bs
    value[a + br] = bv
    label[a + new_local] = new_id[is_seed]
    if len(new_local):
        value[a + new_local] = exact_dots(units, a + new_local, a + new_local)
        seeds.add(codes[new_local], a + new_local)
    if len(br) + len(new_local) != b - a:  # cannot happen: a non-seed has a pair at >= t by construction
        raise RuntimeError(f"internal error: positions {a}..{b} were not all assigned")


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


def _pairs_at_least(xa: np.ndarray, xb: np.ndarray, threshold: float, block: int, seed_chunk: int,
                    screen: str = "auto"):
    """Exact pairs (row of xa, row of xb, similarity) with similarity ``>= threshold`` (screen + refine)."""
    t = check_threshold(threshold)
    scr = _Screen([xa, xb], t, resolve_screen(screen))
    targets = scr.encode(xb)[0] if len(xb) else xb
    rows, cols, vals = [], [], []
    for a in range(0, len(xa), block):
        codes, limit = scr.encode(xa[a:a + block])
        r, c = scr.pairs(codes, limit, targets, seed_chunk)
        v = exact_dots(xa, r + a, c, xb)
        keep = v >= t
        rows.append(r[keep] + a)
        cols.append(c[keep])
        vals.append(v[keep])
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))  # noqa: E731
    return cat(rows, np.int64), cat(cols, np.int64), cat(vals, np.float64)


def assign(emb: np.ndarray, seed_emb: np.ndarray, threshold: float, *, block: int = DEFAULT_BLOCK,
           seed_chunk: int = DEFAULT_SEED_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Canonicalize new phrases against a fixed seed set with the same rule: each row of ``emb`` joins the most
    similar row of ``seed_emb`` at ``>= threshold`` (ties: the lowest seed row), or none.

    Returns ``(seed row (n,) int64, -1 for none; similarity (n,) float64, NaN for none)``."""
    xa, xb = unit_rows(emb), unit_rows(seed_emb)
    r, c, v = _pairs_at_least(xa, xb, threshold, block, seed_chunk)
    br, bv, bs = _best_per_row(r, v, c)
    idx = np.full(len(xa), -1, np.int64)
    sim = np.full(len(xa), np.nan)
    idx[br] = bs
    sim[br] = bv
    return idx, sim


def similar_pairs(emb: np.ndarray, threshold: float, *, block: int = DEFAULT_BLOCK,
                  seed_chunk: int = DEFAULT_SEED_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """All ordered pairs ``(i, j)``, ``i != j``, of rows of ``emb`` with similarity ``>= threshold``, sorted by
    ``(i, j)``; never materialises the ``n x n`` matrix."""
    x = unit_rows(emb)
    r, c, _ = _pairs_at_least(x, x, threshold, block, seed_chunk)
    keep = r != c
    r, c = r[keep], c[keep]
    by = np.lexsort((c, r))
    return r[by], c[by]
