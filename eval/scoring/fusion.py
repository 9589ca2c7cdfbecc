"""`FusionSource`: the z-score fusion of several score sources, scored in one pass over the corpus.

``s(i, j) = sum_k w_k (s_k(i, j) - mu_k(i)) / sigma_k(i) = sum_k a_k(i) s_k(i, j) - b(i)``: per query an affine
combination of the inputs' scores, with ``mu_k(i)``, ``sigma_k(i)`` the mean and (population) std of input k's
scores of query i over all ``n_items`` corpus rows (the PSR paper's score-level fusion).

Where the statistics come from, per input:

- a closed form (`eval.scoring.DenseSource` with one vector per query, where its ``d x d`` product costs less than
  a pass of the queries: ``<u, mu>`` and ``u^T C u``), or a source
  with a per-block cache (``cached_blocks``: a state-space source, whose streamed moments cost gathers, not a
  product): taken for every query before scoring, as `ScoreSource.moments` gives them;
- otherwise (K samples reduced by max or mean, a duck-typed source) the statistics need the input's score of every
  corpus item: the query block's scores are computed once, chunk by chunk (the calls `stream_moments` makes), the
  block's statistics are taken from them, and the scorer's tiles of that block are then served from those same
  arrays (``cache``). The corpus is therefore scored once per input, never twice. Memory: ``q_block x n_items``
  float32 per such input while its block is scored (512 x 218,276 x 4 B = 447 MB at PSR scale).

A tile served from the cache is the very array the uncached fusion computes for it (same call, same query block and
corpus chunk), and the statistics are the same arithmetic on the same numbers, so the fused scores are bitwise
those of two separate passes; a call the cache does not hold exactly (another query block or corpus chunk than the
fusion's ``q_block`` / ``c_chunk``) is computed as before. Calls on index arrays (the scorer's pass A on the
positives) are gathered from the cache; the scorer's results depend only on its tiles (`eval.scoring.block`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval.errors import InputError
from eval.scoring.sources import (
    DEFAULT_C_CHUNK,
    DEFAULT_Q_BLOCK,
    SPREAD_RTOL,
    ScoreSource,
    _as_index,
    as_score_source,
    check_out,
    stream_moments,
    tile_buffer,
)


def combine(scores: Sequence[np.ndarray], a: np.ndarray, b: np.ndarray, scratch: int | None = None) -> np.ndarray:
    """``sum_k a[k][:, None] * scores[k] - b[:, None]``. float32 tiles go through one numba pass
    (`eval.scoring._combine`, bitwise numpy's float32 arithmetic); anything else through numpy.

    The result is a new array, except that ``scores[scratch]`` (an array its caller owns and discards: a fresh
    product, not a view of a score matrix or a cached chunk) may be overwritten with it: a 512 x 16,384 tile freshly
    allocated costs more page faults than the pass itself. No other input is ever written to."""
    if len({np.shape(s) for s in scores}) != 1:
        raise InputError(f"fusion inputs gave score blocks of different shapes {[np.shape(s) for s in scores]}")
    if all(s.dtype == np.float32 and s.ndim == 2 and s.flags.c_contiguous for s in scores):
        from eval.scoring import _combine

        # elementwise, each element read before it is written: the result may take a scratch input's place (with
        # three inputs or more, only the first's: the later ones are read after the first pass has written)
        if scratch is not None and (len(scores) <= 2 or scratch == 0):
            out = scores[scratch]
        else:
            out = np.empty(scores[0].shape, np.float32)
        if len(scores) == 1:
            _combine.scale_minus(scores[0], a[0], b, out)
        elif len(scores) == 2:
            _combine.combine2(scores[0], scores[1], a[0], a[1], b, out)
        else:
            _combine.scale(scores[0], a[0], out)
            for s, ak in zip(scores[1:-1], a[1:-1], strict=True):
                _combine.add_scaled(out, s, ak)
            _combine.add_scaled_minus(out, scores[-1], a[-1], b)
        return out
    out = None
    for s, ak in zip(scores, a, strict=True):
        t = np.multiply(s, ak[:, None])
        out = t if out is None else np.add(out, t, out=out)
    out -= b[:, None]
    return out


def needs_full_scores(src: ScoreSource) -> bool:
    """True when ``src``'s statistics need its score of every corpus item and each score costs a product (no
    closed form, no per-block cache): the fusion computes such an input's block once and keeps it (`_BlockCache`)."""
    return src.streams_moments() and not src.cached_blocks


class _Chunks(ScoreSource):
    """One query block of one input, held as its corpus chunks (the arrays ``src.scores(block, chunk)`` returned)."""

    def __init__(self, block: slice, chunks: list[np.ndarray], c_chunk: int, n_items: int):
        self.block, self.chunks, self.c_chunk = block, chunks, c_chunk
        self.n_queries, self.n_items = block.stop - block.start, n_items

    def chunk(self, q: slice, items: slice) -> np.ndarray | None:
        """The cached array of exactly (``q`` within the block, ``items`` = one whole chunk), else None."""
        c, r = divmod(items.start, self.c_chunk)
        if r or items.stop != min(self.n_items, items.start + self.c_chunk) or c >= len(self.chunks):
            return None
        return self.chunks[c][q.start - self.block.start:q.stop - self.block.start]

    def gather(self, q: slice, idx: np.ndarray) -> np.ndarray:
        """Scores of block rows ``q`` for corpus rows ``idx`` (any order), gathered chunk by chunk."""
        rows = slice(q.start - self.block.start, q.stop - self.block.start)
        out = np.empty((q.stop - q.start, len(idx)), np.float32)
        which = idx // self.c_chunk
        for c in np.unique(which):
            sel = np.flatnonzero(which == c)
            out[:, sel] = self.chunks[int(c)][rows][:, idx[sel] - int(c) * self.c_chunk]
        return out

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        """Block-local ``q`` (`stream_moments` on the block asks for ``0..n``, chunk by chunk)."""
        shifted = slice(q.start + self.block.start, q.stop + self.block.start)
        got = self.chunk(shifted, items) if isinstance(items, slice) else None
        return got if got is not None else self.gather(shifted, np.arange(items.start, items.stop))


@dataclass
class _BlockCache:
    """The fusion block being scored: its query rows and, per input that needs them, its chunks (`_Chunks`)."""

    block: slice
    inputs: dict[int, _Chunks]


class FusionSource(ScoreSource):
    """Z-score fusion of several sources over the same queries and corpus (module docstring).

    A source whose scores are constant for query i (``sigma_k(i) <= SPREAD_RTOL * rms_k(i)``, `SPREAD_RTOL`)
    contributes 0 to that query; a source constant for every query, or with a non-finite mean or std, is refused
    (`eval.errors.InputError` naming it). ``weights`` default to 1; ``names`` name the sources in messages.
    Computed elementwise in float32, so tied inputs stay tied. Inputs that are not `ScoreSource` objects are
    adapted (`as_score_source`). ``q_block`` and ``c_chunk`` are the grid of the statistics (and of the cache): the
    scorer's own grid (`eval.scoring.score_stream`, default the same) lets every tile come from the cache.
    """

    fresh_arrays = True  # a new array, or an input's fresh one holding the result (`combine`)

    def __init__(self, sources: Sequence[Any], weights: Sequence[float] | None = None,
                 c_chunk: int = DEFAULT_C_CHUNK, q_block: int = DEFAULT_Q_BLOCK, names: Sequence[str] | None = None):
        if not sources:
            raise InputError("FusionSource needs at least one source")
        self.sources = [as_score_source(s) for s in sources]
        nq = {s.n_queries for s in self.sources}
        ni = {s.n_items for s in self.sources}
        if len(nq) != 1 or len(ni) != 1:
            raise InputError(f"sources disagree on shape: n_queries {sorted(nq)}, n_items {sorted(ni)}")
        self.weights = np.ones(len(sources)) if weights is None else np.asarray(weights, dtype=np.float64)
        if self.weights.shape != (len(sources),):
            raise InputError(f"{len(sources)} sources but {self.weights.size} weights")
        self.names = [s.label for s in self.sources] if names is None else list(names)
        self.n_queries, self.n_items = nq.pop(), ni.pop()
        self._c_chunk, self._q_block = max(1, int(c_chunk)), max(1, int(q_block))
        self._full = [k for k, s in enumerate(self.sources) if needs_full_scores(s)]
        # pass A may ask for a whole block at once when every input answers it with a gather
        self.cached_blocks = all(s.cached_blocks or k in self._full for k, s in enumerate(self.sources))
        n = len(self.sources)
        self._mean = np.full((n, self.n_queries), np.nan)
        self._std = np.full((n, self.n_queries), np.nan)
        #: per input: its statistics are known for every query (inputs without full scores), or it is known not to
        #: be constant for every query (inputs with full scores: `_decide_constant`)
        self._known = np.zeros(n, bool)
        self._a = np.zeros((n, self.n_queries), np.float32)
        self._b = np.zeros(self.n_queries, np.float32)
        self._ready = np.zeros(self.n_queries, bool)  # a, b final for that query
        self._cache: _BlockCache | None = None
        self._buffers: dict[int, np.ndarray] = {}  # scores_into: input k's reused tile
        #: bool (n_sources, n_q): the source was constant for that query (weight 0); filled as blocks are scored
        #: (every query after `coefficients`)
        self.constant = np.zeros((n, self.n_queries), bool)

    # --- statistics ---------------------------------------------------------------------------------------------
    def _blocks(self, q: slice) -> list[slice]:
        """The fusion blocks overlapping ``q``."""
        first, qb = (q.start // self._q_block) * self._q_block, self._q_block
        return [slice(a, min(self.n_queries, a + qb)) for a in range(first, q.stop, qb)]

    def _statistics_upfront(self) -> None:
        """Moments of every input that has a closed form or a per-block cache, for every query (cheap), and the
        all-constant check of those inputs."""
        for k, src in enumerate(self.sources):
            if self._known[k] or k in self._full:
                continue
            for q in self._blocks(slice(0, self.n_queries)):
                self._mean[k, q], self._std[k, q] = src.moments(q, self._c_chunk)
            self._check(k, slice(0, self.n_queries))
            self._refuse_if_always_constant(k)
            self._known[k] = True

    def _check(self, k: int, q: slice) -> None:
        """Refuse non-finite statistics of input k on queries ``q``; mark where it is constant."""
        mean, std = self._mean[k, q], self._std[k, q]
        bad = ~(np.isfinite(mean) & np.isfinite(std))
        if bad.any():
            raise InputError(f"fusion input {k} ({self.names[k]}) has a non-finite score mean or std for query row "
                             f"{q.start + int(np.flatnonzero(bad)[0])} ({int(bad.sum())} queries of rows {q.start}-"
                             f"{q.stop - 1}): its scores hold NaN or inf", fix="check that input's query and item vectors")
        self.constant[k, q] = std <= SPREAD_RTOL * np.sqrt(mean * mean + std * std)

    def _refuse_if_always_constant(self, k: int) -> None:
        if self.n_queries and self.constant[k].all():
            std = self._std[k]
            raise InputError(f"fusion input {k} ({self.names[k]}) gives every query constant scores (spread "
                             f"<= 2^-16 of their magnitude, largest std {float(std.max()):.3g}): it carries "
                             "no ranking information", fix="leave it out of the fusion")

    def _finish(self, q: slice) -> None:
        """Slopes ``a_k = w_k / sigma_k`` (0 where constant) and offset ``b = sum_k a_k mu_k`` of queries ``q``,
        float64 then float32 (the arithmetic of the two-pass fusion, query by query)."""
        a = np.zeros((len(self.sources), q.stop - q.start))
        b = np.zeros(q.stop - q.start)
        for k in range(len(self.sources)):
            ok = ~self.constant[k, q]
            a[k, ok] = self.weights[k] / self._std[k, q][ok]
            b += a[k] * self._mean[k, q]
        self._a[:, q], self._b[q] = a.astype(np.float32), b.astype(np.float32)
        self._ready[q] = True

    def _block_statistics(self, block: slice, keep: bool) -> None:
        """Statistics of ``block`` for the inputs that need full scores: their chunks are computed once (kept as the
        block's cache when ``keep``), then `stream_moments` runs on them."""
        self._statistics_upfront()
        if keep:
            self._cache = None  # free the previous block's arrays first
        inputs = {}
        for k in self._full:
            src = self.sources[k]
            chunks = [np.asarray(src.scores(block, slice(c, min(self.n_items, c + self._c_chunk))))
                      for c in range(0, self.n_items, self._c_chunk)]
            held = _Chunks(block, chunks, self._c_chunk, self.n_items)
            self._mean[k, block], self._std[k, block] = stream_moments(held, slice(0, held.n_queries), self._c_chunk)
            self._check(k, block)
            if not self._known[k]:
                self._decide_constant(k, block)
            inputs[k] = held
        self._finish(block)
        self._cache = _BlockCache(block, inputs) if keep else None

    def _decide_constant(self, k: int, block: slice) -> None:
        """Input k's first block: if it varies for some query there, input k is not constant for every query;
        otherwise (a degenerate input) take every other block's statistics now, one pass, and refuse it if it is
        constant everywhere, before anything is scored."""
        if self.constant[k, block].all():
            for other in self._blocks(slice(0, self.n_queries)):
                if other != block:
                    self._mean[k, other], self._std[k, other] = self.sources[k].moments(other, self._c_chunk)
                    self._check(k, other)
            self._refuse_if_always_constant(k)
        self._known[k] = True

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """``(a, b)``: float32 (n_sources, n_q) slopes ``w_k / sigma_k`` (0 where source k is constant for the
        query) and float32 (n_q,) offset ``sum_k a_k mu_k``, so that ``s = sum_k a_k s_k - b``. Computes every
        query's statistics (one pass over the corpus for the inputs without a closed form)."""
        self._statistics_upfront()
        for block in self._blocks(slice(0, self.n_queries)):
            if not self._ready[block].all():
                self._block_statistics(block, keep=False)
        return self._a, self._b

    def _prepare(self, q: slice) -> None:
        """Make ``a``, ``b`` of queries ``q`` final; keep the cache of the block holding ``q`` (if one does)."""
        blocks = self._blocks(q)
        for block in blocks:
            held = self._cache is not None and self._cache.block == block
            if not held and (not self._ready[block].all() or (len(blocks) == 1 and self._full)):
                self._block_statistics(block, keep=len(blocks) == 1)

    # --- scores -------------------------------------------------------------------------------------------------
    def _held(self, k: int, q: slice) -> _Chunks | None:
        """Input k's kept chunks when the block cache holds queries ``q``, else None."""
        held = self._cache.inputs.get(k) if self._cache is not None else None
        return held if held is not None and held.block.start <= q.start and q.stop <= held.block.stop else None

    def _input_scores(self, k: int, q: slice, items: slice | np.ndarray) -> tuple[np.ndarray, bool]:
        """Input k's scores, and whether the array is a fresh one nobody else holds (a gather from the cache, a call
        of a source with ``fresh_arrays``; not a cached chunk)."""
        held = self._held(k, q)
        if held is not None:
            if isinstance(items, slice):
                got = held.chunk(q, items)
                if got is not None:
                    return got, False
            else:
                return held.gather(q, items), True
        src = self.sources[k]
        return src.scores(q, items), src.fresh_arrays

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        q = slice(*q.indices(self.n_queries)[:2])
        items = _as_index(items, self.n_items)
        self._prepare(q)
        got = [self._input_scores(k, q, items) for k in range(len(self.sources))]
        scratch = next((k for k, (arr, fresh) in enumerate(got) if fresh and arr.dtype == np.float32), None)
        return combine([arr for arr, _ in got], self._a[:, q], self._b[q], scratch)

    def scores_into(self, q: slice, items: slice, out: np.ndarray) -> np.ndarray:
        """`scores`, with every input that is not read from the block's cache written into a buffer: the first into
        ``out``, the others into buffers the fusion keeps (valid until its next call); the fused tile takes one of
        them (`combine`). No fresh tile is allocated."""
        if not isinstance(items, slice):
            return self.scores(q, items)
        q = slice(*q.indices(self.n_queries)[:2])
        items = _as_index(items, self.n_items)
        shape = (q.stop - q.start, items.stop - items.start)
        check_out(out, shape)
        self._prepare(q)
        got, spare = [], out
        for k in range(len(self.sources)):
            if self._held(k, q) is not None:
                got.append(self._input_scores(k, q, items))
                continue
            if spare is None:
                kept = self._buffers.get(k)
                spare = tile_buffer(*shape, kept)
                if kept is None or kept.size < spare.size:  # a new buffer (the kept one was too small)
                    self._buffers[k] = spare
            arr = self.sources[k].scores_into(q, items, spare)
            got.append((arr, arr is spare or self.sources[k].fresh_arrays))
            spare = None if arr is spare else spare
        scratch = next((k for k, (arr, fresh) in enumerate(got) if fresh and arr.dtype == np.float32), None)
        return combine([arr for arr, _ in got], self._a[:, q], self._b[q], scratch)

    def nonfinite_origin(self, i: int, j: int) -> str:
        """Which input gave query ``i`` a non-finite score for item ``j``, or that the fused z-score overflowed."""
        for k, src in enumerate(self.sources):
            v = float(np.asarray(src.scores(slice(i, i + 1), np.array([j])))[0, 0])
            if not np.isfinite(v):
                return f" (fusion input {k}, {self.names[k]}, gave {v})"
        return " (every fusion input is finite there: the fused z-score overflowed)"
