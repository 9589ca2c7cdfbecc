"""A short QLoRA run on CUDA through the documented launcher (skipped without CUDA).

``accelerate launch --config_file configs/accelerate/single_gpu.yaml -m distill.train --config
configs/distill/tiny-cpu.yaml`` with the preset's CPU settings overridden for the GPU path of the real presets:
4-bit NF4 base on the GPU (bitsandbytes CUDA kernels), bf16 compute with fp32 LoRA weights, gradient checkpointing.
A tiny random Qwen3-VL keeps it to seconds; the loss must go down on a repeated example, the adapter must be saved,
and it must serve through the forecasters' hf backend on CUDA as a student.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def student_set(synth_dir, tmp_path_factory):
    from distill.narrate import NarrateConfig, run_narration
    from distill.predicates import PredicatesConfig, write_predicates
    from distill.sft import SFTBuildConfig, build_sft

    root = tmp_path_factory.mktemp("gpu-distill")
    write_predicates(PredicatesConfig(data=str(synth_dir), out=str(root / "p.jsonl"), split="train", progress=False))
    run_narration(NarrateConfig(data=str(synth_dir), predicates=str(root / "p.jsonl"), out=str(root / "r"),
                                narrator="template", progress=False))
    build_sft(SFTBuildConfig(data=str(synth_dir), rationales=str(root / "r"), out=str(root / "sft"), limit=4,
                             progress=False))
    return root / "sft"


def test_qlora_on_cuda_through_accelerate(student_set, synth_dir, tmp_path):
    from forecasters.tiny_models import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "tiny", "qwen3_vl", seed=0)
    out = tmp_path / "student"
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])  # keep the caller's packages
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    cmd = [str(Path(sys.executable).with_name("accelerate")), "launch", "--config_file",
           str(REPO / "configs" / "accelerate" / "single_gpu.yaml"), "-m", "distill.train",
           "--config", str(REPO / "configs" / "distill" / "tiny-cpu.yaml"), "--model_name_or_path", str(model),
           "--dataset_name", str(student_set / "cot"), "--output_dir", str(out), "--use_cpu", "false", "--bf16",
           "true", "--dtype", "bfloat16", "--gradient_checkpointing", "true", "--max_steps", "10",
           "--max_train_samples", "1", "--repeat", "10", "--learning_rate", "5e-3", "--save_steps", "5"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    conf = json.loads((out / "train.config.json").read_text())
    assert conf["sft"]["bf16"] and conf["model"]["load_in_4bit"] and m["adapter_dtype"] == "float32"
    losses = [loss for _, loss in m["losses"]]
    assert m["global_step"] == 10 and losses[-1] < losses[0], losses
    assert (out / "adapter" / "adapter_model.safetensors").exists()
    assert (out / "checkpoints" / "checkpoint-10").is_dir()

    from eval.phrases import read_phrases
    from forecasters.runner import RunConfig, run

    phrases = tmp_path / "student.jsonl"
    s = run(RunConfig(data=str(synth_dir), out=str(phrases), forecaster="student", backend="hf", model=str(model),
                      adapter=str(out / "adapter"), split="test", limit=4, max_tokens=16, device="cuda",
                      dtype="bfloat16", progress=False))
    assert s.attempted == 4 and s.coverage.failed == 0
    assert len(read_phrases(phrases)) == 4


def test_4bit_weights_live_on_the_gpu(tmp_path):
    from distill.train import load_model
    from distill.train_args import parse_train_args
    from forecasters.tiny_models import build_tiny_vlm

    model_dir = build_tiny_vlm(tmp_path / "tiny", "qwen3_vl", seed=0)
    psr, sft, model_args = parse_train_args(["--model_name_or_path", str(model_dir), "--dataset_name", "-",
                                             "--output_dir", "-", "--bf16", "true"])
    model = load_model(psr, sft, model_args)
    q = next(m for n, m in model.named_modules() if n.endswith("language_model.layers.0.self_attn.q_proj"))
    assert type(q).__name__ == "Linear4bit" and q.weight.device.type == "cuda"
    assert q.weight.quant_state.quant_type == "nf4"
