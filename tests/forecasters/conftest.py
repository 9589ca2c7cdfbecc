"""Fixtures of the forecaster tests: tiny models, the real vLLM server (one per session), the fault proxy.

The vLLM server serves one tiny random Qwen2-VL (`tiny_models.build_tiny_vlm`), which takes both text-only and
image prompts: one server instead of two (measured on 2 shared cores: one starts in ~35 s, two at once in 85-110 s).
When any collected test uses ``vllm_server``, the server starts in the background at the first test of this
directory, so its start-up overlaps the CPU-only tests; tests that need it block until it answers.

Under pytest-xdist (``make test`` runs every test on two workers) each worker collects every test, so starting
the background jobs early would start each of them in both workers. There, each job's test files form one scope
that one worker runs (``tests/conftest.py``: `BACKGROUND_JOBS`), and a job starts when the first of its tests asks
for it: one server, one in-process run and one architecture job per session, each in the worker that needs it.

Without ``.venv-vllm`` those tests skip, unless ``PSR_REQUIRE_VLLM=1`` (``make test``), where they fail.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for _p in (TESTS, TESTS / "forecasters"):  # tests/ helpers (tiny_models, vllm_server, fault_proxy, arch_*)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from arch_runs import TEST_FILE as ARCH_TEST_FILE  # noqa: E402
from arch_runs import ArchRuns  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from tiny_models import TinyModels  # noqa: E402
from vllm_server import VLLMServer, require_vllm, vllm_available  # noqa: E402

REPO = TESTS.parent
#: Set by pytest-xdist in its workers.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


@pytest.fixture(scope="session")
def hf_backends(tiny):
    """Loaded hf backends by tiny model kind, shared by the runner tests (loading costs more than generating)."""
    from forecasters.backends import get_backend
    from forecasters.backends.hf import HFConfig

    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = get_backend("hf", HFConfig(model=str(tiny[kind]), batch_size=8))
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyModels:
    """Tiny random models by kind, built on first use: ``tiny["qwen2"]``, ``tiny["qwen2_vl"]``, ..."""
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))


class _ServerHandle:
    """Starts the server in a thread; `get` waits for it (or raises the start-up error)."""

    def __init__(self, tiny: TinyModels, log_dir: Path):
        self.server: VLLMServer | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._tiny, self._log_dir = tiny, log_dir
        self._thread = threading.Thread(target=self._start, daemon=True, name="vllm-server-start")
        self._thread.start()

    def _start(self) -> None:
        try:
            self.server = VLLMServer(self._tiny["qwen2_vl"], served_name="tiny-vl",
                                     log_path=self._log_dir / "vllm-server.log").start()
            self.server.wait_ready(timeout_s=float(os.environ.get("PSR_VLLM_START_TIMEOUT", "420")))
        except BaseException as e:  # reported to the tests that need the server
            self.error = e
        finally:
            self._done.set()

    def get(self) -> VLLMServer:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.server

    def stop(self) -> None:
        self._done.wait()
        if self.server is not None:
            self.server.stop()


@pytest.fixture(scope="session")
def _vllm_handle(tiny, tmp_path_factory):
    if not vllm_available():
        if require_vllm():
            pytest.fail("PSR_REQUIRE_VLLM=1 but the vLLM venv is missing: run `make vllm-venv`")
        pytest.skip("no .venv-vllm (run `make vllm-venv`); vLLM tests skipped")
    handle = _ServerHandle(tiny, tmp_path_factory.mktemp("vllm-logs"))
    yield handle
    handle.stop()  # SIGTERM


@pytest.fixture(autouse=True, scope="session")
def _start_vllm_early(request):
    """Kick off the vLLM jobs (server, in-process runs) at the first test here, if a collected test needs them,
    so their start-up overlaps the CPU-only tests."""
    if not vllm_available() or XDIST_WORKER:  # under xdist: at the first test that needs it
        return
    needed = {name for it in request.session.items for name in getattr(it, "fixturenames", ())}
    for fixture, handle in (("vllm_server", "_vllm_handle"), ("vllm_inprocess_runs", "vllm_inprocess_runs")):
        if fixture in needed:
            request.getfixturevalue(handle)


class InProcessRuns:
    """``python -m forecasters run --backend vllm`` commands, run in the vLLM venv in the background
    (`vllm_cli_driver.py`: one process, so vllm is imported once). `wait` returns the finished process."""

    def __init__(self, commands: list[list[str]], outs: dict[str, Path], adapter: Path, model: Path):
        import json
        import subprocess

        from vllm_server import VLLM_PYTHON, vllm_env

        self.outs, self.adapter, self.model = outs, adapter, model
        env = dict(vllm_env(), PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([str(VLLM_PYTHON), str(TESTS / "forecasters" / "vllm_cli_driver.py"),
                                      json.dumps(commands)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def wait(self, timeout_s: float = 600):
        out, errs = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, out, errs


def _random_lora(model_dir: Path, out: Path) -> Path:
    """A random LoRA adapter (r 8) on the language model of a tiny VLM, strong enough to change its outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                  target_modules=r".*language_model.*\.(q_proj|v_proj)"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def vllm_inprocess_runs(tiny, synth_dir, tmp_path_factory):
    """CLI runs in the vLLM venv on the tiny Qwen2-VL, 6 test queries each, started in the background: the vllm
    backend with m3 (images), llava-video (a video) and m3 + a LoRA adapter; the hf backend with llava-video; the
    vllm backend scoring every state (likelihood, ``runs.likelihood_out``)."""
    if not vllm_available():
        if require_vllm():
            pytest.fail("PSR_REQUIRE_VLLM=1 but the vLLM venv is missing: run `make vllm-venv`")
        pytest.skip("no .venv-vllm (run `make vllm-venv`); vLLM tests skipped")
    root = tmp_path_factory.mktemp("vllm-inprocess")
    model = tiny["qwen2_vl"]
    adapter = _random_lora(model, root / "adapter")
    common = ["--data", str(synth_dir), "--backend", "vllm", "--model", str(model), "--limit", "6",
              "--max-model-len", "2048", "--no-progress"]
    outs = {k: root / f"{k}.jsonl" for k in ("m3", "video", "lora", "hf_video")}
    commands = [["run", "--forecaster", "m3", "--out", str(outs["m3"]), *common],
                ["run", "--forecaster", "llava-video", "--out", str(outs["video"]), *common],
                ["run", "--forecaster", "m3", "--adapter", str(adapter), "--out", str(outs["lora"]), *common],
                # the hf backend's video path needs torchvision, which this venv has (ours does not)
                ["run", "--forecaster", "llava-video", "--out", str(outs["hf_video"]), "--data", str(synth_dir),
                 "--backend", "hf", "--model", str(model), "--limit", "6", "--num-threads", "1", "--no-progress"],
                # likelihood scoring: prompt log-probabilities through the prefix cache (test_fc_likelihood)
                ["run", "--forecaster", "likelihood", "--candidates", "states", "--out", str(root / "lik.jsonl"),
                 *common]]
    runs = InProcessRuns(commands, outs, adapter, model)
    runs.likelihood_out = root / "lik.jsonl"
    yield runs
    if runs.proc.poll() is None:
        runs.proc.kill()
        runs.proc.wait()


@pytest.fixture(scope="session")
def vllm_server(_vllm_handle) -> VLLMServer:
    """The session's running vLLM server (tiny Qwen2-VL served as ``tiny-vl`` on 127.0.0.1)."""
    try:
        return _vllm_handle.get()
    except BaseException as e:
        if require_vllm():
            pytest.fail(f"vLLM server did not start: {e}")
        pytest.skip(f"vLLM server did not start: {e}")


@pytest.fixture
def fault_proxy(vllm_server):
    """A fresh fault-injection proxy in front of the session's server."""
    with FaultProxy(f"http://127.0.0.1:{vllm_server.port}") as proxy:
        yield proxy


# --- every preset architecture through every backend (test_fc_architectures.py, arch_runs.py) ---
_ARCH: dict[str, ArchRuns] = {}


def pytest_collection_modifyitems(session, config, items):
    """In one process the architecture tests run last: they wait for the background job started when collection
    finishes (under xdist, `tests/conftest.py` orders the tests)."""
    if XDIST_WORKER:
        return
    arch = [it for it in items if it.path.name == ARCH_TEST_FILE]
    if arch:
        items[:] = [it for it in items if it.path.name != ARCH_TEST_FILE] + arch


def _start_arch_runs() -> ArchRuns:
    if "job" not in _ARCH:
        reuse = os.environ.get("PSR_ARCH_RUNS_DIR")
        root = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="psr-arch-"))
        _ARCH["job"] = ArchRuns(root, with_vllm=vllm_available())
    return _ARCH["job"]


def pytest_collection_finish(session):
    if not XDIST_WORKER and any(it.path.name == ARCH_TEST_FILE for it in session.items):
        _start_arch_runs()


def pytest_sessionfinish(session, exitstatus):
    job = _ARCH.pop("job", None)
    if job is not None:
        job.stop()
        if not (os.environ.get("PSR_KEEP_ARCH_RUNS") or os.environ.get("PSR_ARCH_RUNS_DIR")):
            shutil.rmtree(job.root, ignore_errors=True)


@pytest.fixture(scope="session")
def arch_runs() -> ArchRuns:
    """The background job: tiny models of every preset architecture, then vLLM in process and served."""
    return _start_arch_runs()
