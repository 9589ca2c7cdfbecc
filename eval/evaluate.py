"""Stratified evaluation of one run: every number the reports print, as one nested dict.

The evaluated population (`Population`) is explicit: by default the paper's main benchmark, the fair test queries
of Q1-Q4 (PSR §5.1: "the fair test set of n = 2,430 queries whose ground truth is present in the retrieval space";
App. C: "Q1-Q4 constitute the main benchmark ... Q5 is a separate multi-object stress test"). Every stratum, the
nDCG mean, the tiers, the triplets and the significance tests of a report use that one population. Q5 is scored
apart, per group, by `evaluate_groups` (the joint all-objects metric of App. Q).

Strata (each reports ``n``, the queries with a non-empty pool, and ``n_empty``):

- ``main``: the main pool (``type2-all`` = in_dataset + cross_dataset, own video excluded), with ``macro``
  (R@5 averaged unweighted over horizons 1..5, h >= 6 folded into 5) and the tier-weighted nDCG;
- ``by_horizon`` (1..5, folded), ``by_qtype``, ``by_domain`` (the query's source domain): the main pool
  restricted to those queries;
- ``by_tier``: each tier scored against that tier's pool alone (``in_video`` over the full corpus;
  ``in_dataset``, ``cross_dataset``, ``bge_similar`` with the own video excluded);
- ``by_gt_definition``: every GT definition the run holds (`eval.schema.GT_DEFINITION_FIELDS`);
- ``triplets``: the GenState-style diagnostics (`eval.triplets`), overall and by domain.

Recall, MRR and nDCG are fractions in [0, 1] (tables print them x100); ``MedR`` is a rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from eval.errors import InputError
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
from eval.schema import GT_DEFINITION_FIELDS, MAIN_QTYPES, QUESTION_TYPES, REPORT_MAX_HORIZON, SPLITS

MAIN_POOL = "type2-all"
TIER_POOLS = ("in_video", "in_dataset", "cross_dataset", "bge_similar")
DEFAULT_NDCG_K = 10
#: Question types of the main benchmark; Q5 (multi-object) is its separate stress test (PSR App. C, Q).
MULTI_OBJECT_QTYPE = "Q5"


@dataclass(frozen=True)
class QueryLabels:
    """Labels of a run's queries, aligned with ``query_ids``: folded horizon (1..5), question type, domain, split,
    fair (main GT pool non-empty) and the Q5 group id (None outside Q5)."""

    query_ids: list[str]
    horizon: np.ndarray
    qtype: np.ndarray
    domain: np.ndarray
    split: np.ndarray = field(default=None)  # type: ignore[assignment]
    fair: np.ndarray = field(default=None)  # type: ignore[assignment]
    group_id: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        n = len(self.query_ids)
        for name, default in (("split", "test"), ("fair", True), ("group_id", None)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(n, default, dtype=bool if name == "fair" else object))

    @classmethod
    def from_benchmark(cls, bench, query_ids: Sequence[str], run_name: str = "run") -> QueryLabels:
        index = bench.query_index
        missing = [q for q in query_ids if q not in index]
        if missing:
            raise InputError(f"{run_name}: {len(missing)} query ids are not in benchmark {bench.root} "
                             f"(first: {missing[0]!r}); was the run scored on another benchmark?")
        rows = np.fromiter((index[q] for q in query_ids), dtype=np.int64, count=len(query_ids))
        ds = bench.queries_ds.select(rows)
        return cls(list(query_ids), report_horizons(np.asarray(ds["horizon"][:])),
                   np.asarray(ds["qtype"][:], dtype=object), np.asarray(ds["domain"][:], dtype=object),
                   np.asarray(ds["split"][:], dtype=object), np.asarray(ds["fair"][:], dtype=bool),
                   np.asarray(ds["group_id"][:], dtype=object))

    def select(self, mask: np.ndarray) -> QueryLabels:
        m = np.asarray(mask, bool)
        return QueryLabels([q for q, keep in zip(self.query_ids, m, strict=True) if keep], self.horizon[m],
                           self.qtype[m], self.domain[m], self.split[m], self.fair[m], self.group_id[m])


def _span(items: Sequence[str], universe: Sequence[str]) -> str:
    """``Q1–Q4`` for a contiguous run of ``universe``, else ``Q1, Q3``."""
    idx = [universe.index(x) for x in items if x in universe]
    if len(idx) > 2 and idx == list(range(idx[0], idx[0] + len(idx))) and len(idx) == len(items):
        return f"{items[0]}–{items[-1]}"
    return ", ".join(items)


@dataclass(frozen=True)
class Population:
    """The evaluated queries: those of ``splits`` (None = every split), only the fair ones (main GT pool non-empty,
    the benchmark's ``fair`` field) when ``fair``, of question types ``qtypes``. The default is the paper's main
    benchmark: fair test queries of Q1-Q4."""

    splits: tuple[str, ...] | None = ("test",)
    fair: bool = True
    qtypes: tuple[str, ...] = MAIN_QTYPES

    def __post_init__(self) -> None:
        unknown = [s for s in self.splits or () if s not in SPLITS]
        if unknown:
            raise InputError(f"unknown split {unknown[0]!r}; expected some of {SPLITS} (or all)")
        if not self.qtypes:
            raise InputError("the population needs at least one question type")

    def mask(self, labels: QueryLabels) -> np.ndarray:
        """bool (n,): which of ``labels``' queries are in the population."""
        m = np.isin(labels.qtype.astype(str), list(self.qtypes))
        if self.splits is not None:
            m &= np.isin(labels.split.astype(str), list(self.splits))
        if self.fair:
            m &= labels.fair.astype(bool)
        return m

    def describe(self) -> str:
        """``test split, fair queries, Q1–Q4`` (for captions and messages)."""
        split = ("all splits" if self.splits is None else
                 ("+".join(self.splits) + (" split" if len(self.splits) == 1 else " splits")))
        fair = "fair queries (main GT pool non-empty)" if self.fair else "all queries (fair or not)"
        return f"{split}, {fair}, {_span(list(self.qtypes), list(QUESTION_TYPES))}"

    def multi_object(self) -> Population:
        """The same splits and fairness for the Q5 (multi-object) queries."""
        return Population(self.splits, self.fair, (MULTI_OBJECT_QTYPE,))

    def query_ids(self, bench) -> list[str]:
        """The benchmark's queries in the population, in file order."""
        labels = QueryLabels.from_benchmark(bench, bench.query_ids)
        return [q for q, keep in zip(labels.query_ids, self.mask(labels), strict=True) if keep]

    def to_dict(self) -> dict:
        return {"splits": list(self.splits) if self.splits is not None else None, "fair": self.fair,
                "qtypes": list(self.qtypes), "description": self.describe()}


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
                 ndcg_k: int = DEFAULT_NDCG_K, gains: Mapping[str, float] | None = None,
                 population: Population | None = None) -> dict:
    """Every stratum of one run (see the module docstring). ``labels`` must be aligned with ``run.query_ids``.

    With ``population`` the run is first restricted to the queries in it (``n_left_out`` counts the others); every
    number is then over those queries. None evaluates every query of the run. A run with no query left is an
    `eval.errors.InputError`, never a table of NaN."""
    from eval.triplets import TripletScores, triplet_summary

    if list(labels.query_ids) != list(run.query_ids):
        raise InputError(f"labels are not aligned with run {run.name!r}")
    n_in = run.n
    if population is not None:
        keep = population.mask(labels)
        if not keep.all():
            run, labels = run.select([q for q, k in zip(run.query_ids, keep, strict=True) if k]), labels.select(keep)
    if run.n == 0:
        raise InputError(f"run {run.name!r} holds no query" + (f" of the population ({population.describe()})"
                                                                if population is not None and n_in else "")
                         + ": nothing to evaluate")
    st = RankStats.from_run(run, MAIN_POOL)
    h = labels.horizon
    main = metric_block(st, ks=ks, tie=tie, horizons=h)
    if run.ranked is not None and ndcg_k <= run.k:
        main[f"nDCG@{ndcg_k}"] = mean_valid(ndcg_at_k(run.ranked, ndcg_k, gains))[0]
    out = {"name": run.name, "method": run.method, "benchmark": run.benchmark, "n_queries": run.n,
           "n_left_out": n_in - run.n, "population": population.to_dict() if population is not None else None,
           "k": run.k, "tie": tie, "main": main}
    out["by_horizon"] = {str(x): metric_block(st, h == x, ks=ks, tie=tie)
                         for x in range(1, REPORT_MAX_HORIZON + 1) if (h == x).any()}
    qtypes = [q for q in QUESTION_TYPES if (labels.qtype == q).any()]
    qtypes += sorted(set(labels.qtype.tolist()) - set(qtypes))
    out["by_qtype"] = {q: metric_block(st, labels.qtype == q, ks=ks, tie=tie) for q in qtypes}
    out["by_domain"] = {d: metric_block(st, labels.domain == d, ks=ks, tie=tie)
                        for d in sorted(set(labels.domain.tolist()))}
    out["by_tier"] = {p: metric_block(RankStats.from_run(run, p), ks=ks, tie=tie) for p in TIER_POOLS if p in run.stats}
    out["by_gt_definition"] = {p: metric_block(RankStats.from_run(run, p), ks=ks, tie=tie)
                               for p in GT_DEFINITION_FIELDS if p in run.stats}
    try:
        ts = TripletScores.from_run(run)
    except KeyError:
        out["triplets"] = None
    else:
        out["triplets"] = {"all": triplet_summary(ts),
                           "by_domain": {d: triplet_summary(ts, labels.domain == d)
                                         for d in sorted(set(labels.domain.tolist()))}}
    return out


def check_fingerprint(run, bench) -> None:
    """Refuse (`eval.errors.InputError`, naming both) a run whose benchmark fingerprint (`eval.fingerprint`) is not
    ``bench``'s, or that records none (written before runs recorded one: nothing else says which benchmark it
    belongs to)."""
    from eval.fingerprint import describe

    fp = bench.fingerprint
    if run.fingerprint is None:
        raise InputError(f"run {run.name!r} records no benchmark fingerprint, so it cannot be checked against "
                         f"{bench.root} ({describe(fp)})", fix="score the method again with this toolkit "
                         "(`python -m retrieval ...`, `eval.scoring.score_benchmark`): runs record the fingerprint "
                         "of the benchmark they were scored on")
    if run.fingerprint != fp:
        raise InputError(f"run {run.name!r} was scored on benchmark {describe(run.fingerprint)}, but {bench.root} is "
                         f"{describe(fp)}", fix="pass the benchmark the run was scored on, or score the method again "
                                                "on this one")


def check_run_against(run, bench) -> None:
    """Refuse (`eval.errors.InputError`, naming both) a run that was not scored on ``bench``: its benchmark
    fingerprint (`eval.fingerprint`) must equal the benchmark's, and every query's pool sizes (``n_pos`` of each
    pool and probe) and ranked counts must be what the benchmark gives it (`eval.scoring.expected_pool_sizes`:
    ``n_above + n_tie_neg + n_pos`` at most the items ranked). A run without a fingerprint (written before runs
    recorded one) is refused too (`check_fingerprint`)."""
    from eval.fingerprint import describe
    from eval.scoring import expected_pool_sizes

    check_fingerprint(run, bench)
    fp = bench.fingerprint
    if run.n == 0:
        return
    sizes, n_excluded = expected_pool_sizes(bench, run.query_ids)
    n_corpus = len(bench.corpus_ids)
    for pool, want in sizes.items():
        if pool not in run.stats:
            continue
        d = run.stats[pool]
        bad = np.flatnonzero(np.asarray(d["n_pos"]) != want)
        if bad.size:
            i = int(bad[0])
            raise InputError(f"run {run.name!r}: query {run.query_ids[i]!r} has n_pos = {int(d['n_pos'][i])} in pool "
                             f"{pool!r}, but {bench.root} ({describe(fp)}) gives it {int(want[i])} positives "
                             f"({bad.size} queries differ)", fix="score the method again on this benchmark")
        if "n_above" in d:
            ranked = n_corpus - (n_excluded if pool != "in_video" else np.zeros_like(n_excluded))
            over = np.flatnonzero(d["n_above"] + d["n_tie_neg"] + d["n_pos"] > ranked)
            if over.size:
                i = int(over[0])
                raise InputError(f"run {run.name!r}: query {run.query_ids[i]!r} counts more items in pool {pool!r} "
                                 f"(n_above + n_tie_neg + n_pos = "
                                 f"{int(d['n_above'][i] + d['n_tie_neg'][i] + d['n_pos'][i])}) than {bench.root} "
                                 f"ranks for it ({int(ranked[i])})", fix="score the method again on this benchmark")


def multi_object_groups(bench, population: Population) -> tuple[dict[str, list[str]], int]:
    """The Q5 groups scored under ``population`` (its splits and fairness, question type Q5): ``{group_id: member
    query ids}`` in file order, keeping a group only when every member is in the population (a member without a
    GT in the corpus can never be hit, so a partial group would not be the joint task); and the number of groups
    left out for that reason."""
    pop = population.multi_object()
    labels = QueryLabels.from_benchmark(bench, bench.query_ids)
    is_q5 = labels.qtype == MULTI_OBJECT_QTYPE
    keep = pop.mask(labels)
    groups: dict[str, list[str]] = {}
    complete: dict[str, bool] = {}
    for q, gid, k in zip(np.asarray(labels.query_ids, dtype=object)[is_q5], labels.group_id[is_q5], keep[is_q5],
                         strict=True):
        gid = str(gid if gid is not None else q)  # a Q5 query without a group is a group of one
        groups.setdefault(gid, []).append(q)
        complete[gid] = complete.get(gid, True) and bool(k)
    in_split = {g for g, members in groups.items() if pop.splits is None or
                str(labels.split[bench.query_index[members[0]]]) in pop.splits}
    kept = {g: m for g, m in groups.items() if complete[g]}
    return kept, len(in_split) - len(kept)


def evaluate_groups(run, groups: Mapping[str, Sequence[str]], *, ks: Sequence[int] = DEFAULT_KS,
                    tie: str = "expected", n_left_out: int = 0) -> dict:
    r"""The multi-object (Q5) metric of PSR App. Q: a group (the K objects of one video asked together) is correct
    at k when every member query is a hit at k.

    Members are distinct queries, each ranking the corpus on its own, so their tie orders are independent and the
    tie-aware expectation is exact as a product: ``E[joint_k(G)] = prod_{i in G} E[hit_k(i)]`` (under a
    deterministic tie rule the product of 0/1 hits). ``joint`` R@k = mean over groups; ``per_object`` R@k = mean
    over the member queries; ``by_size`` = joint R@k per group size K (the paper: ~p^K, collapsing with K).
    ``groups`` come from `multi_object_groups`; the run must hold every member. A group with a member whose main
    pool is empty (possible only in a population that is not fair-only) has no value and is counted in
    ``n_groups_empty``."""
    index = {q: i for i, q in enumerate(run.query_ids)}
    missing = [q for members in groups.values() for q in members if q not in index]
    if missing:
        raise InputError(f"run {run.name!r} lacks {len(missing)} member queries of the multi-object (Q5) groups, e.g. "
                         f"{missing[0]!r}", fix="score every query of the population (a failed forecast counts as a "
                                                "miss)")
    st = RankStats.from_run(run, MAIN_POOL)
    rows = [np.fromiter((index[q] for q in m), np.int64, count=len(m)) for m in groups.values()]
    sizes = np.array([len(r) for r in rows], np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    group_of = np.repeat(np.arange(len(rows)), sizes)
    valid = np.ones(len(rows), bool)
    np.logical_and.at(valid, group_of, st.valid[flat])
    out: dict = {"n_groups": int(valid.sum()), "n_groups_empty": int((~valid).sum()),
                 "n_objects": int(sizes[valid].sum()), "n_groups_left_out": int(n_left_out), "tie": tie,
                 "joint": {}, "per_object": {}, "by_size": {}}
    for k in ks:
        hit = recall_at_k(st, k, tie)[flat]
        joint = np.ones(len(rows))
        np.multiply.at(joint, group_of, np.nan_to_num(hit))
        out["joint"][f"R@{k}"] = mean_valid(np.where(valid, joint, np.nan))[0]
        out["per_object"][f"R@{k}"] = mean_valid(np.where(valid[group_of], hit, np.nan))[0]
        for size in sorted(set(sizes[valid].tolist())):
            sel = valid & (sizes == size)
            out["by_size"].setdefault(str(size), {"n": int(sel.sum())})[f"R@{k}"] = float(joint[sel].mean())
    return out
