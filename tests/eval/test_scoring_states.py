"""The state-level scoring path (`eval.scoring.states`) against the tile stream it replaces for state-space sources:
the same results, bit for bit, on problems full of exact ties (small-integer vectors), own-video exclusions,
positives inside them, empty pools, an unexcluded pool, probes, states without rows, zero query vectors (every
row tied) and corpora shorter than k; and the same error for a non-finite score."""

from __future__ import annotations

import numpy as np
import pytest
from test_scoring_reference import RANKED_FIELDS, result_arrays

from eval.errors import InputError
from eval.scoring import DenseSource, ScoreSource, score_stream


class TileOnly(ScoreSource):
    """The same source without its state block: the scorer streams tiles."""

    def __init__(self, inner):
        self.inner, self.n_queries, self.n_items = inner, inner.n_queries, inner.n_items
        self.cached_blocks = inner.cached_blocks

    def scores(self, q, items):
        return self.inner.scores(q, items)


def _groups(rng, nq, n, max_size, empty_rate=0.15):
    return [rng.choice(n, size=0 if rng.random() < empty_rate else int(rng.integers(1, min(n, max_size) + 1)),
                       replace=False).astype(np.int64) for _ in range(nq)]


def _problem(seed: int):
    rng = np.random.default_rng(seed)
    nq, m, d = int(rng.integers(5, 40)), int(rng.integers(3, 60)), int(rng.integers(1, 4))
    n = int(rng.integers(5, 400))
    item_rows = rng.integers(0, m, n)
    if rng.random() < 0.5:  # some states hold no row
        item_rows[item_rows == 0] = 1
    K = int(rng.integers(1, 4))
    q = rng.integers(-2, 3, size=(nq, K, d)).astype(np.float32)
    q[rng.random(nq) < 0.15] = 0  # missed queries: every row tied
    items = rng.integers(-2, 3, size=(m, d)).astype(np.float32)
    src = DenseSource(q, items, item_rows=item_rows, reduce="max" if rng.random() < 0.7 else "mean")
    exclude = _groups(rng, nq, n, 30, empty_rate=0.2)
    pools = {"a": _groups(rng, nq, n, 25), "b": _groups(rng, nq, n, 3), "in_video": _groups(rng, nq, n, 4)}
    pools["a"] = [np.unique(np.concatenate([p, e[:2]])) for p, e in zip(pools["a"], exclude, strict=True)]
    kw = dict(k=int(rng.integers(1, 80)), q_block=int(rng.integers(1, 20)), c_chunk=int(rng.integers(1, 150)),
              no_exclude_pools=("in_video",), probes={"pr": _groups(rng, nq, n, 6)})
    return src, pools, exclude, kw


@pytest.mark.parametrize("seed", range(40))
def test_state_path_equals_the_tile_stream(seed):
    src, pools, exclude, kw = _problem(seed)
    assert src.state_scores(slice(0, 1)) is not None
    got = result_arrays(score_stream(src, pools, exclude, progress=False, **kw))
    want = result_arrays(score_stream(TileOnly(src), pools, exclude, progress=False, **kw))
    assert sorted(got) == sorted(want)
    for key, v in want.items():
        assert got[key].dtype == v.dtype and got[key].shape == v.shape, key
        assert got[key].tobytes() == v.tobytes(), key
    assert {f"ranked/{f}" for f in RANKED_FIELDS} <= set(got)


@pytest.mark.parametrize("where", ["item", "positive"])
def test_a_non_finite_score_is_the_same_error(where):
    src, pools, exclude, kw = _problem(3)
    items = np.asarray(src._items_np).copy()
    rows = src.item_rows
    bad_state = int(rows[pools["a"][1][0]]) if where == "positive" else int(rows[-1])
    items[bad_state, 0] = np.nan
    bad = DenseSource(src._q.numpy(), items, item_rows=rows, reduce=src.reduce)
    messages = []
    for s in (bad, TileOnly(bad)):
        with pytest.raises(InputError) as e:
            score_stream(s, pools, exclude, progress=False, query_ids=[f"q{i}" for i in range(s.n_queries)],
                         item_ids=[f"c{j}" for j in range(s.n_items)], source_label="m", **kw)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "must be finite" in messages[0]
