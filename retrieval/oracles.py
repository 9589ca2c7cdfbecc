"""The paper's oracles: retrieval with the true future state (the ceiling decomposition, §5.3 and App. J).

- ``semantic_text``: the query's true canonical target-state text, embedded by the semantic space's text
  encoder (as a query), retrieves in that space. The clean ceiling.
- ``state_prototype``: the mean visual feature of all segments of the target state (normalised), retrieved in
  the same visual space. Mildly optimistic: the prototype averages the GT segments themselves.
- ``independent_appearance``: the query's own observed future frame (its in-video segment of the target state,
  the self tier) retrieves cross-instance in a visual space. ``reduce="first"`` uses the earliest such segment
  (the paper's single frame), ``"mean"`` averages all of them (its multi-frame variant). Queries without an
  in-video segment are misses (zero vectors; see `retrieval.queries`).
"""

from __future__ import annotations

import numpy as np

from eval.benchmark import Benchmark
from eval.features import l2_normalize
from retrieval.queries import QueryVectors
from retrieval.spaces import Space


def _ids(bench: Benchmark, rows: np.ndarray) -> list[str]:
    ids = bench.query_ids
    return [ids[int(r)] for r in rows]


def semantic_text(bench: Benchmark, rows: np.ndarray, space: Space, encoder) -> QueryVectors:
    texts = bench.queries_ds.select(rows)["target_state"][:] if len(rows) else []
    return QueryVectors(_ids(bench, rows), encoder.encode_queries(texts)[:, None], space.name)


def state_prototype(bench: Benchmark, rows: np.ndarray, space: Space) -> QueryVectors:
    sidx = bench.state_index
    states = bench.queries_ds.select(rows)["target_state_id"][:] if len(rows) else []
    st = np.fromiter((sidx.get(s, -1) for s in states), np.int64, count=len(states))
    vec = np.zeros((len(rows), space.dim), np.float32)
    vec[st >= 0] = space.state_prototypes()[st[st >= 0]]
    return QueryVectors(_ids(bench, rows), vec[:, None], space.name)


def independent_appearance(bench: Benchmark, rows: np.ndarray, space: Space, reduce: str = "first") -> QueryVectors:
    if reduce not in ("first", "mean"):
        raise ValueError(f"reduce must be 'first' or 'mean', got {reduce!r}")
    cidx = bench.corpus_index
    start = np.asarray(bench.corpus_ds["start"][:], np.float64)
    pools = bench.queries_ds.select(rows)["gt_pools"][:] if len(rows) else []
    vec = np.zeros((len(rows), space.dim), np.float32)
    for i, p in enumerate(pools):  # per query: its few in-video segments
        own = np.fromiter((cidx[x] for x in p["in_video"] if x in cidx), np.int64)
        if own.size == 0:
            continue
        feats = space.segment_features(own)
        vec[i] = feats[np.argmin(start[own])] if reduce == "first" else l2_normalize(feats.mean(0))
    return QueryVectors(_ids(bench, rows), vec[:, None], space.name)
