"""State-level accuracy of runs, beside the R@5 that naming the right state can reach.

    python scripts/state_accuracy.py --data data/psr-synth reports/demo/runs/lftr-sim-minilm-seed0.parquet \\
        reports/demo/runs/transition-table.parquet reports/demo/runs/oracle-semantic-text.parquet

R@5 mixes two things: whether a method names the target's state, and how many segments tie with the main pool's
positives once it does. This script separates them, over the main table's population (the split's fair Q1-Q4
queries that the run answers).

For each run:
- **top-1 state**: the share of queries whose first-ranked segment is in the target's canonical state. (A run keeps
  its top 50 segments, which one well-named state's tied segments often fill, so the list cannot tell which states
  come second.)
- **R@5**: its micro R@5, tie-aware (`eval.metrics`).

One line is the same for every run: **naming the state**. It is the mean expected hit@5 of a ranking that puts
every segment of the target state (outside the query's own video) first, tied:

    1 - C(m - g, 5) / C(m, 5)

where ``m`` counts those segments and ``g`` the main-pool positives among them. Positives outside the target state
are left out: they would rank below the tie.

A run's R@5 is therefore about its top-1 state share times this ceiling. The semantic-text oracle names every
state and reaches the ceiling (up to positives outside the state).

``--out FILE.json`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def population(bench, split: str) -> np.ndarray:
    """Query rows of the main table: ``split``'s fair Q1-Q4 queries."""
    from eval.schema import MAIN_QTYPES

    return bench.query_rows(split, fair_only=True, qtypes=MAIN_QTYPES)


def naming_the_state(bench, rows: np.ndarray, k: int = 5) -> np.ndarray:
    """Per query row: the expected hit@k of naming the target state (`eval.synth.predictability.naming_the_state`)."""
    from eval.synth.predictability import naming_the_state as naming

    return naming(bench, rows, k)


def state_accuracy(bench, run, rows: np.ndarray) -> dict:
    """Top-1 state share and micro R@5 of ``run`` over the query ``rows`` it answers."""
    from eval.metrics import mean_valid, per_query_metrics

    seg_state, row = np.asarray(bench.corpus_ds["state_id"][:]), bench.corpus_index
    ids = np.asarray(bench.queries_ds["id"][:])
    target = np.asarray(bench.queries_ds["target_state_id"][:])
    wanted = {str(ids[r]): str(target[r]) for r in rows}
    r5 = per_query_metrics(run, "type2-all", ks=(5,), ndcg_k=None)["R@5"]
    top1, hits = [], []
    for i, (qid, ranked) in enumerate(zip(run.query_ids, run.topk_ids, strict=True)):
        if qid not in wanted:
            continue
        top1.append(bool(ranked) and bool(ranked[0]) and seg_state[row[ranked[0]]] == wanted[qid])
        hits.append(r5[i])
    n = len(top1)
    return {"method": run.method, "n": n, "top1_state": float(np.mean(top1)) if n else float("nan"),
            "r5": 100 * mean_valid(np.asarray(hits, float))[0] if n else float("nan")}


def markdown(results: list[dict], ceiling: float, n: int) -> str:
    lines = ["| run | queries | top-1 state | R@5 |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['method']}` | {r['n']:,} | {100 * r['top1_state']:.1f}% | {r['r5']:.2f} |" for r in results]
    lines += ["", f"Naming the state (every segment of the target state outside the query's video tied at the top): "
                  f"R@5 {100 * ceiling:.2f} over {n:,} queries with a positive in their state."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run files (.parquet)")
    p.add_argument("--data", type=Path, required=True, help="the benchmark the runs answer")
    p.add_argument("--split", default="test")
    p.add_argument("--out", type=Path, default=None, help="also write the numbers to this JSON file")
    a = p.parse_args()
    from eval.benchmark import Benchmark
    from eval.runs import read_run

    bench = Benchmark.load(a.data)
    rows = population(bench, a.split)
    ceiling = naming_the_state(bench, rows)
    results = [state_accuracy(bench, read_run(r), rows) for r in a.runs]
    valid = ceiling[np.isfinite(ceiling)]
    md = markdown(results, float(valid.mean()) if valid.size else float("nan"), int(valid.size))
    print(md, end="")
    if a.out:
        from eval.io import write_json

        write_json(a.out, {"runs": results, "naming_the_state_r5": float(valid.mean()) if valid.size else None,
                           "queries_with_a_positive_in_their_state": int(valid.size), "split": a.split,
                           "data": str(a.data)})


if __name__ == "__main__":
    main()
