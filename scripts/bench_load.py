"""Benchmark: loading a PSR-scale benchmark directory (20,182 queries, 218,276 segments, 51,362 states).

Writes a random benchmark of the release's shape (GT pools of a few ids, as in PSR; a 384-d state feature table),
then times, in one run:
  - the first `Benchmark.load` (JSONL -> Arrow through `datasets`, cached in DIR/.cache),
  - a second `Benchmark.load` (memory-mapped Arrow cache), and inside it the full Arrow validation of the three
    tables (the check that finds invalid UTF-8 with no Python per row), timed on its own,
  - typed access: every test query as a `Query`, GT rows of the test split, 10,000 random segments,
  - `python -m eval validate` on the same directory (reads every line for line numbers),
  - the benchmark fingerprint runs record (`eval.fingerprint`: a hash of every GT pool and corpus id), and the
    evaluated population (`eval.evaluate.Population`: the fair test queries of Q1-Q4),
and, as the baseline measured in the same run, a bare `json.loads` of every line of the three files.

    python scripts/bench_load.py [--out DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from eval import features as feats
from eval.benchmark import Benchmark, _check_arrow
from eval.evaluate import Population
from eval.io import write_json
from eval.schema import GT_TIERS, Manifest
from eval.validate import validate

N_QUERIES, N_SEGMENTS, N_STATES, N_VIDEOS, DOMAINS = 20_182, 218_276, 51_362, 1_448, ("howtochange", "oops", "ssv2", "most")


def write_psr_shaped(root: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    seg_video = np.sort(rng.integers(0, N_VIDEOS, N_SEGMENTS))
    video_domain = rng.integers(0, len(DOMAINS), N_VIDEOS)
    seg_state = rng.integers(0, N_STATES, N_SEGMENTS)
    with open(root / "states.jsonl", "w") as f:
        for s in range(N_STATES):
            f.write(json.dumps({"id": f"s{s}", "text": f"state {s}", "members": [f"state {s}", f"phrase {s}"],
                                "n_segments": 0}) + "\n")
    with open(root / "corpus.jsonl", "w") as f:
        for i in range(N_SEGMENTS):
            v, s = int(seg_video[i]), int(seg_state[i])
            f.write(json.dumps({"id": f"c{i}", "video_id": f"v{v}", "domain": DOMAINS[video_domain[v]],
                                "object_id": "o0", "subject": "object", "state": f"state {s}", "state_id": f"s{s}",
                                "state_type1": f"object state {s}", "start": 0.0, "end": 1.0,
                                "frame": f"frames/v{v}/{i}.jpg", "raw": f"state {s}"}) + "\n")
    by_state: dict[int, list[int]] = {}
    for i, s in enumerate(seg_state.tolist()):
        by_state.setdefault(s, []).append(i)
    video_split = rng.choice(["train", "val", "test"], N_VIDEOS, p=[0.713, 0.148, 0.139])
    with open(root / "queries.jsonl", "w") as f:
        for q in range(N_QUERIES):
            v = int(rng.integers(0, N_VIDEOS))
            s = int(seg_state[rng.integers(0, N_SEGMENTS)])
            members = by_state[s]
            dom = DOMAINS[video_domain[v]]
            pools = {t: [] for t in GT_TIERS}
            for i in members:
                vi = int(seg_video[i])
                tier = "in_video" if vi == v else ("in_dataset" if DOMAINS[video_domain[vi]] == dom else "cross_dataset")
                pools[tier].append(f"c{i}")
            main = pools["in_dataset"] + pools["cross_dataset"]
            pools["consensus"] = main[:1]
            f.write(json.dumps({
                "id": f"q{q}", "prefix_id": f"p{v}", "video_id": f"v{v}", "domain": dom, "object_id": "o0",
                "subject": "object", "qtype": "Q1", "horizon": int(rng.integers(1, 8)), "question": "what next?",
                "target_state": f"state {s}", "target_state_id": f"s{s}", "target_state_type1": f"object state {s}",
                "target_time": 3.0, "prefix_start": 0.0, "prefix_end": 2.0,
                "prefix_frames": [f"frames/p{v}/{j}.jpg" for j in range(8)],
                "transcript": [{"t": 0.5, "state": "state 0"}], "split": str(video_split[v]), "gt_pools": pools,
                "gt_type1": main, "fair": bool(main)}) + "\n")
    write_json(root / "manifest.json", Manifest(name="psr-shaped", version="bench", counts={
        "queries": N_QUERIES, "corpus": N_SEGMENTS, "states": N_STATES}, domains=list(DOMAINS)).to_dict())
    feats.write_table(root, "bge", "states", [f"s{s}" for s in range(N_STATES)],
                      feats.l2_normalize(rng.normal(size=(N_STATES, 384)).astype(np.float32)))
    feats.write_meta(root, "bge", kind="semantic", dim=384, model="random")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="where to write the benchmark (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the written benchmark")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="psr-shaped-"))
    try:
        _, t_write = timed(lambda: write_psr_shaped(root))

        def bare():
            n = 0
            for name in ("queries.jsonl", "corpus.jsonl", "states.jsonl"):
                with open(root / name, "rb") as f:
                    for line in f:
                        json.loads(line)
                        n += 1
            return n

        n_lines, t_bare = timed(bare)
        _, t_first = timed(lambda: Benchmark.load(root))
        bench, t_cached = timed(lambda: Benchmark.load(root))
        _, t_arrow = timed(lambda: [_check_arrow(root / f"{n}.jsonl", ds) for n, ds in (
            ("queries", bench.queries_ds), ("corpus", bench.corpus_ds), ("states", bench.states_ds))])

        def access():
            qs = bench.queries("test")
            bench.gt_rows(qs)
            rng = np.random.default_rng(0)
            for i in rng.integers(0, len(bench.corpus_ds), 10_000):
                bench.segment(int(i))
            return len(qs)

        n_test, t_access = timed(access)
        report, t_validate = timed(lambda: validate(root, check_frames=False))
        fp_bench = Benchmark.load(root)  # a fresh object: the fingerprint is cached per loaded benchmark
        _, t_fingerprint = timed(lambda: fp_bench.fingerprint)
        n_pop, t_population = timed(lambda: len(Population().query_ids(fp_bench)))
        rows = [("bare json.loads of every line (baseline)", t_bare), ("Benchmark.load, first (JSONL -> Arrow cache)", t_first),
                ("Benchmark.load, cached (memory-mapped)", t_cached),
                ("  of which: full Arrow validation (invalid UTF-8 check)", t_arrow),
                (f"typed access: {n_test:,} test queries + GT rows + 10,000 segments", t_access),
                ("eval validate (no frame check)", t_validate),
                ("benchmark fingerprint (sha256 of GT pools + corpus ids)", t_fingerprint),
                (f"evaluated population (fair test Q1-Q4: {n_pop:,} queries)", t_population)]
        print(f"PSR-shaped benchmark: {N_QUERIES:,} queries, {N_SEGMENTS:,} segments, {N_STATES:,} states "
              f"({n_lines:,} lines, written in {t_write:.1f} s); validate ok={report.ok}\n")
        print("| step | seconds | x bare parse |\n|---|---:|---:|")
        for name, t in rows:
            print(f"| {name} | {t:.2f} | {t / t_bare:.2f} |")
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
