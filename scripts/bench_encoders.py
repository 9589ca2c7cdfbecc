"""Benchmark the training cost of the learned encoders and the LoRA baseline: seconds per epoch and peak memory.

Each job runs in its own child process (peak RSS = that child's ``ru_maxrss``, from ``os.wait4``), on a benchmark
directory, for ``--epochs`` epochs:

- ``ssl``: the SSL tower (`retrieval.ssl`, `SSLConfig`'s defaults: VICReg) on the train split's frames
  (``--max-frames`` caps them);
- ``lit``: the LiT image tower (`retrieval.lit`) on the train split's (frame, description) pairs;
- ``lftr-frozen`` / ``lftr-lora``: the LoRA baseline's two runs (`retrieval.lora`): LFTR on the frozen prefix
  space's cached tokens vs LoRA on the prefix encoder through the head (needs the spaces encoded:
  ``--prefix-space``, ``--space``, ``--question-space``).

Reports wall-clock and CPU seconds per epoch (CPU: the process's user + system time over all its threads, which a
shared machine inflates far less than wall time), items per second, peak RSS and the load average during the job
(ratios within one run are the robust numbers), as JSON (``--out``) and a Markdown table (printed, and ``OUT.md``),
which it also records (`eval.measured`: docs/perf/bench_encoders_<jobs>.json, which docs/performance.md shows;
``--record-dir`` / ``--no-record`` / ``--record-name``).

Usage::

    python scripts/bench_encoders.py --data data/psr-synth --jobs ssl,lit --epochs 1 --threads 2
    python scripts/bench_encoders.py --data data/psr-synth --jobs lftr-frozen,lftr-lora --space ssl \\
        --prefix-space ssl --question-space minilm --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from a checkout: find the packages

JOBS = ("ssl", "lit", "lftr-frozen", "lftr-lora")


def child(job: str, args: argparse.Namespace, out: Path) -> None:
    """Run one job in this (child) process and write its measurements to ``out`` (JSON)."""
    from eval.benchmark import Benchmark
    from eval.io import write_json

    bench = Benchmark.load(args.data)
    t = f"optim.threads={args.threads}"
    with tempfile.TemporaryDirectory() as d:
        if job in ("ssl", "lit"):
            from retrieval.towers import load_dataclass

            if job == "ssl":
                from retrieval.ssl import SSLConfig, train_ssl

                cfg = load_dataclass(SSLConfig, [], [f"optim.epochs={args.epochs}", t, f"max_frames={args.max_frames}"])
                rec = train_ssl(bench, cfg, Path(d) / "t", progress=False, log=lambda s: None)
                n = rec["frames"] * 2  # two views a frame
            else:
                from retrieval.lit import LiTConfig, train_lit

                cfg = load_dataclass(LiTConfig, [], [f"optim.epochs={args.epochs}", t, f"max_pairs={args.max_frames}"])
                rec = train_lit(bench, cfg, Path(d) / "t", progress=False, log=lambda s: None)
                n = rec["pairs"]
            h = rec["history"]
            res = {"seconds_per_epoch": rec["seconds_per_epoch"], "items_per_epoch": n,
                   "cpu_seconds_per_epoch": sum(x.get("cpu_seconds", float("nan")) for x in h) / len(h),
                   "parameters": rec["parameters"], "load_avg": sum(x["load_avg"] for x in h) / len(h)}
        else:
            from retrieval.lftr.config import load_config
            from retrieval.lora import LORA_LFTR, LoRAConfig, run_lora_baseline

            cfg = load_config([args.config], [f"epochs={args.epochs}", f"threads={args.threads}"],
                              target_space=args.space, prefix_space=args.prefix_space,
                              question_space=args.question_space).with_overrides(
                {"batch_size": LORA_LFTR["batch_size"]})
            name = job.split("-")[1]
            r = run_lora_baseline(bench, cfg, LoRAConfig(with_out=args.with_out), d, runs=(name,), progress=False,
                                  log=lambda s: None)[name]
            n_train = len(bench.query_rows("train"))
            res = {"seconds_per_epoch": r["seconds_per_epoch"], "val_seconds_per_epoch": r["val_seconds_per_epoch"],
                   "cpu_seconds_per_epoch": r["cpu_seconds_per_epoch"],
                   "items_per_epoch": n_train, "parameters": r["parameters"], "load_avg": r["load_avg"],
                   "R@5": r["R@5"]}
    write_json(out, res)


def run_job(job: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "res.json"
        cmd = [sys.executable, __file__, "--child", job, "--child-out", str(out), *sys.argv[1:]]
        t0 = time.time()
        p = subprocess.Popen(cmd, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        if status != 0:
            raise SystemExit(f"job {job} failed (status {status})")
        res = json.loads(out.read_text())
    res.update(peak_rss_mb=usage.ru_maxrss / 1024, wall_seconds=time.time() - t0)
    res["items_per_second"] = res["items_per_epoch"] / res["seconds_per_epoch"]
    return res


def markdown(results: dict) -> str:
    lines = ["| job | s/epoch (wall) | CPU s/epoch | items/epoch | items/s (wall) | peak RSS (MB) | load avg | "
             "parameters |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for job, r in results["jobs"].items():
        lines.append(f"| {job} | {r['seconds_per_epoch']:.1f} | {r['cpu_seconds_per_epoch']:.1f} | "
                     f"{r['items_per_epoch']:,} | {r['items_per_second']:.1f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['load_avg']:.1f} | {r['parameters']:,} |")
    if "cost_ratio_lora_vs_frozen" in results:
        lines.append(f"\nLoRA / frozen LFTR: {results['cost_ratio_lora_vs_frozen']:.1f}x seconds per epoch.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--jobs", default="ssl,lit", help=f"comma-separated, from {JOBS}")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-frames", type=int, default=0, help="cap frames (ssl) / pairs (lit); 0 = all")
    ap.add_argument("--space", default="ssl")
    ap.add_argument("--prefix-space", default="ssl")
    ap.add_argument("--question-space", default="minilm")
    ap.add_argument("--with-out", action="store_true", help="LoRA also on the attention output projection")
    ap.add_argument("--config", type=Path, default=ROOT / "configs/lftr/synth.yaml")
    ap.add_argument("--out", type=Path, default=Path("bench_encoders.json"))
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "bench_encoders_<jobs>")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args, args.child_out)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = [j for j in jobs if j not in JOBS]
    if bad:
        raise SystemExit(f"unknown job(s) {bad}; choose from {JOBS}")
    from eval.io import write_json

    load_before = load_now()
    results = {"data": str(args.data), "epochs": args.epochs, "threads": args.threads, "cpu_count": os.cpu_count(),
               "jobs": {}}
    for j in jobs:
        results["jobs"][j] = run_job(j, args)
        print(j, json.dumps(results["jobs"][j]), flush=True)
    if {"lftr-frozen", "lftr-lora"} <= set(results["jobs"]):
        results["cost_ratio_lora_vs_frozen"] = (results["jobs"]["lftr-lora"]["seconds_per_epoch"]
                                                / results["jobs"]["lftr-frozen"]["seconds_per_epoch"])
    write_json(args.out, results)
    md = markdown(results)
    args.out.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)
    sentence = (f"On `{args.data}`, {args.epochs} epoch(s) a job, {args.threads} threads, each job in its own process"
                + (f", at most {args.max_frames:,} frames / pairs" if args.max_frames else "") + ".")
    record_from_args(args, "bench_encoders_" + "-".join(jobs), title=f"Encoder and LoRA training cost ({', '.join(jobs)})",
                     markdown=sentence + "\n\n" + md, data=results, load=(load_before, load_now()))


if __name__ == "__main__":
    main()
