"""Name -> method dispatch for the baselines and oracles (used by the CLI and the demo).

`method_query_vectors` returns the `QueryVectors` of one named baseline or oracle for the queries at ``rows``;
`retrieval.runs.score_query_vectors` turns them into a run.
"""

from __future__ import annotations

import numpy as np

from eval.benchmark import Benchmark
from eval.errors import InputError
from retrieval import baselines, oracles
from retrieval.method_names import BASELINES, NEEDS, ORACLES
from retrieval.queries import QueryVectors
from retrieval.spaces import Space, pick_prefix_space
from retrieval.textcache import cached_query_encoder


def method_query_vectors(bench: Benchmark, name: str, space: Space | None, rows: np.ndarray, *,
                         prefix_space: str = "", seed: int = 0, reduce: str = "first", device: str | None = None,
                         train_split: str = "train", train_fraction: float = 1.0,
                         progress: bool = True) -> QueryVectors:
    """Query vectors of baseline / oracle ``name`` in ``space`` (see `retrieval.baselines`, `retrieval.oracles`,
    `retrieval.classifier`); ``train_fraction``: the share of the training videos ``state-classifier`` learns from."""
    if name not in BASELINES + ORACLES:
        raise InputError(f"unknown method {name!r}; baselines: {BASELINES}; oracles: {ORACLES}")
    if train_fraction != 1.0 and name != "state-classifier":
        raise InputError(f"--train-fraction is an option of state-classifier, not of {name}")
    if name == "random":
        return baselines.random_baseline(bench, rows, seed=seed, space=space.name if space else "")
    if space is None:
        raise InputError(f"{name} needs --space")
    need = NEEDS[name]
    if need == "visual" and space.kind != "visual":
        raise InputError(f"{name} retrieves with prefix tokens in a visual space; {space.name!r} is {space.kind}")
    if need == "text":
        enc = cached_query_encoder(bench, space.meta, device=device)
        if name == "paraphrase":
            return oracles.paraphrase(bench, rows, space, enc, seed=seed)
        fn = baselines.question_only if name == "question-only" else oracles.semantic_text
        return fn(bench, rows, space, enc)
    if name == "lookup":
        return baselines.lookup(bench, rows, space, train_split=train_split)
    if name == "transition-table":
        return baselines.transition_table(bench, rows, space, train_split=train_split)
    if name == "knn-future":
        pspace = Space.load(bench, pick_prefix_space(bench, prefix_space))
        return baselines.knn_future(bench, rows, pspace, space, train_split=train_split)
    if name == "state-classifier":
        from retrieval.classifier import ClassifierConfig, state_classifier

        pspace = Space.load(bench, pick_prefix_space(bench, prefix_space))
        return state_classifier(bench, rows, pspace, space, seed=seed, train_split=train_split,
                                cfg=ClassifierConfig(train_fraction=train_fraction), progress=progress)
    if name == "persistence":
        return baselines.persistence(bench, rows, space)
    if name == "zero-shot":
        return baselines.zero_shot(bench, rows, space)
    if name == "state-prototype":
        return oracles.state_prototype(bench, rows, space)
    return oracles.independent_appearance(bench, rows, space, reduce=reduce)
