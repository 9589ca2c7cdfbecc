"""Report plots (matplotlib, Agg canvas; no global backend change), each drawn from the typed report
(`eval.report.Report`): R@5 by horizon with its intervals, R@5 by GT tier, the paired ΔR@5 by horizon (forest
plot), the triplet order shares (stacked bars), the ceiling decomposition and the horizon shares (bars).

Each ``plot_*`` function draws one figure from its data, writes it as PNG and returns the figure (its artists hold
the plotted numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from eval.io import atomic_path
from eval.report_result import CeilingStage, HorizonCurve, HorizonDeltas, HorizonMix, OrderShares, TierBars


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
