"""`make demo`: the main job of the toolkit on the embedded default (the synthetic benchmark), end to end.

Stages (each a CLI command of a package, so the demo is also a worked example of the commands):
  1. build the synthetic benchmark (skipped when DIR already holds one built with the same settings) and validate it;
Each stage logs the exact command it runs. Outputs: the benchmark in --data, runs and the report in --out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable


def run(cmd: list[str], log: list[dict]) -> None:
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)
    log.append({"cmd": shlex.join(cmd), "seconds": round(time.time() - t0, 1)})


def synth_is_current(data: Path, videos: int, seed: int) -> bool:
    m = data / "manifest.json"
    if not m.exists():
        return False
    extra = json.loads(m.read_text()).get("extra", {})
    return extra.get("videos") == videos and extra.get("seed") == seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/psr-synth"), help="benchmark directory (built if missing)")
    ap.add_argument("--out", type=Path, default=Path("reports/demo"), help="where runs and the report go")
    ap.add_argument("--videos", type=int, default=300, help="size of the synthetic benchmark")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log: list[dict] = []

    if not synth_is_current(args.data, args.videos, args.seed):
        run([PY, "-m", "eval", "synth", "--out", str(args.data), "--videos", str(args.videos), "--seed", str(args.seed)], log)
    run([PY, "-m", "eval", "validate", str(args.data)], log)

    (args.out / "demo_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"\ndemo done: {args.out}")


if __name__ == "__main__":
    main()
