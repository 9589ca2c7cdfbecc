"""Time LFTR's validation R@k with and without the cut, on trained heads of a built benchmark.

Validation (`retrieval.lftr.predict.validation_recall`) wants only R@val_k. In a visual space it scores each chunk's
samples one at a time and drops a query once ``val_k`` of its negatives certainly beat its best positive; in a
semantic space it counts the negatives above the best positive from the state scores and expands only the queries
with fewer than ``val_k`` to the corpus rows (`torch_main_pool_stats(..., cut=val_k)`). The baseline, measured in the same run, scores every sample of every query
(``cut=None``). For each checkpoint (``--checkpoint``, e.g. the demo's ``reports/demo/runs/lftr-pixels-seed0/best.pt``)
and for the same head untrained (its weights at initialisation, as in the first epochs), the script computes the
validation queries' vectors once, then times both scorers on ``--threads`` torch threads, taking turns, ``--repeats``
rounds, each keeping its minimum; it checks that both give the same R@val_k and reports the share of queries dropped.

    python scripts/bench_lftr_val.py --data data/psr-synth --checkpoint reports/demo/runs/lftr-pixels-seed0/best.pt \
        --checkpoint reports/demo/runs/lftr-minilm-seed0/best.pt

Prints the table and records it (`eval.measured`: docs/perf/bench_lftr_val.json; ``--record-dir`` / ``--no-record``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from a checkout: find the packages


def measure(prep, model, label: str, repeats: int) -> dict:
    """Both scorers on the validation vectors of ``model``: seconds (min over rounds), R@k, dropped share."""
    from retrieval.lftr.predict import recall_at_k, step_vectors, torch_main_pool_stats, validation_rows

    cfg = model.cfg
    rows = validation_rows(prep, cfg)
    vec = step_vectors(model, prep, rows, rule="matched", seed=cfg.seed)
    torch_main_pool_stats(prep, rows, vec[:8])  # build the cached pools outside the timings
    times: dict[str, list[float]] = {"all": [], "cut": []}
    stats: dict[str, dict] = {}
    for _ in range(repeats):
        for name, cut in (("all", None), ("cut", cfg.val_k)):
            t0 = time.perf_counter()
            stats[name] = torch_main_pool_stats(prep, rows, vec, cut=cut)
            times[name].append(time.perf_counter() - t0)
    full, part = stats["all"], stats["cut"]
    dropped = (part["n_above"] == cfg.val_k) & (part["n_tie_neg"] == 0) & (full["n_above"] != part["n_above"])
    r_all, r_cut = recall_at_k(full, cfg.val_k), recall_at_k(part, cfg.val_k)
    return {"head": label, "space": cfg.target_space, "queries": len(rows), "samples": int(vec.shape[1]),
            "items": int(prep.target.items.shape[0]), "dim": int(prep.target.items.shape[1]), "k": cfg.val_k,
            "all_s": min(times["all"]), "cut_s": min(times["cut"]), "recall_all": r_all, "recall_cut": r_cut,
            "dropped": float(dropped.mean()) if len(rows) else 0.0}


def markdown(res: dict) -> str:
    lines = [f"Validation queries of `{res['data']}` (Q1-Q4 of the validation split), {res['threads']} torch "
             f"thread(s), minimum over {res['repeats']} rounds, the two scorers taking turns; baseline: every "
             "sample of every query scored (`cut=None`).", "",
             "| head | space | queries x samples | items x dim | every sample | with the cut | ratio | queries dropped "
             "| R@k every sample / with the cut |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["heads"]:
        lines.append(f"| {r['head']} | {r['space']} | {r['queries']:,} x {r['samples']} | {r['items']:,} x {r['dim']} "
                     f"| {r['all_s']:.2f} s | {r['cut_s']:.2f} s | **{r['cut_s'] / r['all_s']:.2f}** "
                     f"| {100 * r['dropped']:.0f}% | R@{r['k']} {100 * r['recall_all']:.2f} / "
                     f"{100 * r['recall_cut']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "psr-synth", help="a built benchmark")
    ap.add_argument("--checkpoint", type=Path, action="append", required=True,
                    help="an LFTR checkpoint (best.pt) trained on --data; repeat for several heads")
    ap.add_argument("--repeats", type=int, default=3, help="rounds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo trains its heads on 1 each)")
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "bench_lftr_val")
    a = ap.parse_args()
    import torch

    from eval.benchmark import Benchmark
    from retrieval.lftr.model import LFTR
    from retrieval.lftr.train import load_checkpoint, prepare

    for ck in a.checkpoint:
        if not ck.is_file():
            raise SystemExit(f"no checkpoint at {ck}: train a head first (make demo writes reports/demo/runs/)")
    load_before = load_now()
    torch.set_num_threads(a.threads)
    bench = Benchmark.load(a.data)
    heads = []
    with tempfile.TemporaryDirectory() as tmp:
        for ck in a.checkpoint:
            model, cfg, _ = load_checkpoint(ck)
            prep = prepare(bench, cfg, Path(tmp), "cpu")
            name = ck.parent.name
            heads.append(measure(prep, model, f"{name} ({ck.name})", a.repeats))
            torch.manual_seed(cfg.seed)
            fresh = LFTR(cfg, model.d_in, model.d_out, model.d_text)
            heads.append(measure(prep, fresh, f"{name} (untrained)", a.repeats))
            for h in heads[-2:]:
                print(h, flush=True)
    res = {"data": str(a.data), "threads": a.threads, "repeats": a.repeats, "heads": heads}
    md = markdown(res)
    print("\n" + md, end="")
    record_from_args(a, "bench_lftr_val", title="LFTR's validation R@k with and without the cut", markdown=md,
                     data=res, load=(load_before, load_now()))


if __name__ == "__main__":
    main()
