"""Benchmark: the batch runner against the bare minimum on the same requests and the same server, in the same run.

    python scripts/bench_runner.py [--backend openai] [--queries 256] [--concurrency 16] [--repeats 3]
                                   [--latency-median 0.2 --latency-sigma 0.8] [--forecaster m3] [--out FILE.json]
    python scripts/bench_runner.py --backend openai --base-url URL --model NAME     # a real server instead
    python scripts/bench_runner.py --backend hf [--model DIR] [--batch-size 8]     # an in-process engine

``--backend openai`` (default): without ``--base-url`` the script starts a stand-in OpenAI-compatible server on
127.0.0.1 whose latency varies per request: each chat completion waits ``median * exp(sigma * z)`` seconds with
``z ~ N(0, 1)`` drawn from a generator seeded by the CRC32 of the request body, so the same request waits the same
time in every contender (lognormal: mean ``median * exp(sigma^2 / 2)``; ``--latency-sigma 0`` makes it constant).
For the same N rendered requests (the runner's own request bodies), timed in turn, median of ``--repeats``:

- bare: one ``httpx.AsyncClient`` (connection pool of ``concurrency``, the HTTP library the runner uses), an
  ``asyncio.Semaphore(concurrency)``, ``asyncio.gather`` over all N prebuilt JSON bodies: the floor for
  ``concurrency`` requests in flight;
- bare_openai: the same with one ``openai.AsyncOpenAI`` client over the prebuilt payloads (what most users write);
- chunked_openai: that client sending chunks of ``4 x concurrency`` and waiting for each chunk to finish (a
  reference for what a chunked sender loses under variable latency);
- runner: ``forecasters.runner.run`` end to end into a fresh phrase file (plan: benchmark load, query selection,
  resume scan; server check; frames, rendering, PNG encoding; streaming with ``concurrency`` in flight; parsing;
  JSON lines, write + fsync as answers arrive; config and summary files).

The contenders take turns (the order rotates per repeat). Reported: the median wall times, ``ratio = runner / bare``
(target <= 1.1), ``runner / bare_openai`` and ``chunked_openai / bare``.

``--backend hf``: raw = the rendered requests through ``backend.generate`` in chunks of ``batch_size``; runner as
above on the same built backend; ``ratio = runner / raw``. Without ``--data`` / ``--model`` the script builds the
synthetic benchmark (40 videos) and a tiny random Qwen2 in a temp dir.

Prints the results as JSON and records them as a table (`markdown`; `eval.measured`: docs/perf/bench_runner_*.json,
named after the backend and the options that change what is measured, which docs/performance.md shows;
``--record-dir`` / ``--no-record`` / ``--record-name``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class VariableLatencyServer:
    """A stand-in OpenAI-compatible server (HTTP/1.1 keep-alive) on 127.0.0.1, in its own process like a real
    server (so it never competes with the client for the GIL): ``/v1/models``, ``/version`` and
    ``/v1/chat/completions``, answering each completion after its body's latency (see the module docstring)."""

    ANSWER = "rolling down the ramp"

    def __init__(self, median: float, sigma: float, model: str = "bench", backlog: int = 128):
        self.median, self.sigma, self.model, self.backlog = median, sigma, model, backlog
        self.port = 0
        self._proc = None

    def latency(self, body: bytes) -> float:
        return self.median * math.exp(self.sigma * random.Random(zlib.crc32(body)).gauss(0.0, 1.0))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> VariableLatencyServer:
        import multiprocessing as mp

        parent, child = mp.get_context("fork").Pipe()
        self._proc = mp.get_context("fork").Process(target=self._main, args=(child,), daemon=True)
        self._proc.start()
        if not parent.poll(30):
            raise RuntimeError("the stand-in server did not start")
        self.port = parent.recv()
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(10)

    def _main(self, conn) -> None:
        async def main():
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=self.backlog)
            conn.send(server.sockets[0].getsockname()[1])
            await server.serve_forever()

        asyncio.run(main())

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                if method == "POST" and path.endswith("/chat/completions"):
                    await asyncio.sleep(self.latency(body))
                    out = {"id": "b", "object": "chat.completion", "created": 0, "model": self.model,
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": self.ANSWER},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": len(body) // 4, "completion_tokens": 5, "total_tokens": 0}}
                elif path.endswith("/models"):
                    out = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
                else:
                    out = {"version": "bench-server"}
                data = json.dumps(out).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _bare_openai(base_url: str, model: str, payloads: list[dict], concurrency: int, chunk: int | None) -> float:
    """Seconds to answer every payload with one ``AsyncOpenAI`` client and ``concurrency`` in flight (in chunks of
    ``chunk``, each awaited whole, when given)."""
    import httpx
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http = DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=concurrency,
                                                       max_keepalive_connections=concurrency))
    async with AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, http_client=http) as client:
        sem = asyncio.Semaphore(concurrency)

        async def one(p):
            async with sem:
                r = await client.chat.completions.create(**p)
                assert r.choices, r

        t0 = time.perf_counter()
        step = chunk or len(payloads)
        for s in range(0, len(payloads), step):
            await asyncio.gather(*(one(p) for p in payloads[s:s + step]))
        return time.perf_counter() - t0


async def _bare_httpx(base_url: str, bodies: list[bytes], concurrency: int) -> float:
    """Seconds to answer every JSON body with one ``httpx.AsyncClient`` and ``concurrency`` in flight."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120, headers={"Content-Type": "application/json"}) as client:
        sem = asyncio.Semaphore(concurrency)

        async def one(body):
            async with sem:
                r = await client.post(base_url.rstrip("/") + "/chat/completions", content=body)
                assert r.status_code == 200 and r.json()["choices"], r.text

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - t0


def _setup(args, tmp: Path) -> tuple[str, str | None]:
    data = args.data
    if data is None:
        from eval.synth import build_benchmark

        data = str(build_benchmark(tmp / "synth", videos=40, seed=0, progress=False))
    model = args.model
    if model is None and args.backend == "hf":
        from forecasters.tiny_models import build_tiny_qwen2

        model = str(build_tiny_qwen2(tmp / "tiny-qwen2"))
    return data, model


def bench_openai(args, tmp: Path) -> dict:
    from forecasters.backends import get_backend
    from forecasters.media import FrameCache
    from forecasters.runner import RunConfig, backend_config, plan, render_request, run

    server = None
    base_url, model = args.base_url, args.model
    if base_url is None:  # started first: it forks, and nothing here has started a thread yet
        server = VariableLatencyServer(args.latency_median, args.latency_sigma).start()
        base_url, model = server.base_url, server.model
    try:
        data, _ = _setup(args, tmp)
        cfg = RunConfig(data=data, out=str(tmp / "warm.jsonl"), forecaster=args.forecaster, backend="openai",
                        model=model, base_url=base_url, split=None, limit=args.queries, concurrency=args.concurrency,
                        max_tokens=args.max_tokens, progress=False)
        backend = get_backend("openai", backend_config(cfg, model))
        run(RunConfig(**{**cfg.__dict__, "limit": min(args.queries, 2 * args.concurrency)}), backend=backend)  # warm-up
        p = plan(RunConfig(**{**cfg.__dict__, "out": str(tmp / "plan.jsonl")}))
        frames = FrameCache(p.bench.root, max_pixels=backend.config.max_pixels)
        payloads = [backend.payload(render_request(p.spec, p.template, q, p.bench, frames, sampling=p.sampling,
                                                   selection=cfg.frame_selection())) for q in p.todo]

        def runner(i: int) -> float:
            t0 = time.perf_counter()
            s = run(RunConfig(**{**cfg.__dict__, "out": str(tmp / f"run{i}.jsonl")}), backend=backend)
            assert s.complete and s.attempted == len(payloads), s
            return time.perf_counter() - t0

        bodies = [json.dumps(p, ensure_ascii=False).encode("utf-8") for p in payloads]
        n = args.concurrency
        contenders = {
            "bare": lambda i: asyncio.run(_bare_httpx(base_url, bodies, n)),
            "bare_openai": lambda i: asyncio.run(_bare_openai(base_url, model, payloads, n, None)),
            "chunked_openai": lambda i: asyncio.run(_bare_openai(base_url, model, payloads, n, 4 * n)),
            "runner": runner}
        times: dict[str, list[float]] = {k: [] for k in contenders}
        names = list(contenders)
        for i in range(args.repeats):  # the order rotates, so no contender always goes first
            for k in names[i % len(names):] + names[:i % len(names)]:
                times[k].append(contenders[k](i))
        backend.close()
    finally:
        if server is not None:
            server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"backend": "openai", "server": "variable-latency stand-in" if server else base_url, "model": model,
           "forecaster": args.forecaster, "queries": len(payloads), "concurrency": args.concurrency,
           "latency_median_s": args.latency_median if server else None,
           "latency_sigma": args.latency_sigma if server else None, "repeats": args.repeats,
           **{f"{k}_s": round(v, 3) for k, v in med.items()},
           **{f"{k}_all_s": [round(x, 3) for x in v] for k, v in times.items()}}
    res["ratio"] = round(med["runner"] / med["bare"], 3)
    res["ratio_vs_bare_openai"] = round(med["runner"] / med["bare_openai"], 3)
    res["chunked_openai_ratio"] = round(med["chunked_openai"] / med["bare"], 3)
    res["overhead_ms_per_query"] = round(1000 * (med["runner"] - med["bare"]) / len(payloads), 2)
    return res


def bench_hf(args, tmp: Path) -> dict:
    from forecasters.backends import get_backend
    from forecasters.media import FrameCache
    from forecasters.runner import RunConfig, backend_config, plan, render_request, run

    data, model = _setup(args, tmp)
    cfg = RunConfig(data=data, out=str(tmp / "warm.jsonl"), forecaster=args.forecaster, backend="hf", model=model,
                    split=None, limit=args.queries, batch_size=args.batch_size, max_tokens=args.max_tokens,
                    num_threads=args.threads, progress=False)
    backend = get_backend("hf", backend_config(cfg, model))
    run(cfg, backend=backend)  # warm-up: caches, lazy imports, first-call costs
    p = plan(RunConfig(**{**cfg.__dict__, "out": str(tmp / "plan.jsonl")}))
    frames = FrameCache(p.bench.root, max_pixels=backend.config.max_pixels)
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
    res = {"backend": "hf", "engine": backend.engine_version, "forecaster": args.forecaster, "model": model,
           "queries": n, "batch_size": args.batch_size, "max_tokens": args.max_tokens, "repeats": args.repeats,
           "raw_s": round(statistics.median(raw), 3), "runner_s": round(statistics.median(runner), 3),
           "raw_all_s": [round(x, 3) for x in raw], "runner_all_s": [round(x, 3) for x in runner]}
    res["ratio"] = round(res["runner_s"] / res["raw_s"], 3)
    res["overhead_ms_per_query"] = round(1000 * (res["runner_s"] - res["raw_s"]) / n, 2)
    return res


def record_name(args) -> str:
    """The record's name: the backend and the options that change what is measured."""
    if args.backend == "hf":
        return f"bench_runner_hf_{args.forecaster}_b{args.batch_size}_t{args.max_tokens}_q{args.queries}"
    where = "server" if args.base_url else "standin"
    return f"bench_runner_openai_{where}_{args.forecaster}_c{args.concurrency}_q{args.queries}"


def markdown(res: dict) -> str:
    """One row: the contenders' median seconds and the runner's ratio to the bare minimum."""
    if res["backend"] == "hf":
        return "\n".join([
            f"In process ({res['engine']}), median of {res['repeats']} repeat(s).", "",
            "| forecaster | queries | batch / max tokens | raw `backend.generate` | runner | ratio | overhead / query |",
            "|---|---:|---|---:|---:|---:|---:|",
            f"| {res['forecaster']} | {res['queries']:,} | {res['batch_size']} / {res['max_tokens']} | "
            f"{res['raw_s']:.2f} s | {res['runner_s']:.2f} s | **{res['ratio']:.2f}** | "
            f"{res['overhead_ms_per_query']:.1f} ms |"]) + "\n"
    server = (f"a stand-in server (latency median {res['latency_median_s']} s, sigma {res['latency_sigma']})"
              if res["latency_median_s"] is not None else f"the server at {res['server']}")
    return "\n".join([
        f"Over HTTP against {server}, median of {res['repeats']} repeat(s), the contenders taking turns.", "",
        "| forecaster | queries | in flight | bare | bare AsyncOpenAI | chunked | runner | runner / bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {res['forecaster']} | {res['queries']:,} | {res['concurrency']} | {res['bare_s']:.2f} s | "
        f"{res['bare_openai_s']:.2f} s | {res['chunked_openai_s']:.2f} s | {res['runner_s']:.2f} s | "
        f"**{res['ratio']:.2f}** |"]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="openai", choices=["openai", "hf"])
    ap.add_argument("--data")
    ap.add_argument("--model")
    ap.add_argument("--base-url")
    ap.add_argument("--forecaster", default=None, help="default: m3 (openai), text-only (hf)")
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--latency-median", type=float, default=0.2)
    ap.add_argument("--latency-sigma", type=float, default=0.8)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    if str(REPO) not in sys.path:  # `python scripts/bench_runner.py` from a checkout
        sys.path.insert(0, str(REPO))
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "bench_runner_<backend>_<options>")
    args = ap.parse_args()
    args.forecaster = args.forecaster or ("m3" if args.backend == "openai" else "text-only")
    load_before = load_now()
    tmp = Path(tempfile.mkdtemp(prefix="bench-runner-"))
    res = (bench_openai if args.backend == "openai" else bench_hf)(args, tmp)
    res["command"] = "python scripts/bench_runner.py " + " ".join(sys.argv[1:])
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    record_from_args(args, record_name(args), title=f"The runner against the bare minimum ({res['backend']}, "
                                                    f"{res['forecaster']})", markdown=markdown(res), data=res,
                     load=(load_before, load_now()))


if __name__ == "__main__":
    main()
