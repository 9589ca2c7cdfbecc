"""Report plots (matplotlib, Agg canvas; no global backend change): R@5 by horizon with 95% CIs, R@5 by tier.

Error bars: a single run gets the 95% percentile bootstrap CI of its mean tie-aware hit@5 in each horizon
(``ci_resamples`` resamples of the queries, seeded); a multi-seed group gets mean ± std over its seeds.
Each function returns the plotted numbers (also stored in report.json).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eval.io import atomic_path
from eval.metrics import RankStats, recall_at_k
from eval.schema import REPORT_MAX_HORIZON


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


def _bootstrap_ci(v: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float]:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_resamples, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def plot_r5_by_horizon(runs: dict, labels: dict, entries: list, path: Path, cfg) -> dict:
    """Lines of R@5 (x100) over horizons 1..5 per table row, with 95% CIs (see the module docstring)."""
    hs = np.arange(1, REPORT_MAX_HORIZON + 1)
    data = {}
    fig = _figure(6.4, 4.0)
    ax = fig.add_subplot(111)
    for j, e in enumerate(entries):
        per_run = []
        for name in e.names:
            hit = recall_at_k(RankStats.from_run(runs[name], "type2-all"), 5, cfg.tie)
            h = labels[name].horizon
            per_run.append((hit, h))
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
                lo[i], hi[i] = _bootstrap_ci(hit[h == x], cfg.ci_resamples, cfg.seed)
        ok = np.isfinite(mean)
        off = (j - (len(entries) - 1) / 2) * 0.06
        ax.errorbar(hs[ok] + off, 100 * mean[ok], yerr=100 * np.abs(np.stack([mean[ok] - lo[ok], hi[ok] - mean[ok]])),
                    capsize=3, label=e.label, markersize=4, **_style(j, len(entries)))
        data[e.label] = {"horizon": hs.tolist(), "r5": mean.tolist(), "low": lo.tolist(), "high": hi.tolist(),
                         "interval": "mean±std over seeds" if e.is_group else "95% bootstrap CI"}
    ax.set_xlabel("horizon (h>=6 as 5)")
    ax.set_ylabel("R@5 (%)")
    ax.set_xticks(hs)
    ax.set_title("R@5 by horizon")
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)
    return data


def plot_tiers(results: dict, entries: list, path: Path, metric: str = "R@5") -> dict:
    """Grouped bars of R@5 (x100) per GT tier per table row (seed groups: mean with std bars)."""
    tiers = [t for t in ("in_video", "in_dataset", "cross_dataset", "bge_similar")
             if any(t in r.get("by_tier", {}) for r in results.values())]
    fig = _figure(max(5.0, 1.4 * len(tiers) + 2), 4.0)
    ax = fig.add_subplot(111)
    width = 0.8 / max(1, len(entries))
    data = {}
    for j, e in enumerate(entries):
        vals = np.array([[results[n]["by_tier"].get(t, {}).get(metric, np.nan) for t in tiers] for n in e.names],
                        dtype=np.float64)
        mean = np.nanmean(vals, axis=0) if len(vals) else np.full(len(tiers), np.nan)
        sd = np.nanstd(vals, axis=0, ddof=1) if len(vals) > 1 else None
        x = np.arange(len(tiers)) + (j - (len(entries) - 1) / 2) * width
        ax.bar(x, 100 * np.nan_to_num(mean), width, yerr=None if sd is None else 100 * sd, capsize=3, label=e.label,
               color=_style(j, len(entries))["color"])
        data[e.label] = {"tiers": tiers, metric: mean.tolist(), "std": None if sd is None else sd.tolist()}
    ax.set_xticks(np.arange(len(tiers)))
    ax.set_xticklabels(tiers)
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(f"{metric} by GT tier (each tier against its own pool)")
    ax.grid(axis="y", alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)
    return data
