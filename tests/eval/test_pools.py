"""`eval.pools.process_pool`: the results of an executor, and workers that end with their command when it is
interrupted (a SIGTERM to the command alone, a Ctrl-C to its whole process group) or when a job fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from eval.pools import process_pool

ROOT = Path(__file__).resolve().parents[2]

#: A command whose 6 jobs (2 workers) each write their worker's pid into ``started-<i>``, then sleep 60 s.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from eval.cli_support import Interrupted, signals_as_exceptions
    from eval.pools import process_pool

    def job(folder, i):
        tmp = Path(folder, f".tmp-{i}")  # written whole, then renamed: the test reads the pid once the file exists
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, Path(folder, f"started-{i}"))
        time.sleep(60)
        return i

    if __name__ == "__main__":
        folder, start = sys.argv[1], sys.argv[2]
        try:
            with signals_as_exceptions(), process_pool(2, start=start) as pool:
                futures = [pool.submit(job, folder, i) for i in range(6)]
                print([f.result() for f in futures])
        except Interrupted as e:
            print("interrupted", e, flush=True)
            sys.exit(128 + e.signum)
""")


def _square(x: int) -> int:
    return x * x


def _fail(folder: Path, x: int) -> int:
    # written whole or not at all: a job terminated while it writes leaves no empty pid file behind
    (folder / f".pid-{x}").write_text(str(os.getpid()))
    os.replace(folder / f".pid-{x}", folder / f"pid-{x}")
    if x == 3:
        time.sleep(1)  # fails while the other worker runs a 30 s job (either way both workers are then busy)
        raise ValueError("job 3 failed")
    time.sleep(30)
    return x


def _gone(pids: list[int]) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_results_are_those_of_a_map(start):
    with process_pool(2, start=start) as pool:
        assert list(pool.map(_square, range(20), chunksize=3)) == [x * x for x in range(20)]


def test_a_failed_job_ends_the_others_at_once(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="job 3 failed"), process_pool(2) as pool:
        futures = [pool.submit(_fail, tmp_path, x) for x in (3, 1, 2, 4)]
        [f.result() for f in futures]
    assert time.monotonic() - t0 < 25  # the sleeping job was terminated, not waited for
    started = sorted(p.name.lstrip(".") for p in tmp_path.iterdir())
    assert "pid-4" not in started  # the worker of job 3 took job 2 at once; job 4 never started
    # every pid written (a job terminated before its rename left only a hidden file, maybe still empty)
    assert _gone([int(t) for p in tmp_path.iterdir() if (t := p.read_text())])


@pytest.mark.slow
@pytest.mark.parametrize(("start", "sig", "to_group"), [("spawn", signal.SIGTERM, False), ("fork", signal.SIGTERM, True),
                                                        ("spawn", signal.SIGINT, True)],
                         ids=["spawn-SIGTERM-command", "fork-SIGTERM-group", "spawn-SIGINT-group"])
def test_an_interrupted_command_ends_its_workers_at_once(tmp_path, start, sig, to_group):
    script = tmp_path / "cmd.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), start], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        t0 = time.monotonic()
        while len(list(tmp_path.glob("started-*"))) < 2:
            assert proc.poll() is None and time.monotonic() - t0 < 120, "the jobs never started"
            time.sleep(0.05)
        workers = [int(p.read_text()) for p in tmp_path.glob("started-*")]
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        t1 = time.monotonic()
        text = proc.communicate(timeout=30)[0].decode(errors="replace")
        assert time.monotonic() - t1 < 15, text  # not the 60 s of a job, nor the queued ones
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig and f"interrupted {signal.Signals(sig).name}" in text, text
    assert "Traceback" not in text, text
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"]  # none queued started
    assert _gone(workers)
