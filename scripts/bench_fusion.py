"""Benchmark the z-score fusion against the sum of its inputs' bare chunked matmuls, measured in the same run.

    python scripts/bench_fusion.py                            # both cases, 218,276 items, 2 threads
    python scripts/bench_fusion.py --cases lftr --queries 256 --two-pass --out reports/bench_fusion.json

Cases (random L2-normalised float32 vectors, the pools and own-video exclusions of `scripts/bench_scoring.py`, k = 50,
the scorer's tiles of 512 x 16,384):

- ``lftr`` -- what `scripts/psr_scale.py` fuses: LFTR in a semantic space (``--states`` states x 384-d, expanded to
  the corpus by a state per item) and in a visual space (``--items`` x 576-d), ``--samples`` vectors per query
  scored by their max (32, the paper's);
- ``dense`` -- two one-vector spaces (384-d and 1,024-d over the same items; e.g. two phrase-search runs).

Per case: ``bare_s`` = the sum over inputs of the bare chunked matmul of its query vectors (all samples) against its
items (``Q[a:a+1024] @ X[c:c+16384].T``, torch, the same threads; a new tile per product), ``bare_reused_s`` = the
same products written into one preallocated buffer (``torch.mm(out=)``: no page faults for fresh tiles; the stricter
bound, ``ratio_reused``, which the target is judged on), ``fusion_s`` = `eval.scoring.score_stream` on
`eval.scoring.FusionSource` built once over every query, as a pipeline builds it (the statistics it takes for every
query before its first tile, timed once, plus every block: its tiles, pass A, rank counting, top-k), ``ratio =
fusion_s / bare_s``. The blocks are timed per query block of 512 with the contenders taking turns (`interleaved` of
`scripts/bench_scoring.py`: each block's minimum over ``--repeats``, summed), also in CPU seconds (``cpu_ratio``);
and with ``--two-pass`` the same for the fusion that computed every input's statistics in a pass of their own
before scoring (the reference kept in ``tests/eval/eval_sources.py``). Also the load average before and after,
and the peak resident memory of the fusion (sampled every 10 ms) minus the RSS before it. Target (issue 23), on ``ratio_reused``:
ratio <= 1.2. Prints a line per case and records the table of `markdown` (`eval.measured`: docs/perf/bench_fusion.json,
which docs/performance.md shows).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def unit_rows(rng, shape) -> np.ndarray:
    x = np.empty(shape, np.float32)
    flat = x.reshape(-1, shape[-1])
    for a in range(0, len(flat), 65536):  # chunks: no float64 copy of the whole array
        b = min(len(flat), a + 65536)
        flat[a:b] = rng.standard_normal((b - a, shape[-1]), dtype=np.float32)
        flat[a:b] /= np.linalg.norm(flat[a:b], axis=1, keepdims=True)
    return x


def inputs(case: str, a, rng) -> list[dict]:
    """The case's inputs: query vectors ``q`` (n, K, d), items ``x`` (m, d), optional ``item_rows``."""
    if case == "lftr":
        return [dict(q=unit_rows(rng, (a.queries, a.samples, 384)), x=unit_rows(rng, (a.states, 384)),
                     item_rows=rng.integers(0, a.states, a.items)),
                dict(q=unit_rows(rng, (a.queries, a.samples, 576)), x=unit_rows(rng, (a.items, 576)))]
    if case == "dense":
        return [dict(q=unit_rows(rng, (a.queries, 1, 384)), x=unit_rows(rng, (a.items, 384))),
                dict(q=unit_rows(rng, (a.queries, 1, 1024)), x=unit_rows(rng, (a.items, 1024)))]
    raise SystemExit(f"unknown case {case!r} (lftr, dense)")


def bare_matmul(spec: dict, qs: slice, rows: int = 1024, c_chunk: int = 16384, out=None) -> None:
    """``(n*K, d) @ (d, m)`` of queries ``qs`` in tiles of ``rows`` x ``c_chunk``, nothing else: a new tile per
    product, or each written into ``out`` (a flat float32 tensor of ``rows * c_chunk``) when given."""
    import torch

    q = torch.from_numpy(np.ascontiguousarray(spec["q"][qs]).reshape(-1, spec["q"].shape[2]))
    x = torch.from_numpy(spec["x"])
    for r in range(0, len(q), rows):
        for c in range(0, len(x), c_chunk):
            qr, xc = q[r:r + rows], x[c:c + c_chunk]
            if out is None:
                s = qr @ xc.T
                del s
            else:
                torch.mm(qr, xc.T, out=out[:len(qr) * len(xc)].view(len(qr), len(xc)))


class QueryRows:
    """Query rows ``rows`` of ``source``, as a score source of their own (one block of a fusion built over every
    query)."""

    def __init__(self, source, rows: slice):
        self.source, self.rows = source, rows
        self.n_queries, self.n_items = rows.stop - rows.start, source.n_items
        self.cached_blocks = source.cached_blocks

    def _rows(self, q: slice) -> slice:
        q = slice(*q.indices(self.n_queries)[:2])
        return slice(q.start + self.rows.start, q.stop + self.rows.start)

    def scores(self, q: slice, items):
        return self.source.scores(self._rows(q), items)

    def scores_into(self, q: slice, items: slice, out: np.ndarray) -> np.ndarray:
        return self.source.scores_into(self._rows(q), items, out)


def run_case(case: str, a) -> dict:
    from bench_scoring import RssSampler, interleaved, make_data

    from eval.scoring import DEFAULT_Q_BLOCK, DenseSource, FusionSource, score_stream

    rng = np.random.default_rng(a.seed)
    specs = inputs(case, a, rng)
    _, _, pools, exclude, probes = make_data(a.queries, a.items, 2, a.seed)
    kinds = {"one-pass": FusionSource}
    if a.two_pass:
        sys.path.insert(0, str(ROOT / "tests" / "eval"))
        from eval_sources import TwoPassFusion

        kinds["two-pass"] = TwoPassFusion
    starts = list(range(0, a.queries, DEFAULT_Q_BLOCK))
    blocks = [slice(s, min(a.queries, s + DEFAULT_Q_BLOCK)) for s in starts]
    results: dict[str, dict[int, object]] = {k: {} for k in kinds}
    extra = {k: 0.0 for k in kinds}

    # one fusion over every query, as a pipeline builds it: statistics taken once (a closed form's covariance
    # costs a product over the items), each block scored through a view of its rows
    fusions = {name: kind([DenseSource(s["q"], s["x"], item_rows=s.get("item_rows")) for s in specs])
               for name, kind in kinds.items()}

    def fused(name, b):
        qs = blocks[b]
        if isinstance(fusions[name], FusionSource):  # a repeat redoes the block's work, not reads the kept chunks
            fusions[name]._cache = None
        with RssSampler() as mem:
            results[name][b] = score_stream(QueryRows(fusions[name], qs), {n: v[qs] for n, v in pools.items()},
                                            exclude[qs], k=50, progress=False,
                                            probes={n: v[qs] for n, v in probes.items()})
        extra[name] = max(extra[name], (mem.peak - mem.start) / 2**20)

    import torch

    buf = torch.empty(1024 * 16384)
    contenders = {"bare": lambda b: [bare_matmul(s, blocks[b]) for s in specs],
                  "bare_reused": lambda b: [bare_matmul(s, blocks[b], out=buf) for s in specs]}
    contenders.update({name: (lambda b, name=name: fused(name, b)) for name in kinds})
    # compile the kernels outside the timed region
    score_stream(DenseSource(specs[0]["q"][:4], specs[0]["x"][:1000]), {"a": [np.arange(3)] * 4},
                 [np.arange(3, 9)] * 4, k=5, progress=False)
    load_before = os.getloadavg()[0]
    # the statistics a fusion takes for every query before its first tile (closed forms, state-space moments; the
    # two-pass reference: every input's), timed once and added to its blocks' seconds
    upfront = {}
    for name, f in fusions.items():
        t0, c0 = time.perf_counter(), time.process_time()
        (f._statistics_upfront if isinstance(f, FusionSource) else f.coefficients)()
        upfront[name] = (time.perf_counter() - t0, time.process_time() - c0)
    t = interleaved(contenders, len(blocks), a.repeats)
    for name, (wall, cpu) in upfront.items():
        t[name]["wall_s"] += wall
        t[name]["cpu_s"] += cpu
    if a.two_pass:  # the same fusion, bit for bit
        for b in range(len(blocks)):
            one, two = results["one-pass"][b], results["two-pass"][b]
            assert one.topk_scores.tobytes() == two.topk_scores.tobytes()
            assert np.array_equal(one.topk_rows, two.topk_rows)
    out = {"case": case, "queries": a.queries, "items": a.items, "threads": a.threads, "repeats": a.repeats,
           "inputs": [{"vectors_per_query": int(s["q"].shape[1]), "dim": int(s["q"].shape[2]),
                       "items": int(len(s["x"])), "state_space": "item_rows" in s} for s in specs],
           "bare_s": t["bare"]["wall_s"], "bare_cpu_s": t["bare"]["cpu_s"],
           "bare_reused_s": t["bare_reused"]["wall_s"], "load_before": load_before,
           "load_after": os.getloadavg()[0]}
    for name in kinds:
        out[name] = {"s": t[name]["wall_s"], "cpu_s": t[name]["cpu_s"], "ratio": t[name]["wall_s"] / t["bare"]["wall_s"],
                     "ratio_reused": t[name]["wall_s"] / t["bare_reused"]["wall_s"],
                     "cpu_ratio": t[name]["cpu_s"] / t["bare"]["cpu_s"], "extra_mb": extra[name]}
    return out


def markdown(results: list[dict], two_pass: bool) -> str:
    """A row per case: the inputs, the bare matmuls' and the fusion's seconds (each query block's minimum, summed)."""
    r0 = results[0]
    head = (f"{r0['queries']:,} queries, {r0['threads']} threads, minimum over {r0['repeats']} repeat(s) per query "
            "block; bare = the sum of the inputs' chunked matmuls, measured in the same run.")
    cols = ("| case | items | inputs | bare matmuls | the same into one reused buffer | one-pass fusion | ratio | "
            "ratio to the reused-buffer matmuls | CPU ratio | fusion's extra memory |")
    sep = "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    if two_pass:
        cols, sep = cols + " two-pass | ratio |", sep + "---:|---:|"
    lines = [head, "", cols + " load before / after |", sep + "---|"]
    for r in results:
        one = r["one-pass"]
        inputs = " + ".join(f"{i['vectors_per_query']} x {i['dim']}-d" + (" (states)" if i["state_space"] else "")
                            for i in r["inputs"])
        row = (f"| {r['case']} | {r['items']:,} | {inputs} | {r['bare_s']:.2f} s | {r['bare_reused_s']:.2f} s | "
               f"{one['s']:.2f} s | {one['ratio']:.2f} | **{one['ratio_reused']:.2f}** | {one['cpu_ratio']:.2f} | "
               f"{one['extra_mb']:,.0f} MB |")
        if two_pass:
            row += f" {r['two-pass']['s']:.2f} s | {r['two-pass']['ratio']:.2f} |"
        lines.append(row + f" {r['load_before']:.1f} / {r['load_after']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from eval.measured import add_record_options, load_now, record_from_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=["lftr", "dense"])
    p.add_argument("--queries", type=int, default=256, help="queries (each with --samples vectors in lftr)")
    p.add_argument("--items", type=int, default=218276)
    p.add_argument("--states", type=int, default=8123, help="lftr: states of the semantic space")
    p.add_argument("--samples", type=int, default=32, help="lftr: vectors per query")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--two-pass", action="store_true", help="also time the two-pass fusion (and check it is equal)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    add_record_options(p, "bench_fusion")
    a = p.parse_args()
    import numba
    import torch

    torch.set_num_threads(a.threads)
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    results = []
    load_before = load_now()
    for case in a.cases:
        r = run_case(case, a)
        results.append(r)
        line = (f"{case}: {r['queries']} queries x {r['items']:,} items, inputs "
                + " + ".join(f"{i['vectors_per_query']} x {i['dim']}-d" for i in r["inputs"])
                + f": bare matmuls {r['bare_s']:.2f} s; one-pass fusion {r['one-pass']['s']:.2f} s, ratio "
                  f"{r['one-pass']['ratio']:.2f}, {r['one-pass']['ratio_reused']:.2f} to the matmuls into one buffer (CPU {r['one-pass']['cpu_ratio']:.2f}, +{r['one-pass']['extra_mb']:.0f} MB)")
        if a.two_pass:
            line += (f"; two-pass {r['two-pass']['s']:.2f} s, ratio {r['two-pass']['ratio']:.2f} (CPU "
                     f"{r['two-pass']['cpu_ratio']:.2f})")
        print(line + f" (load {r['load_before']:.1f} -> {r['load_after']:.1f})", flush=True)
    md = markdown(results, a.two_pass)
    print("\n" + md, end="")
    record_from_args(a, "bench_fusion", title="Z-score fusion against its inputs' bare matmuls", markdown=md,
                     data={"results": results}, load=(load_before, load_now()))
    if a.out:
        from eval.io import write_json

        write_json(a.out, {"command": " ".join(["python", "scripts/bench_fusion.py", *sys.argv[1:]]),
                           "results": results})


if __name__ == "__main__":
    main()
