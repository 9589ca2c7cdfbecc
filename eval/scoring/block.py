"""One query block of `eval.scoring.score_stream`: its rows (`BlockContext`), its scoring, its result (`BlockResult`).

Steps (`score_block`):

1. pass A (`positive_scores`): the block's positives are scored in calls on the union of their rows; per query and
   pool the best positive score ``t`` and the lowest corpus row among the positives scoring ``t`` follow
   (`Thresholds`);
2. the stream (`stream_tiles`): one ``source.scores`` call per corpus chunk; the fused kernel (`eval.scoring._tile`)
   counts items ``> t``, ``== t`` and ``== t`` below the first tied positive's row (`TileCounts`) and keeps the
   running top-k (`TopK`); the positives', probes' and own-video rows' scores are gathered from the same tiles;
3. consistency: if a positive's tile score differs from its pass-A score in any bit (a BLAS path that rounds
   differently), the block is streamed again with the thresholds taken from the tiles, so every count refers to one
   set of scores (a positive and a negative with bitwise-equal scores are always recognised as tied); `PassAPlan`
   probes the source for this before the first block and makes pass A call it so that its scores are the tiles';
4. per pool (`pool_statistics`): the tile counts minus the positives' and, for cross-instance pools, the own-video
   rows' contributions, known from their gathered scores; per probe (`probe_statistics`) the best score;
5. the tie-aware nDCG information (`ranked_positives`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval.errors import EngineError, InputError
from eval.runs import RankedPositives
from eval.scoring.sources import ScoreSource, tile_buffer

#: Queries per pass-A call for sources without a per-block cache (see `positive_scores`).
PASS_A_QUERIES = 64
#: Rank statistics of a pool, per query (``eval.scoring`` module docstring); probes hold ``n_pos`` and ``best``.
STAT_FIELDS = ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first", "best")
PROBE_STAT_FIELDS = ("n_pos", "best")


@dataclass(frozen=True)
class Labels:
    """How the scorer's errors name the source, a query (source row) and a corpus item (corpus row)."""

    source: str
    query_ids: Sequence[str] | None = None
    item_ids: Sequence[str] | None = None

    def query(self, i: int) -> str:
        return f"query {self.query_ids[i]!r} (source row {i})" if self.query_ids is not None else f"query row {i}"

    def item(self, j: int) -> str:
        return f"corpus item {self.item_ids[j]!r} (row {j})" if self.item_ids is not None else f"corpus row {j}"

    def nonfinite(self, source: ScoreSource, i: int, j: int, value: float) -> InputError:
        """The error for a non-finite score of source row ``i`` for corpus row ``j``."""
        return InputError(f"score source {self.source}{source.nonfinite_origin(i, j)} gave {self.query(i)} the score "
                          f"{value} for {self.item(j)}: scores must be finite (NaN and +-inf break the rank counts)",
                          fix="check the method's query and item vectors (or score function) for NaN/inf")


class BlockRows:
    """Corpus rows of one pool (or probe, or the own-video exclusion) for the queries of one block, as
    (block-local query, corpus row) pairs sorted by corpus row, with the score of each pair once gathered.

    ``query``, ``rows``: int64 ``(n,)``; ``keys``: sorted ``query * n_items + rows``; ``scores``: float32 ``(n,)``,
    -inf until `gather` has seen the tile holding the pair."""

    def __init__(self, query: np.ndarray, rows: np.ndarray, n_items: int):
        self.query, self.rows = query, rows
        self.keys = np.sort(query * n_items + rows)
        self.scores = np.full(len(rows), -np.inf, dtype=np.float32)

    @classmethod
    def of_lists(cls, lists: Sequence[np.ndarray], a: int, b: int, n_items: int) -> BlockRows:
        """The rows ``lists[i]`` of queries ``a <= i < b``, deduplicated (`IndexError` naming a row outside the
        corpus)."""
        return cls(*_flatten(lists, a, b, n_items), n_items)

    @classmethod
    def empty(cls, n_items: int) -> BlockRows:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), n_items)

    def gather(self, tile: np.ndarray, c0: int, c1: int) -> None:
        """Record the scores of the pairs whose row lies in the tile's columns ``c0:c1``."""
        i0, i1 = np.searchsorted(self.rows, [c0, c1])
        if i1 > i0:
            self.scores[i0:i1] = tile[self.query[i0:i1], self.rows[i0:i1] - c0]

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """bool per key ``query * n_items + row``: the pair is one of these rows."""
        if not len(self.keys) or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return self.keys[pos] == keys

    def without(self, other: BlockRows, n_items: int) -> BlockRows:
        """These pairs minus those in ``other``."""
        if not len(other.keys):
            return self
        keep = ~other.contains(self.query * n_items + self.rows)
        return BlockRows(self.query[keep], self.rows[keep], n_items)


def sorted_unique(a: np.ndarray, *, counts: bool = False):
    """``np.unique`` of an int64 array (with ``counts``: and how often each value occurs) by one sort: numpy's
    hash-based unique is many times slower on millions of distinct keys."""
    a = np.sort(np.asarray(a, np.int64))
    start = np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1]))) if len(a) else np.zeros(0, np.int64)
    if not counts:
        return a[start]
    return a[start], np.diff(np.concatenate((start, [len(a)]))).astype(np.int64)


def _flatten(lists: Sequence[np.ndarray], a: int, b: int, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of queries a..b-1 as (local query index, row), deduplicated, sorted by row."""
    parts = [np.asarray(lists[i], dtype=np.int64).ravel() for i in range(a, b)]
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=b - a)
    rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= n_items):
        bad = int(np.flatnonzero((rows < 0) | (rows >= n_items))[0])
        qi = int(np.searchsorted(np.cumsum(sizes), bad, side="right")) + a
        raise InputError(f"query {qi}: corpus row {int(rows[bad])} out of range [0, {n_items})")
    n_q = max(b - a, 1)
    # row-major keys: one sort orders the pairs by row (then query) and drops the repeats
    key = sorted_unique(rows * n_q + np.repeat(np.arange(b - a, dtype=np.int64), sizes))
    return key % n_q, key // n_q


@dataclass
class BlockContext:
    """Everything about one query block (source rows ``queries``) that scoring it needs besides the source.

    ``pools`` / ``probes``: name -> `BlockRows` (a cross-instance pool's own-video rows already removed); ``excluded``:
    the own-video rows, removed from the top-k list and from every pool not in ``unexcluded``; ``k``: list length;
    ``c_chunk``: corpus items per tile; ``labels``: how errors name things."""

    queries: slice
    n_items: int
    k: int
    c_chunk: int
    pools: dict[str, BlockRows]
    probes: dict[str, BlockRows]
    excluded: BlockRows
    unexcluded: frozenset[str]
    labels: Labels

    @classmethod
    def build(cls, queries: slice, *, pools: dict[str, Sequence[np.ndarray]], probes: dict[str, Sequence[np.ndarray]],
              exclude: Sequence[np.ndarray] | None, unexcluded: frozenset[str], n_items: int, k: int, c_chunk: int,
              labels: Labels) -> BlockContext:
        """The block's rows from the per-query lists of the whole job."""
        a, b = queries.start, queries.stop
        excluded = BlockRows.of_lists(exclude, a, b, n_items) if exclude is not None else BlockRows.empty(n_items)
        block_pools = {}
        for name, lists in pools.items():
            rows = BlockRows.of_lists(lists, a, b, n_items)
            block_pools[name] = rows if name in unexcluded else rows.without(excluded, n_items)
        block_probes = {name: BlockRows.of_lists(lists, a, b, n_items) for name, lists in probes.items()}
        return cls(queries, n_items, k, c_chunk, block_pools, block_probes, excluded, unexcluded, labels)

    @property
    def size(self) -> int:
        return self.queries.stop - self.queries.start

    @property
    def pool_names(self) -> list[str]:
        return list(self.pools)

    def exclusion_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets (nb + 1,), rows)``: each query's own-video rows, ascending (what the tile kernel skips)."""
        keys = self.excluded.keys
        offsets = np.searchsorted(keys // self.n_items, np.arange(self.size + 1)).astype(np.int64)
        return offsets, keys % self.n_items


@dataclass
class Thresholds:
    """Per query and pool, float32 / int64 ``(nb, max(1, n_pools))``: the best positive score ``best`` (+inf when the
    pool is empty) and ``first_row``, the lowest corpus row among the positives scoring ``best``."""

    best: np.ndarray
    first_row: np.ndarray

    @classmethod
    def of(cls, ctx: BlockContext, positive: dict[str, np.ndarray]) -> Thresholds:
        """From the positives' scores (``positive[pool]`` aligned with ``ctx.pools[pool].rows``)."""
        shape = (ctx.size, max(1, len(ctx.pools)))
        best = np.full(shape, np.inf, np.float32)
        first_row = np.full(shape, np.iinfo(np.int64).max, np.int64)
        for p, (name, g) in enumerate(ctx.pools.items()):
            top = segment_max(g.query, positive[name], ctx.size)
            has = np.isfinite(top)
            best[has, p] = top[has]
            tied = positive[name] == best[g.query, p]
            np.minimum.at(first_row[:, p], g.query[tied], g.rows[tied])
        return cls(best, first_row)


@dataclass
class TileCounts:
    """Counts over every tile of a block, int64 ``(nb, max(1, n_pools))``: items scoring ``> best`` (``above``),
    ``== best`` (``tied``), ``== best`` with corpus row ``< first_row`` (``tied_before_first``); positives and own-video
    rows included (`pool_statistics` subtracts them)."""

    above: np.ndarray
    tied: np.ndarray
    tied_before_first: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, int]) -> TileCounts:
        return cls(np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64))


@dataclass
class TopK:
    """The top-k of a block's queries: ``rows`` int64 ``(nb, k)`` (-1 pads), ``scores`` float32 ``(nb, k)`` (-inf
    pads), sorted by (score desc, corpus row asc), own-video rows left out; ``unlisted`` int64 ``(nb,)``: items
    tied with the k-th score that are not in the list."""

    rows: np.ndarray
    scores: np.ndarray
    unlisted: np.ndarray

    @classmethod
    def empty(cls, nb: int, k: int) -> TopK:
        return cls(np.full((nb, k), -1, np.int64), np.full((nb, k), -np.inf, np.float32), np.zeros(nb, np.int64))


@dataclass
class BlockResult:
    """A scored query block: ``stats[pool][field]`` (`STAT_FIELDS`; probes `PROBE_STAT_FIELDS`) per query, the
    `TopK`, and the `RankedPositives` of its queries."""

    stats: dict[str, dict[str, np.ndarray]]
    top: TopK
    ranked: RankedPositives


def segment_max(query: np.ndarray, scores: np.ndarray, nb: int) -> np.ndarray:
    """float32 ``(nb,)``: the largest score per query (-inf for a query without rows)."""
    out = np.full(nb, -np.inf, dtype=np.float32)
    np.maximum.at(out, query, scores)
    return out


@contextlib.contextmanager
def _one_torch_thread():
    """torch on one thread inside the block (when torch is loaded; otherwise nothing changes)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class PassAPlan:
    """How pass A calls a source, kept across the blocks of one stream (`eval.scoring.score_stream`).

    Pass A scores sub-blocks of `PASS_A_QUERIES` queries, whose unions of positives are small. A source that takes
    query rows in any order (`eval.scoring.ScoreSource.scores_rows`) gets sub-blocks of queries that share
    positives (``grouped``, `_grouping`): where many queries share a large pool (every segment of a state), their
    union is that pool once rather than once per query in the sub-block.

    A BLAS may compute a product with few rows and a long dot product by another algorithm than a full tile's: torch
    on two threads splits such a dot product over its threads (measured on an Intel Xeon at 1,024-d below about 256
    rows; on one thread it rounds as the tile does). Its scores then differ from the tile's in the last bit, and
    step 3 streams the block twice. So before the first block `decide` asks the source once, on a few rows (a
    product of milliseconds), whether a sub-block's scores, gathered in another order (``grouped``) or else as a
    slice, are the whole block's; if not, whether they are on one torch thread (``one_thread``: pass A runs its
    sub-blocks so); if not either, pass A scores whole blocks (``whole_block``, the tile's own row count). A block
    that is streamed twice all the same sets ``whole_block`` for the blocks after it.
    """

    whole_block: bool = False
    one_thread: bool = False
    grouped: bool = False
    decided: bool = False
    #: corpus rows of `decide`'s probe (a product with fewer columns may take yet another path)
    PROBE_ROWS = 1024

    def decide(self, source: ScoreSource, ctx: BlockContext) -> None:
        """Once per stream (sources with a per-block cache answer pass A from it: no probe)."""
        if self.decided:
            return
        self.decided = True
        if source.cached_blocks or ctx.size <= PASS_A_QUERIES or ctx.n_items == 0:
            return
        idx = np.arange(min(ctx.n_items, self.PROBE_ROWS), dtype=np.int64)
        q0 = ctx.queries.start
        full = np.asarray(source.scores(ctx.queries, idx), dtype=np.float32)
        picks = np.arange(ctx.size - 1, -1, -2, dtype=np.int64)[:PASS_A_QUERIES]  # an order no slice has

        def agree() -> bool:
            gathered = source.scores_rows(q0 + picks, idx)
            self.grouped = gathered is not None and np.asarray(gathered, np.float32).tobytes() == full[picks].tobytes()
            if self.grouped:
                return True
            sub = np.asarray(source.scores(slice(q0, q0 + PASS_A_QUERIES), idx), dtype=np.float32)
            return sub.tobytes() == full[:PASS_A_QUERIES].tobytes()

        if agree():
            return
        with _one_torch_thread():
            self.one_thread = agree()
        self.whole_block = not self.one_thread

    def threads(self) -> contextlib.AbstractContextManager:
        """The context pass A's sub-blocks run in."""
        return _one_torch_thread() if self.one_thread and not self.whole_block else contextlib.nullcontext()


def score_block(source: ScoreSource, ctx: BlockContext, bar: Any, plan: PassAPlan | None = None) -> BlockResult:
    """Steps 1-5 of the module docstring for one block (``bar``: a progress bar, one update per tile; ``plan``: how
    pass A calls the source, `PassAPlan`, updated when this block had to be streamed twice)."""
    plan = PassAPlan() if plan is None else plan
    plan.decide(source, ctx)
    with plan.threads():
        positive = positive_scores(source, ctx, whole_block=plan.whole_block, grouped=plan.grouped)
    for name, g in ctx.pools.items():
        bad = np.flatnonzero(~np.isfinite(positive[name]))
        if bad.size:  # a +-inf positive would make its pool look empty or tie with nothing
            x = int(bad[0])
            raise ctx.labels.nonfinite(source, ctx.queries.start + int(g.query[x]), int(g.rows[x]),
                                       float(positive[name][x]))
    for _attempt in range(2):
        thresholds = Thresholds.of(ctx, positive)
        counts, top = stream_tiles(source, ctx, thresholds, bar)
        if all(np.array_equal(g.scores, positive[name]) for name, g in ctx.pools.items()):
            break
        # the source gave a positive a different score in the union call than in its tile (last-bit BLAS
        # differences): re-stream the block with thresholds taken from the tiles themselves
        positive = {name: g.scores.copy() for name, g in ctx.pools.items()}
        plan.whole_block = True
    else:
        raise EngineError("the score source is not deterministic: a positive's score changed between two "
                           "identical passes over the corpus")
    stats = {name: pool_statistics(ctx, name, p, thresholds, counts) for p, name in enumerate(ctx.pools)}
    stats.update({name: probe_statistics(g, ctx.size) for name, g in ctx.probes.items()})
    return BlockResult(stats, top, ranked_positives(ctx, top))


def _pass_a_bounds(nb: int, whole_block: bool) -> list[int]:
    """Query sub-blocks of pass A: the whole block for a caching source, else `PASS_A_QUERIES` at a time, with no
    tiny last sub-block (BLAS may round a 1-2 row product differently)."""
    bounds = list(range(0, nb, nb if whole_block else PASS_A_QUERIES)) + [nb]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < PASS_A_QUERIES // 4:
        del bounds[-2]
    return bounds


def positive_scores(source: ScoreSource, ctx: BlockContext, whole_block: bool = False,
                    grouped: bool = False) -> dict[str, np.ndarray]:
    """Pass A: per pool, float32 scores aligned with ``ctx.pools[pool].rows``, from calls on the union of the
    positives' rows; they fix the thresholds of the stream.

    The cost is (queries x union of their positives); for sources without a per-block cache (``cached_blocks``) it
    is paid in sub-blocks of `PASS_A_QUERIES` queries, whose unions are much smaller than the whole block's, unless
    ``whole_block`` (`PassAPlan`). With ``grouped`` (a source with `eval.scoring.ScoreSource.scores_rows`) the
    sub-blocks hold queries that share positives (`_grouping`) instead of consecutive ones."""
    out = {name: np.full(len(g.rows), -np.inf, np.float32) for name, g in ctx.pools.items()}
    whole = source.cached_blocks or whole_block
    bounds = _pass_a_bounds(ctx.size, whole)
    grouped = grouped and not whole and len(bounds) > 2
    order = _grouping(ctx) if grouped else np.arange(ctx.size, dtype=np.int64)
    place = np.empty(ctx.size, np.int64)  # a block query's position in pass A's order
    place[order] = np.arange(ctx.size, dtype=np.int64)
    at = {name: place[g.query] for name, g in ctx.pools.items()}
    q0 = ctx.queries.start
    for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True):
        sel = {name: np.flatnonzero((p >= s0) & (p < s1)) for name, p in at.items()}
        union = sorted_unique(np.concatenate([ctx.pools[n].rows[i] for n, i in sel.items()] + [np.zeros(0, np.int64)]))
        for u0 in range(0, len(union), ctx.c_chunk):
            urows = union[u0:u0 + ctx.c_chunk]
            called = source.scores_rows(q0 + order[s0:s1], urows) if grouped else \
                source.scores(slice(q0 + s0, q0 + s1), urows)
            scores = np.asarray(called, dtype=np.float32)
            for name, idx in sel.items():
                g = ctx.pools[name]
                rows = g.rows[idx]
                j = idx[(rows >= urows[0]) & (rows <= urows[-1])]
                out[name][j] = scores[at[name][j] - s0, np.searchsorted(urows, g.rows[j])]
    return out


def _grouping(ctx: BlockContext) -> np.ndarray:
    """The block's queries (local indices) ordered so that queries sharing positives are neighbours: by the lowest
    and highest row and the size of their positives in the block's largest pool (equal for queries whose pool is
    the same set, e.g. every segment of their target state), then by query."""
    nb = ctx.size
    lo = np.full(nb, np.iinfo(np.int64).max, np.int64)
    hi = np.full(nb, -1, np.int64)
    size = np.zeros(nb, np.int64)
    if ctx.pools:
        g = max(ctx.pools.values(), key=lambda b: len(b.rows))
        np.minimum.at(lo, g.query, g.rows)
        np.maximum.at(hi, g.query, g.rows)
        size = np.bincount(g.query, minlength=nb)
    return np.lexsort((np.arange(nb), size, hi, lo)).astype(np.int64)


def stream_tiles(source: ScoreSource, ctx: BlockContext, thresholds: Thresholds, bar: Any) -> tuple[TileCounts, TopK]:
    """Step 2: one pass over the corpus in tiles of ``ctx.c_chunk`` items; every `BlockRows` of the block gathers its
    scores from the tiles. A non-finite score is an `InputError` naming the source, the query and the item."""
    from eval.scoring._tile import tile_pass

    nb, n_items = ctx.size, ctx.n_items
    best, first_row = thresholds.best, thresholds.first_row
    floor = best.min(axis=1)
    pool_order = np.argsort(best, axis=1, kind="stable").astype(np.int64)
    counts = TileCounts.zeros(best.shape)
    top = TopK.empty(nb, ctx.k)
    ex_offsets, ex_rows = ctx.exclusion_csr()
    ex_cursor = ex_offsets[:-1].copy()
    n_nonfinite = np.zeros(nb, np.int64)
    gathering = (*ctx.pools.values(), *ctx.probes.values(), ctx.excluded)
    buf = None  # one tile's memory for the whole pass: the source writes each tile into it when it can
    for c0 in range(0, n_items, ctx.c_chunk):
        c1 = min(n_items, c0 + ctx.c_chunk)
        out = tile_buffer(nb, c1 - c0, buf)
        buf = out if buf is None else buf
        tile = np.ascontiguousarray(source.scores_into(ctx.queries, slice(c0, c1), out), dtype=np.float32)
        if tile.shape != (nb, c1 - c0):
            raise InputError(f"the source returned scores of shape {tile.shape}, expected {(nb, c1 - c0)}")
        for g in gathering:
            g.gather(tile, c0, c1)
        tile_pass(tile, np.arange(c0, c1, dtype=np.int64), best, pool_order, first_row, floor, counts.above,
                  counts.tied, counts.tied_before_first, top.scores, top.rows, top.unlisted, ex_offsets, ex_rows,
                  ex_cursor, n_nonfinite)
        if n_nonfinite.any():
            i = int(np.flatnonzero(n_nonfinite)[0])
            j = int(np.flatnonzero(~np.isfinite(tile[i]))[0])
            raise ctx.labels.nonfinite(source, ctx.queries.start + i, c0 + j, float(tile[i, j]))
        bar.update(1)
    return counts, top


def pool_statistics(ctx: BlockContext, name: str, p: int, thresholds: Thresholds,
                    counts: TileCounts) -> dict[str, np.ndarray]:
    """Pool ``name`` (column ``p``): the tile counts minus the positives' and (for a cross-instance pool) the
    own-video rows' contributions, both known from their gathered scores; zeros and ``best`` NaN for a query
    without positives."""
    nb, g, ex = ctx.size, ctx.pools[name], ctx.excluded
    n_pos = np.bincount(g.query, minlength=nb).astype(np.int64)
    has = n_pos > 0
    best, first_row = thresholds.best[:, p], thresholds.first_row[:, p]
    n_tie_pos = np.bincount(g.query[g.scores == best[g.query]], minlength=nb).astype(np.int64)
    n_above = counts.above[:, p].copy()  # positives never score above the best positive
    n_tie_neg = counts.tied[:, p] - n_tie_pos
    n_first = counts.tied_before_first[:, p].copy()  # no tied positive lies below the first tied positive
    if name not in ctx.unexcluded and len(ex.rows):
        best_of_excluded = best[ex.query]
        n_above -= np.bincount(ex.query[ex.scores > best_of_excluded], minlength=nb)
        tied = ex.scores == best_of_excluded
        n_tie_neg -= np.bincount(ex.query[tied], minlength=nb)
        n_first -= np.bincount(ex.query[tied & (ex.rows < first_row[ex.query])], minlength=nb)
    zero = np.zeros(nb, np.int64)
    return {"n_pos": n_pos, "n_above": np.where(has, n_above, zero), "n_tie_neg": np.where(has, n_tie_neg, zero),
            "n_tie_pos": n_tie_pos, "n_tie_neg_first": np.where(has, n_first, zero),
            "best": np.where(has, best, np.nan).astype(np.float32)}


def probe_statistics(g: BlockRows, nb: int) -> dict[str, np.ndarray]:
    """A probe: its number of rows and best score per query (NaN without rows); no rank counting."""
    best = segment_max(g.query, g.scores, nb)
    return {"n_pos": np.bincount(g.query, minlength=nb).astype(np.int64),
            "best": np.where(np.isfinite(best), best, np.nan).astype(np.float32)}


def _main_ranking_positives(ctx: BlockContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct positives of the main ranking (pools not in ``unexcluded``): ``(key, pool bitmask, score)``
    sorted by key ``query * n_items + row`` (bit b = the b-th pool of the block)."""
    keys, masks, scores = [], [], []
    for bit, (name, g) in enumerate(ctx.pools.items()):
        if name in ctx.unexcluded:
            continue  # its positives are removed from the main ranking
        keys.append(g.query * ctx.n_items + g.rows)
        masks.append(np.full(len(g.rows), 1 << bit, np.int64))
        scores.append(g.scores)
    key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    mask = np.concatenate(masks) if masks else np.zeros(0, np.int64)
    score = np.concatenate(scores) if scores else np.zeros(0, np.float32)
    order = np.argsort(key, kind="stable")
    key, mask, score = key[order], mask[order], score[order]
    if len(key):
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        mask = np.bitwise_or.reduceat(mask, first)
        key, score = key[first], score[first]
    return key, mask, score


def ranked_positives(ctx: BlockContext, top: TopK) -> RankedPositives:
    """Step 5: per query, the counts of the main ranking's positives by pool bitmask, and every positive scoring
    at least the k-th score with the number of ranked items strictly above it and its tie-group size (the listed
    items tied with it, plus the unlisted ones when it ties the k-th score), best first."""
    nb = ctx.size
    key, mask, score = _main_ranking_positives(ctx)
    query = key // ctx.n_items
    # the distinct (query, bitmask) pairs in (query, bitmask) order, as one int64 key (a 1-D unique, not axis=0)
    base = int(mask.max()) + 1 if len(mask) else 1
    pair_key, count = sorted_unique(query * base + mask, counts=True)
    count_query, count_mask = pair_key // base, pair_key % base
    count_offsets = np.searchsorted(count_query, np.arange(nb + 1))
    kth = top.scores[:, -1]
    listed = score >= kth[query]
    tq, tm, ts = query[listed], mask[listed], score[listed]
    from eval.scoring._tile import above_and_tied

    above, tie = above_and_tied(np.ascontiguousarray(top.scores), tq, np.ascontiguousarray(ts))
    tie = tie + np.where(ts == kth[tq], top.unlisted[tq], 0)
    order = np.lexsort((above, tq))  # by query, then best first
    tq, tm, above, tie = tq[order], tm[order], above[order], tie[order]
    top_offsets = np.searchsorted(tq, np.arange(nb + 1))
    return RankedPositives(ctx.pool_names, top_offsets, tm, above, tie, count_offsets, count_mask,
                           count.astype(np.int64))
