r"""Greedy embedding clustering of raw state phrases: the PSR canonicalization rule, exact and fast.

The rule (PSR appendix, "State extraction and canonicalization"). Phrases are visited in a fixed order (most
frequent first, `visit_order`). When phrase ``i`` is visited, let ``C_i`` be the seeds that exist at that moment
(earlier phrases that founded a cluster) with ``sim(i, k) >= t``. If ``C_i`` is empty, ``i`` seeds a new cluster;
otherwise it joins ``argmax_{k in C_i} sim(i, k)``, ties going to the earliest seed. Clusters are numbered in
seed order (cluster 0 is founded by the first phrase visited).

Similarity. ``sim(i, k) = <q_i, q_k> / 2^40`` with ``q = rint(x * 2^20)`` the L2-normalised embedding ``x`` on a
``2^-20`` grid: a change of at most ``2^-21`` per component (about ``1e-5`` in cosine). The dot product of two grid
vectors is an integer of magnitude at most ``2^40``, computed exactly (float64 holding integers: every partial sum
is an integer below ``2^53``), so a comparison never depends on a summation order: the fast path and the
straightforward loop (`greedy_cluster_loop`) agree exactly, ties and values sitting on the threshold included.

Fast path (`greedy_cluster`), blocks of ``B`` phrases in visiting order:

1. screen: approximate scores of the block against the seeds that exist, in tiles of ``C`` seeds, keeping every
   pair whose score clears a rigorous lower bound (so no pair with ``sim >= t`` is lost):

   - ``screen="int8"`` (default): every grid vector is quantised once with one global scale ``S = max|x| / 127``,
     ``x = S x^ + e`` with ``|e_k| <= S/2``; tiles are exact int32 products ``x^ . y^`` (``torch._int_mm``: VNNI /
     AVX2 integer kernels, half the time of a float32 product and a quarter of its memory). Then
     ``|x.y - S^2 x^.y^| <= (S/2)(|x|_1 + |y|_1 + d S) + d S^2/4 =: B_x`` (with ``|y|_1`` bounded by its maximum over
     all rows), and a pair is a candidate iff ``x^.y^ >= floor((t - B_x) / S^2) - 1`` (an integer compare per row);
   - ``screen="float32"``: BLAS float32 tiles; a float32 dot product of vectors of norm at most ``r`` is within
     ``gamma_d r^2`` of the exact value, ``gamma_d = d u / (1 - d u)``, ``u = 2^-24`` (Higham, *Accuracy and Stability
     of Numerical Algorithms*, 3.1), for any summation order: candidates are the pairs with score
     ``>= t - 2 gamma_d r^2``.
2. refine: exact similarities of the candidate pairs (vectorised over pairs); keep ``sim >= t``.
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

#: Grid of the similarity: embeddings are rounded to multiples of 2^-GRID_BITS.
GRID_BITS = 20
_SCALE = float(2**GRID_BITS)
#: Default block of phrases and chunk of seeds of the fast path (B x C float32 scores = 64 MiB).
DEFAULT_BLOCK = 2048
DEFAULT_SEED_CHUNK = 8192
#: Pairs refined exactly at once (memory: pairs x d x 16 bytes); rows converted at once elsewhere.
_PAIR_CHUNK = 8192
_ROW_CHUNK = 16384


@dataclass
class Clustering:
    """Result of a greedy clustering of ``n`` phrases (rows in input order).

    Attributes:
        labels: ``(n,)`` int64, the cluster of each phrase; clusters are numbered in seed order.
        seeds: ``(n_clusters,)`` int64, the input row of each cluster's seed.
        seed_sim: ``(n,)`` float64, the similarity of each phrase to its cluster's seed (the seed's own squared norm
            on the grid, about 1, for seeds).
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


def visit_order(counts: Sequence[int] | np.ndarray, phrases: Sequence[str]) -> np.ndarray:
    """The paper's visiting order: count descending, ties by phrase text (code-point order) ascending.

    Returns ``(n,)`` int64 input rows."""
    counts = np.asarray(counts, np.int64)
    if len(counts) != len(phrases):
        raise ValueError(f"{len(counts)} counts for {len(phrases)} phrases")
    text_rank = np.empty(len(phrases), np.int64)
    text_rank[np.argsort(np.asarray(phrases, dtype=object), kind="stable")] = np.arange(len(phrases))
    return np.lexsort((text_rank, -counts)).astype(np.int64)


def to_grid(emb: np.ndarray) -> np.ndarray:
    """``(n, d)`` float32: rows L2-normalised, then rounded to the ``2^-GRID_BITS`` grid (exact in float32).

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
        scaled = c * (_SCALE / np.sqrt(sq)).astype(np.float32)[:, None]
        out[s:s + _ROW_CHUNK] = np.rint(scaled, out=scaled) * np.float32(1 / _SCALE)  # exact: a power of two
    return out


def threshold_units(threshold: float) -> int:
    """The threshold in grid units: ``sim >= t  <=>  <q, q'> >= ceil(t * 2^(2 GRID_BITS))`` (q, q' integer)."""
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must lie in [-1, 1], got {threshold}")
    return math.ceil(threshold * _SCALE * _SCALE)  # exact: scaling by a power of two


def _int_rows(grid: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Grid rows as integers ``q`` held in float64 (exact). Every partial sum of a dot product of two of them is an
    integer of magnitude at most ``sum_i |q_i q'_i| <= |q| |q'| ~ 2^40 < 2^53``, so float64 arithmetic on them is
    exact in any order (BLAS included)."""
    return np.rint(grid[rows].astype(np.float64) * _SCALE)


def exact_dots(grid: np.ndarray, a: np.ndarray, b: np.ndarray, grid_b: np.ndarray | None = None) -> np.ndarray:
    """``(len(a),)`` int64: exact ``<q_a[i], q_b[i]>`` of rows ``a[i]`` of ``grid`` and ``b[i]`` of ``grid_b``
    (default ``grid``), vectorised over pairs."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    grid_b = grid if grid_b is None else grid_b
    out = np.empty(len(a), np.int64)
    for s in range(0, len(a), _PAIR_CHUNK):
        e = min(s + _PAIR_CHUNK, len(a))
        out[s:e] = np.einsum("ij,ij->i", _int_rows(grid, a[s:e]), _int_rows(grid_b, b[s:e])).astype(np.int64)
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
    """Candidate pairs at a threshold, in one of `SCREENS` (module docstring, step 1), for rows of ``grids``
    (every grid whose rows will be compared: the quantisation scale and the norm bounds cover them all)."""

    def __init__(self, grids: Sequence[np.ndarray], threshold: float, kind: str = "int8"):
        if kind not in SCREENS:
            raise ValueError(f"screen must be one of {SCREENS}, got {kind!r}")
        self.kind, self.t = kind, float(threshold)
        nonempty = [g for g in grids if len(g)]
        self.dim = nonempty[0].shape[1] if nonempty else 1
        if kind == "float32":
            r = max((float(np.sqrt(_sq_norms(g).max())) for g in nonempty), default=1.0)
            self.lo = float(np.float32(self.t - screen_margin(self.dim, r)))
            return
        self.scale = max((max(float(np.abs(c).max(initial=0.0)) for c in _chunks(g)) for g in nonempty),
                         default=1.0) / 127.0 or 1.0
        self.l1_max = max((float(_l1(g).max()) for g in nonempty), default=0.0)

    def encode(self, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray | float]:
        """``(codes, per-row limit)``: float32 rows and the scalar ``lo``, or int8 codes and int64 row thresholds."""
        if self.kind == "float32":
            return grid, self.lo
        codes = np.rint(grid.astype(np.float64) / self.scale).astype(np.int8)
        s = self.scale
        bound = (s / 2) * (_l1(grid) + self.l1_max + self.dim * s) + self.dim * s * s / 4
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


def greedy_cluster(emb: np.ndarray, threshold: float = 0.85, order: np.ndarray | None = None, *,
                   block: int = DEFAULT_BLOCK, seed_chunk: int = DEFAULT_SEED_CHUNK, screen: str = "auto",
                   progress: bool = False) -> Clustering:
    """Cluster ``emb`` (``(n, d)``, any norm; rows are normalised) with the greedy rule of the module docstring.

    ``order``: visiting order as input rows (default: row order; use `visit_order` for most-frequent-first);
    ``screen``: the candidate screen, ``"int8"``, ``"float32"`` (same result, different speed) or ``"auto"`` (int8 when
    torch multiplies int8 matrices, else float32).
    Returns a `Clustering` whose rows refer to the input rows. The result equals `greedy_cluster_loop` exactly.
    """
    from tqdm.auto import tqdm

    grid_in = to_grid(emb)
    n, dim = grid_in.shape
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order must be a permutation of the {n} rows")
    if block < 1 or seed_chunk < 1:
        raise ValueError("block and seed_chunk must be positive")
    grid = np.ascontiguousarray(grid_in[order])  # visiting order from here on: position = row of `grid`
    screen = resolve_screen(screen)
    scr = _Screen([grid], threshold, screen)
    t_int = threshold_units(threshold)
    seeds = _SeedBuffer(dim, np.int8 if screen == "int8" else np.float32)
    label = np.empty(n, np.int64)  # cluster (= seed number) of each position
    value = np.empty(n, np.int64)  # exact dot with the cluster's seed, grid units
    bar = tqdm(total=n, desc=f"greedy clustering t={threshold:g}", unit="phrase", disable=not progress)
    for a in range(0, n, block):
        b = min(a + block, n)
        _cluster_block(grid, a, b, scr, seeds, label, value, t_int, seed_chunk)
        bar.update(b - a)
        bar.set_postfix(clusters=seeds.n, refresh=False)
    bar.close()
    out_labels = np.empty(n, np.int64)
    out_labels[order] = label
    out_sim = np.empty(n, np.float64)
    out_sim[order] = value / (_SCALE * _SCALE)
    return Clustering(labels=out_labels, seeds=order[seeds.pos[: seeds.n]].copy(), seed_sim=out_sim, order=order,
                      threshold=float(threshold))


def _cluster_block(grid, a, b, scr: _Screen, seeds: _SeedBuffer, label, value, t_int, seed_chunk) -> None:
    """Steps 1-4 of the module docstring for positions ``a:b``; appends the block's new seeds to ``seeds``."""
    codes, limit = scr.encode(grid[a:b])
    n_old = seeds.n
    # 1-2: old seeds
    r, c = scr.pairs(codes, limit, seeds.codes[:n_old], seed_chunk)
    v = exact_dots(grid, r + a, seeds.pos[c]) if len(r) else np.zeros(0, np.int64)
    keep = v >= t_int
    old_r, old_v, old_s = r[keep], v[keep], c[keep]
    has_old = np.zeros(b - a, bool)
    has_old[old_r] = True
    # 3: the block's potential seeds and every block row's pairs with earlier potential seeds
    pot = np.flatnonzero(~has_old)  # block-local rows, ascending = visiting order
    r2, c2 = scr.pairs(codes, limit, codes[pot], seed_chunk)  # c2 indexes `pot`
    before = pot[c2] < r2
    r2, c2 = r2[before], c2[before]
    v2 = exact_dots(grid, r2 + a, pot[c2] + a) if len(r2) else np.zeros(0, np.int64)
    keep = v2 >= t_int
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
        value[a + new_local] = exact_dots(grid, a + new_local, a + new_local)
        seeds.add(codes[new_local], a + new_local)
    if len(br) + len(new_local) != b - a:  # cannot happen: a non-seed has a pair at >= t by construction
        raise RuntimeError(f"internal error: positions {a}..{b} were not all assigned")


def greedy_cluster_loop(emb: np.ndarray, threshold: float = 0.85, order: np.ndarray | None = None, *,
                        exact: bool = True, start: int = 0, stop: int | None = None,
                        initial_seeds: np.ndarray | None = None) -> Clustering:
    """The straightforward reference: one phrase at a time against the current seed matrix (numpy).

    ``exact=True`` compares exact grid dot products (the definition, for tests); ``exact=False`` uses float32
    matrix-vector products (the fastest plain loop, for timing). ``start``/``stop`` visit only positions
    ``start:stop`` of the order, starting from ``initial_seeds`` (input rows of the seeds founded before ``start``,
    in seed order); rows outside the range get label -1.
    """
    grid_in = to_grid(emb)
    n, dim = grid_in.shape
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    t_int = threshold_units(threshold)
    stop = n if stop is None else min(stop, n)
    init = np.zeros(0, np.int64) if initial_seeds is None else np.asarray(initial_seeds, np.int64)
    labels = np.full(n, -1, np.int64)
    sims = np.full(n, np.nan)
    scale2 = 1.0 if not exact else _SCALE * _SCALE
    cap = len(init) + max(stop - start, 0)
    mat = np.empty((max(cap, 1), dim), np.float64 if exact else np.float32)
    mat[: len(init)] = _int_rows(grid_in, init) if exact else grid_in[init]
    seed_rows = list(init)
    for i in range(start, stop):
        row = int(order[i])
        q = _int_rows(grid_in, np.array([row]))[0] if exact else grid_in[row]
        s = len(seed_rows)
        if s:
            dots = mat[:s] @ q
            k = int(np.argmax(dots))  # the first maximum: the earliest seed
            if dots[k] >= (t_int if exact else threshold):
                labels[row] = k
                sims[row] = float(dots[k]) / scale2
                continue
        mat[s] = q
        seed_rows.append(row)
        labels[row] = s
        sims[row] = float(q @ q) / scale2
    return Clustering(labels=labels, seeds=np.asarray(seed_rows, np.int64), seed_sim=sims, order=order,
                      threshold=float(threshold))


def _pairs_at_least(ga: np.ndarray, gb: np.ndarray, threshold: float, block: int, seed_chunk: int,
                    screen: str = "auto"):
    """Exact pairs (row of ga, row of gb, dot in grid units) with similarity ``>= threshold`` (screen + refine)."""
    t_int = threshold_units(threshold)
    scr = _Screen([ga, gb], threshold, resolve_screen(screen))
    targets = scr.encode(gb)[0] if len(gb) else gb
    rows, cols, vals = [], [], []
    for a in range(0, len(ga), block):
        codes, limit = scr.encode(ga[a:a + block])
        r, c = scr.pairs(codes, limit, targets, seed_chunk)
        v = exact_dots(ga, r + a, c, gb) if len(r) else np.zeros(0, np.int64)
        keep = v >= t_int
        rows.append(r[keep] + a)
        cols.append(c[keep])
        vals.append(v[keep])
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))  # noqa: E731
    return cat(rows), cat(cols), cat(vals)


def assign(emb: np.ndarray, seed_emb: np.ndarray, threshold: float, *, block: int = DEFAULT_BLOCK,
           seed_chunk: int = DEFAULT_SEED_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Canonicalize new phrases against a fixed seed set with the same rule: each row of ``emb`` joins the most
    similar row of ``seed_emb`` at ``>= threshold`` (ties: the lowest seed row), or none.

    Returns ``(seed row (n,) int64, -1 for none; similarity (n,) float64, NaN for none)``."""
    ga, gb = to_grid(emb), to_grid(seed_emb)
    r, c, v = _pairs_at_least(ga, gb, threshold, block, seed_chunk)
    br, bv, bs = _best_per_row(r, v, c)
    idx = np.full(len(ga), -1, np.int64)
    sim = np.full(len(ga), np.nan)
    idx[br] = bs
    sim[br] = bv / (_SCALE * _SCALE)
    return idx, sim


def similar_pairs(emb: np.ndarray, threshold: float, *, block: int = DEFAULT_BLOCK,
                  seed_chunk: int = DEFAULT_SEED_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """All ordered pairs ``(i, j)``, ``i != j``, of rows of ``emb`` with similarity ``>= threshold``, sorted by
    ``(i, j)``; never materialises the ``n x n`` matrix."""
    g = to_grid(emb)
    r, c, _ = _pairs_at_least(g, g, threshold, block, seed_chunk)
    keep = r != c
    r, c = r[keep], c[keep]
    by = np.lexsort((c, r))
    return r[by], c[by]
