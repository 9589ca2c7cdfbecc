"""Paper-shaped reports over one or many runs: ``python -m eval report RUN [RUN ...] --data DIR --out DIR``.

Output directory::

    main.{md,csv,tex}             method x R@1/5/10/20/50, MRR, macro, nDCG@10, MedR, n (PSR Table 2)
    by_horizon.{md,csv,tex}       R@5 by horizon h1..h5 + all (Table 4, the ceiling decomposition)
    by_qtype / by_tier / by_gt_definition / by_domain .{md,csv,tex}     R@5 per stratum
    triplets.{md,csv,tex}         Acc_temp / Acc_sem / Acc_tri and the order histogram (GenState-style)
    multi_object.{md,csv,tex}     Q5 groups: joint all-objects-correct R@k and per-object R@k (PSR App. Q)
    significance.{md,csv,tex}     every run vs the reference run: paired bootstrap, McNemar, per-horizon bootstrap,
                                  and a paired t-test across seeds for multi-seed groups
    pairs.{md,csv,tex}            the same tests between two other runs (``--pair RUN:AGAINST``, repeatable)
    r5_by_horizon.png, tiers.png  R@5 by horizon (95% CIs), R@5 by GT tier (matplotlib, Agg; numbers in report.json)
    deltas_by_horizon.png         forest plot of the per-horizon paired ΔR@5 with 95% CIs (with --reference or --pair)
    triplet_orders.png            stacked bars of the triplet order shares per method
    ceiling.png                   the ceiling decomposition (`eval.findings.ceiling`), when the runs hold its roles
    horizon_shares.png            the population's share of queries per horizon, and the card's (``--card``)
                                  (each of these four with its plotted numbers beside it as NAME.json)
    report.json                   every number above (fractions in [0, 1]) + the per-run stratified results
    report_config.json            the resolved configuration of this report

Population. Every table is over one evaluated population (`eval.evaluate.Population`; default the paper's main
benchmark, the fair test queries of Q1-Q4; ``--split``, ``--fair/--no-fair``, ``--qtypes`` to choose), printed in
every caption; the multi-object table is over the Q5 groups of the same splits and fairness. Every run is first
checked against the benchmark (`eval.evaluate.check_run_against`: fingerprint and pool sizes) and must hold every
query of the population; queries outside it are left out with a note (printed, and in report.md and report.json).
An empty run, or one with no query of the population, is an error.

Multi-seed grouping rule: a run whose name ends in a seed suffix -- ``seed`` followed by digits, optionally joined
by ``-``, ``_``, ``.`` or ``=`` and preceded by ``-``, ``_`` or ``.`` (``lftr-fusion-seed3``, ``lftr_fusion.seed=3``)
-- belongs to the group named by the rest (``lftr-fusion``), with that seed. A group with two or more distinct seeds
is shown as one row of mean±std (sample std over seeds); its runs stay in report.json. Other runs are single rows.

Significance (the paper's protocol): per-query tests on the population, for R@5 of the main pool: paired bootstrap
of the hit@5 under the report's tie rule (10^4 resamples, seeded; delta = run - reference, in points; no p-value
below `eval.stats.MIN_BOOTSTRAP_N` queries, printed "n too small"), McNemar's test on the same hits
(`eval.stats.mcnemar`: exact binomial on 0/1 hits, a sign-flip randomization test on expected hits; never the
corpus row order), and the bootstrap per horizon. When the reference is a multi-seed group, per-query tests use
its lowest-seed run; a paired t-test across common seeds compares two groups. ``--pair GROUP:GROUP``
between two seed groups (their labels) runs the per-query tests on each query's hit averaged over the
groups' common seeds: the seed means the main table shows, and a paired t-test over those seeds of each seed's
R@5 on the same queries (the seed variance that per-query tests leave out; the paper's per-seed paired test).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval import plots
from eval.errors import InputError
from eval.evaluate import (
    MAIN_POOL,
    MAIN_QTYPES,
    TIER_POOLS,
    Population,
    QueryLabels,
    check_fingerprint,
    check_run_against,
    evaluate_groups,
    evaluate_run,
    multi_object_groups,
)
from eval.io import atomic_dir, atomic_path, write_json
from eval.metrics import DEFAULT_KS, RankStats, recall_at_k
from eval.report_result import (
    CeilingStage,
    GroupsResult,
    HorizonCurve,
    HorizonDeltas,
    HorizonMix,
    MetricBlock,
    Note,
    OrderShares,
    PairedTest,
    RunResult,
    SeedGroupTest,
    TierBars,
)
from eval.runs import seed_group
from eval.schema import GT_DEFINITION_FIELDS, REPORT_MAX_HORIZON
from eval.stats import MIN_BOOTSTRAP_N, mcnemar, paired_bootstrap, paired_bootstrap_by, paired_ttest, seed_summary


@dataclass
class ReportConfig:
    """Resolved configuration of a report (written to report_config.json)."""

    ks: tuple[int, ...] = DEFAULT_KS
    tie: str = "expected"
    ndcg_k: int = 10
    gains: dict[str, float] | None = None
    reference: str | None = None
    #: extra paired tests between two runs that are not the reference: ``(run, against)`` names (``--pair A:B``)
    pairs: tuple[tuple[str, str], ...] = ()
    n_resamples: int = 10_000
    seed: int = 0
    ci_resamples: int = 1000
    data: str = ""
    runs: list[str] = field(default_factory=list)
    #: the evaluated population (`eval.evaluate.Population`): splits (None = all), fair queries only, question types
    split: tuple[str, ...] | None = ("test",)
    fair: bool = True
    qtypes: tuple[str, ...] = MAIN_QTYPES
    #: evaluate over the population queries every run holds (the paper's "intersection subset", Table 3) instead of
    #: refusing a run that lacks some
    intersect: bool = False

    def population(self) -> Population:
        return Population(tuple(self.split) if self.split is not None else None, self.fair, tuple(self.qtypes))


# ------------------------------------------------------------------------------------------------ table cells
@dataclass
class Table:
    """A small table rendered as Markdown, CSV and LaTeX. Cells are strings (already formatted)."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.caption:
            lines += ["", self.caption]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.columns)
        w.writerows(self.rows)
        return buf.getvalue()

    def latex(self) -> str:
        esc = lambda s: (str(s).replace("\\", r"\textbackslash{}").replace("&", r"\&").replace("%", r"\%")  # noqa: E731
                         .replace("_", r"\_").replace("#", r"\#").replace("±", r"$\pm$").replace(">", r"$>$"))
        spec = "l" + "r" * (len(self.columns) - 1)
        out = [r"\begin{table}[t]", r"\centering", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
               " & ".join(esc(c) for c in self.columns) + r" \\", r"\midrule"]
        out += [" & ".join(esc(c) for c in r) + r" \\" for r in self.rows]
        out += [r"\bottomrule", r"\end{tabular}"]
        if self.caption:
            out.append(rf"\caption{{{esc(self.caption)}}}")
        out.append(r"\end{table}")
        return "\n".join(out) + "\n"

    def write(self, out_dir: Path) -> None:
        for ext, text in (("md", self.markdown()), ("csv", self.csv()), ("tex", self.latex())):
            with atomic_path(out_dir / f"{self.name}.{ext}") as tmp:
                tmp.write_text(text, encoding="utf-8")

    def to_dict(self) -> dict:
        return asdict(self)


def _pct(v: float | None) -> str:
    return "—" if v is None or not np.isfinite(v) else f"{100 * v:.2f}"


def _cell(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """One run: the value; a seed group: mean±std."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64) * scale
    if v.size == 0:
        return "—"
    if len(values) == 1:
        return f"{v[0]:.{digits}f}"
    s = seed_summary(v)
    return f"{s.mean:.{digits}f}±{s.std:.{digits}f}"


@dataclass
class Entry:
    """A table row: one run, or a multi-seed group of runs."""

    label: str
    names: list[str]
    seeds: list[int | None]

    @property
    def is_group(self) -> bool:
        return len(self.names) > 1


def group_entries(names: Sequence[str]) -> list[Entry]:
    """Rows in first-appearance order; runs sharing a seed-suffix group with >= 2 distinct seeds are merged."""
    by_group: dict[str, list[tuple[str, int | None]]] = {}
    for n in names:
        g, s = seed_group(n)
        by_group.setdefault(g, []).append((n, s))
    entries, done = [], set()
    for n in names:
        g, s = seed_group(n)
        members = by_group[g]
        seeds = [x[1] for x in members]
        if s is not None and len(members) >= 2 and None not in seeds and len(set(seeds)) == len(seeds):
            if g not in done:
                done.add(g)
                order = sorted(members, key=lambda x: x[1])
                entries.append(Entry(f"{g} ({len(order)} seeds)", [x[0] for x in order], [x[1] for x in order]))
        else:
            entries.append(Entry(n, [n], [s]))
    return entries


# ------------------------------------------------------------------------------------------------ tables
def _stratum_table(name: str, title: str, entries: list[Entry], blocks: Mapping[str, Mapping[str, MetricBlock]],
                   keys: Sequence[str], metric: str = "R@5", caption: str = "", prefix: str = "") -> Table:
    """One row per entry, one column per stratum value in ``keys``; ``blocks``: run name -> value -> block."""
    cols = ["method"]
    for k in keys:
        ns = {blocks[n][k].n for e in entries for n in e.names if k in blocks[n]}
        ns.discard(None)
        label = f"{prefix}{k}" if k != "all" else k
        cols.append(f"{label} (n={ns.pop()})" if len(ns) == 1 else label)
    rows = [[e.label] + [_cell([blocks[n][k].get(metric) if k in blocks[n] else None for n in e.names])
                         for k in keys] for e in entries]
    return Table(name, title, cols, rows, caption)


def _main_table(entries: list[Entry], runs: Mapping[str, RunResult], cfg: ReportConfig) -> Table:
    metrics = [f"R@{k}" for k in cfg.ks] + ["MRR", "macro", f"nDCG@{cfg.ndcg_k}"]
    cols = ["method"] + metrics + ["MedR", "n"]
    rows = []
    for e in entries:
        r = [e.label] + [_cell([runs[n].main.get(m) for n in e.names]) for m in metrics]
        r.append(_cell([runs[n].main.get("MedR") for n in e.names], scale=1.0, digits=1))
        ns = sorted({runs[n].main.n for n in e.names})
        r.append("/".join(str(x) for x in ns))
        rows.append(r)
    cap = (f"Main pool (type2-all: in-dataset + cross-dataset, own video excluded). R@k micro, x100; macro = R@5 "
           f"averaged over horizons 1-5 (h>=6 as 5); ties: {cfg.tie}. Seed groups: mean±std.")
    return Table("main", "Main results", cols, rows, cap)


def _triplet_table(entries: list[Entry], runs: Mapping[str, RunResult]) -> Table:
    orders = _order_names()
    cols = ["method", "Acc_temp", "Acc_sem", "Acc_tri"] + orders + ["n"]
    rows = []
    for e in entries:
        trip = [runs[n].triplets.all for n in e.names]
        r = [e.label] + [_cell([getattr(t, m) for t in trip]) for m in ("acc_temp", "acc_sem", "acc_tri")]
        r += [_cell([t.orders[o].share for t in trip]) for o in orders]
        r.append("/".join(sorted({str(t.n) for t in trip})))
        rows.append(r)
    cap = ("Triplets per query: main = best type1 GT item (same subject+state, other video); temp = best segment of "
           "the queried object's own trajectory in another state; sem = best other-video segment in the target state "
           "with another subject. Accuracies and order shares x100; ties split uniformly. Missed queries (no answer) "
           "count as failures: 0 on every accuracy, their share under 'missed'; n counts them.")
    return Table("triplets", "Triplet diagnostics", cols, rows, cap)


def _order_names() -> list[str]:
    """The triplet orders as the report names them (``main > temp > sem``, ...), then ``missed``."""
    from eval.triplets import ORDERS, order_name

    return [order_name(o) for o in ORDERS] + ["missed"]


def _multi_object_table(entries: list[Entry], groups_res: Mapping[str, GroupsResult], cfg: ReportConfig,
                        q5_pop: Population) -> Table | None:
    have = [e for e in entries if all(n in groups_res for n in e.names)]
    if not have:
        return None
    sizes = sorted({s for n in groups_res for s in groups_res[n].by_size}, key=int)
    cols = (["method"] + [f"joint R@{k}" for k in cfg.ks] + [f"per-object R@{k}" for k in cfg.ks]
            + [f"joint R@5 K={s}" for s in sizes] + ["groups", "objects"])
    rows = []
    for e in have:
        res = [groups_res[n] for n in e.names]
        r = [e.label] + [_cell([x.joint[f"R@{k}"] for x in res]) for k in cfg.ks]
        r += [_cell([x.per_object[f"R@{k}"] for x in res]) for k in cfg.ks]
        r += [_cell([x.by_size[s].get("R@5") if s in x.by_size else None for x in res]) for s in sizes]
        r += ["/".join(sorted({str(x.n_groups) for x in res})), "/".join(sorted({str(x.n_objects) for x in res}))]
        rows.append(r)
    left = max(x.n_groups_left_out for x in groups_res.values())
    cap = (f"Multi-object stress test (PSR App. Q), population: {q5_pop.describe()}; a group is the K objects of one "
           f"video asked together. joint R@k: every member query is a hit at k (ties: {cfg.tie}; members rank "
           "independently, so the tie-aware joint is the product of their expected hits); per-object R@k: the mean "
           "over member queries. x100." + (f" {left} groups with a member outside the population are left out."
                                            if left else ""))
    return Table("multi_object", "Multi-object (Q5): joint all-objects-correct", cols, rows, cap)


def _fmt_p(p: float | None) -> str:
    return "n too small" if p is None else (f"{p:.2g}" if p >= 1e-4 else "<1e-4")


def _per_query_r5(run, tie: str) -> np.ndarray:
    return recall_at_k(RankStats.from_run(run, MAIN_POOL), 5, tie)


def _paired_test(name: str, run, ref_name: str, ref, labels: Mapping[str, QueryLabels],
                 cfg: ReportConfig) -> PairedTest | None:
    """Paired bootstrap, McNemar and per-horizon bootstrap of ``run`` against ``ref`` on the queries both hold
    (None when they share none); delta = run - reference."""
    return _paired_mean_test(name, [run], ref_name, [ref], labels[name], cfg)


def _paired_mean_test(name: str, runs: list, ref_name: str, refs: list, labels: QueryLabels, cfg: ReportConfig,
                      seeds: tuple = ()) -> PairedTest | None:
    """`_paired_test` of the mean hit of ``runs`` against the mean hit of ``refs`` (one run each, or the runs of two
    seed groups at the same ``seeds``), on the queries every run holds; ``labels``: those of ``runs[0]``."""
    held = set.intersection(*(set(r.query_ids) for r in [*runs[1:], *refs]))
    common = [q for q in runs[0].query_ids if q in held]
    if not common:
        return None
    ha = [_per_query_r5(r.select(common), cfg.tie) for r in runs]
    hb = [_per_query_r5(r.select(common), cfg.tie) for r in refs]
    ea, eb = np.mean(ha, 0), np.mean(hb, 0)
    horizons = labels.horizon[[runs[0].query_ids.index(q) for q in common]]
    boot = paired_bootstrap(ea, eb, n_resamples=cfg.n_resamples, seed=cfg.seed)
    mc = mcnemar(ea, eb, n_resamples=cfg.n_resamples, seed=cfg.seed)
    by_h = paired_bootstrap_by(ea, eb, horizons, n_resamples=cfg.n_resamples, seed=cfg.seed)
    ttest = None
    if len(seeds) >= 2:  # each seed's R@5 on these queries, paired by seed
        ttest = paired_ttest({s: float(np.nanmean(h)) for s, h in zip(seeds, ha, strict=True)},
                             {s: float(np.nanmean(h)) for s, h in zip(seeds, hb, strict=True)})
    return PairedTest(name, ref_name, "R@5", cfg.tie, boot.n, boot, mc, {int(h): r for h, r in by_h.items()},
                      seeds, ttest)


def _resolve_name(runs: Mapping[str, Any], entries: list[Entry], name: str, what: str) -> str:
    """The run called ``name``: a run name, or the first run of the entry (seed group) labelled so."""
    if name in runs:
        return name
    entry = next((e for e in entries if name in (e.label, *e.names)), None)
    if entry is None:
        raise InputError(f"{what} {name!r} is not among the runs: {[e.label for e in entries]}")
    return entry.names[0]


def _pair_tests(runs: Mapping[str, Any], labels: Mapping[str, QueryLabels], entries: list[Entry],
                cfg: ReportConfig) -> list[PairedTest]:
    """The ``--pair A:B`` tests: run A against run B; where A and B name two seed groups (their labels, not a run of
    them), each query's hit is its mean over the seeds both groups hold (`_seed_groups_pair`)."""
    out = []
    for a, b in cfg.pairs:
        ga, gb = _group_entry(runs, entries, a), _group_entry(runs, entries, b)
        if ga is not None and gb is not None:
            test = _seed_groups_pair(runs, labels, ga, gb, cfg)
        else:
            na, nb = _resolve_name(runs, entries, a, "--pair run"), _resolve_name(runs, entries, b, "--pair run")
            test = _paired_test(na, runs[na], nb, runs[nb], labels, cfg)
        if test is None:
            raise InputError(f"--pair {a}:{b}: the two runs share no query of the population")
        out.append(test)
    return out


def _group_entry(runs: Mapping[str, Any], entries: list[Entry], name: str) -> Entry | None:
    """The multi-seed entry named ``name``, by its label or its runs' name without the seed (None for a run's own
    name or anything else)."""
    if name in runs:
        return None
    return next((e for e in entries if e.is_group and name in (e.label, seed_group(e.names[0])[0])), None)


def _seed_groups_pair(runs: Mapping[str, Any], labels: Mapping[str, QueryLabels], a: Entry, b: Entry,
                      cfg: ReportConfig) -> PairedTest | None:
    """Group ``a`` against group ``b`` at their common seeds: each query's hit is its mean over those seeds' runs, so
    the test compares the seed means the main table reports (the per-query tests of a single run condition on one
    seed). `InputError` when the groups share no seed."""
    seeds = sorted(set(a.seeds) & set(b.seeds))
    if not seeds:
        raise InputError(f"--pair {a.label}:{b.label}: the seed groups share no seed ({a.seeds} vs {b.seeds})")
    ra = [runs[n] for n, s in zip(a.names, a.seeds, strict=True) if s in seeds]
    rb = [runs[n] for n, s in zip(b.names, b.seeds, strict=True) if s in seeds]
    return _paired_mean_test(seed_group(a.names[0])[0], ra, seed_group(b.names[0])[0], rb, labels[a.names[0]],
                             cfg, tuple(seeds))


def _pairs_table(pairs: list[PairedTest], cfg: ReportConfig) -> Table | None:
    """The ``--pair`` tests in the significance table's format."""
    if not pairs:
        return None
    cols = ["run", "against", *_SIG_COLS[1:], "p (paired t over seeds)",
            *[f"Δh{h}" for h in range(1, REPORT_MAX_HORIZON + 1)]]
    k, rows = len(_SIG_COLS), []
    for t in pairs:
        row = _sig_row(t)
        rows.append([t.run + (f" (mean of seeds {', '.join(map(str, t.seeds))})" if t.seeds else ""), t.reference,
                     *row[1:k], f"{t.ttest.p_value:.2g}" if t.ttest else "—", *row[k:]])
    cap = ("Paired tests between two runs (`--pair RUN:AGAINST`), on the queries both hold; between two seed groups "
           "(`--pair GROUP:GROUP`), of each query's hit averaged over their common seeds, and a paired t-test over "
           "those seeds of each seed's R@5 on the same queries (the seed variance the per-query tests leave out): "
           + _test_caption(cfg))
    return Table("pairs", "Paired tests between runs", cols, rows, cap)


_SIG_COLS = ["run", "n", "ΔR@5 (pp)", "95% CI", "p (bootstrap)", "McNemar b/c", "p (McNemar)"]


def _sig_row(t: PairedTest) -> list[str]:
    b, m = t.bootstrap, t.mcnemar
    bc = (f"{m.b}/{m.c}" if m.method == "exact" else f"{m.b:.1f}/{m.c:.1f}")
    row = [t.run, str(t.n), f"{100 * b.delta:+.2f}", f"[{100 * b.ci_low:+.2f}, {100 * b.ci_high:+.2f}]",
           _fmt_p(b.p_value), bc, _fmt_p(m.p_value)]
    for h in range(1, REPORT_MAX_HORIZON + 1):
        hb = t.by_horizon.get(h)
        row.append("—" if hb is None else f"{100 * hb.delta:+.1f} (p={_fmt_p(hb.p_value)}, n={hb.n})")
    return row


def _test_caption(cfg: ReportConfig) -> str:
    return (f"paired bootstrap ({cfg.n_resamples} resamples, seed "
            f"{cfg.seed}) of hit@5 under the {cfg.tie!r} tie rule, delta = run - reference; no p-value below "
            f"{MIN_BOOTSTRAP_N} queries (n too small). McNemar on the same per-query hits: b = run only, c = "
            "reference only" + (" (expected counts); a sign-flip randomization test on the expected hits, which is "
                                "McNemar's exact binomial test wherever every hit is 0/1; it never depends on the "
                                "corpus row order" if cfg.tie == "expected" else
                                f"; exact binomial test on the 0/1 hits of the {cfg.tie!r} tie-break") + ".")


def _significance(runs: Mapping[str, Any], labels: Mapping[str, QueryLabels], entries: list[Entry],
                  cfg: ReportConfig) -> tuple[str | None, list[PairedTest | SeedGroupTest]]:
    """The reference run's name and every test against it: per run, then per seed group (t-test over seeds, when
    the reference is a seed group)."""
    if not cfg.reference:
        return None, []
    ref_entry = next((e for e in entries if cfg.reference in (e.label, *e.names) or
                      (e.is_group and seed_group(e.names[0])[0] == cfg.reference)), None)
    if ref_entry is None:
        raise InputError(f"reference {cfg.reference!r} is not among the runs: {[e.label for e in entries]}")
    ref_name = cfg.reference if cfg.reference in runs else ref_entry.names[0]
    ref = runs[ref_name]
    out: list[PairedTest | SeedGroupTest] = []
    for name, run in runs.items():
        if name != ref_name:
            test = _paired_test(name, run, ref_name, ref, labels, cfg)
            if test is not None:
                out.append(test)
    ref_group = ref_entry if ref_entry.is_group else None
    for e in entries:
        if e.is_group and ref_group is not None and e is not ref_group:
            a = {s: _get_main(runs[n], cfg) for n, s in zip(e.names, e.seeds, strict=True)}
            b = {s: _get_main(runs[n], cfg) for n, s in zip(ref_group.names, ref_group.seeds, strict=True)}
            try:
                out.append(SeedGroupTest(e.label, ref_group.label, "R@5", ttest=paired_ttest(a, b)))
            except ValueError as err:
                out.append(SeedGroupTest(e.label, ref_group.label, "R@5", error=str(err)))
    return ref_name, out


def _significance_table(ref_name: str | None, tests: list[PairedTest | SeedGroupTest],
                        cfg: ReportConfig) -> Table | None:
    if ref_name is None:
        return None
    cols = _SIG_COLS + [f"Δh{h}" for h in range(1, REPORT_MAX_HORIZON + 1)]
    rows = [_sig_row(t) for t in tests if isinstance(t, PairedTest)]
    for g in tests:
        if isinstance(g, SeedGroupTest):
            t = g.ttest
            rows.append([f"{g.group} (paired t over seeds)", str(len(t.seeds)) if t else "—",
                         f"{100 * t.delta:+.2f}" if t else "—", "—", f"{t.p_value:.2g}" if t else g.error,
                         "—", "—"] + ["—"] * REPORT_MAX_HORIZON)
    cap = f"vs reference {ref_name} on the queries both hold: {_test_caption(cfg)}"
    return Table("significance", f"Significance vs {ref_name}", cols, rows, cap)


def _get_main(run, cfg) -> float:
    return float(np.nanmean(_per_query_r5(run, cfg.tie)))


#: Output kind of a report directory (`eval.outputs`), and the files that identify one without a marker.
OUTPUT_KIND = "eval report"
UNMARKED_FILES = ("report.json", "report_config.json")


@dataclass
class Report:
    """A report over one population: every run's evaluation, the multi-object groups, the paired tests and the data
    of each plot. The tables (`render_tables`), plots (`eval.plots`), report.md and report.json render from it."""

    config: ReportConfig
    population: Population
    n: int
    notes: list[Note]
    entries: list[Entry]
    runs: dict[str, RunResult]
    multi_object: dict[str, GroupsResult]
    #: the reference run's name (``--reference``, resolved to a run) and the tests against it
    reference: str | None
    significance: list[PairedTest | SeedGroupTest]
    pairs: list[PairedTest]
    curves: list[HorizonCurve]
    tier_bars: list[TierBars]
    #: the forest plot: each test against the reference, then each ``--pair`` test
    deltas: list[HorizonDeltas] = field(default_factory=list)
    order_shares: list[OrderShares] = field(default_factory=list)
    ceiling: list[CeilingStage] = field(default_factory=list)
    horizon_mix: HorizonMix | None = None

    def population_line(self) -> str:
        return f"Population: {self.population.describe()}; n = {self.n:,} queries."

    def plot_data(self) -> dict:
        """The plotted numbers, by plot name then table row (as report.json stores them)."""
        return {"r5_by_horizon": {c.label: c.to_dict() for c in self.curves},
                "tiers": {b.label: b.to_dict() for b in self.tier_bars}}

    def to_dict(self) -> dict:
        """The JSON document of report.json (NaN stays NaN here; `write_report` writes it as null)."""
        return {"config": asdict(self.config), "population": {**self.population.to_dict(), "n": self.n},
                "notes": [n.text for n in self.notes], "entries": [asdict(e) for e in self.entries],
                "runs": {k: r.to_dict() for k, r in self.runs.items()},
                "multi_object": {k: g.to_dict() for k, g in self.multi_object.items()},
                "significance": [t.to_dict() for t in self.significance],
                "pairs": [t.to_dict() for t in self.pairs], "plots": self.plot_data(),
                "tables": {t.name: t.to_dict() for t in render_tables(self)}}


def build_report(runs: Sequence[Any], bench, out_dir: str | Path, cfg: ReportConfig | None = None,
                 progress: bool = False, *, inputs: Sequence[str | Path] = (), overwrite: bool = False,
                 card: Mapping | None = None) -> Report:
    """Evaluate ``runs`` (`eval.runs.Run`, names unique) on ``bench`` over the population of ``cfg`` and write every
    table, plot and JSON into ``out_dir`` (built beside it and swapped in at the end); returns the report.
    ``out_dir`` must be new or an earlier report (`eval.outputs`; ``overwrite`` forces), and never one of the job's
    ``inputs``. Bad runs (another benchmark, missing population queries, empty) raise `eval.errors.InputError`
    before anything is written. ``card``: the benchmark's card.json (`eval.card`), plotted beside the population's
    horizon shares."""
    from eval.outputs import check_output_dir

    cfg = cfg or ReportConfig()
    target = dict(kind=OUTPUT_KIND, inputs=inputs, overwrite=overwrite, recognise=UNMARKED_FILES)
    check_output_dir(out_dir, **target)  # before any work
    prepared = _prepare(runs, bench, cfg)
    report = evaluate_report(prepared, cfg, progress, card)
    with atomic_dir(out_dir, tag="report", **target) as stage:  # a failed report leaves no half-written directory
        write_report(report, stage)
    return report


@dataclass
class _Prepared:
    """Runs restricted to the population, with their labels, Q5 runs and groups, and the notes to print."""

    population: Population
    runs: dict[str, Any]
    labels: dict[str, QueryLabels]
    q5_runs: dict[str, Any]
    groups: dict[str, list[str]]
    groups_left_out: int
    notes: list[Note]


def _prepare(runs: Sequence[Any], bench, cfg: ReportConfig) -> _Prepared:
    """Check every run against ``bench`` and restrict it to the population (see the module docstring)."""
    names = [r.name for r in runs]
    if not names:
        raise InputError("no run to report")
    if len(set(names)) != len(names):
        raise InputError(f"run names must be unique: {names}")
    pop = cfg.population()
    pop_ids = pop.query_ids(bench)
    if not pop_ids:
        raise InputError(f"benchmark {bench.root} has no query in the population ({pop.describe()})",
                         fix="choose another population with --split / --qtypes / --no-fair")
    groups, groups_left = multi_object_groups(bench, pop)
    out = _Prepared(pop, {}, {}, {}, groups, groups_left, [])
    if cfg.intersect and runs:
        pop_ids = _intersect(runs, pop, pop_ids, out)
    q5_ids = [q for m in out.groups.values() for q in m]
    for run in runs:
        if run.n == 0:
            raise InputError(f"run {run.name!r} is empty (0 queries): nothing to evaluate")
        check_fingerprint(run, bench)
        have = set(run.query_ids)
        held = [q for q in pop_ids if q in have]
        if not held:
            raise InputError(f"run {run.name!r} holds no query of the population ({pop.describe()}; "
                             f"{len(pop_ids)} queries)", fix="score the method on them, or choose the population "
                                                             "with --split / --qtypes / --no-fair")
        if len(held) < len(pop_ids):
            miss = next(q for q in pop_ids if q not in have)
            raise InputError(f"run {run.name!r} lacks {len(pop_ids) - len(held)} of the {len(pop_ids)} queries of the "
                             f"population ({pop.describe()}), e.g. {miss!r}: its numbers would be over another "
                             "population than the others'", fix="score every query of the population (a failed "
                             "forecast is scored as a miss), narrow it with --split / --qtypes, or pass --intersect "
                             "to evaluate every run on the queries all of them hold")
        out.runs[run.name] = run.select(held)
        check_run_against(out.runs[run.name], bench)
        out.labels[run.name] = QueryLabels.from_benchmark(bench, held, run.name)
        if have & set(q5_ids):
            out.q5_runs[run.name] = run.select([q for q in q5_ids if q in have])
            check_run_against(out.q5_runs[run.name], bench)
        note = _left_out_note(run, bench, pop, run.name in out.q5_runs)
        if note:
            out.notes.append(note)
    return out


def _intersect(runs: Sequence[Any], pop: Population, pop_ids: list[str], out: _Prepared) -> list[str]:
    """``--intersect``: the population queries (and whole Q5 groups) every run holds, with notes."""
    common = set.intersection(*(set(r.query_ids) for r in runs))
    kept_ids = [q for q in pop_ids if q in common]
    if len(kept_ids) < len(pop_ids):
        out.notes.append(Note(f"--intersect: the runs hold {len(kept_ids)} of the {len(pop_ids)} queries of the "
                              f"population ({pop.describe()}) in common; every table is over those",
                              f"--intersect: every table is over the {len(kept_ids)} of {len(pop_ids)} population "
                              "queries all runs hold"))
    kept = {g: m for g, m in out.groups.items() if all(q in common for q in m)}
    if len(kept) < len(out.groups) and any(set(m) & common for m in out.groups.values()):
        text = f"--intersect: {len(kept)} of the {len(out.groups)} multi-object groups are held whole by every run"
        out.notes.append(Note(text, text))
    out.groups = kept
    return kept_ids


def _left_out_note(run, bench, pop: Population, q5: bool) -> Note | None:
    """What of ``run`` lies outside the population (other splits, non-fair, other question types), or None."""
    labels = QueryLabels.from_benchmark(bench, run.query_ids, run.name)
    outside = ~pop.mask(labels)
    left = int(outside.sum())
    if not left:
        return None
    splits = sorted({str(x) for x in labels.split[outside]} - set(pop.splits or ()))
    parts = [f"other splits: {', '.join(splits)}"] if splits and pop.splits is not None else []
    short = list(parts)
    if pop.fair and (~labels.fair[outside]).any():
        parts.append(f"{int((~labels.fair[outside]).sum())} not fair")
        short.append(parts[-1])
    qt = sorted({str(x) for x in labels.qtype[outside]} - set(pop.qtypes))
    if qt:
        parts.append("question types " + ", ".join(qt) + (" (Q5 groups scored in the multi-object table)" if q5 else ""))
        short.append(", ".join(qt) + (" (in the multi-object table)" if q5 else ""))
    text = (f"run {run.name!r}: {left} of its {run.n} queries are outside the population ({pop.describe()}) and left "
            f"out" + (f" ({'; '.join(parts)})" if parts else ""))
    line = (f"{run.name!r}: {left} of {run.n} queries outside the population, left out"
            + (f": {'; '.join(short)}" if short else ""))
    return Note(text, line)


def render_tables(report: Report) -> list[Table]:
    """Every table of the report, in report.md order, each caption ending in the population line."""
    cfg, entries, runs = report.config, report.entries, report.runs
    horizons = [str(h) for h in range(1, REPORT_MAX_HORIZON + 1)]
    tables = [
        _main_table(entries, runs, cfg),
        _stratum_table("by_horizon", "R@5 by horizon (ceiling decomposition)", entries,
                       {n: {**r.by_horizon, "all": r.main} for n, r in runs.items()}, horizons + ["all"],
                       caption="R@5 (x100) of the main pool by horizon (h>=6 as 5); all = micro over every query.",
                       prefix="h"),
        _stratum_table("by_qtype", "R@5 by question type", entries, {n: r.by_qtype for n, r in runs.items()},
                       sorted({q for r in runs.values() for q in r.by_qtype})),
        _stratum_table("by_tier", "R@5 by GT tier", entries, {n: r.by_tier for n, r in runs.items()},
                       [t for t in TIER_POOLS if any(t in r.by_tier for r in runs.values())],
                       caption="Each tier scored against its own pool; in_video over the full corpus, the others "
                               "with the own video excluded; n = queries with a non-empty tier."),
        _stratum_table("by_gt_definition", "R@5 by GT definition", entries,
                       {n: r.by_gt_definition for n, r in runs.items()},
                       [d for d in GT_DEFINITION_FIELDS if any(d in r.by_gt_definition for r in runs.values())]),
        _stratum_table("by_domain", "R@5 by source domain", entries, {n: r.by_domain for n, r in runs.items()},
                       sorted({d for r in runs.values() for d in r.by_domain})),
    ]
    if all(r.triplets for r in runs.values()):
        tables.append(_triplet_table(entries, runs))
    tables += [t for t in (_significance_table(report.reference, report.significance, cfg),
                           _pairs_table(report.pairs, cfg)) if t is not None]
    for t in tables:
        t.caption = (t.caption + " " if t.caption else "") + report.population_line()
    mo = _multi_object_table(entries, report.multi_object, cfg, report.population.multi_object())
    if mo is not None:
        tables.append(mo)
    return tables


def evaluate_report(prep: _Prepared, cfg: ReportConfig, progress: bool = False, card: Mapping | None = None) -> Report:
    """Evaluate the prepared runs: every stratum, the multi-object groups, the paired tests and the plot data
    (``card``: the benchmark's card.json, `eval.card`, for its horizon shares)."""
    from tqdm.auto import tqdm


    by_name, labels, results, groups_res = prep.runs, prep.labels, {}, {}
    for name, r in tqdm(by_name.items(), desc="evaluating", disable=not progress):
        results[name] = RunResult.from_dict(evaluate_run(r, labels[name], ks=cfg.ks, tie=cfg.tie, ndcg_k=cfg.ndcg_k,
                                                         gains=cfg.gains, population=prep.population))
    for name, r in prep.q5_runs.items():
        groups_res[name] = GroupsResult.from_dict(evaluate_groups(r, prep.groups, ks=cfg.ks, tie=cfg.tie,
                                                                  n_left_out=prep.groups_left_out))
    names = list(by_name)
    entries = group_entries(names)
    n_pop = len(next(iter(labels.values())).query_ids)
    ref_name, sig = _significance(by_name, labels, entries, cfg)
    pairs = _pair_tests(by_name, labels, entries, cfg)
    cfg.runs = names
    return Report(cfg, prep.population, n_pop, prep.notes, entries, results, groups_res, ref_name, sig, pairs,
                  plots.horizon_curves(by_name, labels, entries, cfg.tie, cfg.ci_resamples, cfg.seed),
                  plots.tier_bars(results, entries),
                  [HorizonDeltas.from_test(t) for t in [*sig, *pairs] if isinstance(t, PairedTest)],
                  plots.order_shares(results, entries), plots.ceiling_stages(results, entries),
                  plots.horizon_mix(results, card))


def write_report(report: Report, out_dir: Path) -> None:
    """Every table (md, csv, tex), plot, report.json, report_config.json and report.md into ``out_dir``."""
    tables = render_tables(report)
    for t in tables:
        t.write(out_dir)
    plots.plot_r5_by_horizon(report.curves, out_dir / "r5_by_horizon.png")
    plots.plot_tiers(report.tier_bars, out_dir / "tiers.png")
    extra = _write_extra_plots(report, out_dir)
    write_json(out_dir / "report.json", _jsonable(report.to_dict()))
    write_json(out_dir / "report_config.json", _jsonable(asdict(report.config)))
    notes = "".join(f"> note: {n.text}\n" for n in report.notes)
    with atomic_path(out_dir / "report.md") as tmp:
        tmp.write_text("# Evaluation report\n\n" + report.population_line() + "\n\n" + (notes + "\n" if notes else "")
                       + "\n".join(t.markdown() for t in tables)
                       + "\n![R@5 by horizon](r5_by_horizon.png)\n\n![R@5 by tier](tiers.png)\n"
                       + "".join(f"\n![{title}]({name}.png) ([data]({name}.json))\n" for name, title in extra),
                       encoding="utf-8")


#: The plots beside r5_by_horizon.png and tiers.png: file stem and title, each with a sidecar ``STEM.json`` of the
#: plotted numbers (`eval.plots`).
EXTRA_PLOTS = {"deltas_by_horizon": "Paired ΔR@5 by horizon (forest plot)",
               "triplet_orders": "Triplet order shares", "ceiling": "Ceiling decomposition",
               "horizon_shares": "Horizon shares"}


def _write_extra_plots(report: Report, out_dir: Path) -> list[tuple[str, str]]:
    """The forest plot, triplet order shares, ceiling decomposition and horizon shares that have data, each as
    ``NAME.png`` and ``NAME.json``; returns (name, title) of those written."""
    drawn = {"deltas_by_horizon": (report.deltas, plots.plot_deltas_by_horizon),
             "triplet_orders": (report.order_shares, plots.plot_order_shares),
             "ceiling": (report.ceiling, plots.plot_ceiling),
             "horizon_shares": (report.horizon_mix, plots.plot_horizon_shares)}
    out = []
    for name, (data, draw) in drawn.items():
        if not data:
            continue
        draw(data, out_dir / f"{name}.png")
        rows = [asdict(x) for x in data] if isinstance(data, list) else asdict(data)
        write_json(out_dir / f"{name}.json", _jsonable(rows))
        out.append((name, EXTRA_PLOTS[name]))
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x
