"""`scripts/bench_lftr_step.py`: every contender trains real steps of the head in its own process, and the table
puts each against the baseline measured in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_step_benchmark_times_the_baseline_and_the_toolkits_step(synth_sem_dir, tmp_path):
    """The baseline (every torch default, every token, float32) and the toolkit's step in bfloat16: together they
    run every switch of the child; the contenders between them are combinations of the same switches."""
    res = subprocess.run([sys.executable, "scripts/bench_lftr_step.py", "--data", str(synth_sem_dir), "--space",
                          "pixels", "--steps", "2", "--repeats", "1", "--contenders", "6", "--record-dir",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rec = json.loads((tmp_path / "bench_lftr_step.json").read_text())
    rows = rec["data"]["contenders"]
    names = [r["name"] for r in rows]
    assert names[0] == "torch dropout and attention, default malloc, every token" and len(rows) == 2
    assert names[1].startswith("the same in bfloat16 autocast")
    assert all(r["ms"] > 0 and len(r["rounds_ms"]) == 1 for r in rows)
    assert "| torch dropout and attention, default malloc, every token |" in rec["markdown"] and "| 1.00 |" in rec["markdown"]
    missing = subprocess.run([sys.executable, "scripts/bench_lftr_step.py", "--data", str(synth_sem_dir), "--space",
                              "nope", "--no-record"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and "no space 'nope'" in missing.stderr
    bad = subprocess.run([sys.executable, "scripts/bench_lftr_step.py", "--data", str(synth_sem_dir), "--contenders",
                          "9", "--no-record"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--contenders: numbers 1-6" in bad.stderr
