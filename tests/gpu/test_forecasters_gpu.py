"""Forecasters on CUDA (skipped without it): the in-process vllm backend and the hf backend on a GPU.

On a GPU node: ``scripts/gpu_tests.sh`` (needs ``pip install -c constraints-cpu.txt -e '.[gpu]'``, i.e. vllm with
CUDA). Tiny random models keep these to seconds; set ``PSR_GPU_MODEL`` to a local Qwen-VL checkpoint (e.g. a
download of ``Qwen/Qwen3-VL-2B-Instruct``) to also check that a real model answers in phrases through M3's prompt.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(data, out, **kw):
    from forecasters.runner import RunConfig, run

    return run(RunConfig(data=str(data), out=str(out), progress=False, **kw))


def test_vllm_backend_on_cuda_images_and_lora(synth_dir, tmp_path):
    pytest.importorskip("vllm")
    from eval.phrases import read_phrases
    from forecasters.tiny_models import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "tiny", "qwen2_vl")
    s = _run(synth_dir, tmp_path / "m3.jsonl", forecaster="m3", backend="vllm", model=str(model), limit=16,
             max_model_len=2048, gpu_memory_utilization=0.3)
    recs = read_phrases(tmp_path / "m3.jsonl")
    assert s.failed == 0 and len(recs) == 16 and s.engine.endswith("(cuda)")
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
    pytest.importorskip("vllm")
    s = _run(synth_dir, tmp_path / "real.jsonl", forecaster="m3", backend="vllm", model=os.environ["PSR_GPU_MODEL"],
             limit=32, max_model_len=8192, max_pixels=448 * 448)
    assert s.failed == 0 and s.ok >= 24  # an instruction-tuned VLM follows the 2-5 word format
    assert Path(tmp_path / "real.summary.json").exists()
