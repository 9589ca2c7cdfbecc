"""Benchmark the streaming scorer at PSR scale against a bare chunked matmul measured in the same process.

    python scripts/bench_scoring.py                       # 2,430 queries x 218,276 items, 384-d and 1,024-d
    python scripts/bench_scoring.py --dims 384 --repeats 3 --out reports/bench_scoring.json

Prints a line per dimension and records the table of `markdown` (`eval.measured`: docs/perf/bench_scoring.json,
which docs/performance.md shows; ``--record-dir`` / ``--no-record``).

Data: random L2-normalised float32 vectors; per query, positives drawn at random for the seven pools that
`eval.scoring.score_benchmark` scores (type2-all of 1-40 rows, split into in_dataset / cross_dataset, consensus and
type1 subsets, 0-60 bge_similar rows, 1-3 in_video rows inside the query's own "video" of 45 excluded rows) plus
the two triplet probes, k = 50. Each dimension runs in a fresh subprocess so its peak memory is its own.

Timing is interleaved so that both contenders meet the same load on a shared machine: for each query block of
``--q-block`` queries, the bare matmul of the block and `score_stream` on the block (its own pools; blocks are
scored independently, so this is the scorer's work on the whole set) take turns, ``--repeats`` times; each block's
time is the minimum over its repeats and the totals are their sums.

Reported per dimension: ``bare_s`` (``for c-chunk: Q[block] @ X[c].T`` with the scorer's tile sizes, torch, same
threads: a new tile per product, as the issue's bound is written), ``bare_reused_s`` (the same products written into
one preallocated buffer with ``torch.mm(out=)``: no page faults for fresh tiles, the stricter bound, which the
scorer's tile loop also avoids), ``bare_misaligned_s`` (the same into a buffer 16 bytes past a 64-byte boundary,
where numpy's allocator puts a new array: what a tile without `eval.scoring.sources.aligned_empty`'s 64-byte
alignment costs), ``ours_s`` (`score_stream` with `DenseSource`), ``ratio = ours_s / bare_s``,
``ratio_reused = ours_s / bare_reused_s`` (the ratio the targets are judged on), the same in CPU seconds of
the process (``cpu_ratio``), the 1-minute load average before and after, ``peak_rss_mb`` (the process's peak
resident memory, data included), ``data_mb`` (queries + items) and ``scorer_extra_mb`` (the largest peak RSS
while a block is scored minus the RSS before it, sampled every 10 ms). Targets (issue 23), on ``ratio_reused``: <= 1.25 at 384-d, <= 1.3 at 1,024-d, peak
memory < 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def make_data(nq: int, n: int, d: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nq, d), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    x = np.empty((n, d), dtype=np.float32)
    for a in range(0, n, 65536):  # generate in chunks: no float64 copy of the whole corpus
        b = min(n, a + 65536)
        x[a:b] = rng.standard_normal((b - a, d), dtype=np.float32)
        x[a:b] /= np.linalg.norm(x[a:b], axis=1, keepdims=True)
    video = rng.integers(0, n - 45, size=nq)
    exclude = [np.arange(v, v + 45) for v in video]
    main, ind, cross, cons, t1, bge, self_, temp, sem = ([] for _ in range(9))
    for i in range(nq):
        m = rng.choice(n, size=int(rng.integers(1, 41)), replace=False)
        m = m[(m < video[i]) | (m >= video[i] + 45)]
        cut = int(rng.integers(0, len(m) + 1))
        main.append(m)
        ind.append(m[:cut])
        cross.append(m[cut:])
        cons.append(m[rng.random(len(m)) < 0.7])
        t1.append(m[rng.random(len(m)) < 0.2])
        sem.append(np.setdiff1d(m, t1[-1]))
        bge.append(rng.choice(n, size=int(rng.integers(0, 61)), replace=False))
        self_.append(video[i] + rng.choice(45, size=int(rng.integers(1, 4)), replace=False))
        temp.append(video[i] + rng.choice(45, size=int(rng.integers(2, 7)), replace=False))
    pools = {"type2-all": main, "type2-consensus": cons, "type1-all": t1, "in_dataset": ind, "cross_dataset": cross,
             "bge_similar": bge, "in_video": self_}
    return q, x, pools, exclude, {"triplet_temporal": temp, "triplet_semantic": sem}


class RssSampler:
    """Peak resident memory of this process over a window, sampled every 10 ms (psutil)."""

    def __init__(self):
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()

    def __enter__(self):
        self.start = self.peak = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def interleaved(contenders: dict, n_blocks: int, repeats: int) -> dict[str, dict[str, float]]:
    """``contenders[name](block)`` run for every block, taking turns, ``repeats`` times: per contender the sums
    over blocks of each block's minimum wall and CPU seconds (``wall_s``, ``cpu_s``), and every repeat's total."""
    wall = {n: np.full((repeats, n_blocks), np.inf) for n in contenders}
    cpu = {n: np.full((repeats, n_blocks), np.inf) for n in contenders}
    for r in range(repeats):
        for b in range(n_blocks):
            for name, run in contenders.items():
                t0, c0 = time.perf_counter(), time.process_time()
                run(b)
                wall[name][r, b], cpu[name][r, b] = time.perf_counter() - t0, time.process_time() - c0
    return {n: {"wall_s": float(wall[n].min(0).sum()), "cpu_s": float(cpu[n].min(0).sum()),
                "repeats_wall_s": wall[n].sum(1).tolist()} for n in contenders}


def run_one(args) -> dict:
    import torch

    from eval.scoring import DenseSource, score_stream

    torch.set_num_threads(args.threads)
    import numba

    numba.set_num_threads(args.threads)
    q, x, pools, exclude, probes = make_data(args.queries, args.items, args.dim, args.seed)
    # compile the tile kernel outside the timed region (a one-off per installation, cached on disk)
    score_stream(DenseSource(q[:4], x[:1000]), {"a": [np.arange(3)] * 4}, [np.arange(3, 9)] * 4, k=5, progress=False)
    qt, xt = torch.from_numpy(q), torch.from_numpy(x)
    starts = list(range(0, len(q), args.q_block))
    results = {}

    def bare(b):
        a = starts[b]
        for c in range(0, len(x), args.c_chunk):
            s = qt[a:a + args.q_block] @ xt[c:c + args.c_chunk].T
            del s

    def products_into(buf):
        """The bare chunked products of a query block, each written into ``buf`` (flat float32)."""
        def run(b):
            a = starts[b]
            qb = qt[a:a + args.q_block]
            for c in range(0, len(x), args.c_chunk):
                xc = xt[c:c + args.c_chunk]
                torch.mm(qb, xc.T, out=buf[:len(qb) * len(xc)].view(len(qb), len(xc)))
        return run

    bare_reused = products_into(torch.empty(args.q_block * args.c_chunk))
    # the same into a buffer 16 bytes past a 64-byte boundary: where numpy's allocator puts a new array
    # (`eval.scoring.sources.aligned_empty` gives the scorer's tiles 64 bytes)
    raw = np.empty(args.q_block * args.c_chunk * 4 + 128, np.uint8)
    start = -raw.ctypes.data % 64 + 16
    bare_misaligned = products_into(torch.from_numpy(raw[start:start + args.q_block * args.c_chunk * 4]
                                                     .view(np.float32)))

    extra = [0.0]

    def ours(b):
        a, e = starts[b], min(len(q), starts[b] + args.q_block)
        results.pop(b, None)
        with RssSampler() as mem:
            results[b] = score_stream(DenseSource(q[a:e], x), {n: v[a:e] for n, v in pools.items()}, exclude[a:e],
                                      k=args.k, q_block=args.q_block, c_chunk=args.c_chunk, progress=False,
                                      probes={n: v[a:e] for n, v in probes.items()})
        extra[0] = max(extra[0], (mem.peak - mem.start) / 2**20)

    load_before = os.getloadavg()[0]
    t = interleaved({"bare": bare, "bare_reused": bare_reused, "bare_misaligned": bare_misaligned, "ours": ours},
                    len(starts), args.repeats)
    hit5 = float(np.mean(np.concatenate([results[b].stats["type2-all"]["n_above"] for b in sorted(results)]) < 5))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    bare_s, ours_s = t["bare"]["wall_s"], t["ours"]["wall_s"]
    return {"dim": args.dim, "queries": len(q), "items": len(x), "k": args.k, "q_block": args.q_block,
            "c_chunk": args.c_chunk, "threads": args.threads, "repeats": args.repeats,
            "bare_s": bare_s, "ours_s": ours_s, "ratio": ours_s / bare_s,
            "bare_reused_s": t["bare_reused"]["wall_s"], "ratio_reused": ours_s / t["bare_reused"]["wall_s"],
            "bare_misaligned_s": t["bare_misaligned"]["wall_s"],
            "bare_cpu_s": t["bare"]["cpu_s"], "ours_cpu_s": t["ours"]["cpu_s"],
            "cpu_ratio": t["ours"]["cpu_s"] / t["bare"]["cpu_s"], "bare_all_s": t["bare"]["repeats_wall_s"],
            "ours_all_s": t["ours"]["repeats_wall_s"], "load_before": load_before, "load_after": os.getloadavg()[0],
            "peak_rss_mb": peak, "data_mb": (q.nbytes + x.nbytes) / 2**20,
            "scorer_extra_mb": extra[0], "sanity_r5": hit5,
            "torch": torch.__version__, "numba": numba.__version__}


def markdown(results: list[dict]) -> str:
    """A sentence on the setup, then a row per dimension (seconds summed over query blocks, each block's minimum)."""
    r0 = results[0]
    lines = [f"{r0['queries']:,} queries x {r0['items']:,} items, random L2-normalised float32 vectors, k = {r0['k']}, "
             f"tiles of {r0['q_block']:,} x {r0['c_chunk']:,}, {r0['threads']} threads, minimum over "
             f"{r0['repeats']} repeat(s) per query block; torch {r0['torch']}, numba {r0['numba']}.", "",
             "| dim | bare chunked `Q @ X.T` | the same into one reused buffer | the same, buffer 16 bytes off "
             "alignment | `score_stream` | ratio | ratio to the reused-buffer matmul | CPU ratio | peak RSS (data) | "
             "scorer's own extra memory | load before / after |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['dim']:,} | {r['bare_s']:.2f} s | {r['bare_reused_s']:.2f} s | "
              f"{r['bare_misaligned_s']:.2f} s | {r['ours_s']:.2f} s | "
              f"{r['ratio']:.2f} | **{r['ratio_reused']:.2f}** | {r['cpu_ratio']:.2f} | {r['peak_rss_mb']:,.0f} MB ({r['data_mb']:,.0f} MB) | "
              f"{r['scorer_extra_mb']:,.0f} MB | {r['load_before']:.1f} / {r['load_after']:.1f} |" for r in results]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queries", type=int, default=2430)
    p.add_argument("--items", type=int, default=218276)
    p.add_argument("--dims", type=int, nargs="+", default=[384, 1024])
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--q-block", type=int, default=512)
    p.add_argument("--c-chunk", type=int, default=16384)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON file for the results (config written beside it)")
    p.add_argument("--dim", type=int, default=None, help=argparse.SUPPRESS)  # child process
    sys.path.insert(0, str(ROOT))
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(p, "bench_scoring")
    args = p.parse_args()
    if args.dim is not None:
        print(json.dumps(run_one(args)))
        return
    results = []
    load_before = load_now()
    for d in args.dims:
        cmd = [sys.executable, __file__, "--dim", str(d)] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if k not in ("dims", "out", "dim", "record_dir", "no_record", "record_name")]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if proc.returncode != 0:
            sys.exit(f"benchmark for dim {d} failed:\n{proc.stderr}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"{r['queries']} x {r['items']} x {d}-d: bare matmul {r['bare_s']:.2f} s, scorer {r['ours_s']:.2f} s, "
              f"ratio {r['ratio']:.2f}, {r['ratio_reused']:.2f} to the matmul into one buffer (CPU s {r['bare_cpu_s']:.1f} vs {r['ours_cpu_s']:.1f}, ratio "
              f"{r['cpu_ratio']:.2f}); load {r['load_before']:.1f} -> {r['load_after']:.1f}; peak RSS "
              f"{r['peak_rss_mb']:.0f} MB (data {r['data_mb']:.0f} MB, scorer +{r['scorer_extra_mb']:.0f} MB)",
              flush=True)
    load_after = load_now()
    md = markdown(results)
    print("\n" + md, end="")
    record_from_args(args, "bench_scoring", title="The streaming scorer against a bare matmul", markdown=md,
                     data={"results": results}, load=(load_before, load_after))
    if args.out:
        from eval.io import write_json

        write_json(args.out, {"results": results})
        write_json(args.out.with_name(args.out.stem + "_config.json"), {k: str(v) if isinstance(v, Path) else v
                                                                      for k, v in vars(args).items()
                                                                      if k not in ("record_dir", "no_record",
                                                                                   "record_name")})


if __name__ == "__main__":
    main()
