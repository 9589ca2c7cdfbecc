"""Stratified evaluation of one run: every number the reports print, as one nested dict.

Strata (each reports ``n``, the queries with a non-empty pool, and ``n_empty``):

- ``main``: the main pool (``type2-all`` = in_dataset + cross_dataset, own video excluded), with ``macro``
  (R@5 averaged unweighted over horizons 1..5, h >= 6 folded into 5) and the tier-weighted nDCG;
- ``by_horizon`` (1..5, folded), ``by_qtype`` (Q1..Q5), ``by_domain`` (the query's source domain): the main pool
  restricted to those queries;
- ``by_tier``: each tier scored against that tier's pool alone (``in_video`` over the full corpus;
  ``in_dataset``, ``cross_dataset``, ``bge_similar`` with the own video excluded);
- ``by_gt_definition``: ``type2-all``, ``type2-consensus``, ``type1-all``;
- ``triplets``: the GenState-style diagnostics (`eval.triplets`), overall and by domain.

Recall, MRR and nDCG are fractions in [0, 1] (tables print them x100); ``MedR`` is a rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from eval.metrics import (
    DEFAULT_KS,
    RankStats,
    macro_over_horizons,
    mean_valid,
    median_first_rank,
    ndcg_at_k,
    recall_at_k,
    reciprocal_rank,
    report_horizons,
)
from eval.schema import GT_DEFINITIONS, QUESTION_TYPES, REPORT_MAX_HORIZON

MAIN_POOL = "type2-all"
TIER_POOLS = ("in_video", "in_dataset", "cross_dataset", "bge_similar")
DEFAULT_NDCG_K = 10


@dataclass(frozen=True)
class QueryLabels:
    """Strata labels of a run's queries, aligned with ``query_ids``: folded horizon (1..5), question type, domain."""

    query_ids: list[str]
    horizon: np.ndarray
    qtype: np.ndarray
    domain: np.ndarray

    @classmethod
    def from_benchmark(cls, bench, query_ids: Sequence[str], run_name: str = "run") -> QueryLabels:
        index = bench.query_index
        missing = [q for q in query_ids if q not in index]
        if missing:
            raise KeyError(f"{run_name}: {len(missing)} query ids are not in benchmark {bench.root} "
                           f"(first: {missing[0]!r}); was the run scored on another benchmark?")
        rows = np.fromiter((index[q] for q in query_ids), dtype=np.int64, count=len(query_ids))
        ds = bench.queries_ds.select(rows)
        return cls(list(query_ids), report_horizons(np.asarray(ds["horizon"][:])),
                   np.asarray(ds["qtype"][:], dtype=object), np.asarray(ds["domain"][:], dtype=object))


def metric_block(st: RankStats, mask: np.ndarray | None = None, *, ks: Sequence[int] = DEFAULT_KS,
                 tie: str = "expected", horizons: np.ndarray | None = None) -> dict:
    """R@k for ``ks``, MRR, MedR, ``n`` and ``n_empty`` over the queries in ``mask``; ``macro`` when horizons given."""
    if mask is not None:
        st = st.select(np.asarray(mask, bool))
        horizons = horizons[np.asarray(mask, bool)] if horizons is not None else None
    out: dict = {f"R@{k}": mean_valid(recall_at_k(st, k, tie))[0] for k in ks}
    out["MRR"] = mean_valid(reciprocal_rank(st, tie))[0]
    out["MedR"] = median_first_rank(st, tie)
    if horizons is not None:
        out["macro"] = macro_over_horizons(recall_at_k(st, 5, tie), horizons)
    out["n"] = int(st.valid.sum())
    out["n_empty"] = int((~st.valid).sum())
    return out


def evaluate_run(run, labels: QueryLabels, *, ks: Sequence[int] = DEFAULT_KS, tie: str = "expected",
                 ndcg_k: int = DEFAULT_NDCG_K, gains: Mapping[str, float] | None = None) -> dict:
    """Every stratum of one run (see the module docstring). ``labels`` must be aligned with ``run.query_ids``."""
    from eval.triplets import TripletScores, triplet_summary

    if list(labels.query_ids) != list(run.query_ids):
        raise ValueError(f"labels are not aligned with run {run.name!r}")
    st = RankStats.from_run(run, MAIN_POOL)
    h = labels.horizon
    main = metric_block(st, ks=ks, tie=tie, horizons=h)
    if run.ranked is not None and ndcg_k <= run.k:
        main[f"nDCG@{ndcg_k}"] = mean_valid(ndcg_at_k(run.ranked, ndcg_k, gains))[0]
    out = {"name": run.name, "method": run.method, "benchmark": run.benchmark, "n_queries": run.n, "k": run.k,
           "tie": tie, "main": main}
    out["by_horizon"] = {str(x): metric_block(st, h == x, ks=ks, tie=tie)
                         for x in range(1, REPORT_MAX_HORIZON + 1) if (h == x).any()}
    qtypes = [q for q in QUESTION_TYPES if (labels.qtype == q).any()]
    qtypes += sorted(set(labels.qtype.tolist()) - set(qtypes))
    out["by_qtype"] = {q: metric_block(st, labels.qtype == q, ks=ks, tie=tie) for q in qtypes}
    out["by_domain"] = {d: metric_block(st, labels.domain == d, ks=ks, tie=tie)
                        for d in sorted(set(labels.domain.tolist()))}
    out["by_tier"] = {p: metric_block(RankStats.from_run(run, p), ks=ks, tie=tie) for p in TIER_POOLS if p in run.stats}
    out["by_gt_definition"] = {p: metric_block(RankStats.from_run(run, p), ks=ks, tie=tie)
                               for p in GT_DEFINITIONS if p in run.stats}
    try:
        ts = TripletScores.from_run(run)
    except KeyError:
        out["triplets"] = None
    else:
        out["triplets"] = {"all": triplet_summary(ts),
                           "by_domain": {d: triplet_summary(ts, labels.domain == d)
                                         for d in sorted(set(labels.domain.tolist()))}}
    return out
