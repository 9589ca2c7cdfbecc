"""Benchmark: the batch runner's overhead per query against raw backend calls on the same model.

    python scripts/bench_runner.py [--data DIR] [--model DIR] [--queries 64] [--repeats 3] [--forecaster text-only]
                                   [--backend hf | --backend openai --base-url URL --model NAME] [--out FILE.json]

For the same N queries, with one already-built backend:
- raw: the rendered requests go to ``backend.generate`` in chunks of ``batch_size`` (what the runner sends), timed;
- runner: ``forecasters.runner.run`` over the same queries into a fresh phrase file (plan: benchmark load, query
  selection, resume scan; per chunk: frames, rendering, generation, parsing, JSON lines, write + fsync; config and
  summary files), timed end to end.
Reported: median wall times, ``ratio = runner / raw`` and ``overhead_ms_per_query = (runner - raw) / N``.
Without ``--data`` / ``--model`` it builds the synthetic benchmark (40 videos) and a tiny random Qwen2 in a temp dir.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data")
    ap.add_argument("--model")
    ap.add_argument("--forecaster", default="text-only")
    ap.add_argument("--backend", default="hf", choices=["hf", "openai"])
    ap.add_argument("--base-url")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    if str(REPO) not in sys.path:  # `python scripts/bench_runner.py` from a checkout
        sys.path.insert(0, str(REPO))

    from forecasters.backends import get_backend
    from forecasters.media import FrameCache
    from forecasters.runner import RunConfig, backend_config, plan, render_request, run

    tmp = Path(tempfile.mkdtemp(prefix="bench-runner-"))
    data = args.data
    if data is None:
        from eval.synth import build_benchmark

        data = str(build_benchmark(tmp / "synth", videos=40, seed=0, progress=False))
    model = args.model
    if model is None:
        from forecasters.tiny_models import build_tiny_qwen2

        model = str(build_tiny_qwen2(tmp / "tiny-qwen2"))
    cfg = RunConfig(data=data, out=str(tmp / "warm.jsonl"), forecaster=args.forecaster, backend=args.backend,
                    model=model, base_url=args.base_url, split=None, limit=args.queries, batch_size=args.batch_size,
                    concurrency=args.batch_size, max_tokens=args.max_tokens, num_threads=args.threads, progress=False)
    backend = get_backend(args.backend, backend_config(cfg, model))
    run(cfg, backend=backend)  # warm-up: caches, lazy imports, first-call costs
    p = plan(RunConfig(**{**cfg.__dict__, "out": str(tmp / "plan.jsonl")}))
    frames = FrameCache(p.bench.root)
    requests = [render_request(p.spec, p.template, q, p.bench, frames, sampling=p.sampling) for q in p.todo]
    raw, runner = [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        for s in range(0, len(requests), args.batch_size):
            backend.generate(requests[s:s + args.batch_size])
        raw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run(RunConfig(**{**cfg.__dict__, "out": str(tmp / f"run{i}.jsonl")}), backend=backend)
        runner.append(time.perf_counter() - t0)
    n = len(requests)
    res = {"backend": args.backend, "engine": backend.engine_version, "forecaster": args.forecaster, "model": model,
           "queries": n, "batch_size": args.batch_size, "max_tokens": args.max_tokens, "repeats": args.repeats,
           "raw_s": round(statistics.median(raw), 3), "runner_s": round(statistics.median(runner), 3),
           "raw_all_s": [round(x, 3) for x in raw], "runner_all_s": [round(x, 3) for x in runner]}
    res["ratio"] = round(res["runner_s"] / res["raw_s"], 3)
    res["overhead_ms_per_query"] = round(1000 * (res["runner_s"] - res["raw_s"]) / n, 2)
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
