"""The paper's oracles: retrieval with the true future state (the ceiling decomposition, §5.3 and App. J).

- ``semantic_text``: the query's true canonical target-state text, embedded by the semantic space's text
  encoder (as a query), retrieves in that space. The clean ceiling.
- ``paraphrase``: the paraphrase oracle with the held-out phrasing (synthetic benchmark: `eval.synth.paraphrase`):
  the query's true canonical state text re-said in the lexicon that never wrote the corpus, embedded as a query,
  retrieves in the semantic space; its drop from ``semantic_text`` is the canonicalization loss (App. U).
- ``state_prototype``: the mean visual feature of all segments of the target state (normalised), retrieved in
  the same visual space. Mildly optimistic: the prototype averages the GT segments themselves.
- ``independent_appearance``: the queried object's own observed future frame -- the middle frame of its target
  segment (same video and object, active at the query's ``target_time``) -- retrieves cross-instance in a visual
  space (the paper's independent observed-future-frame oracle). ``reduce="first"`` uses that segment (the paper's
  single frame); ``"mean"`` averages the object's segments in the target state (its multi-frame variant). Queries
  whose target segment is not in the corpus are misses (zero vectors; see `retrieval.queries`).
"""

from __future__ import annotations

import numpy as np

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.features import l2_normalize
from eval.segments import SegmentTimeline
from retrieval.queries import QueryVectors
from retrieval.spaces import Space


def _ids(bench: Benchmark, rows: np.ndarray) -> list[str]:
    ids = bench.query_ids
    return [ids[int(r)] for r in rows]


def semantic_text(bench: Benchmark, rows: np.ndarray, space: Space, encoder) -> QueryVectors:
    texts = bench.queries_ds.select(rows)["target_state"][:] if len(rows) else []
    return QueryVectors(_ids(bench, rows), encoder.encode_queries(texts)[:, None], space.name)


def paraphrase(bench: Benchmark, rows: np.ndarray, space: Space, encoder, seed: int = 0) -> QueryVectors:
    from eval.synth.build import read_denotations
    from eval.synth.paraphrase import paraphrase_for

    try:
        den = read_denotations(bench.root)
    except FileNotFoundError:
        raise InputError(f"{bench.root}: the held-out paraphrase oracle needs sim/phrases.jsonl (a synthetic "
                         "build); on other benchmarks run the LLM paraphrase probe (`forecasters run --forecaster "
                         "paraphrase`)") from None
    sel = bench.queries_ds.select(rows) if len(rows) else None
    qids = sel["id"][:] if sel is not None else []
    targets = sel["target_state"][:] if sel is not None else []
    texts = [paraphrase_for(q, den[t], seed) if t in den else t for q, t in zip(qids, targets, strict=True)]
    return QueryVectors(_ids(bench, rows), encoder.encode_queries(texts)[:, None], space.name)


def state_prototype(bench: Benchmark, rows: np.ndarray, space: Space) -> QueryVectors:
    sidx = bench.state_index
    states = bench.queries_ds.select(rows)["target_state_id"][:] if len(rows) else []
    st = np.fromiter((sidx.get(s, -1) for s in states), np.int64, count=len(states))
    vec = np.zeros((len(rows), space.dim), np.float32)
    vec[st >= 0] = space.state_prototypes()[st[st >= 0]]
    return QueryVectors(_ids(bench, rows), vec[:, None], space.name)


def target_segment_rows(bench: Benchmark, rows: np.ndarray) -> np.ndarray:
    """(len(rows),) corpus row of each query's target segment (its video and object, active at ``target_time``,
    `eval.segments`; -1 when the corpus has no such segment)."""
    if not len(rows):
        return np.zeros(0, np.int64)
    q = bench.queries_ds.select(rows)
    return SegmentTimeline.of(bench).active_rows(q["video_id"][:], q["object_id"][:], q["target_time"][:])


def independent_appearance(bench: Benchmark, rows: np.ndarray, space: Space, reduce: str = "first") -> QueryVectors:
    if reduce not in ("first", "mean"):
        raise InputError(f"reduce must be 'first' or 'mean', got {reduce!r}")
    target = target_segment_rows(bench, rows)
    vec = np.zeros((len(rows), space.dim), np.float32)
    have = target >= 0
    if reduce == "first":
        if have.any():
            vec[have] = space.segment_features(target[have])
        return QueryVectors(_ids(bench, rows), vec[:, None], space.name)
    cds = bench.corpus_ds
    obj = {}
    for r, (v, o, s) in enumerate(zip(cds["video_id"][:], cds["object_id"][:], cds["state_id"][:], strict=True)):
        obj.setdefault((v, o, s), []).append(r)
    vids, objs, states = cds["video_id"][:], cds["object_id"][:], cds["state_id"][:]
    for i, t in enumerate(target):  # per query: the few segments of its object in the target state
        if t < 0:
            continue
        own = np.asarray(obj[(vids[t], objs[t], states[t])], np.int64)
        vec[i] = l2_normalize(space.segment_features(own).mean(0))
    return QueryVectors(_ids(bench, rows), vec[:, None], space.name)
