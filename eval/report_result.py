"""The typed pieces of a report (`eval.report.Report`): one run's evaluation, the multi-object groups, the paired
tests, the notes and the data each plot draws. Values are fractions in [0, 1] (NaN where undefined) unless a field
says otherwise. Each ``to_dict`` gives the JSON shape of report.json; `RunResult.from_dict` and
`GroupsResult.from_dict` read the dicts `eval.evaluate.evaluate_run` and `eval.evaluate.evaluate_groups` return.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from eval.evaluate import Population
from eval.stats import BootstrapResult, McNemarResult, TTestResult

#: The strata of `RunResult`, in report.json order: each maps a stratum value to its `MetricBlock`.
STRATA = ("by_horizon", "by_qtype", "by_domain", "by_tier", "by_gt_definition")


@dataclass(frozen=True)
class MetricBlock:
    """The metrics of one stratum (`eval.evaluate.metric_block`): ``R@k`` for each k, ``MRR``, ``MedR`` (a rank),
    ``n`` and ``n_empty`` (queries), and on the main block ``macro`` and ``nDCG@k``; keyed by metric name."""

    values: dict[str, float | int | None]

    def get(self, metric: str) -> float | None:
        return self.values.get(metric)

    @property
    def n(self) -> int | None:
        return self.values.get("n")

    def to_dict(self) -> dict:
        return dict(self.values)


def _blocks(d: Mapping[str, Mapping]) -> dict[str, MetricBlock]:
    return {k: MetricBlock(dict(v)) for k, v in d.items()}


@dataclass(frozen=True)
class OrderShare:
    """One order of the triplet (main, temp, sem): its expected count of queries and its share of ``n``."""

    count: float
    share: float


@dataclass(frozen=True)
class TripletSummary:
    """`eval.triplets.triplet_summary`: accuracies, the order histogram (with ``missed``), and query counts."""

    n: int
    n_missed: int
    n_incomplete: int
    acc_temp: float
    acc_sem: float
    acc_tri: float
    orders: dict[str, OrderShare]

    @classmethod
    def from_dict(cls, d: Mapping) -> TripletSummary:
        return cls(d["n"], d["n_missed"], d["n_incomplete"], d["acc_temp"], d["acc_sem"], d["acc_tri"],
                   {o: OrderShare(v["count"], v["share"]) for o, v in d["orders"].items()})

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Triplets:
    """Triplet diagnostics over every query (``all``) and per source domain."""

    all: TripletSummary
    by_domain: dict[str, TripletSummary]

    def to_dict(self) -> dict:
        return {"all": self.all.to_dict(), "by_domain": {d: s.to_dict() for d, s in self.by_domain.items()}}


@dataclass(frozen=True)
class RunResult:
    """Every stratum of one run over the report's population (`eval.evaluate.evaluate_run`)."""

    name: str
    method: str
    benchmark: str
    n_queries: int
    n_left_out: int
    population: Population | None
    k: int
    tie: str
    main: MetricBlock
    by_horizon: dict[str, MetricBlock]
    by_qtype: dict[str, MetricBlock]
    by_domain: dict[str, MetricBlock]
    by_tier: dict[str, MetricBlock]
    by_gt_definition: dict[str, MetricBlock]
    triplets: Triplets | None

    def stratum(self, name: str) -> dict[str, MetricBlock]:
        """The blocks of stratum ``name`` (one of `STRATA`)."""
        if name not in STRATA:
            raise KeyError(f"unknown stratum {name!r}; one of {STRATA}")
        return getattr(self, name)

    @classmethod
    def from_dict(cls, d: Mapping) -> RunResult:
        p = d["population"]
        pop = None if p is None else Population(tuple(p["splits"]) if p["splits"] is not None else None, p["fair"],
                                                tuple(p["qtypes"]))
        t = d["triplets"]
        trip = None if t is None else Triplets(TripletSummary.from_dict(t["all"]),
                                               {k: TripletSummary.from_dict(v) for k, v in t["by_domain"].items()})
        return cls(d["name"], d["method"], d["benchmark"], d["n_queries"], d["n_left_out"], pop, d["k"], d["tie"],
                   MetricBlock(dict(d["main"])), *(_blocks(d[s]) for s in STRATA), trip)

    def to_dict(self) -> dict:
        return {"name": self.name, "method": self.method, "benchmark": self.benchmark, "n_queries": self.n_queries,
                "n_left_out": self.n_left_out,
                "population": self.population.to_dict() if self.population is not None else None, "k": self.k,
                "tie": self.tie, "main": self.main.to_dict(),
                **{s: {k: b.to_dict() for k, b in self.stratum(s).items()} for s in STRATA},
                "triplets": self.triplets.to_dict() if self.triplets is not None else None}


@dataclass(frozen=True)
class GroupsResult:
    """The multi-object (Q5) groups of one run (`eval.evaluate.evaluate_groups`): counts, joint and per-object
    ``R@k``, and joint ``R@k`` by group size K (each with its ``n`` groups)."""

    n_groups: int
    n_groups_empty: int
    n_objects: int
    n_groups_left_out: int
    tie: str
    joint: dict[str, float]
    per_object: dict[str, float]
    by_size: dict[str, MetricBlock]

    @classmethod
    def from_dict(cls, d: Mapping) -> GroupsResult:
        return cls(d["n_groups"], d["n_groups_empty"], d["n_objects"], d["n_groups_left_out"], d["tie"],
                   dict(d["joint"]), dict(d["per_object"]), _blocks(d["by_size"]))

    def to_dict(self) -> dict:
        return {"n_groups": self.n_groups, "n_groups_empty": self.n_groups_empty, "n_objects": self.n_objects,
                "n_groups_left_out": self.n_groups_left_out, "tie": self.tie, "joint": dict(self.joint),
                "per_object": dict(self.per_object), "by_size": {k: b.to_dict() for k, b in self.by_size.items()}}


@dataclass(frozen=True)
class PairedTest:
    """Per-query tests of R@5 of ``run`` against ``reference`` on the queries both hold: paired bootstrap, McNemar,
    and the bootstrap within each horizon (delta = run - reference, a fraction)."""

    run: str
    reference: str
    metric: str
    tie: str
    n: int
    bootstrap: BootstrapResult
    mcnemar: McNemarResult
    by_horizon: dict[int, BootstrapResult]
    #: the seeds whose runs' hits were averaged per query (two seed groups, `eval.report`'s ``--pair GROUP:GROUP``);
    #: empty: one run against one run
    seeds: tuple = ()
    #: with two or more ``seeds``: the paired t-test over them of each seed's R@5 on the same queries (the seed
    #: variance that the per-query tests of the seed means leave out)
    ttest: TTestResult | None = None

    def to_dict(self) -> dict:
        out = {"run": self.run, "reference": self.reference, "metric": self.metric, "tie": self.tie, "n": self.n,
               "bootstrap": self.bootstrap.to_dict(), "mcnemar": self.mcnemar.to_dict(),
               "by_horizon": {str(h): r.to_dict() for h, r in self.by_horizon.items()}, "seeds": list(self.seeds)}
        if self.ttest is not None:
            out["ttest"] = self.ttest.to_dict()
        return out


@dataclass(frozen=True)
class SeedGroupTest:
    """A paired t-test across common seeds of a seed group against the reference group; ``error`` when none ran
    (`eval.stats.paired_ttest` refused, e.g. fewer than two common seeds)."""

    group: str
    reference: str
    metric: str
    ttest: TTestResult | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        out: dict = {"group": self.group, "reference": self.reference, "metric": self.metric}
        if self.ttest is not None:
            out["ttest"] = self.ttest.to_dict()
        else:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class Note:
    """Something the reader must know about the population: ``text`` (report.md, report.json) and ``line`` (one
    terminal line)."""

    text: str
    line: str


@dataclass(frozen=True)
class HorizonCurve:
    """One table row's R@5 (fraction) by horizon with its interval: a 95% bootstrap CI for one run, mean±std over
    seeds for a seed group (`eval.report`)."""

    label: str
    horizon: list[int]
    r5: list[float]
    low: list[float]
    high: list[float]
    interval: str

    def to_dict(self) -> dict:
        return {"horizon": self.horizon, "r5": self.r5, "low": self.low, "high": self.high, "interval": self.interval}


@dataclass(frozen=True)
class TierBars:
    """One table row's ``metric`` (fraction) per GT tier: a run's value, or a seed group's mean and std."""

    label: str
    metric: str
    tiers: list[str]
    values: list[float]
    std: list[float] | None

    def to_dict(self) -> dict:
        return {"tiers": self.tiers, self.metric: self.values, "std": self.std}


@dataclass(frozen=True)
class HorizonDeltas:
    """One paired test's ΔR@5 (fraction, run - reference) within each horizon, with its 95% bootstrap CI and n."""

    run: str
    reference: str
    horizon: list[int]
    delta: list[float]
    ci_low: list[float]
    ci_high: list[float]
    n: list[int]

    @classmethod
    def from_test(cls, t: PairedTest) -> HorizonDeltas:
        hs = sorted(t.by_horizon)
        b = [t.by_horizon[h] for h in hs]
        return cls(t.run, t.reference, hs, [x.delta for x in b], [x.ci_low for x in b], [x.ci_high for x in b],
                   [x.n for x in b])


@dataclass(frozen=True)
class OrderShares:
    """One table row's triplet order shares (fractions of its ``n`` triplets; a seed group's mean), ``missed`` last."""

    label: str
    orders: list[str]
    shares: list[float]


@dataclass(frozen=True)
class CeilingStage:
    """One stage of the ceiling decomposition (`eval.findings.ceiling`): its run (or seed group), R@5 x100 (seeds'
    mean) and that R@5 as a fraction of the first stage's (the semantic-text oracle's)."""

    stage: str
    run: str
    r5: float
    share_of_first: float


@dataclass(frozen=True)
class HorizonMix:
    """The share (fraction) of queries at each horizon (h >= 6 as 5): of the report's population, and of the
    benchmark card's ``h1_share`` .. ``h5_share`` (Q1-Q4 queries of every split) when a card was given."""

    horizon: list[int]
    population: list[float]
    card: list[float] | None
