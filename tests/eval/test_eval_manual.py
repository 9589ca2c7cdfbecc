"""eval/README.md stays a manual a newcomer reads (at most 250 lines; the reference lives in docs/eval-reference.md)
and names every file `eval report` writes."""

from __future__ import annotations

from pathlib import Path

from eval.report import EXTRA_PLOTS

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 250


def test_eval_manual_is_short_and_points_to_the_reference():
    text = (ROOT / "eval" / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    assert "docs/eval-reference.md" in text and (ROOT / "docs" / "eval-reference.md").exists()


def test_eval_manual_names_every_report_plot():
    text = (ROOT / "eval" / "README.md").read_text(encoding="utf-8")
    missing = [f"{name}.png" for name in ("r5_by_horizon", "tiers", *EXTRA_PLOTS) if f"{name}.png" not in text]
    assert not missing, f"eval/README.md does not name {missing}"
