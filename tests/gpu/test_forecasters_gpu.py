"""Forecasters on CUDA (skipped without it): the in-process vllm backend and the hf backend on a GPU.

On a GPU node: ``scripts/gpu_tests.sh``. The toolkit's venv runs these tests; vLLM lives in its own venv
(``scripts/install_vllm.sh --gpu``; env ``PSR_VLLM_PYTHON``, default ``.venv-vllm/bin/python``) because it pins an
older transformers, so the vllm backend runs there as ``python -m forecasters run --backend vllm`` with this
repository on PYTHONPATH, exactly as ``scripts/run_m3.sh`` runs M3. Tiny random models keep these to seconds; set
``PSR_GPU_MODEL`` to a local Qwen-VL checkpoint (e.g. a download of ``Qwen/Qwen3-VL-2B-Instruct``) to also check that
a real model answers in phrases through M3's prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("PSR_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))


def _run(data, out, **kw):
    from forecasters.runner import RunConfig, run

    return run(RunConfig(data=str(data), out=str(out), progress=False, **kw))


def _run_vllm(data, out: Path, *args: str) -> dict:
    """``forecasters run --backend vllm`` in the vLLM venv; returns the run's summary."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"no vLLM venv at {VLLM_PYTHON}: run scripts/install_vllm.sh --gpu (or set PSR_VLLM_PYTHON)")
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    cmd = [str(VLLM_PYTHON), "-m", "forecasters", "run", "--data", str(data), "--split", "test", "--backend", "vllm",
           "--out", str(out), "--no-progress", *args]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.with_name(out.stem + ".summary.json").read_text())


def test_vllm_backend_on_cuda_images_and_lora(synth_dir, tmp_path):
    from eval.phrases import read_phrases
    from forecasters.tiny_models import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "tiny", "qwen2_vl")
    s = _run_vllm(synth_dir, tmp_path / "m3.jsonl", "--forecaster", "m3", "--model", str(model), "--limit", "16",
                  "--max-model-len", "2048")
    recs = read_phrases(tmp_path / "m3.jsonl")
    assert s["complete"] and s["failed"] == 0 and len(recs) == 16 and "cuda" in s["this_run"]["engine"]
    assert all(r.extra["prompt_tokens"] > 8 * 4 for r in recs.values())


def test_hf_backend_on_cuda_matches_cpu(synth_dir, tmp_path):
    from eval.phrases import read_phrases
    from forecasters.tiny_models import build_tiny_qwen2

    model = build_tiny_qwen2(tmp_path / "tiny")
    common = dict(forecaster="text-only", backend="hf", model=str(model), limit=8, dtype="float32", max_tokens=8)
    _run(synth_dir, tmp_path / "cpu.jsonl", device="cpu", **common)
    s = _run(synth_dir, tmp_path / "gpu.jsonl", device="cuda", **common)
    assert "cuda" in s.engine
    cpu, gpu = read_phrases(tmp_path / "cpu.jsonl"), read_phrases(tmp_path / "gpu.jsonl")
    assert sum(cpu[q].raw == gpu[q].raw for q in cpu) >= 6  # float32 greedy: same tokens up to rare near-ties


@pytest.mark.skipif(not os.environ.get("PSR_GPU_MODEL"), reason="set PSR_GPU_MODEL to a local Qwen-VL checkpoint")
def test_real_model_answers_in_short_phrases(synth_dir, tmp_path):
    s = _run_vllm(synth_dir, tmp_path / "real.jsonl", "--forecaster", "m3", "--model", os.environ["PSR_GPU_MODEL"],
                  "--limit", "32", "--max-model-len", "8192", "--max-pixels", str(448 * 448))
    assert s["failed"] == 0 and s["ok"] >= 24  # an instruction-tuned VLM follows the 2-5 word format

