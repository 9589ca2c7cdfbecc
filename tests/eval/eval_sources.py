"""Score sources on the session's synthetic benchmark shared by the evaluator tests."""

from __future__ import annotations

import numpy as np

from eval.scoring import DEFAULT_C_CHUNK, DEFAULT_Q_BLOCK, SPREAD_RTOL, DenseSource, ScoreSource, as_score_source


def oracle_and_pixels(bench, rows=None):
    """Query rows (default: the fair test rows), the true-state oracle (one-hot states, expanded to segments: exact
    ties) and persistence in the pixels space (the 8 prefix tokens of each query, scored by their max)."""
    rows = bench.query_rows("test", fair_only=True) if rows is None else np.asarray(rows)
    qs = bench.queries_ds.select(rows)
    eye = np.eye(len(bench.state_ids), dtype=np.float32)
    oracle = DenseSource(eye[[bench.state_index[s] for s in qs["target_state_id"]]], eye,
                         item_rows=bench.segment_state_rows)
    pre, corp = bench.features("pixels", "prefixes"), bench.features("pixels", "corpus")
    pidx = pre.index()
    pixels = DenseSource(np.asarray(pre.array)[[pidx[p] for p in qs["prefix_id"]]], corp.array)
    return rows, oracle, pixels


class TwoPassFusion(ScoreSource):
    """The z-score fusion as it was computed before `eval.scoring.FusionSource` scored each input once: every
    query's statistics first (a full pass over the corpus for an input without a closed form), then every call of
    the scorer computes every input again. Kept verbatim as the reference the one-pass fusion must equal bitwise."""

    def __init__(self, sources, weights=None, c_chunk=DEFAULT_C_CHUNK, q_block=DEFAULT_Q_BLOCK, names=None):
        self.sources = [as_score_source(s) for s in sources]
        self.weights = np.ones(len(sources)) if weights is None else np.asarray(weights, dtype=np.float64)
        self.names = [s.label for s in self.sources] if names is None else list(names)
        self.n_queries, self.n_items = self.sources[0].n_queries, self.sources[0].n_items
        self._c_chunk, self._q_block = c_chunk, q_block
        self.cached_blocks = any(s.cached_blocks for s in self.sources)
        self._coef = None

    def _moments_of(self, src):
        mean, std = np.empty(self.n_queries), np.empty(self.n_queries)
        for a in range(0, self.n_queries, self._q_block):
            q = slice(a, min(self.n_queries, a + self._q_block))
            mean[q], std[q] = src.moments(q, self._c_chunk)
        return mean, std

    def coefficients(self):
        if self._coef is None:
            a = np.zeros((len(self.sources), self.n_queries))
            b = np.zeros(self.n_queries)
            for k, src in enumerate(self.sources):
                mean, std = self._moments_of(src)
                ok = ~(std <= SPREAD_RTOL * np.sqrt(mean * mean + std * std))
                a[k, ok] = self.weights[k] / std[ok]
                b += a[k] * mean
            self._coef = (a.astype(np.float32), b.astype(np.float32))
        return self._coef

    def scores(self, q, items):
        q = slice(*q.indices(self.n_queries)[:2])
        a, b = self.coefficients()
        out = None
        for k, src in enumerate(self.sources):
            s = np.multiply(src.scores(q, items), a[k, q][:, None])
            out = s if out is None else np.add(out, s, out=out)
        out -= b[q][:, None]
        return out


class Counting(ScoreSource):
    """A source that counts the (query, item) scores asked of it, by kind of call: ``tiles`` (corpus slices) and
    ``gathers`` (index arrays, the scorer's pass A)."""

    def __init__(self, inner):
        self.inner = inner
        self.n_queries, self.n_items, self.cached_blocks = inner.n_queries, inner.n_items, inner.cached_blocks
        self.tiles = self.gathers = 0

    def streams_moments(self):
        return self.inner.streams_moments()

    def moments(self, q, c_chunk=DEFAULT_C_CHUNK):
        return self.inner.moments(q, c_chunk) if not self.streams_moments() else super().moments(q, c_chunk)

    def scores(self, q, items):
        out = self.inner.scores(q, items)
        if isinstance(items, slice):
            self.tiles += out.size
        else:
            self.gathers += out.size
        return out
