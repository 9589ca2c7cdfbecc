"""Paper-shaped reports over one or many runs: ``python -m eval report RUN [RUN ...] --data DIR --out DIR``.

Output directory::

    main.{md,csv,tex}             method x R@1/5/10/20/50, MRR, macro, nDCG@10, MedR, n (PSR Table 2)
    by_horizon.{md,csv,tex}       R@5 by horizon h1..h5 + all (Table 4, the ceiling decomposition)
    by_qtype / by_tier / by_gt_definition / by_domain .{md,csv,tex}     R@5 per stratum
    triplets.{md,csv,tex}         Acc_temp / Acc_sem / Acc_tri and the order histogram (GenState-style)
    significance.{md,csv,tex}     every run vs the reference run: paired bootstrap, McNemar, per-horizon bootstrap,
                                  and a paired t-test across seeds for multi-seed groups
    r5_by_horizon.png, tiers.png  plots (matplotlib, Agg)
    report.json                   every number above (fractions in [0, 1]) + the per-run stratified results
    report_config.json            the resolved configuration of this report

Multi-seed grouping rule: a run whose name ends in a seed suffix -- ``seed`` followed by digits, optionally joined
by ``-``, ``_``, ``.`` or ``=`` and preceded by ``-``, ``_`` or ``.`` (``lftr-fusion-seed3``, ``lftr_fusion.seed=3``)
-- belongs to the group named by the rest (``lftr-fusion``), with that seed. A group with two or more distinct seeds
is shown as one row of mean±std (sample std over seeds); its runs stay in report.json. Other runs are single rows.

Significance (the paper's protocol): per-query tests on the queries both runs hold, for R@5 of the main pool:
paired bootstrap of the tie-aware hit@5 (10^4 resamples, seeded; delta = run - reference, in points), McNemar's
exact test on hits under the row tie-break, and the bootstrap per horizon. When the reference is a multi-seed group,
per-query tests use its lowest-seed run; a paired t-test across common seeds compares two groups.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval.evaluate import MAIN_POOL, TIER_POOLS, QueryLabels, evaluate_run
from eval.io import atomic_dir, atomic_path, write_json
from eval.metrics import DEFAULT_KS, RankStats, recall_at_k
from eval.schema import GT_DEFINITIONS, REPORT_MAX_HORIZON
from eval.stats import mcnemar_exact, paired_bootstrap, paired_bootstrap_by, paired_ttest, seed_summary

SEED_SUFFIX = re.compile(r"^(?P<group>.+?)[-_.]seed[-_.=]?(?P<seed>\d+)$")


def seed_group(name: str) -> tuple[str, int | None]:
    """``("lftr-fusion", 3)`` for ``"lftr-fusion-seed3"``; ``(name, None)`` without a seed suffix."""
    m = SEED_SUFFIX.match(name)
    return (m.group("group"), int(m.group("seed"))) if m else (name, None)


@dataclass
class ReportConfig:
    """Resolved configuration of a report (written to report_config.json)."""

    ks: tuple[int, ...] = DEFAULT_KS
    tie: str = "expected"
    ndcg_k: int = 10
    gains: dict[str, float] | None = None
    reference: str | None = None
    n_resamples: int = 10_000
    seed: int = 0
    ci_resamples: int = 1000
    data: str = ""
    runs: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ tables
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


def _get(result: dict, path: Sequence[str]) -> float | None:
    cur: Any = result
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


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


# ------------------------------------------------------------------------------------------------ report
def _stratum_table(name, title, entries, results, section, keys, metric="R@5", caption="", prefix=""):
    cols = ["method"]
    for k in keys:
        ns = {_get(results[n], (section, k, "n")) for e in entries for n in e.names}
        ns.discard(None)
        label = f"{prefix}{k}" if k != "all" else k
        cols.append(f"{label} (n={ns.pop()})" if len(ns) == 1 else label)
    rows = [[e.label] + [_cell([_get(results[n], (section, k, metric)) for n in e.names]) for k in keys]
            for e in entries]
    return Table(name, title, cols, rows, caption)


def _main_table(entries, results, cfg: ReportConfig) -> Table:
    metrics = [f"R@{k}" for k in cfg.ks] + ["MRR", "macro", f"nDCG@{cfg.ndcg_k}"]
    cols = ["method"] + metrics + ["MedR", "n"]
    rows = []
    for e in entries:
        r = [e.label] + [_cell([_get(results[n], ("main", m)) for n in e.names]) for m in metrics]
        r.append(_cell([_get(results[n], ("main", "MedR")) for n in e.names], scale=1.0, digits=1))
        ns = sorted({_get(results[n], ("main", "n")) for n in e.names})
        r.append("/".join(str(x) for x in ns))
        rows.append(r)
    cap = (f"Main pool (type2-all: in-dataset + cross-dataset, own video excluded). R@k micro, x100; macro = R@5 "
           f"averaged over horizons 1-5 (h>=6 as 5); ties: {cfg.tie}. Seed groups: mean±std.")
    return Table("main", "Main results", cols, rows, cap)


def _triplet_table(entries, results) -> Table:
    from eval.triplets import ORDERS, order_name

    orders = [order_name(o) for o in ORDERS]
    cols = ["method", "Acc_temp", "Acc_sem", "Acc_tri"] + orders + ["n"]
    rows = []
    for e in entries:
        r = [e.label] + [_cell([_get(results[n], ("triplets", "all", m)) for n in e.names]) for m in
                         ("acc_temp", "acc_sem", "acc_tri")]
        r += [_cell([_get(results[n], ("triplets", "all", "orders", o, "share")) for n in e.names]) for o in orders]
        r.append("/".join(sorted({str(_get(results[n], ("triplets", "all", "n"))) for n in e.names})))
        rows.append(r)
    cap = ("Triplets per query: main = best type1 GT item (same subject+state, other video); temp = best segment of "
           "the queried object's own trajectory in another state; sem = best other-video segment in the target state "
           "with another subject. Accuracies and order shares x100; ties split uniformly.")
    return Table("triplets", "Triplet diagnostics", cols, rows, cap)


def _per_query_r5(run, tie: str) -> tuple[np.ndarray, np.ndarray]:
    st = RankStats.from_run(run, MAIN_POOL)
    return recall_at_k(st, 5, tie), recall_at_k(st, 5, "row")


def _significance(runs: Mapping[str, Any], labels: Mapping[str, QueryLabels], entries: list[Entry],
                  cfg: ReportConfig) -> tuple[list[dict], Table | None]:
    if not cfg.reference:
        return [], None
    ref_entry = next((e for e in entries if cfg.reference in (e.label, *e.names) or
                      (e.is_group and seed_group(e.names[0])[0] == cfg.reference)), None)
    if ref_entry is None:
        raise KeyError(f"reference {cfg.reference!r} is not among the runs: {[e.label for e in entries]}")
    ref_name = cfg.reference if cfg.reference in runs else ref_entry.names[0]
    ref = runs[ref_name]
    out = []
    for name, run in runs.items():
        if name == ref_name:
            continue
        common = [q for q in run.query_ids if q in set(ref.query_ids)]
        if not common:
            continue
        a, ra = run.select(common), ref.select(common)
        ea, ha = _per_query_r5(a, cfg.tie)
        eb, hb = _per_query_r5(ra, cfg.tie)
        horizons = labels[name].horizon[[run.query_ids.index(q) for q in common]] if common else None
        boot = paired_bootstrap(ea, eb, n_resamples=cfg.n_resamples, seed=cfg.seed)
        mc = mcnemar_exact(ha, hb)
        by_h = paired_bootstrap_by(ea, eb, horizons, n_resamples=cfg.n_resamples, seed=cfg.seed)
        out.append({"run": name, "reference": ref_name, "metric": "R@5", "n": len(common),
                    "bootstrap": boot.to_dict(), "mcnemar": mc.to_dict(),
                    "by_horizon": {str(h): r.to_dict() for h, r in by_h.items()}})
    ref_group = ref_entry if ref_entry.is_group else None
    groups = []
    for e in entries:
        if e.is_group and ref_group is not None and e is not ref_group:
            a = {s: _get_main(runs[n], labels[n], cfg) for n, s in zip(e.names, e.seeds, strict=True)}
            b = {s: _get_main(runs[n], labels[n], cfg) for n, s in zip(ref_group.names, ref_group.seeds, strict=True)}
            try:
                groups.append({"group": e.label, "reference": ref_group.label, "metric": "R@5",
                               "ttest": paired_ttest(a, b).to_dict()})
            except ValueError as err:
                groups.append({"group": e.label, "reference": ref_group.label, "metric": "R@5", "error": str(err)})
    cols = ["run", "n", "ΔR@5 (pp)", "95% CI", "p (bootstrap)", "McNemar b/c", "p (McNemar)"]
    cols += [f"Δh{h}" for h in range(1, REPORT_MAX_HORIZON + 1)]
    rows = []
    fmt_p = lambda p: f"{p:.2g}" if p >= 1e-4 else "<1e-4"  # noqa: E731
    for r in out:
        b, m = r["bootstrap"], r["mcnemar"]
        row = [r["run"], str(r["n"]), f"{100 * b['delta']:+.2f}", f"[{100 * b['ci_low']:+.2f}, {100 * b['ci_high']:+.2f}]",
               fmt_p(b["p_value"]), f"{m['b']}/{m['c']}", f"{m['p_value']:.2g}"]
        for h in range(1, REPORT_MAX_HORIZON + 1):
            hb = r["by_horizon"].get(str(h))
            row.append("—" if hb is None else f"{100 * hb['delta']:+.1f} (p={fmt_p(hb['p_value'])})")
        rows.append(row)
    for g in groups:
        t = g.get("ttest")
        rows.append([f"{g['group']} (paired t over seeds)", str(len(t["seeds"])) if t else "—",
                     f"{100 * t['delta']:+.2f}" if t else "—", "—", f"{t['p_value']:.2g}" if t else g["error"],
                     "—", "—"] + ["—"] * REPORT_MAX_HORIZON)
    cap = (f"vs reference {ref_name}: paired bootstrap over common queries ({cfg.n_resamples} resamples, seed "
           f"{cfg.seed}) of tie-aware hit@5, delta = run - reference; McNemar exact on row-tie-break hits "
           "(b = run only, c = reference only).")
    return out + groups, Table("significance", f"Significance vs {ref_name}", cols, rows, cap)


def _get_main(run, labels, cfg) -> float:
    st = RankStats.from_run(run, MAIN_POOL)
    return float(np.nanmean(recall_at_k(st, 5, cfg.tie)))


#: Output kind of a report directory (`eval.outputs`); files that identify one written before markers existed.
OUTPUT_KIND = "eval report"
LEGACY_FILES = ("report.json", "report_config.json")


def build_report(runs: Sequence[Any], bench, out_dir: str | Path, cfg: ReportConfig | None = None,
                 progress: bool = False, *, inputs: Sequence[str | Path] = (), overwrite: bool = False) -> dict:
    """Evaluate ``runs`` (`eval.runs.Run`, names unique) on ``bench`` and write every table, plot and JSON into
    ``out_dir`` (built beside it and swapped in at the end); returns the JSON document. ``out_dir`` must be new or
    an earlier report (`eval.outputs`; ``overwrite`` forces), and never one of the job's ``inputs``."""
    cfg = cfg or ReportConfig()
    with atomic_dir(out_dir, kind=OUTPUT_KIND, tag="report", inputs=inputs, overwrite=overwrite,
                    legacy=LEGACY_FILES) as stage:  # a failed report leaves no half-written directory
        return _build(runs, bench, stage, cfg, progress)


def _build(runs, bench, out_dir: Path, cfg: ReportConfig, progress: bool) -> dict:
    from tqdm.auto import tqdm

    from eval.plots import plot_r5_by_horizon, plot_tiers

    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must be unique: {names}")
    by_name = {r.name: r for r in runs}
    labels, results = {}, {}
    for r in tqdm(runs, desc="evaluating", disable=not progress):
        labels[r.name] = QueryLabels.from_benchmark(bench, r.query_ids, r.name)
        results[r.name] = evaluate_run(r, labels[r.name], ks=cfg.ks, tie=cfg.tie, ndcg_k=cfg.ndcg_k, gains=cfg.gains)
    entries = group_entries(names)
    horizons = [str(h) for h in range(1, REPORT_MAX_HORIZON + 1)]
    tables = [
        _main_table(entries, results, cfg),
        _stratum_table("by_horizon", "R@5 by horizon (ceiling decomposition)", entries,
                       {n: {**res, "by_horizon": {**res["by_horizon"], "all": res["main"]}} for n, res in results.items()},
                       "by_horizon", horizons + ["all"],
                       caption="R@5 (x100) of the main pool by horizon (h>=6 as 5); all = micro over every query.",
                       prefix="h"),
        _stratum_table("by_qtype", "R@5 by question type", entries, results, "by_qtype",
                       sorted({q for res in results.values() for q in res["by_qtype"]})),
        _stratum_table("by_tier", "R@5 by GT tier", entries, results, "by_tier",
                       [t for t in TIER_POOLS if any(t in res["by_tier"] for res in results.values())],
                       caption="Each tier scored against its own pool; in_video over the full corpus, the others "
                               "with the own video excluded."),
        _stratum_table("by_gt_definition", "R@5 by GT definition", entries, results, "by_gt_definition",
                       [d for d in GT_DEFINITIONS if any(d in res["by_gt_definition"] for res in results.values())]),
        _stratum_table("by_domain", "R@5 by source domain", entries, results, "by_domain",
                       sorted({d for res in results.values() for d in res["by_domain"]})),
    ]
    if all(res.get("triplets") for res in results.values()):
        tables.append(_triplet_table(entries, results))
    sig, sig_table = _significance(by_name, labels, entries, cfg)
    if sig_table is not None:
        tables.append(sig_table)
    for t in tables:
        t.write(out_dir)
    plots = {"r5_by_horizon": plot_r5_by_horizon(by_name, labels, entries, out_dir / "r5_by_horizon.png", cfg),
             "tiers": plot_tiers(results, entries, out_dir / "tiers.png")}
    cfg.runs = names
    doc = {"config": asdict(cfg), "entries": [asdict(e) for e in entries], "runs": results, "significance": sig,
           "plots": plots, "tables": {t.name: t.to_dict() for t in tables}}
    write_json(out_dir / "report.json", _jsonable(doc))
    write_json(out_dir / "report_config.json", _jsonable(asdict(cfg)))
    with atomic_path(out_dir / "report.md") as tmp:
        tmp.write_text("# Evaluation report\n\n" + "\n".join(t.markdown() for t in tables) +
                       "\n![R@5 by horizon](r5_by_horizon.png)\n\n![R@5 by tier](tiers.png)\n", encoding="utf-8")
    return doc


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
