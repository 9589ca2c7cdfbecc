"""Build cost of a synthetic-benchmark preset: wall time and peak memory of each construction step.

    python scripts/bench_synth.py --preset psr --out /data/psr-synth-psr [--workers N]

Runs the two steps of `python -m retrieval synth` as separate processes -- ``eval synth`` (simulate, label,
describe, render, featurize) and ``retrieval canon apply`` (embed the raw descriptions, cluster at 0.85, re-key,
mine and verify the GT) -- and records for each: wall seconds, the peak resident memory of the step's process tree
(``ru_maxrss`` of the children), and the machine's load average before and after (the machine may be shared: the
load says how much to trust the seconds). Then it validates the result and writes the card. Output: a JSON and a
Markdown table in ``--report`` (default ``reports/bench_synth_<preset>.{json,md}``), the table also recorded
(`eval.measured`: docs/perf/bench_synth_<preset>.json, which docs/performance.md shows; ``--record-dir`` /
``--no-record`` / ``--record-name``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from a checkout: find the packages
    sys.path.insert(0, str(ROOT))

from eval.measured import add_record_options, load_now, record_from_args  # noqa: E402

PY = sys.executable


def _step(name: str, cmd: list[str]) -> dict:
    load0 = os.getloadavg()[0]
    t0 = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(cmd, check=True)
    wall = time.time() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"step": name, "cmd": " ".join(cmd), "seconds": round(wall, 1),
            # ru_maxrss of children is the largest single child seen so far (KiB on Linux)
            "peak_rss_gb": round(max(peak_kb, before) / 2**20, 2), "load_before": round(load0, 1),
            "load_after": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="psr", help="demo | psr")
    ap.add_argument("--out", type=Path, required=True, help="benchmark directory to build (step 1 writes OUT-truth)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="simulation processes (0 = all cores)")
    ap.add_argument("--model", default="packaged:all-MiniLM-L6-v2")
    ap.add_argument("--report", type=Path, default=None, help="folder for the JSON and Markdown (default reports/)")
    add_record_options(ap, "bench_synth_<preset>")
    a = ap.parse_args()
    load_before = load_now()
    truth = a.out.with_name(a.out.name + "-truth")
    steps = [
        _step("simulate (eval synth)", [PY, "-m", "eval", "synth", "--out", str(truth), "--preset", a.preset,
                                        "--seed", str(a.seed), "--workers", str(a.workers)]),
        _step("canonicalize + mine + verify (retrieval canon apply)",
              [PY, "-m", "retrieval", "synth", "--out", str(a.out), "--preset", a.preset, "--seed", str(a.seed),
               "--model", a.model]),
        _step("validate (eval validate --no-frames)", [PY, "-m", "eval", "validate", str(a.out), "--no-frames"]),
    ]
    manifest = json.loads((a.out / "manifest.json").read_text())
    rep = Path(a.report or "reports")
    rep.mkdir(parents=True, exist_ok=True)
    subprocess.run([PY, "-m", "eval", "card", str(a.out), "--out", str(rep / f"card_{a.preset}")], check=True)
    doc = {"preset": a.preset, "seed": a.seed, "cores": os.cpu_count(), "counts": manifest["counts"],
           "steps": steps, "total_seconds": round(sum(s["seconds"] for s in steps), 1)}
    (rep / f"bench_synth_{a.preset}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = [f"Build cost of the `{a.preset}` preset (`python scripts/bench_synth.py --preset {a.preset}`), "
          f"{os.cpu_count()} cores; counts {manifest['counts']}.", "",
          "| step | seconds | peak RSS (GB) | load before / after |", "|---|---:|---:|---:|"]
    md += [f"| {s['step']} | {s['seconds']:,} | {s['peak_rss_gb']} | {s['load_before']} / {s['load_after']} |"
           for s in steps]
    (rep / f"bench_synth_{a.preset}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    record_from_args(a, f"bench_synth_{a.preset}", title=f"Building the `{a.preset}` preset", markdown="\n".join(md),
                     data=doc, load=(load_before, load_now()))


if __name__ == "__main__":
    main()
