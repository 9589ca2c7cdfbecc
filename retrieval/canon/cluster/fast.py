r"""The fast path of the greedy rule (`retrieval.canon.cluster.rule`): blocks of phrases, a screen, exact refinement.

`greedy_cluster` visits blocks of ``B`` phrases in visiting order and runs the steps of
`retrieval.canon.cluster.steps` on each: screen the block against the seeds that exist, in tiles of ``C`` seeds
(`retrieval.canon.cluster.screen`), refine the candidates exactly, resolve the block's new seeds, assign the others.
The result equals `greedy_cluster_loop` exactly. `extend_clustering` continues a finished clustering; `assign` and
`similar_pairs` use the same screen + refinement for pairs at ``>= t``.

Cost: the product of each phrase with the seeds that exist when its block starts, at most ``n x S_final x d``
multiply-adds: the cost of one dense product of all phrases against the final seed set (see
`retrieval.canon.speed` for the measured comparison), plus work linear in the candidate pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eval.errors import InputError
from retrieval.canon.cluster.rule import Clustering, check_order
from retrieval.canon.cluster.screen import make_screen
from retrieval.canon.cluster.similarity import ROW_CHUNK, check_threshold, exact_dots, unit_rows
from retrieval.canon.cluster.steps import GreedyPass, SeedBuffer, best_per_row, cluster_block

#: Default block of phrases and chunk of seeds of the fast path (B x C float32 scores = 64 MiB).
DEFAULT_BLOCK = 2048
DEFAULT_SEED_CHUNK = 8192


def greedy_cluster(emb: np.ndarray, threshold: float = 0.85, order: np.ndarray | None = None, *,
                   block: int = DEFAULT_BLOCK, seed_chunk: int = DEFAULT_SEED_CHUNK, screen: str = "auto",
                   progress: bool = False) -> Clustering:
    """Cluster ``emb`` (``(n, d)``; rows are taken to unit norm by `unit_rows`) with the greedy rule
    (`retrieval.canon.cluster.rule`).

    ``order``: visiting order as input rows (default: row order; use `visit_order` for most-frequent-first);
    ``screen``: the candidate screen, ``"int8"``, ``"float32"`` (same result, different speed) or ``"auto"`` (int8 when
    torch multiplies int8 matrices, else float32).
    Returns a `Clustering` whose rows refer to the input rows. The result equals `greedy_cluster_loop` exactly.
    """
    x = unit_rows(emb)
    order = check_order(order, len(x))
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
    the rows of ``emb`` are visited in ``order`` with the greedy rule (joining the best seed, old or
    new, at ``>= threshold``, else founding cluster ``S, S+1, ...``). Equal to clustering the seeds first and these
    phrases after them, when the seeds are pairwise below ``threshold`` (as the seeds of one clustering are)."""
    seeds, new = unit_rows(seed_emb), unit_rows(emb)
    if len(seeds) and len(new) and seeds.shape[1] != new.shape[1]:
        raise InputError(f"embeddings of dimension {new.shape[1]} against seeds of dimension {seeds.shape[1]}")
    order = check_order(order, len(new))
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
        raise InputError("block and seed_chunk must be positive")
    units = np.ascontiguousarray(x[np.concatenate([np.arange(n_fixed, dtype=np.int64), order])])
    n = len(units)
    scr = make_screen(screen, [units], t)
    run = GreedyPass(units, scr, SeedBuffer(units.shape[1], scr.code_dtype, max(1024, n_fixed)),
                     label=np.empty(n, np.int64), value=np.empty(n, np.float64), t=t, seed_chunk=seed_chunk)
    fixed = np.arange(n_fixed, dtype=np.int64)
    run.label[:n_fixed], run.value[:n_fixed] = fixed, exact_dots(units, fixed, fixed)
    for a in range(0, n_fixed, ROW_CHUNK):
        b = min(a + ROW_CHUNK, n_fixed)
        run.seeds.add(scr.encode(units[a:b]).codes, fixed[a:b])
    bar = tqdm(total=n - n_fixed, desc=f"greedy clustering t={t:g}", unit="phrase", disable=not progress)
    for a in range(n_fixed, n, block):
        b = min(a + block, n)
        cluster_block(run, a, b)
        bar.update(b - a)
        bar.set_postfix(clusters=run.seeds.n, refresh=False)
    bar.close()
    return run.label, run.value, run.seeds.pos[: run.seeds.n].copy()


def _pairs_at_least(xa: np.ndarray, xb: np.ndarray, threshold: float, block: int, seed_chunk: int,
                    screen: str = "auto"):
    """Exact pairs (row of xa, row of xb, similarity) with similarity ``>= threshold`` (screen + refine)."""
    t = check_threshold(threshold)
    scr = make_screen(screen, [xa, xb], t)
    targets = scr.encode(xb).codes if len(xb) else xb
    rows, cols, vals = [], [], []
    for a in range(0, len(xa), block):
        r, c = scr.pairs(scr.encode(xa[a:a + block]), targets, seed_chunk)
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
    br, bv, bs = best_per_row(r, v, c)
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
