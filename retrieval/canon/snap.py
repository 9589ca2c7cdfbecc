r"""Canonicalize-then-retrieve: snap a free-form phrase to its nearest canonical states before the state expansion
(``python -m retrieval search ... --canonicalize TOP_M``).

The snap applies the benchmark's own canonicalization to a prediction. The index holds every canonical state's
raw phrasings (``states.jsonl`` ``members``, the canonical text included), embedded by the semantic space's text
encoder. A phrase ``p`` scores each state ``s`` by its closest phrasing,

.. math::  a(p, s) = \max_{m \in \mathrm{members}(s)} \cos(p, m),

and keeps its top-``m`` states ``s_1..s_m`` with scores ``a_1 >= .. >= a_m``. Retrieval then ranks with the
snapped states instead of the phrase: the query's vectors become ``a_k e(s_k)`` (``e``: the state's embedding in the
space), so an item of state ``j`` scores ``max_k a_k cos(s_k, j)``: the snapped states first, in snap order, then
their neighbours. A multi-phrase query snaps every phrase and keeps the best ``m`` states over all of them
(``a(q, s) = max_i a(p_i, s)``). Misses (no usable phrase) stay misses.

Hold-out (honest evaluation): ``exclude_members_of`` lists states whose raw phrasings are left out of the index
(only their canonical text stays), so a paraphrase of a held-out state can only snap through similarity, never
through an exact vocabulary hit (see `retrieval.canon.finetune` for the split of states).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import read_json
from retrieval.queries import QueryVectors

#: (query x phrase) rows and index phrasings per block of the snap's product (128 MiB of float32 scores).
_QK_ROWS = 8192
_MEMBER_CHUNK = 4096


@dataclass
class CanonicalIndex:
    """Member phrasings of canonical states: ``texts`` ``(m,)``, their benchmark state rows ``state_rows`` ``(m,)``
    int64, and ``emb`` ``(m, d)`` float32 L2-normalised; ``n_states`` benchmark states."""

    texts: list[str]
    state_rows: np.ndarray
    emb: np.ndarray
    n_states: int

    @classmethod
    def from_benchmark(cls, bench, encoder, *, exclude_members_of: set[str] | None = None,
                       progress: bool = False) -> CanonicalIndex:
        exclude = exclude_members_of or set()
        texts, rows = [], []
        for r, (sid, text, members) in enumerate(zip(bench.state_ids, bench.states_ds["text"][:],
                                                     bench.states_ds["members"][:], strict=True)):
            phr = [text] if sid in exclude else list(dict.fromkeys([text, *(members or [])]))
            texts += phr
            rows += [r] * len(phr)
        emb = encoder.encode_items(texts, progress=progress)
        return cls(texts, np.asarray(rows, np.int64), np.asarray(emb, np.float32), len(bench.state_ids))


def snap_scores(index: CanonicalIndex, vectors: np.ndarray, top_m: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``m`` states per query: ``vectors`` ``(n, K, d)`` (zero rows = no phrase) ->
    ``(states (n, m) int64, scores (n, m) float32)`` ordered by score (ties: lower state row); queries whose
    vectors are all zero get states -1 and scores 0. A state's score is the best cosine of any live phrase of the
    query with any of its phrasings (NumPy: a search loads no torch for it)."""
    n, k, d = vectors.shape
    if index.emb.shape[1] != d:
        raise InputError(f"the canonical index is {index.emb.shape[1]}-d but the query vectors are {d}-d")
    top_m = min(top_m, index.n_states)
    states = np.full((n, top_m), -1, np.int64)
    scores = np.zeros((n, top_m), np.float32)
    order = np.argsort(index.state_rows, kind="stable")  # each state's phrasings side by side
    rows = np.asarray(index.state_rows)[order]
    members = np.ascontiguousarray(np.asarray(index.emb, np.float32)[order])
    block = max(1, _QK_ROWS // k)
    for a in range(0, n, block):
        v = np.ascontiguousarray(vectors[a:a + block], np.float32)
        b = len(v)
        live = (v != 0).any(axis=2)  # (b, K): usable phrases
        per_state = np.full((b, index.n_states), -np.inf, np.float32)
        for c in range(0, len(members), _MEMBER_CHUNK):
            sim = (v.reshape(b * k, d) @ members[c:c + _MEMBER_CHUNK].T).reshape(b, k, -1)
            sim[~live] = -np.inf
            best = sim.max(axis=1)  # (b, chunk): the best over the phrases
            chunk_rows = rows[c:c + _MEMBER_CHUNK]
            starts = np.flatnonzero(np.r_[True, chunk_rows[1:] != chunk_rows[:-1]])
            st = chunk_rows[starts]  # distinct states of this chunk (a state may continue in the next one)
            per_state[:, st] = np.maximum(per_state[:, st], np.maximum.reduceat(best, starts, axis=1))
        top = np.argsort(-per_state, axis=1, kind="stable")[:, :top_m]  # score desc, state row asc
        ok = live.any(axis=1)
        states[a:a + b][ok] = top[ok]
        scores[a:a + b][ok] = np.take_along_axis(per_state, top, axis=1)[ok]
    return states, scores


def snap_query_vectors(qv: QueryVectors, space, index: CanonicalIndex, top_m: int) -> tuple[QueryVectors, dict]:
    """Replace each query's phrase vectors by its snapped states' vectors ``a_k e(s_k)`` (module docstring).

    ``space``: the semantic `retrieval.spaces.Space` the phrases were embedded for. Returns the new query vectors
    ``(n, m, d)`` and a summary (mean top-1 snap score, queries snapped)."""
    if space.kind != "semantic":
        raise InputError(f"--canonicalize snaps to canonical states: it needs a semantic space, {space.name!r} is "
                         f"{space.kind}")
    if top_m < 1:
        raise InputError(f"top-m must be >= 1, got {top_m}")
    states, scores = snap_scores(index, qv.vectors, top_m)
    item = space.state_items  # benchmark state row -> item row
    ok = states >= 0
    if (item[states[ok]] < 0).any():
        raise InputError(f"space {space.name!r} lacks some canonical states: re-encode it")
    vec = np.zeros((len(qv.query_ids), states.shape[1], space.dim), np.float32)
    vec[ok] = space.items[item[states[ok]]] * scores[ok][:, None]
    live = ok[:, 0]
    summary = {"canonicalize_top_m": int(top_m), "snapped_queries": int(live.sum()),
               "mean_top1_snap_score": float(scores[live, 0].mean()) if live.any() else float("nan"),
               "index_phrasings": len(index.texts)}
    return QueryVectors(list(qv.query_ids), vec, qv.space), summary


def read_holdout(path: str | os.PathLike) -> dict:
    """A hold-out file written by ``canon finetune`` (``holdout.json``): ``{"train_states": [...],
    "heldout_states": [...], ...}``."""
    d = read_json(Path(path))
    for key in ("train_states", "heldout_states"):
        if not isinstance(d.get(key), list):
            from eval.io import FormatError

            raise FormatError(path, "expected a list of state ids", field=key)
    return d


def canonicalize_phrases(bench, space, encoder, qv: QueryVectors, top_m: int,
                         holdout: str | os.PathLike | None = None) -> tuple[QueryVectors, dict]:
    """The ``--canonicalize TOP_M`` step of phrase search: build the index of ``bench``'s states (members of the
    held-out states of ``holdout`` left out) with ``encoder`` and snap ``qv``. Returns the new query vectors and a
    summary for the run config."""
    exclude = set(read_holdout(holdout)["heldout_states"]) if holdout else set()
    index = CanonicalIndex.from_benchmark(bench, encoder, exclude_members_of=exclude)
    out, summary = snap_query_vectors(qv, space, index, top_m)
    summary["canonicalize_holdout"] = str(holdout) if holdout else None
    summary["index_excluded_states"] = len(exclude)
    return out, summary
