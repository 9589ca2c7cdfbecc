"""A background CPU load: N busy processes (each spins a core in a pure-Python loop) until stopped.

    python scripts/busy_load.py --processes 4                  # until Ctrl-C
    python scripts/busy_load.py --processes 4 --seconds 600    # at most 10 minutes

Benchmarks import `busy` (a context manager) to measure a job under a known extra load
(`scripts/bench_train_load.py`). Only the processes it started are stopped, by their ids.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

#: One busy process: a pure-Python loop (no library threads), ended by SIGTERM or after its time limit.
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def busy(processes: int, seconds: float = 3600.0) -> Iterator[list[int]]:
    """Start ``processes`` busy processes (each stops by itself after ``seconds``); yield their pids; stop them."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)]) for _ in range(max(0, processes))]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3600.0, help="stop after this long (default one hour)")
    a = ap.parse_args()
    with busy(a.processes, a.seconds) as pids:
        print(f"{len(pids)} busy processes: {' '.join(map(str, pids))} (load average now "
              f"{os.getloadavg()[0]:.1f}); Ctrl-C stops them", flush=True)
        try:
            end = time.monotonic() + a.seconds
            while time.monotonic() < end:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
