"""Report plots (matplotlib, Agg canvas; no global backend change), each drawn from the typed report
(`eval.report.Report`): R@5 by horizon with its intervals, R@5 by GT tier, the paired ΔR@5 by horizon (forest
plot), the triplet order shares (stacked bars), the ceiling decomposition and the horizon shares (bars).

The data of each plot is a typed value of `eval.report_result` (`horizon_curves`, `tier_bars`, `order_shares`,
`ceiling_stages`, `horizon_mix` compute them; the forest plot's `HorizonDeltas` come from the paired tests); each
``plot_*`` function draws one figure from its data, writes it as PNG and returns the figure (its artists hold the
plotted numbers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from eval.evaluate import MAIN_POOL, TIER_POOLS
from eval.io import atomic_path
from eval.metrics import RankStats, recall_at_k
from eval.report_result import (
    CeilingStage,
    HorizonCurve,
    HorizonDeltas,
    HorizonMix,
    OrderShares,
    RunResult,
    TierBars,
)
from eval.schema import REPORT_MAX_HORIZON


# ------------------------------------------------------------------------------------------------ plot data
def order_shares(runs: Mapping[str, RunResult], entries: Sequence) -> list[OrderShares]:
    """Each row's triplet order shares (a seed group's mean over seeds); empty when a run has no triplets."""
    if not all(r.triplets for r in runs.values()):
        return []
    orders = list(next(iter(runs.values())).triplets.all.orders)  # the six orders, then "missed"
    out = []
    for e in entries:
        shares = np.array([[runs[n].triplets.all.orders[o].share for o in orders] for n in e.names], np.float64)
        out.append(OrderShares(e.label, orders, shares.mean(axis=0).tolist()))
    return out


def ceiling_stages(runs: Mapping[str, RunResult], entries: Sequence) -> list[CeilingStage]:
    """The ceiling decomposition (`eval.findings.ceiling`) of the table rows (`eval.report.Entry`), when the runs hold
    its roles."""
    from eval.findings import ceiling

    doc = {"entries": [asdict(e) for e in entries],
           "runs": {n: {"main": {"R@5": r.main.get("R@5")}} for n, r in runs.items()}}
    rows = ceiling(doc)
    if not rows:
        return []
    top = rows[0][2]
    return [CeilingStage(stage, run, v, v / top if top else float("nan")) for stage, run, v in rows]


def horizon_mix(runs: Mapping[str, RunResult], card: Mapping | None = None) -> HorizonMix:
    """The population's share of queries per horizon (every run holds the same population), and the card's."""
    hs = list(range(1, REPORT_MAX_HORIZON + 1))
    first = next(iter(runs.values()))
    n = [first.by_horizon[str(h)].n if str(h) in first.by_horizon else 0 for h in hs]
    total = sum(n)
    values = (card or {}).get("values", {})
    card_shares = [values.get(f"h{h}_share") for h in hs] if card is not None else None
    return HorizonMix(hs, [x / total if total else float("nan") for x in n],
                      [float("nan") if v is None else float(v) for v in card_shares] if card_shares else None)


def horizon_curves(runs: Mapping, labels: Mapping, entries: Sequence, tie: str, ci_resamples: int,
                   seed: int) -> list[HorizonCurve]:
    """R@5 over horizons per table row (`eval.report.Entry`) with its interval: a single run (`eval.runs.Run`) gets
    the 95% percentile bootstrap CI of its mean tie-aware hit@5 in each horizon (``ci_resamples`` resamples of the
    queries, seeded); a seed group gets mean ± std over its seeds. ``labels``: run name -> `eval.evaluate.QueryLabels`."""
    hs = np.arange(1, REPORT_MAX_HORIZON + 1)
    out = []
    for e in entries:
        per_run = [(recall_at_k(RankStats.from_run(runs[name], MAIN_POOL), 5, tie), labels[name].horizon)
                   for name in e.names]
        mean = np.full(len(hs), np.nan)
        lo, hi = mean.copy(), mean.copy()
        for i, x in enumerate(hs):
            vals = [np.nanmean(hit[h == x]) if np.isfinite(hit[h == x]).any() else np.nan for hit, h in per_run]
            if e.is_group:
                v = np.asarray(vals)
                v = v[np.isfinite(v)]
                if v.size:
                    mean[i] = v.mean()
                    sd = v.std(ddof=1) if v.size > 1 else 0.0
                    lo[i], hi[i] = mean[i] - sd, mean[i] + sd
            else:
                hit, h = per_run[0]
                mean[i] = vals[0]
                lo[i], hi[i] = _bootstrap_ci(hit[h == x], ci_resamples, seed)
        out.append(HorizonCurve(e.label, hs.tolist(), mean.tolist(), lo.tolist(), hi.tolist(),
                                "mean±std over seeds" if e.is_group else "95% bootstrap CI"))
    return out


def _bootstrap_ci(v: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float]:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_resamples, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def tier_bars(runs: Mapping[str, RunResult], entries: Sequence, metric: str = "R@5") -> list[TierBars]:
    """``metric`` per GT tier per table row: a run's value, a seed group's mean and std (ddof 1) over its seeds."""
    tiers = [t for t in TIER_POOLS if any(t in r.by_tier for r in runs.values())]
    out = []
    for e in entries:
        vals = np.array([[runs[n].by_tier[t].values.get(metric, np.nan) if t in runs[n].by_tier else np.nan
                          for t in tiers] for n in e.names], dtype=np.float64)
        mean = np.nanmean(vals, axis=0) if len(vals) else np.full(len(tiers), np.nan)
        sd = np.nanstd(vals, axis=0, ddof=1) if len(vals) > 1 else None
        out.append(TierBars(e.label, metric, tiers, mean.tolist(), None if sd is None else sd.tolist()))
    return out


# ------------------------------------------------------------------------------------------------ drawing
def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")


_MARKERS = "osD^vP*Xhp<>"
_STYLES = ("-", "--", "-.", ":")


def _style(j: int, n: int) -> dict:
    """Distinct colour, marker and line style for row ``j`` of ``n`` (tab10 alone repeats after ten methods)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return {"color": cmap(j % cmap.N), "marker": _MARKERS[j % len(_MARKERS)], "linestyle": _STYLES[(j // 10) % len(_STYLES)]}


def _legend_outside(ax) -> None:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def plot_r5_by_horizon(curves: Sequence[HorizonCurve], path: Path):
    """Lines of R@5 (x100) over horizons per table row, with each curve's interval as error bars."""
    fig = _figure(6.4, 4.0)
    ax = fig.add_subplot(111)
    for j, c in enumerate(curves):
        hs = np.asarray(c.horizon)
        mean, lo, hi = (np.asarray(v, dtype=np.float64) for v in (c.r5, c.low, c.high))
        ok = np.isfinite(mean)
        off = (j - (len(curves) - 1) / 2) * 0.06
        ax.errorbar(hs[ok] + off, 100 * mean[ok], yerr=100 * np.abs(np.stack([mean[ok] - lo[ok], hi[ok] - mean[ok]])),
                    capsize=3, label=c.label, markersize=4, **_style(j, len(curves)))
    ax.set_xlabel("horizon (h>=6 as 5)")
    ax.set_ylabel("R@5 (%)")
    if curves:
        ax.set_xticks(curves[0].horizon)
    ax.set_title("R@5 by horizon")
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)
    return fig


def plot_tiers(bars: Sequence[TierBars], path: Path):
    """Grouped bars of a metric (x100) per GT tier per table row (seed groups: mean with std bars)."""
    tiers = bars[0].tiers if bars else []
    metric = bars[0].metric if bars else "R@5"
    fig = _figure(max(5.0, 1.4 * len(tiers) + 2), 4.0)
    ax = fig.add_subplot(111)
    width = 0.8 / max(1, len(bars))
    for j, b in enumerate(bars):
        mean = np.asarray(b.values, dtype=np.float64)
        x = np.arange(len(tiers)) + (j - (len(bars) - 1) / 2) * width
        ax.bar(x, 100 * np.nan_to_num(mean), width, yerr=None if b.std is None else 100 * np.asarray(b.std),
               capsize=3, label=b.label, color=_style(j, len(bars))["color"])
    ax.set_xticks(np.arange(len(tiers)))
    ax.set_xticklabels(tiers)
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(f"{metric} by GT tier (each tier against its own pool)")
    ax.grid(axis="y", alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)
    return fig


def plot_deltas_by_horizon(deltas: Sequence[HorizonDeltas], path: Path):
    """Forest plot: one row per (test, horizon), ΔR@5 (pp, run - reference) with its 95% bootstrap CI, a line at 0."""
    rows = [(d, i) for d in deltas for i in range(len(d.horizon))]
    fig = _figure(6.4, max(2.0, 0.28 * len(rows) + 1.2))
    ax = fig.add_subplot(111)
    y = np.arange(len(rows))[::-1]
    for j, d in enumerate(deltas):
        sel = [k for k, (dd, _) in enumerate(rows) if dd is d]
        delta, lo, hi = (100 * np.asarray(v, dtype=np.float64) for v in (d.delta, d.ci_low, d.ci_high))
        ax.errorbar(delta, y[sel], xerr=np.abs(np.stack([delta - lo, hi - delta])), fmt="o", capsize=3,
                    markersize=4, color=_style(j, len(deltas))["color"], label=f"{d.run} vs {d.reference}")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{d.run} h{d.horizon[i]} (n={d.n[i]})" for d, i in rows], fontsize=7)
    ax.set_xlabel("ΔR@5 (pp), run - reference, 95% bootstrap CI")
    ax.set_title("Paired ΔR@5 by horizon")
    ax.grid(axis="x", alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)
    return fig


def plot_order_shares(shares: Sequence[OrderShares], path: Path):
    """Stacked horizontal bars: each row's triplet order shares (%), one segment per order, ``missed`` last."""
    from matplotlib import colormaps

    orders = shares[0].orders
    cmap = colormaps["tab10"]
    fig = _figure(7.0, max(2.0, 0.4 * len(shares) + 1.2))
    ax = fig.add_subplot(111)
    y = np.arange(len(shares))[::-1]
    left = np.zeros(len(shares))
    for k, o in enumerate(orders):
        v = 100 * np.nan_to_num(np.array([s.shares[k] for s in shares], dtype=np.float64))
        ax.barh(y, v, left=left, label=o, color=cmap(k % cmap.N))
        left += v
    ax.set_yticks(y)
    ax.set_yticklabels([s.label for s in shares])
    ax.set_xlabel("share of triplets (%)")
    ax.set_title("Triplet order shares")
    _legend_outside(ax)
    _save(fig, path)
    return fig


def plot_ceiling(stages: Sequence[CeilingStage], path: Path):
    """Bars of R@5 (x100) per stage of the ceiling decomposition, each labelled with its share of the first."""
    fig = _figure(6.4, max(2.0, 0.45 * len(stages) + 1.2))
    ax = fig.add_subplot(111)
    y = np.arange(len(stages))[::-1]
    bars = ax.barh(y, [s.r5 for s in stages], color=[_style(j, len(stages))["color"] for j in range(len(stages))])
    ax.bar_label(bars, labels=[f"{100 * s.share_of_first:.0f}%" for s in stages], fontsize=8, padding=2)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{s.stage}\n({s.run})" for s in stages], fontsize=7)
    ax.set_xlabel("R@5 (%)")
    ax.set_title("Ceiling decomposition (share of the first stage)")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)
    return fig


def plot_horizon_shares(mix: HorizonMix, path: Path):
    """Bars of the share of queries (%) per horizon: the report's population, and the benchmark card's."""
    series = [("population", mix.population)] + ([("card (Q1-Q4, every split)", mix.card)] if mix.card else [])
    fig = _figure(5.0, 3.6)
    ax = fig.add_subplot(111)
    hs = np.asarray(mix.horizon, dtype=np.float64)
    width = 0.8 / len(series)
    for j, (label, v) in enumerate(series):
        x = hs + (j - (len(series) - 1) / 2) * width
        ax.bar(x, 100 * np.nan_to_num(np.asarray(v, dtype=np.float64)), width, label=label,
               color=_style(j, len(series))["color"])
    ax.set_xticks(mix.horizon)
    ax.set_xlabel("horizon (h>=6 as 5)")
    ax.set_ylabel("share of queries (%)")
    ax.set_title("Horizon shares")
    ax.grid(axis="y", alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)
    return fig
