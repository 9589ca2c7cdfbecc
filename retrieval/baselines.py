"""The paper's naive and zero-shot baselines (App. "Baselines (exact setup)"), as query vectors.

Each function takes the benchmark, the query rows to answer and the space(s), and returns `QueryVectors`:

- ``random``: a random ranking of the corpus (eval's ``RandomSource``; only the seed is kept).
- ``question_only``: the question text, embedded by the semantic space's text encoder, retrieves in that space
  (no visual input: the language prior).
- ``knn_future``: the nearest training query by prefix features, its GT future state is the prediction.
  Prefix feature = ``normalise(mean of the 8 prefix tokens)``; the neighbour is searched among training queries
  with the same question type and horizon (falling back to the same horizon, then to all training queries) and
  never from the query's own video; the prediction is that state's vector in the target space (its embedding in a
  semantic space, its segment-mean prototype in a visual one).
- ``lookup``: a prior, no input at all beyond the question's metadata: the most frequent training target state of
  the query's (domain, question type, horizon) -- falling back to (question type, horizon), then horizon, then all
  training queries; count ties go to the lowest state row -- as a vector of the target space (its embedding in a
  semantic space). A floor every learned method must beat: it measures how much the targets are predictable from
  the benchmark's construction alone.
- ``transition_table``: perfect perception of the present, a table for the future: the query's *current* state (the
  canonical state active at the prefix's end, read from its transcript: the entry with the latest time ``<=
  prefix_end``) is known exactly, and the prediction is the most frequent training target of the query's (current
  state, question type, horizon) -- falling back to (current state, horizon), (current state), then the lookup
  prior; count ties go to the lowest state row. With the ``sim`` LFTR (`eval.synth.simspace`) it bounds what
  perfect perception buys: the present as a label, without its kinematics.
- ``persistence``: the last prefix frame's token retrieves in the same visual space ("future = present").
- ``zero_shot``: ``normalise(mean of the 8 prefix tokens)`` retrieves in the encoder's own corpus space.
"""

from __future__ import annotations

import numpy as np

from eval.benchmark import Benchmark
from eval.features import l2_normalize
from eval.segments import current_states, target_states
from retrieval.queries import QueryVectors
from retrieval.spaces import Space


def _ids(bench: Benchmark, rows: np.ndarray) -> list[str]:
    ids = bench.query_ids
    return [ids[int(r)] for r in rows]


def random_baseline(bench: Benchmark, rows: np.ndarray, seed: int = 0, space: str = "") -> QueryVectors:
    return QueryVectors(_ids(bench, rows), np.zeros((0, 1, 1), np.float32), space, kind="random", seed=seed)


def question_only(bench: Benchmark, rows: np.ndarray, space: Space, encoder) -> QueryVectors:
    """``encoder.encode_queries(question texts)`` -> ``(n, 1, d)`` in ``space`` (a semantic space)."""
    texts = bench.queries_ds.select(rows)["question"][:] if len(rows) else []
    return QueryVectors(_ids(bench, rows), encoder.encode_queries(texts)[:, None], space.name)


def _prefix_tokens(bench: Benchmark, rows: np.ndarray, space: Space) -> np.ndarray:
    pids = bench.queries_ds.select(rows)["prefix_id"][:] if len(rows) else []
    return np.asarray(space.prefixes.array[space.prefix_rows(pids)], np.float32)  # (n, 8, d)


def persistence(bench: Benchmark, rows: np.ndarray, space: Space) -> QueryVectors:
    """Last prefix token -> ``(n, 1, d)``; ``space`` must hold both the prefixes and the corpus."""
    return QueryVectors(_ids(bench, rows), l2_normalize(_prefix_tokens(bench, rows, space)[:, -1])[:, None], space.name)


def zero_shot(bench: Benchmark, rows: np.ndarray, space: Space) -> QueryVectors:
    """Mean of the 8 prefix tokens -> ``(n, 1, d)`` in the encoder's own corpus space."""
    return QueryVectors(_ids(bench, rows), l2_normalize(_prefix_tokens(bench, rows, space).mean(1))[:, None],
                        space.name)


def knn_neighbours(bench: Benchmark, rows: np.ndarray, prefix_space: Space, train_split: str = "train",
                   chunk: int = 4096) -> np.ndarray:
    """``(n,)`` query row of each query's nearest training query (see the module docstring), -1 when none."""
    qd = bench.queries_ds
    pid_rows = prefix_space.prefix_rows(qd["prefix_id"][:])
    pooled = l2_normalize(np.asarray(prefix_space.prefixes.array, np.float32).mean(1))  # (n_prefixes, d)
    qtype = np.asarray(qd["qtype"][:])
    horizon = np.asarray(qd["horizon"][:])
    video = np.asarray(qd["video_id"][:])
    train = bench.query_rows(train_split)
    out = np.full(len(rows), -1, np.int64)
    todo = np.ones(len(rows), bool)
    keys = [lambda r: (qtype[r], horizon[r]), lambda r: (horizon[r],), lambda r: ()]
    for key in keys:  # progressively looser matching, each level vectorised per group
        groups: dict[tuple, list[int]] = {}
        for i in np.flatnonzero(todo):
            groups.setdefault(tuple(key(rows[i])), []).append(i)
        train_groups: dict[tuple, list[int]] = {}
        for t in train:
            train_groups.setdefault(tuple(key(t)), []).append(t)
        for g, idx in groups.items():
            cand = np.asarray(train_groups.get(g, []), np.int64)
            if cand.size == 0:
                continue
            cand_feat = pooled[pid_rows[cand]]
            for s in range(0, len(idx), chunk):
                ii = np.asarray(idx[s:s + chunk])
                q = rows[ii]
                sims = pooled[pid_rows[q]] @ cand_feat.T
                sims[video[q][:, None] == video[cand][None, :]] = -np.inf
                best = sims.argmax(1)
                ok = np.isfinite(sims[np.arange(len(ii)), best])
                out[ii[ok]] = cand[best[ok]]
                todo[ii[ok]] = False
    return out


def lookup_states(bench: Benchmark, rows: np.ndarray, train_split: str = "train") -> np.ndarray:
    """``(n,)`` state row of the lookup prior's answer for each query (see the module docstring), -1 when none."""
    qd = bench.queries_ds
    state = target_states(bench)
    domain, qtype, horizon = (np.asarray(qd[c][:]) for c in ("domain", "qtype", "horizon"))
    train = bench.query_rows(train_split)
    train = train[state[train] >= 0]
    levels = [lambda r: (domain[r], qtype[r], horizon[r]), lambda r: (qtype[r], horizon[r]),
              lambda r: (horizon[r],), lambda r: ()]
    return _most_frequent(list(reversed(levels)), train, state, rows, np.full(len(rows), -1, np.int64))


def _most_frequent(levels, train: np.ndarray, state: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """For each level (coarse to fine), overwrite ``out[i]`` with the most frequent training state of
    ``rows[i]``'s key at that level (count ties -> the lowest state row); a finer level wins where it has data."""
    for key in levels:
        counts: dict[tuple, dict[int, int]] = {}
        for t in train:
            c = counts.setdefault(tuple(key(t)), {})
            c[int(state[t])] = c.get(int(state[t]), 0) + 1
        best = {k: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for k, c in counts.items()}
        for i, r in enumerate(rows):
            out[i] = best.get(tuple(key(r)), out[i])
    return out


def transition_states(bench: Benchmark, rows: np.ndarray, train_split: str = "train") -> np.ndarray:
    """``(n,)`` state row of the transition table's answer for each query (module docstring), -1 when none."""
    qd = bench.queries_ds
    state = target_states(bench)
    current = current_states(bench)
    qtype, horizon = (np.asarray(qd[c][:]) for c in ("qtype", "horizon"))
    train = bench.query_rows(train_split)
    train = train[(state[train] >= 0) & (current[train] >= 0)]
    out = lookup_states(bench, rows, train_split)
    levels = [lambda r: (current[r],), lambda r: (current[r], horizon[r]), lambda r: (current[r], qtype[r], horizon[r])]
    return _most_frequent(levels, train, state, rows, out)


def transition_table(bench: Benchmark, rows: np.ndarray, target: Space, train_split: str = "train") -> QueryVectors:
    """The transition table's state as a vector of ``target`` -> ``(n, 1, d)``."""
    st = transition_states(bench, rows, train_split)
    vec = np.zeros((len(rows), target.dim), np.float32)
    vec[st >= 0] = target.state_prototypes()[st[st >= 0]]
    return QueryVectors(_ids(bench, rows), vec[:, None], target.name)


def lookup(bench: Benchmark, rows: np.ndarray, target: Space, train_split: str = "train") -> QueryVectors:
    """The lookup prior's state as a vector of ``target`` -> ``(n, 1, d)``."""
    st = lookup_states(bench, rows, train_split)
    vec = np.zeros((len(rows), target.dim), np.float32)
    vec[st >= 0] = target.state_prototypes()[st[st >= 0]]
    return QueryVectors(_ids(bench, rows), vec[:, None], target.name)


def knn_future(bench: Benchmark, rows: np.ndarray, prefix_space: Space, target: Space,
               train_split: str = "train") -> QueryVectors:
    """The nearest training query's target state, as a vector of ``target`` -> ``(n, 1, d)``."""
    nb = knn_neighbours(bench, rows, prefix_space, train_split)
    tstate = target_states(bench)
    protos = target.state_prototypes()
    vec = np.zeros((len(rows), target.dim), np.float32)
    ok = nb >= 0
    st = tstate[nb[ok]]
    good = st >= 0
    vec[np.flatnonzero(ok)[good]] = protos[st[good]]
    return QueryVectors(_ids(bench, rows), vec[:, None], target.name)
