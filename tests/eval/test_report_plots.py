"""The report's plots, each drawn from the typed report (`eval.report_result`): the figure holds the given numbers."""

from __future__ import annotations

import numpy as np
import pytest

from eval import plots
from eval.report_result import (
    CeilingStage,
    HorizonCurve,
    HorizonDeltas,
    HorizonMix,
    MetricBlock,
    OrderShares,
    RunResult,
    TierBars,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _bar_widths(ax) -> list[float]:
    return [p.get_width() for p in ax.patches]


def _bar_heights(ax) -> list[float]:
    return [p.get_height() for p in ax.patches]


def test_forest_plot_holds_each_horizon_delta(tmp_path):
    d = HorizonDeltas("a", "ref", [1, 2], [0.10, -0.05], [0.02, -0.15], [0.20, 0.04], [30, 8])
    fig = plots.plot_deltas_by_horizon([d], tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:8] == PNG
    ax = fig.axes[0]
    line = ax.lines[0]
    np.testing.assert_allclose(line.get_xdata(), [10.0, -5.0])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a h1 (n=30)", "a h2 (n=8)"]
    segs = ax.collections[0].get_segments()  # the CI bars, in pp
    np.testing.assert_allclose([s[:, 0] for s in segs], [[2.0, 20.0], [-15.0, 4.0]])


def test_order_shares_are_stacked_to_the_whole(tmp_path):
    orders = ["main > temp > sem", "missed"]
    fig = plots.plot_order_shares([OrderShares("x", orders, [0.75, 0.25]), OrderShares("y", orders, [0.5, 0.5])],
                                  tmp_path / "o.png")
    assert (tmp_path / "o.png").read_bytes()[:8] == PNG
    ax = fig.axes[0]
    assert _bar_widths(ax) == pytest.approx([75.0, 50.0, 25.0, 50.0])
    assert [p.get_x() for p in ax.patches] == pytest.approx([0.0, 0.0, 75.0, 50.0])


def test_ceiling_bars_and_their_shares(tmp_path):
    stages = [CeilingStage("labels", "oracle", 80.0, 1.0), CeilingStage("forecasting", "lftr-sim[x]", 40.0, 0.5)]
    fig = plots.plot_ceiling(stages, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
    ax = fig.axes[0]
    assert _bar_widths(ax) == pytest.approx([80.0, 40.0])
    assert [t.get_text() for t in ax.texts] == ["100%", "50%"]


def test_horizon_shares_population_and_card(tmp_path):
    mix = HorizonMix([1, 2], [0.6, 0.4], [0.5, 0.5])
    fig = plots.plot_horizon_shares(mix, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG
    assert _bar_heights(fig.axes[0]) == pytest.approx([60.0, 40.0, 50.0, 50.0])
    fig = plots.plot_horizon_shares(HorizonMix([1, 2], [0.6, 0.4], None), tmp_path / "h2.png")
    assert _bar_heights(fig.axes[0]) == pytest.approx([60.0, 40.0])


def test_r5_curves_and_tier_bars(tmp_path):
    c = HorizonCurve("a", [1, 2, 3], [0.5, float("nan"), 0.25], [0.4, float("nan"), 0.2], [0.6, float("nan"), 0.3],
                     "95% bootstrap CI")
    fig = plots.plot_r5_by_horizon([c], tmp_path / "r.png")
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [50.0, 25.0])
    fig = plots.plot_tiers([TierBars("a", "R@5", ["in_video", "in_dataset"], [0.3, 0.7], None)], tmp_path / "t.png")
    assert _bar_heights(fig.axes[0]) == pytest.approx([30.0, 70.0])


def test_run_result_reads_and_writes_the_evaluation_dict():
    block = {"R@5": 0.5, "n": 4, "n_empty": 0}
    trip = {"n": 2, "n_missed": 0, "n_incomplete": 1, "acc_temp": 1.0, "acc_sem": 0.5, "acc_tri": 0.5,
            "orders": {"main > temp > sem": {"count": 1.0, "share": 0.5}, "missed": {"count": 0.0, "share": 0.0}}}
    d = {"name": "a", "method": "m", "benchmark": "b", "n_queries": 4, "n_left_out": 0,
         "population": {"splits": ["test"], "fair": True, "qtypes": ["Q1"], "description": "test split, fair queries "
                        "(main GT pool non-empty), Q1"}, "k": 50, "tie": "expected", "main": {**block, "macro": 0.4},
         "by_horizon": {"1": block}, "by_qtype": {"Q1": block}, "by_domain": {"kitchen": block},
         "by_tier": {"in_video": block}, "by_gt_definition": {"type2-all": block},
         "triplets": {"all": trip, "by_domain": {"kitchen": trip}}}
    r = RunResult.from_dict(d)
    assert r.to_dict() == d and list(r.to_dict()) == list(d)
    assert r.triplets.all.orders["main > temp > sem"].share == 0.5 and r.stratum("by_tier")["in_video"].n == 4
    assert MetricBlock(block).get("R@5") == 0.5
    with pytest.raises(KeyError, match="unknown stratum"):
        r.stratum("main")


def test_ceiling_stages_follow_the_findings_decomposition():
    from types import SimpleNamespace

    from eval.findings import ceiling
    from eval.plots import ceiling_stages
    from eval.report import group_entries

    r5 = {"semantic-text": 0.8, "lftr-sim[minilm]": 0.4, "lftr[minilm]-seed0": 0.1, "lftr[minilm]-seed1": 0.3,
          "persistence": 0.05}
    entries = group_entries(list(r5))
    runs = {n: SimpleNamespace(main=MetricBlock({"R@5": v})) for n, v in r5.items()}
    stages = ceiling_stages(runs, entries)
    assert [(s.stage, s.run) for s in stages] == [(st, run) for st, run, _ in ceiling(
        {"entries": [e.__dict__ for e in entries], "runs": {n: {"main": {"R@5": v}} for n, v in r5.items()}})]
    assert [s.r5 for s in stages] == pytest.approx([80.0, 40.0, 20.0])
    assert [s.share_of_first for s in stages] == pytest.approx([1.0, 0.5, 0.25])
    assert ceiling_stages({"persistence": runs["persistence"]}, group_entries(["persistence"])) == []
