"""`scripts/bench_allocators.py`: a scoring stage under each allocator setting as fresh processes, each against the
library defaults measured in the same run; the toolkit's own setting is the one `eval.allocators` chooses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # four fresh scoring processes, about 15 s: make test runs it, make test-fast does not
def test_the_allocator_benchmark_runs_each_setting_and_records_the_table(synth_sem_dir, tmp_path):
    res = subprocess.run([sys.executable, "scripts/bench_allocators.py", "--data", str(synth_sem_dir), "--stages",
                          "semantic-text", "--repeats", "1", "--record-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rec = json.loads((tmp_path / "bench_allocators.json").read_text())
    rows = rec["data"]["runs"]
    assert [r["setting"] for r in rows] == ["library defaults", "numpy advice off", "jemalloc pool", "toolkit"]
    assert all(r["stage"] == "semantic-text" and r["wall_s"] > 0 and r["user_s"] > 0 for r in rows)
    assert "| semantic-text | library defaults |" in rec["markdown"] and "| 1.00 |" in rec["markdown"]
    assert set(rec["data"]["thp"]) == {"enabled", "defrag"}
    bad = subprocess.run([sys.executable, "scripts/bench_allocators.py", "--data", str(synth_sem_dir), "--stages",
                          "nope", "--no-record"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown stage 'nope'" in bad.stderr
