"""Report plots (matplotlib, Agg canvas; no global backend change), each drawn from the typed report
(`eval.report.Report`): R@5 by horizon with its intervals, R@5 by GT tier.

Each ``plot_*`` function draws one figure from its data, writes it as PNG and returns the figure (its artists hold
the plotted numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from eval.io import atomic_path
from eval.report_result import HorizonCurve, TierBars


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
