"""The background job of `test_fc_architectures.py`: `arch_prep.py` (toolkit venv: the tiny models, the LoRA adapter,
a small benchmark), then `arch_driver.py` (vLLM venv: in-process engines and one server per architecture, one after
the other). In one process it starts when collection finishes, so its minutes overlap the session's other tests,
and the architecture tests run last and wait for it; under pytest-xdist it starts at the first architecture test,
in the worker that runs them all (``tests/conftest.py``: one scope per job's files). ``PSR_ARCH_RUNS_DIR=DIR`` reuses
a finished job's folder (kept with ``PSR_KEEP_ARCH_RUNS=1``) instead of running it again, to re-check the assertions.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TEST_FILE = "test_fc_architectures.py"
#: Wall-clock limits (s) of the two steps; measured on 2 loaded cores: prep 40-90 s, driver 5-7 min.
PREP_TIMEOUT_S = float(os.environ.get("PSR_ARCH_PREP_TIMEOUT", "900"))
DRIVER_TIMEOUT_S = float(os.environ.get("PSR_ARCH_DRIVER_TIMEOUT", "2400"))


def _tail(path: Path, n: int = 60) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


class ArchRuns:
    """Runs prep then (with ``with_vllm``) the driver in a thread; `spec` and `results` wait for them."""

    def __init__(self, root: Path, *, with_vllm: bool):
        self.root, self.with_vllm = root, with_vllm
        self.prepared, self.done = threading.Event(), threading.Event()
        self.prep_error: str | None = None
        self.driver_error: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="arch-runs")
        self._thread.start()

    def _step(self, cmd: list[str], env: dict, log: Path, timeout_s: float) -> str | None:
        """Run one step; None when it exits 0, else what went wrong (with its log's tail)."""
        if self._stopping:
            return "stopped"
        with open(log, "w") as out:
            self._proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                code = self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.send_signal(signal.SIGTERM)  # the driver stops its server on SIGTERM
                self._proc.wait()
                return f"{cmd[1]} did not finish in {timeout_s:.0f} s; log tail:\n{_tail(log)}"
        return None if code == 0 else f"{cmd[1]} exited with {code}; log tail:\n{_tail(log)}"

    def _run(self) -> None:
        from vllm_server import VLLM_PYTHON, vllm_env

        if (self.root / "spec.json").exists():  # a finished job's folder (PSR_ARCH_RUNS_DIR)
            self.prepared.set()
            self.done.set()
            return
        try:
            env = dict(os.environ, PYTHONPATH=str(REPO))
            self.prep_error = self._step([sys.executable, str(HERE / "arch_prep.py"), str(self.root)], env,
                                         self.root / "prep.log", PREP_TIMEOUT_S)
            self.prepared.set()
            if self.prep_error is None and self.with_vllm:
                self.driver_error = self._step([str(VLLM_PYTHON), str(HERE / "arch_driver.py"),
                                                str(self.root / "spec.json")], dict(vllm_env(), PYTHONPATH=str(REPO)),
                                               self.root / "driver.log", DRIVER_TIMEOUT_S)
        except Exception as e:  # reported by the tests that wait
            self.driver_error = self.driver_error or f"{type(e).__name__}: {e}"
        finally:
            self.prepared.set()
            self.done.set()

    def spec(self) -> dict:
        """The prepared spec (models, adapter, benchmark); raises if preparation failed."""
        self.prepared.wait()
        if self.prep_error:
            raise RuntimeError(f"architecture prep failed: {self.prep_error}")
        return json.loads((self.root / "spec.json").read_text())

    def results(self) -> dict:
        """The driver's results; raises if it failed (with its log's tail)."""
        self.done.wait()
        if self.prep_error or self.driver_error:
            raise RuntimeError(f"architecture runs failed: {self.prep_error or self.driver_error}")
        return json.loads((self.root / "results.json").read_text())

    def stop(self) -> None:
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=60)
            if self._proc.poll() is None:
                self._proc.kill()
