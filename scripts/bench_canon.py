"""Speed benchmark of the greedy canonicalization clustering (issue: 200,000 phrases, 384-d, ~50,000 true clusters).

    python scripts/bench_canon.py --out reports/bench_canon            # the full benchmark (minutes on 2 cores)
    python scripts/bench_canon.py --n 20000 --clusters 5000 --out /tmp/b   # a quick look

Times, in one run on the same data (see `retrieval.canon.speed`): the fast blocked clustering, (a) the straightforward
per-phrase numpy loop on a subset, extrapolated, and (b) one dense product of all phrases against the final seed set.
Writes ``bench_canon.json`` and ``bench_canon.md`` into --out; exit code 1 when a target is missed (>= 20x faster
than (a), within 2x of (b)) or, with --check-exact N, when the fast result differs from the exact loop on N phrases.
Also records the Markdown (`eval.measured`: docs/perf/bench_canon.json, bench_canon_float32.json with
``--screen float32``, which docs/performance.md shows; ``--record-dir`` / ``--no-record`` / ``--record-name``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the packages live at the repository root
    sys.path.insert(0, str(ROOT))

from eval.io import atomic_path, write_json  # noqa: E402
from eval.measured import add_record_options, load_now, record_from_args  # noqa: E402
from retrieval.canon.speed import SpeedConfig, run_speed_benchmark  # noqa: E402


def markdown(r: dict) -> str:
    c = r["config"]
    q = r["quality"]
    loads = ", ".join(f"{x['load_avg_1m']:.1f}" for x in r["rounds"])
    return "\n".join([
        "### Greedy canonicalization: speed",
        "",
        f"{c['n']:,} phrases x {c['dim']} dims, {c['n_clusters']:,} true clusters, threshold {c['threshold']}; "
        f"{r['clusters']:,} clusters found (purity {q['purity']:.3f}, inverse purity {q['inverse_purity']:.3f}, "
        f"ARI {q['ari']:.3f}); {r['machine']['cpus']} CPUs, {r['machine']['blas']}; best of {len(r['rounds'])} "
        f"interleaved rounds (1-min load averages {loads}).",
        "",
        "| method | seconds | fast is |",
        "|---|---:|---:|",
        f"| fast (blocked {r['screen']} screen + exact refinement) | {r['fast_s']:.1f} | |",
        f"| (a) per-phrase numpy loop, {r['loop_subset_phrases']:,} phrases timed, extrapolated | "
        f"{r['loop_extrapolated_s']:.0f} | {r['speedup_vs_loop']:.1f}x faster (target >= 20x) |",
        f"| (b) one dense float32 product against the {r['clusters']:,} final seeds | {r['dense_bound_s']:.1f} | "
        f"{r['ratio_to_dense_bound']:.2f}x its time (target <= 2x) |",
        f"| (b') the same product in int8 (the screen's arithmetic) | {r['dense_bound_int8_s']:.1f} | "
        f"{r['ratio_to_dense_bound_int8']:.2f}x its time |",
        "",
        f"targets met: {'yes' if r['targets_met'] else 'NO'}"
        + (f"; exact check on {r['exact_check']['phrases']:,} phrases: "
           f"{'equal' if r['exact_check']['equal'] else 'DIFFERENT'}" if "exact_check" in r else ""),
        "",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SpeedConfig()
    ap.add_argument("--out", type=Path, required=True, help="directory for bench_canon.json / .md")
    ap.add_argument("--n", type=int, default=d.n, help="phrases")
    ap.add_argument("--clusters", type=int, default=d.n_clusters, help="true clusters")
    ap.add_argument("--dim", type=int, default=d.dim)
    ap.add_argument("--threshold", type=float, default=d.threshold)
    ap.add_argument("--loop-phrases", type=int, default=d.loop_phrases, help="phrases the loop (a) is timed on")
    ap.add_argument("--block", type=int, default=d.block)
    ap.add_argument("--seed-chunk", type=int, default=d.seed_chunk)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--screen", choices=("int8", "float32"), default=d.screen, help="candidate screen of the fast path")
    ap.add_argument("--rounds", type=int, default=d.rounds, help="interleaved timing rounds (each method keeps its best)")
    ap.add_argument("--check-exact", type=int, default=0, help="also compare with the exact loop on N phrases")
    add_record_options(ap, "bench_canon, or bench_canon_float32 with --screen float32")
    a = ap.parse_args()
    load_before = load_now()
    cfg = SpeedConfig(n=a.n, n_clusters=a.clusters, dim=a.dim, threshold=a.threshold, loop_phrases=a.loop_phrases,
                      block=a.block, seed_chunk=a.seed_chunk, seed=a.seed, screen=a.screen,
                      rounds=a.rounds, check_exact=a.check_exact)
    r = run_speed_benchmark(cfg)
    md = markdown(r)
    print("\n" + md)
    write_json(a.out / "bench_canon.json", r)
    with atomic_path(a.out / "bench_canon.md") as tmp:
        tmp.write_text(md, encoding="utf-8")
    body = md.split("\n", 1)[1].lstrip("\n")  # the page gives the record its own heading
    record_from_args(a, "bench_canon" if a.screen == "int8" else f"bench_canon_{a.screen}",
                     title=f"Greedy canonicalization: speed ({a.screen} screen)", markdown=body, data=r,
                     load=(load_before, load_now()))
    ok = r["targets_met"] and r.get("exact_check", {"equal": True})["equal"]
    print(json.dumps({"targets_met": r["targets_met"], "exact": r.get("exact_check")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
