"""`python -m eval compare` end to end with a real step: the missing text-predictor row is built by a
``python -m retrieval search`` subprocess, the LFTR row comes from ``--lftr-run``; a rerun runs nothing."""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli

from eval.benchmark import Benchmark
from eval.runs import read_run


@pytest.mark.slow
def test_compare_runs_retrieval_search_for_a_missing_row(world, tmp_path):
    out = tmp_path / "table3"
    argv = ["eval", "compare", "--data", world["bench"], "--phrases", f"M3={world['phrases']}", "--text-space",
            "minilm", "--lftr-run", f"minilm={world['run']}", "--out", out, "--resamples", "100"]
    res = run_cli(*argv)
    assert res.code == 0, res.text
    assert "-m retrieval search" in res.out  # the step (run in a subprocess) is logged
    run = read_run(out / "runs" / "m3-minilm.parquet")
    test_ids = [q.id for q in Benchmark.load(world["bench"]).queries("test")]
    assert run.method.startswith("m3-minilm") and list(run.query_ids) == test_ids  # --method m3-minilm
    doc = json.loads((out / "compare.json").read_text())
    assert doc["subset"]["query_ids"] == test_ids and doc["reference"] == "M3->minilm"
    assert list(doc["main"]) == ["M3->minilm", "LFTR->minilm"]
    assert "| M3->minilm |" in res.out and "| LFTR->minilm |" in res.out
    before = (out / "runs" / "m3-minilm.parquet").stat().st_mtime_ns
    res = run_cli(*argv)  # resumes: the row exists, no step runs
    assert res.code == 0, res.text
    assert "-m retrieval" not in res.out
    assert (out / "runs" / "m3-minilm.parquet").stat().st_mtime_ns == before
