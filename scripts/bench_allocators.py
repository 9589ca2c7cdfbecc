"""Scoring stages under each allocator setting of `eval.allocators`, as fresh processes, side by side.

    python scripts/bench_allocators.py --data DIR [--stages semantic-text,persistence] [--repeats 2]

Each stage is one toolkit command run as its own process (``python -m retrieval oracle semantic-text`` in the
semantic space: fixed costs only, as its matmul bound is tiny; ``python -m retrieval baseline persistence`` in the
visual space: the whole corpus scored), under four settings, given to the child through the variables that
`eval.allocators.configure` leaves alone when set:

- ``library defaults``: pyarrow's mimalloc pool and numpy's huge-page advice on (what a process gets without
  `eval.allocators`), the baseline of the ratios;
- ``numpy advice off``: numpy's huge-page advice off, pyarrow's pool as it is;
- ``jemalloc pool``: pyarrow's jemalloc pool, numpy's advice on;
- ``toolkit``: neither variable set, so `eval.allocators.configure` chooses (on a machine whose ``defrag`` makes a
  huge-page request wait, this is the two changes together).

The runs are written into a temporary folder, removed at the end. Settings take turns within each repeat, and
each keeps its fastest repeat. Measured per run: wall seconds, and the
user and system CPU seconds of the child (``resource.getrusage(RUSAGE_CHILDREN)``). The machine's transparent huge
page settings are printed with the table. The table is printed and recorded (`eval.measured`:
docs/perf/bench_allocators.json, which docs/performance.md shows; ``--record-dir`` / ``--no-record`` /
``--record-name``).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from a checkout: find the packages
    sys.path.insert(0, str(ROOT))

SETTINGS = {
    "library defaults": {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc", "NUMPY_MADVISE_HUGEPAGE": "1"},
    "numpy advice off": {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc", "NUMPY_MADVISE_HUGEPAGE": "0"},
    "jemalloc pool": {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", "NUMPY_MADVISE_HUGEPAGE": "1"},
    "toolkit": {},
}
STAGES = {
    "semantic-text": ["oracle", "semantic-text", "--space", "minilm"],
    "persistence": ["baseline", "persistence", "--space", "pixels", "--prefix-space", "pixels"],
}


def run_stage(stage: str, setting: str, data: Path, out: Path) -> dict:
    """One fresh process of ``stage`` under ``setting``: wall, user and system seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "NUMPY_MADVISE_HUGEPAGE")}
    env.update(SETTINGS[setting], PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "retrieval", *STAGES[stage], "--data", str(data), "--split", "test",
           "--out", str(out / f"{stage}.parquet"), "--overwrite"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{stage} under {setting!r} failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr[-2000:]}")
    return {"stage": stage, "setting": setting, "wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
            "sys_s": after.ru_stime - before.ru_stime}


def markdown(rows: list[dict]) -> str:
    base = {r["stage"]: r for r in rows if r["setting"] == "library defaults"}
    lines = ["| stage | setting | wall s | user CPU s | system CPU s | wall ratio to the library defaults |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["wall_s"] / base[r["stage"]]["wall_s"]
        cell = f"**{ratio:.2f}**" if r["setting"] == "toolkit" else f"{ratio:.2f}"
        lines.append(f"| {r['stage']} | {r['setting']} | {r['wall_s']:.2f} | {r['user_s']:.2f} | {r['sys_s']:.2f} | "
                     f"{cell} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--data", type=Path, required=True, help="a built benchmark with the minilm and pixels spaces")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {list(STAGES)}")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each stage and setting; the fastest is kept")
    from eval.allocators import THP_DEFRAG, thp_setting
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "bench_allocators")
    a = ap.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    for s in stages:
        if s not in STAGES:
            ap.error(f"unknown stage {s!r}; choose from {list(STAGES)}")
    load_before = load_now()
    with tempfile.TemporaryDirectory(prefix="psr-bench-alloc-") as tmp:
        out = Path(tmp)  # the runs are this script's own: each rerun of a stage replaces its run here
        best: dict[tuple[str, str], dict] = {}
        for rep in range(a.repeats):
            for stage in stages:
                for setting in SETTINGS:
                    r = run_stage(stage, setting, a.data.resolve(), out)
                    print(f"[{rep + 1}/{a.repeats}] {stage} / {setting}: {r['wall_s']:.2f} s wall, user "
                          f"{r['user_s']:.2f} s, system {r['sys_s']:.2f} s", flush=True)
                    key = (stage, setting)
                    if key not in best or r["wall_s"] < best[key]["wall_s"]:
                        best[key] = r
    rows = [best[(s, g)] for s in stages for g in SETTINGS]
    thp = {"enabled": thp_setting(THP_DEFRAG.with_name("enabled")), "defrag": thp_setting(THP_DEFRAG)}
    md = (f"Benchmark `{a.data}`, test split; fastest of {a.repeats} run(s) per stage and setting; transparent huge "
          f"pages: enabled `{thp['enabled']}`, defrag `{thp['defrag']}`.\n\n" + markdown(rows))
    print("\n" + md, end="")
    record_from_args(a, "bench_allocators", title="Scoring stages under each allocator setting", markdown=md,
                     data={"thp": thp, "runs": rows}, load=(load_before, load_now()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
