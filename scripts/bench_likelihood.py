"""Benchmark: likelihood scoring of candidate states against free-form generation, on the same tiny model.

    python scripts/bench_likelihood.py cost [--queries 24] [--repeats 3] [--top 20] [--server] [--out FILE.json]
    python scripts/bench_likelihood.py cost --base-url URL --served-model NAME     # a running vLLM server
    python scripts/bench_likelihood.py quality [--data DIR] [--fit-steps 150] [--out DIR]

``cost``: the cost per query of ``forecasters run --forecaster likelihood`` against ``--forecaster m3`` (free-form,
greedy, 24 tokens) on the same queries, the same tiny random Qwen2-VL and the same engine, in the same run: the
``hf`` backend in process, and with ``--server`` (or ``--base-url``) the ``openai`` backend against a vLLM server
(``--server`` starts one from ``.venv-vllm``, as the tests do). Contenders, each end to end through
``forecasters.runner.run`` into a fresh phrase file on one built backend, taking turns, median of ``--repeats``:
``generate`` (m3), ``top N`` (likelihood, ``--candidates topN:RUN`` on a first-stage run of random scores),
``states`` (likelihood, every canonical state). The likelihood contenders run with ``--cpn-alpha 0``: the
content-free prior is a one-off per run (one request scoring every candidate text), timed apart (``prior``).
Reported: seconds per query and the ratio to ``generate``. Without ``--data`` the synthetic benchmark (40 videos)
and the tiny model are built in a temp dir. The table is printed and recorded (`eval.measured`:
docs/perf/bench_likelihood_cost.json, which docs/performance.md shows; ``--record-dir`` / ``--no-record``).

``quality`` (plumbing, not a baseline: a tiny model fitted for a few steps says nothing about forecasting): fit a
tiny Qwen2-VL on the synthetic train split with the M3 prompt (`forecasters.tiny_fit`), then on the test split
(1) its free-form answer (``m3``) retrieved in the MiniLM text space (the run keeps its top 1,000 segments, so its
list holds 20 distinct states to rerank), (2) its likelihood ranking of every state with and without CPN, (3) its
likelihood rerank of the top 20 states of (1); ``python -m eval report`` over the four runs (significance against
the free-form run) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _setup(data: str | None, tmp: Path) -> tuple[str, str]:
    from eval.synth import build_benchmark
    from forecasters.tiny_models import build_tiny_model

    if data is None:
        data = str(build_benchmark(tmp / "bench", videos=40, seed=0, progress=False))
    return data, str(build_tiny_model(tmp / "tiny-qwen2-vl", "qwen2_vl", seed=0))


def _first_stage(data: str, out: Path) -> str:
    """A first-stage run of random scores over the test split (only its top states matter here)."""
    from eval.benchmark import Benchmark
    from eval.runs import write_run
    from eval.scoring import RandomSource, score_benchmark

    bench = Benchmark.load(data)
    rows = bench.query_rows("test")
    run = score_benchmark(bench, RandomSource(len(rows), len(bench.corpus_ids), 0), rows, method="random",
                          progress=False)
    return str(write_run(out, run))


def _time_contenders(contenders: dict, backend, repeats: int, tmp: Path) -> dict[str, float]:
    from forecasters.runner import RunConfig, run

    tmp.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:  # take turns
            cfg = RunConfig(**{**contenders[name], "out": str(tmp / f"{name}-{r}.jsonl")})
            t0 = time.perf_counter()
            s = run(cfg, backend=backend)
            times[name].append(time.perf_counter() - t0)
            assert s.complete and s.coverage.failed == 0, (name, s.to_dict())
    return {k: statistics.median(v) for k, v in times.items()}


def _prior_seconds(data: str, backend, base: dict, tmp: Path) -> tuple[float, int]:
    """Wall time of the content-free prior of every state (one scoring request), and the number of states."""
    from forecasters.backends import ScoreRequest
    from forecasters.likelihood import content_free_request
    from forecasters.runner import RunConfig, plan

    p = plan(RunConfig(**{**base, "out": str(tmp / "prior.jsonl"), "forecaster": "likelihood",
                          "candidates": "states"}))
    req = content_free_request(p.template, p.spec.system)
    t0 = time.perf_counter()
    (res,) = backend.score([ScoreRequest("prior", req, tuple(p.task.candidates.texts))])
    assert res.ok, res.error
    return time.perf_counter() - t0, len(p.task.candidates.texts)


def _scale_seconds(data: str, backend, base: dict, n: int, tmp: Path, queries: int = 2) -> float:
    """Seconds per query to score ``n`` candidate answers (the state texts, then numbered copies of them) for
    ``queries`` queries through `Backend.score` (the cost of ``--candidates states`` on a benchmark with n states)."""
    from forecasters.backends import ScoreRequest
    from forecasters.likelihood import score_requests
    from forecasters.media import FrameCache
    from forecasters.runner import RunConfig, plan

    p = plan(RunConfig(**{**base, "out": str(tmp / f"scale{n}.jsonl"), "forecaster": "likelihood",
                          "candidates": "states", "limit": queries}))
    m = len(p.task.candidates.texts)
    texts = [p.task.candidates.texts[i % m] + (f" {i // m}" if i >= m else "") for i in range(n)]  # distinct
    reqs = [ScoreRequest(r.id, r.prompt, tuple(texts)) for r in score_requests(p, FrameCache(p.bench.root,
                                                                                           max_pixels=448 * 448))]
    t0 = time.perf_counter()
    res = backend.score(reqs)
    assert all(r.ok for r in res), [r.error for r in res]
    return (time.perf_counter() - t0) / len(reqs)


def cost(args) -> dict:
    from forecasters.backends import get_backend
    from forecasters.backends.hf import HFConfig
    from forecasters.backends.openai_compat import OpenAIConfig

    tmp = Path(tempfile.mkdtemp(prefix="bench-lik-"))
    data, model = _setup(args.data, tmp)
    first = _first_stage(data, tmp / "first-stage.parquet")
    results = {"queries": args.queries, "repeats": args.repeats, "top": args.top, "rows": []}
    engines = [("hf", model, HFConfig(model=model, batch_size=8, candidate_batch_size=32,
                                      num_threads=args.threads))]
    server = None
    if args.server and not args.base_url:
        sys.path.insert(0, str(REPO / "tests"))
        from vllm_server import VLLMServer

        server = VLLMServer(model, served_name="tiny-vl", log_path=tmp / "vllm-server.log").start()
        server.wait_ready(timeout_s=600)
        args.base_url, args.served_model = server.base_url, "tiny-vl"
    if args.base_url:
        engines.append(("openai", args.served_model, OpenAIConfig(model=args.served_model, base_url=args.base_url,
                                                                  concurrency=args.concurrency,
                                                                  batch_size=4 * args.concurrency)))
    try:
        for name, served, bcfg in engines:
            backend = get_backend(name, bcfg)
            base = dict(data=data, backend=name, model=served, base_url=args.base_url if name == "openai" else None,
                        limit=args.queries, progress=False, concurrency=args.concurrency)
            contenders = {"generate": {**base, "forecaster": "m3"},
                          f"top{args.top}": {**base, "forecaster": "likelihood",
                                             "candidates": f"top{args.top}:{first}", "cpn_alpha": 0.0},
                          "states": {**base, "forecaster": "likelihood", "candidates": "states", "cpn_alpha": 0.0}}
            _time_contenders({"generate": contenders["generate"]}, backend, 1, tmp / f"warm-{name}")  # warm-up
            med = _time_contenders(contenders, backend, args.repeats, tmp / name)
            prior_s, n_states = _prior_seconds(data, backend, base, tmp)
            for k, v in med.items():
                results["rows"].append({"backend": name, "contender": k, "wall_s": round(v, 3),
                                        "s_per_query": round(v / args.queries, 4),
                                        "ratio_to_generate": round(v / med["generate"], 2),
                                        "candidates_per_query": 0 if k == "generate" else
                                        (n_states if k == "states" else min(args.top, n_states))})
            results["rows"].append({"backend": name, "contender": "prior", "wall_s": round(prior_s, 3),
                                    "candidates_per_query": n_states, "s_per_query": None, "ratio_to_generate": None})
            gen_q = med["generate"] / args.queries
            for n in args.scale:
                sq = _scale_seconds(data, backend, base, n, tmp)
                results["rows"].append({"backend": name, "contender": f"{n} candidates (Backend.score)",
                                        "wall_s": None, "candidates_per_query": n, "s_per_query": round(sq, 4),
                                        "ratio_to_generate": round(sq / gen_q, 2)})
            backend.close()
    finally:
        if server is not None:
            server.stop()
    print(cost_markdown(results), end="")
    return results


def cost_markdown(results: dict) -> str:
    """A sentence on the setup, then a row per backend and contender (medians over the repeats)."""
    lines = [f"{results['queries']} test queries of the synthetic benchmark, tiny random Qwen2-VL, median of "
             f"{results['repeats']} repeat(s), the contenders taking turns; likelihood without CPN.", "",
             "| backend | contender | candidates / query | wall | s / query | / generate |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results["rows"]:
        sq = f"{r['s_per_query']:.3f}" if r["s_per_query"] is not None else "(once per run)"
        ratio = f"{r['ratio_to_generate']:.2f}" if r["ratio_to_generate"] is not None else ""
        wall = f"{r['wall_s']:.2f} s" if r["wall_s"] is not None else ""
        lines.append(f"| {r['backend']} | {r['contender']} | {r['candidates_per_query']} | {wall} | {sq} | {ratio} |")
    return "\n".join(lines) + "\n"


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, *args], cwd=REPO, check=True)


def quality(args) -> dict:
    from forecasters.tiny_fit import fit_on_benchmark

    tmp = Path(tempfile.mkdtemp(prefix="bench-lik-q-"))
    data, model = _setup(args.data, tmp)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loss = fit_on_benchmark(model, data, forecaster="m3", steps=args.fit_steps, seed=0)
    if not (Path(data) / "features" / "minilm" / "meta.json").exists():
        _cli("-m", "retrieval", "encode", "--data", data, "--space", "minilm", "--model", "packaged:all-MiniLM-L6-v2")
    common = ["--data", data, "--split", "test", "--backend", "hf", "--model", model, "--num-threads", "1",
              "--no-progress"]
    free = out / "free-form.jsonl"
    _cli("-m", "forecasters", "run", "--forecaster", "m3", "--out", str(free), *common)
    _cli("-m", "retrieval", "search", "--data", data, "--phrases", str(free), "--space", "minilm",
         "--out", str(out / "free-form.parquet"), "--method", "free-form m3", "--k", "1000")
    runs = {"free-form": out / "free-form.parquet"}
    variants = {"lik-states-cpn": ["--candidates", "states"],
                "lik-states-nocpn": ["--candidates", "states", "--cpn-alpha", "0"],
                "lik-rerank20-cpn": ["--candidates", f"top20:{out / 'free-form.parquet'}"]}
    for name, flags in variants.items():
        _cli("-m", "forecasters", "run", "--forecaster", "likelihood", *flags, "--out", str(out / f"{name}.jsonl"),
             "--run-out", str(out / f"{name}.parquet"), *common)
        runs[name] = out / f"{name}.parquet"
    _cli("-m", "eval", "report", *map(str, runs.values()), "--data", data, "--out", str(out / "report"),
         "--reference", "free-form", "--resamples", "1000")
    doc = json.loads((out / "report" / "report.json").read_text())
    return {"fit_loss": loss, "fit_steps": args.fit_steps, "runs": {k: str(v) for k, v in runs.items()},
            "main": {name: {k: v for k, v in r["main"].items() if k.startswith(("R@", "MRR", "n"))}
                     for name, r in doc["runs"].items()}}


def main() -> None:
    from eval.measured import add_record_options, load_now, record_from_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--data")
    c.add_argument("--queries", type=int, default=24)
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--top", type=int, default=20)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--concurrency", type=int, default=4)
    c.add_argument("--scale", type=lambda x: [int(v) for v in x.split(",") if v], default=[256, 1024],
                   help="also time Backend.score with this many candidates a query (comma-separated)")
    c.add_argument("--server", action="store_true", help="start a vLLM server (.venv-vllm) on the tiny model")
    c.add_argument("--base-url")
    c.add_argument("--served-model", default="tiny-vl")
    c.add_argument("--out")
    add_record_options(c, "bench_likelihood_cost")
    q = sub.add_parser("quality")
    q.add_argument("--data")
    q.add_argument("--fit-steps", type=int, default=150)
    q.add_argument("--out", default="reports/bench-likelihood")
    args = ap.parse_args()
    load_before = load_now()
    res = cost(args) if args.what == "cost" else quality(args)
    print(json.dumps(res, indent=2))
    if args.what == "cost":
        record_from_args(args, "bench_likelihood_cost", title="Likelihood scoring against free-form generation",
                         markdown=cost_markdown(res), data=res, load=(load_before, load_now()))
    if getattr(args, "out", None) and args.what == "cost":
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
