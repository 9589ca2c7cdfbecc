"""`scripts/state_accuracy.py` on the session's demo runs: the top-1 state share of a run, and the R@5 that naming
the target's state reaches, which the semantic-text oracle must equal wherever the positives lie in that state."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eval.benchmark import Benchmark
from eval.metrics import per_query_metrics

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _script():
    spec = importlib.util.spec_from_file_location("state_accuracy", REPO / "scripts" / "state_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_oracle_names_every_state_and_reaches_the_ceiling_exactly(synth_demo, synth_sem_dir):
    sa = _script()
    bench = Benchmark.load(synth_sem_dir)
    rows = sa.population(bench, "test")
    oracle = synth_demo["oracle-semantic-text"]
    got = sa.state_accuracy(bench, oracle, rows)
    assert got["n"] == len(rows) > 0 and got["top1_state"] == 1.0
    ceiling = sa.naming_the_state(bench, rows)
    # per query: where every positive lies in the target state, the oracle's tie-aware R@5 is that formula exactly
    r5 = dict(zip(oracle.query_ids, per_query_metrics(oracle, "type2-all", ks=(5,), ndcg_k=None)["R@5"],
                  strict=True))
    ids = np.asarray(bench.queries_ds["id"][:])[rows]
    state = np.asarray(bench.corpus_ds["state_id"][:])
    target = np.asarray(bench.queries_ds["target_state_id"][:])[rows]
    from eval.scoring import benchmark_groups

    pools = benchmark_groups(bench, bench.query_table(rows))[0]["type2-all"]
    inside = np.array([len(p) > 0 and bool((state[p] == t).all()) for p, t in zip(pools, target, strict=True)])
    assert inside.sum() > 0.9 * len(rows)
    np.testing.assert_allclose(ceiling[inside], [r5[q] for q in ids[inside]], rtol=0, atol=1e-12)
    assert 0 < np.nanmean(ceiling) < 1


def test_a_random_ranking_seldom_names_the_state_and_the_cli_writes_its_table(synth_demo, synth_demo_out,
                                                                            synth_sem_dir, tmp_path):
    sa = _script()
    bench = Benchmark.load(synth_sem_dir)
    rows = sa.population(bench, "test")
    rnd = sa.state_accuracy(bench, synth_demo["random"], rows)
    assert rnd["top1_state"] < 0.1
    out = tmp_path / "acc.json"
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "state_accuracy.py"), "--data", str(synth_sem_dir),
                          str(synth_demo_out / "random.parquet"), str(synth_demo_out / "oracle-semantic-text.parquet"),
                          "--out", str(out)], capture_output=True, text=True, check=True)
    assert "| `random` |" in res.stdout and "Naming the state" in res.stdout
    d = json.loads(out.read_text())
    assert [r["method"] for r in d["runs"]] == ["random", "oracle-semantic-text[minilm]"]
    assert d["runs"][1]["top1_state"] == 1.0 and d["queries_with_a_positive_in_their_state"] > 0
