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
and, as the baseline measured in the same run, a bare `json.loads` of every line of the three files. Prints the
table and records it (`eval.measured`: docs/perf/bench_load.json, which docs/performance.md shows).

    python scripts/bench_load.py [--out DIR] [--keep] [--scale F] [--record-dir DIR | --no-record]

``--scale F`` multiplies the queries, segments, states and videos by F (a quick look; its record is named
``bench_load_scale<F>``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from a checkout: find the packages

from eval import features as feats  # noqa: E402
from eval.benchmark import Benchmark, _check_arrow  # noqa: E402
from eval.evaluate import Population  # noqa: E402
from eval.io import write_json  # noqa: E402
from eval.measured import add_record_options, load_now, record_from_args  # noqa: E402
from eval.schema import GT_TIERS, Manifest  # noqa: E402
from eval.validate import validate  # noqa: E402

N_QUERIES, N_SEGMENTS, N_STATES, N_VIDEOS, DOMAINS = 20_182, 218_276, 51_362, 1_448, ("howtochange", "oops", "ssv2", "most")


@dataclass(frozen=True)
class Shape:
    """The written benchmark's counts (default: the PSR release's)."""

    queries: int = N_QUERIES
    segments: int = N_SEGMENTS
    states: int = N_STATES
    videos: int = N_VIDEOS

    @classmethod
    def scaled(cls, f: float) -> Shape:
        return cls(*(max(1, round(n * f)) for n in (N_QUERIES, N_SEGMENTS, N_STATES, N_VIDEOS)))


def write_psr_shaped(root: Path, seed: int = 0, shape: Shape = Shape()) -> None:
    n_queries, n_segments, n_states, n_videos = shape.queries, shape.segments, shape.states, shape.videos
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    seg_video = np.sort(rng.integers(0, n_videos, n_segments))
    video_domain = rng.integers(0, len(DOMAINS), n_videos)
    seg_state = rng.integers(0, n_states, n_segments)
    with open(root / "states.jsonl", "w") as f:
        for s in range(n_states):
            f.write(json.dumps({"id": f"s{s}", "text": f"state {s}", "members": [f"state {s}", f"phrase {s}"],
                                "n_segments": 0}) + "\n")
    with open(root / "corpus.jsonl", "w") as f:
        for i in range(n_segments):
            v, s = int(seg_video[i]), int(seg_state[i])
            f.write(json.dumps({"id": f"c{i}", "video_id": f"v{v}", "domain": DOMAINS[video_domain[v]],
                                "object_id": "o0", "subject": "object", "state": f"state {s}", "state_id": f"s{s}",
                                "state_type1": f"object state {s}", "start": 0.0, "end": 1.0,
                                "frame": f"frames/v{v}/{i}.jpg", "raw": f"state {s}"}) + "\n")
    by_state: dict[int, list[int]] = {}
    for i, s in enumerate(seg_state.tolist()):
        by_state.setdefault(s, []).append(i)
    video_split = rng.choice(["train", "val", "test"], n_videos, p=[0.713, 0.148, 0.139])
    with open(root / "queries.jsonl", "w") as f:
        for q in range(n_queries):
            v = int(rng.integers(0, n_videos))
            s = int(seg_state[rng.integers(0, n_segments)])
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
        "queries": n_queries, "corpus": n_segments, "states": n_states}, domains=list(DOMAINS)).to_dict())
    feats.write_table(root, "bge", "states", [f"s{s}" for s in range(n_states)],
                      feats.l2_normalize(rng.normal(size=(n_states, 384)).astype(np.float32)))
    feats.write_meta(root, "bge", kind="semantic", dim=384, model="random")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def markdown(shape: Shape, n_lines: int, t_write: float, valid: bool, rows: list[tuple[str, float]]) -> str:
    """The printed and recorded result: a sentence on the data, then a row a step (``rows[0]`` is the baseline)."""
    t_bare = rows[0][1]
    lines = [f"PSR-shaped benchmark: {shape.queries:,} queries, {shape.segments:,} segments, {shape.states:,} states "
             f"({n_lines:,} lines, written in {t_write:.1f} s); validate ok={valid}", "",
             "| step | seconds | x bare parse |", "|---|---:|---:|"]
    lines += [f"| {name} | {t:.2f} | {t / t_bare:.2f} |" for name, t in rows]
    return "\n".join(lines) + "\n"


def measure(root: Path, shape: Shape) -> tuple[int, float, bool, list[tuple[str, float]]]:
    """Write the benchmark into ``root`` and time every step: (lines, write seconds, validate ok, (step, seconds)
    rows, the bare parse first)."""
    _, t_write = timed(lambda: write_psr_shaped(root, shape=shape))

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
    return n_lines, t_write, report.ok, rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="where to write the benchmark (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the written benchmark")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every count by this (default 1: PSR's)")
    add_record_options(ap, "bench_load, or bench_load_scale<F> with --scale")
    args = ap.parse_args(argv)
    shape = Shape() if args.scale == 1.0 else Shape.scaled(args.scale)
    root = args.out or Path(tempfile.mkdtemp(prefix="psr-shaped-"))
    load_before = load_now()
    try:
        n_lines, t_write, valid, rows = measure(root, shape)
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    md = markdown(shape, n_lines, t_write, valid, rows)
    print(md, end="")
    record_from_args(args, "bench_load" if args.scale == 1.0 else f"bench_load_scale{args.scale:g}",
                     title="Loading a PSR-shaped benchmark" + ("" if args.scale == 1.0 else f" (scale {args.scale:g})"),
                     markdown=md, data={"shape": asdict(shape), "lines": n_lines,
                                        "write_s": t_write, "validate_ok": valid,
                                        "steps": [{"step": n.strip(), "seconds": t} for n, t in rows]},
                     load=(load_before, load_now()),
                     argv=None if argv is None else ["scripts/bench_load.py", *argv])


if __name__ == "__main__":
    main()
