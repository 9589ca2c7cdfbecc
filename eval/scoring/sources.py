"""Score sources: what `eval.scoring.score_stream` ranks.

A score source gives the score of query ``i`` against corpus row ``j`` on demand, in blocks (`ScoreSource`). Three
are built in: inner products of vectors (`DenseSource`, with a state -> segment expansion and K samples per query),
the z-score fusion of several sources (`FusionSource`) and the random baseline (`RandomSource`). Any other object
with ``n_queries``, ``n_items`` and ``scores(q, items)`` is adapted where it enters (`as_score_source`). The z-score
fusion of several sources is `eval.scoring.fusion.FusionSource`.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.errors import InputError

if TYPE_CHECKING:
    import torch

#: Default tile: 512 queries x 16,384 corpus items (32 MiB of float32 scores).
DEFAULT_Q_BLOCK = 512
DEFAULT_C_CHUNK = 16384
#: Largest (query rows x samples) matrix multiplied at once by `DenseSource` for K > 1.
_MAX_QK_ROWS = 1024
#: A fusion input whose per-query score spread is at most this fraction of the scores' magnitude (their root mean
#: square) counts as constant for that query and gets weight 0. Scores are float32: a spread below 2^-16 of the
#: magnitude spans at most ~2^8 float32 steps, so its z-scores would mostly amplify rounding (an unshifted float32
#: second moment leaves a spread of pure rounding error, ~1e-4 of the magnitude, worth a weight of ~10^4).
SPREAD_RTOL = 2.0 ** -16


class ScoreSource(ABC):
    """Scores of queries against corpus rows, computed on demand.

    A subclass sets ``n_queries`` and ``n_items`` and implements `scores`. It may override:

    - `moments` with a closed form (the default streams the scores once, `stream_moments`);
    - ``cached_blocks`` (``True``): a call on any rows of a query block costs a gather once the block has been
      scored, so the scorer's pass A scores a whole block in one call;
    - ``fresh_arrays`` (``True``): every `scores` call returns a new array that only the caller holds (no view of
      a kept matrix), so a caller may overwrite it (a fusion writes its result into one);
    - `scores_into` to write a tile into the caller's buffer (the scorer reuses one buffer for all its tiles: a
      freshly allocated tile of the default size is mapped anew by the allocator, and its page faults cost a
      sizeable share of its product; `scripts/bench_scoring.py` times both);
    - `scores_rows` to score query rows in any order (the scorer's pass A then groups the queries that share
      positives, whose union of rows is smaller);
    - ``name``: how messages name it (default: its class name);
    - `nonfinite_origin`: which input produced a non-finite score (a fusion names its input).

    A source must be deterministic: the same (query, item) pair gets the same score whichever call computes it (up
    to float rounding for plain dense sources, which `eval.scoring.score_stream` tolerates).
    """

    n_queries: int
    n_items: int
    cached_blocks: bool = False
    fresh_arrays: bool = False
    name: str = ""

    @abstractmethod
    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        """float32 ``(q.stop - q.start, n_sel)``: row ``a`` is query ``q.start + a``, column ``b`` is corpus row
        ``items[b]`` (or ``items.start + b`` for a slice). Higher is better."""

    def scores_into(self, q: slice, items: slice, out: np.ndarray) -> np.ndarray:
        """`scores` of queries ``q`` against the corpus rows ``items`` (a slice), written into ``out`` (C-contiguous
        float32 of the result's shape, owned by the caller) when the source can; returns the array holding them:
        ``out``, or a new array (the default: `scores`). Either stays valid until the caller reuses ``out``."""
        return self.scores(q, items)

    def scores_rows(self, queries: np.ndarray, items: slice | np.ndarray) -> np.ndarray | None:
        """`scores` of the query rows ``queries`` (int64, any order): row ``a`` is query ``queries[a]``; None when
        the source scores slices of queries only (the default)."""
        return None

    def moments(self, q: slice, c_chunk: int = DEFAULT_C_CHUNK) -> tuple[np.ndarray, np.ndarray]:
        """Per-query mean and population std of the scores over all ``n_items`` corpus rows, float64 ``(n_q,)``:
        by default one streaming pass over the corpus in chunks of ``c_chunk`` items (`stream_moments`)."""
        return stream_moments(self, q, c_chunk)

    def streams_moments(self) -> bool:
        """True when `moments` needs the score of every corpus item (`stream_moments`), False for a closed form."""
        return type(self).moments is ScoreSource.moments

    def state_scores(self, q: slice) -> tuple[np.ndarray, np.ndarray] | None:
        """``(S, item_rows)`` when every corpus row ``j`` of queries ``q`` scores ``S[:, item_rows[j]]`` (a
        state-space source: the scorer then works at the state level, `eval.scoring.states`), else None."""
        return None

    def nonfinite_origin(self, i: int, j: int) -> str:
        """Text naming where the non-finite score of query ``i`` for item ``j`` came from ("" for the source
        itself); only called to word an error."""
        return ""

    @property
    def label(self) -> str:
        """How messages name the source: ``name``, else its class name."""
        return str(self.name or type(self).__name__)


class _Foreign(ScoreSource):
    """An object that is not a `ScoreSource` but has ``n_queries``, ``n_items`` and ``scores(q, items)``, adapted
    once (`as_score_source`). Its optional ``scores_into`` is called when it has one. Its optional ``name``,
    ``cached_blocks`` and ``moments`` (which may raise
    `NotImplementedError` for "no closed form") are read here, and only here."""

    def __init__(self, inner: Any):
        missing = [a for a in ("n_queries", "n_items", "scores") if not hasattr(inner, a)]
        if missing:
            raise TypeError(f"{type(inner).__name__} is not a score source: it has no {', '.join(missing)} "
                            "(derive it from eval.scoring.ScoreSource)")
        self.inner = inner
        self.n_queries, self.n_items = int(inner.n_queries), int(inner.n_items)
        self.cached_blocks = bool(getattr(inner, "cached_blocks", False))
        self.name = str(getattr(inner, "name", "") or type(inner).__name__)
        self._moments = getattr(inner, "moments", None)

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        return self.inner.scores(q, items)

    def scores_into(self, q: slice, items: slice, out: np.ndarray) -> np.ndarray:
        own = getattr(self.inner, "scores_into", None)
        return own(q, items, out) if callable(own) else self.inner.scores(q, items)

    def streams_moments(self) -> bool:
        return not callable(self._moments)  # its own `moments` may still raise NotImplementedError (then streamed)

    def moments(self, q: slice, c_chunk: int = DEFAULT_C_CHUNK) -> tuple[np.ndarray, np.ndarray]:
        if callable(self._moments):
            try:
                return self._moments(q)
            except NotImplementedError:
                pass
        return stream_moments(self, q, c_chunk)


def as_score_source(source: Any) -> ScoreSource:
    """``source`` itself when it is a `ScoreSource`, else the object adapted to one (`TypeError` when it lacks
    ``n_queries``, ``n_items`` or ``scores``)."""
    return source if isinstance(source, ScoreSource) else _Foreign(source)


def source_name(source: Any) -> str:
    """How messages name a score source: its ``name`` attribute when it has one, else its class."""
    return as_score_source(source).label


#: Byte alignment of a new tile. numpy aligns a new array to 16 bytes only, and BLAS writing a product into a tile
#: that is not 32-byte aligned splits its vector stores across cache lines (`scripts/bench_scoring.py` times the
#: bare matmul into both).
TILE_ALIGN = 64


def aligned_empty(shape: tuple[int, ...], align: int = TILE_ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous float32 array of ``shape`` whose first element is ``align``-byte aligned."""
    n = int(np.prod(shape, dtype=np.int64)) * 4
    raw = np.empty(n + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + n].view(np.float32).reshape(shape)


def tile_buffer(rows: int, cols: int, buf: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous float32 ``(rows, cols)`` array over the memory of ``buf`` when it holds enough (any shape),
    else a new one, 64-byte aligned (`aligned_empty`): the scorer's reused tile (`ScoreSource.scores_into`)."""
    if buf is not None and buf.size >= rows * cols:
        return buf.reshape(-1)[:rows * cols].reshape(rows, cols)
    return aligned_empty((rows, cols))


def check_out(out: np.ndarray, shape: tuple[int, int]) -> None:
    """``out`` can take a tile of ``shape`` in place (`ScoreSource.scores_into`), else ValueError."""
    if out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"scores_into needs a writable C-contiguous float32 array of shape {shape}, got "
                         f"{out.dtype} {out.shape}")


def _as_index(items: slice | np.ndarray, n: int) -> slice | np.ndarray:
    if isinstance(items, slice):
        start, stop, step = items.indices(n)
        if step != 1:
            return np.arange(start, stop, step, dtype=np.int64)
        return slice(start, stop)
    idx = np.asarray(items, dtype=np.int64)
    if idx.ndim != 1:
        raise InputError(f"items must be a slice or a 1-d index array, got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise InputError(f"item rows out of range [0, {n})")
    return idx


def _torch_view(a: np.ndarray) -> torch.Tensor:
    """A zero-copy torch view of a float32 array (read-only memmaps included; we never write through it)."""
    import torch

    a = np.ascontiguousarray(a, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "array is not writable": we only read
        return torch.from_numpy(a)


class DenseSource(ScoreSource):
    """Inner-product scores of query vectors against item vectors (cosine when both are L2-normalised).

    - ``queries``: ``(n_q, d)`` or ``(n_q, K, d)`` float32; with K samples per query the score is
      ``s(i, j) = max_k <q_{i,k}, x_j>`` (``reduce="max"``, LFTR's K samples, multi-phrase forecasters) or the mean
      over samples (``reduce="mean"``).
    - ``items``: ``(m, d)`` float32 (may be a read-only memmap: it is never copied as a whole).
    - ``item_rows``: optional ``(n_corpus,)`` int array, corpus row -> row of ``items`` (state-space expansion:
      every segment of a state gets its state's score). Scores are then computed for a whole query block against
      all ``m`` items once (cached for the block) and gathered, so tied segments are bitwise identical.

    ``n_items`` is ``n_corpus`` with ``item_rows``, else ``m``.

    ``moments`` (the per-query statistics a fusion needs, `moments`): ``"closed"`` takes them in closed form (one
    query vector per query only), ``"stream"`` from the scores of every item (`stream_moments`; inside a fusion the
    very arrays it scores, `eval.scoring.fusion`), ``"auto"`` the cheaper: the closed form costs one ``d x d``
    product over the ``m`` items, a stream one pass of the ``n_q`` queries (``n_q m d``), so the closed form is
    taken for one vector per query when ``d <= n_q`` or with ``item_rows`` (``m`` states, not the corpus).
    """

    fresh_arrays = True  # a product, or a take from the block's state scores

    def __init__(self, queries: np.ndarray, items: np.ndarray, item_rows: np.ndarray | None = None,
                 reduce: str = "max", moments: str = "auto"):
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 2:
            q = q[:, None, :]
        if q.ndim != 3:
            raise InputError(f"queries must be (n_q, d) or (n_q, K, d), got shape {np.shape(queries)}")
        if items.ndim != 2 or items.shape[1] != q.shape[2]:
            raise InputError(f"items must be (m, {q.shape[2]}), got shape {items.shape}")
        if reduce not in ("max", "mean"):
            raise InputError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        self._q_np = np.ascontiguousarray(q)
        self._items_np = items
        self.reduce = reduce
        self.K = int(q.shape[1])
        self.n_queries = int(q.shape[0])
        if moments not in ("auto", "closed", "stream"):
            raise InputError(f"moments must be 'auto', 'closed' or 'stream', got {moments!r}")
        if moments == "closed" and self.K != 1:
            raise InputError(f"moments='closed' needs one vector per query, got K = {self.K} samples (a max or mean "
                             "over samples is not linear in the query vector)")
        self._closed_form = self.K == 1 and (moments == "closed" or (
            moments == "auto" and (item_rows is not None or int(q.shape[2]) <= self.n_queries)))
        self.m = int(items.shape[0])
        if item_rows is not None:
            item_rows = np.asarray(item_rows, dtype=np.int64)
            if item_rows.ndim != 1:
                raise InputError("item_rows must be 1-d (n_corpus,)")
            if item_rows.size and (item_rows.min() < 0 or item_rows.max() >= self.m):
                raise InputError(f"item_rows must index rows of items in [0, {self.m}); "
                                 "map segments with unknown states explicitly")
        self.item_rows = item_rows
        self.n_items = int(len(item_rows)) if item_rows is not None else self.m
        #: a query block's state-level scores are cached: calls on any rows of the same block cost a gather
        self.cached_blocks = item_rows is not None
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None
        self._moments: tuple[np.ndarray, np.ndarray] | None = None
        self._scratch_buf: torch.Tensor | None = None

    @cached_property
    def _q(self) -> torch.Tensor:
        """The query vectors as a torch view (torch is imported on first use)."""
        return _torch_view(self._q_np)

    @cached_property
    def _items(self) -> torch.Tensor | None:
        items = self._items_np
        return _torch_view(items) if items.dtype == np.float32 and items.flags.c_contiguous else None

    def _item_block(self, sel: slice | np.ndarray) -> torch.Tensor:
        if self._items is not None and isinstance(sel, slice):
            return self._items[sel]
        # numpy's row gather is ~50x faster than torch indexing on CPU
        rows = self._items_np[sel] if isinstance(sel, slice) else np.take(self._items_np, sel, axis=0)
        return _torch_view(np.asarray(rows, dtype=np.float32))

    def _raw(self, q: slice | np.ndarray, sel: slice | np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Scores of queries ``q`` (a slice, or query rows in any order) against rows ``sel`` of ``items`` (no
        expansion): float32 (n_q, n_sel), in ``out`` when given (C-contiguous, that shape). Against the whole corpus
        through torch's matmul; against the states of a state space (a few thousand rows, `_state_block`) through
        numpy's, so that a stage scoring states never imports torch. With K samples, the (rows x K) products go
        through one scratch buffer kept by the source."""
        if self.item_rows is not None:
            return self._raw_numpy(q, sel)
        import torch

        x = self._item_block(sel)
        qv = self._q[q] if isinstance(q, slice) else self._q[torch.from_numpy(np.asarray(q, dtype=np.int64))]
        nq, n = qv.shape[0], x.shape[0]
        if self.K == 1:
            if out is None:
                return (qv[:, 0, :] @ x.T).numpy()
            torch.mm(qv[:, 0, :], x.T, out=_torch_view(out))
            return out
        if out is None:
            out = np.empty((nq, n), dtype=np.float32)
        res = _torch_view(out)
        step = max(1, _MAX_QK_ROWS // self.K)
        scratch = self._scratch(min(step, nq) * self.K * n)
        for a in range(0, nq, step):
            b = min(nq, a + step)
            s = scratch[:(b - a) * self.K * n].view((b - a) * self.K, n)
            torch.mm(qv[a:b].reshape(-1, qv.shape[2]), x.T, out=s)
            s = s.view(b - a, self.K, n)
            if self.reduce == "max":
                torch.amax(s, 1, out=res[a:b])
            else:
                torch.mean(s, 1, out=res[a:b])
        return out

    def _scratch(self, size: int) -> torch.Tensor:
        """A flat float32 buffer of at least ``size`` elements, kept between calls (the K-sample products)."""
        import torch

        buf = self._scratch_buf
        if buf is None or buf.numel() < size:
            self._scratch_buf = buf = None  # free the old one before allocating the larger one
            buf = self._scratch_buf = torch.empty(size, dtype=torch.float32)
        return buf

    def _raw_numpy(self, q: slice, sel: slice | np.ndarray) -> np.ndarray:
        """`_raw` in numpy (float32 BLAS products; the mean over samples accumulated in float32 as torch's)."""
        rows = self._items_np[sel] if isinstance(sel, slice) else np.take(self._items_np, sel, axis=0)
        x = np.asarray(rows, dtype=np.float32)
        qv = self._q_np[q]
        nq = qv.shape[0]
        if self.K == 1:
            return qv[:, 0, :] @ x.T
        out = np.empty((nq, x.shape[0]), dtype=np.float32)
        step = max(1, _MAX_QK_ROWS // self.K)
        for a in range(0, nq, step):
            b = min(nq, a + step)
            s = (qv[a:b].reshape(-1, qv.shape[2]) @ x.T).reshape(b - a, self.K, -1)
            out[a:b] = s.max(1) if self.reduce == "max" else s.mean(1, dtype=np.float32)
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

    def scores_rows(self, queries: np.ndarray, items: slice | np.ndarray) -> np.ndarray | None:
        if self.item_rows is not None:  # a state source caches whole blocks: pass A needs no grouping
            return None
        queries = np.asarray(queries, dtype=np.int64)
        if queries.ndim != 1 or (queries.size and (queries.min() < 0 or queries.max() >= self.n_queries)):
            raise InputError(f"query rows must be a 1-d array in [0, {self.n_queries})")
        return self._raw(queries, _as_index(items, self.n_items))

    def scores_into(self, q: slice, items: slice, out: np.ndarray) -> np.ndarray:
        if self.item_rows is not None or not isinstance(items, slice):
            return self.scores(q, items)
        q = slice(*q.indices(self.n_queries)[:2])
        check_out(out, (q.stop - q.start, len(range(*items.indices(self.n_items)))))
        return self._raw(q, _as_index(items, self.n_items), out)

    def state_scores(self, q: slice) -> tuple[np.ndarray, np.ndarray] | None:
        if self.item_rows is None:
            return None
        return self._state_block(slice(*q.indices(self.n_queries)[:2])), self.item_rows

    def streams_moments(self) -> bool:
        return not self._closed_form  # the class docstring's ``moments``

    def moments(self, q: slice, c_chunk: int = DEFAULT_C_CHUNK) -> tuple[np.ndarray, np.ndarray]:
        """Per-query mean and std of the scores over all ``n_items`` corpus rows, float64 (n_q,): in closed form
        (below) where the class docstring's ``moments`` chooses it, streamed otherwise (`ScoreSource.moments`; a max
        or mean over samples is not linear).

        With ``c_r`` the number of corpus rows mapped to item ``r`` (1 without expansion), ``n = sum_r c_r``, a
        shift ``x0`` (the mean of the first chunk of items) and ``y_r = x_r - x0``: ``mu = x0 + (1/n) sum_r c_r y_r``,
        ``C = (1/n) sum_r c_r y_r y_r^T - (mu - x0)(mu - x0)^T`` (the d x d covariance of the items), and for a query
        vector ``u``: ``mean = <u, mu>``, ``std = sqrt(max(u^T C u, 0))``. The shift keeps the rounding error of
        ``C`` relative to the items' spread, not to their magnitude: identical items give ``C = 0`` exactly, so a
        constant source has std 0 (an unshifted ``E[s^2] - mean^2`` leaves ~1e-4 of the magnitude in float32).
        Without expansion (every ``c_r`` 1) ``sum_r y_r y_r^T`` is taken by a symmetric rank-k update per chunk
        (`_gram`): half the multiply-adds of a general product, which is what the closed form costs.
        """
        if self.streams_moments():
            return super().moments(q, c_chunk)
        if self._moments is None:
            counts = (np.bincount(self.item_rows, minlength=self.m).astype(np.float64)
                      if self.item_rows is not None else np.ones(self.m))
            import torch

            d = self._q_np.shape[2]
            # float32 shift: x - x0 is exact wherever x and x0 are close (Sterbenz), where cancellation would bite
            x0 = self._item_block(slice(0, min(self.m, DEFAULT_C_CHUNK))).double().mean(0).float()
            s1 = np.zeros(d)
            s2 = np.zeros((d, d))
            unweighted = self.item_rows is None  # every item counted once: Y^T Y is symmetric, half its products do
            for a in range(0, self.m, DEFAULT_C_CHUNK):
                b = min(self.m, a + DEFAULT_C_CHUNK)
                y = self._item_block(slice(a, b)) - x0
                w = torch.from_numpy(counts[a:b].astype(np.float32))
                s1 += (w @ y).double().numpy()
                s2 += _gram(y.numpy()) if unweighted else (y.T @ (y * w[:, None])).double().numpy()
            n = counts.sum()
            shift = s1 / n
            self._moments = (x0.double().numpy() + shift, s2 / n - np.outer(shift, shift))
        mu, cov = self._moments
        u = self._q_np[q][:, 0, :].astype(np.float64)
        # u^T C u row by row through one BLAS product (an unoptimised 3-operand einsum loops over d^2 per query:
        # 1.4 s for 512 queries at 1,024-d); float64 rounding differs from it by ~1e-15 relative
        return u @ mu, np.sqrt(np.maximum(np.einsum("id,id->i", u @ cov, u), 0.0))


def _gram(y: np.ndarray) -> np.ndarray:
    """``y^T y`` of a float32 ``(n, d)`` block, as float64. numpy computes a product of an array's transpose with
    itself by a symmetric rank-k update (BLAS ``syrk``: half the multiply-adds of a general product) and mirrors it,
    so the result is exactly symmetric."""
    y = np.ascontiguousarray(y, dtype=np.float32)
    return (y.T @ y).astype(np.float64)


def stream_moments(source: Any, q: slice, c_chunk: int = DEFAULT_C_CHUNK) -> tuple[np.ndarray, np.ndarray]:
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


_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLD
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class RandomSource(ScoreSource):
    """The random baseline: ``s(i, j) = U[0, 1)`` from a counter-based hash of ``(seed, i, j)`` (splitmix64,
    24-bit float32), so a query's scores do not depend on how the corpus is chunked."""

    fresh_arrays = True

    def __init__(self, n_queries: int, n_items: int, seed: int = 0):
        self.n_queries, self.n_items, self.seed = int(n_queries), int(n_items), int(seed)
        self._key = _splitmix64(np.array([self.seed], dtype=np.uint64))[0]

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        q = slice(*q.indices(self.n_queries)[:2])
        items = _as_index(items, self.n_items)
        cols = (np.arange(items.start, items.stop, dtype=np.uint64) if isinstance(items, slice)
                else items.astype(np.uint64))
        from eval.scoring._random import random_scores

        out = np.empty((q.stop - q.start, len(cols)), np.float32)
        random_scores(q.start, q.stop - q.start, cols, self.n_items, self._key, out)
        return out

