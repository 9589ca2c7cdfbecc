"""`distill.train` on CPU with a tiny random Qwen3-VL: the loss goes down on a tiny repeated set, the 4-bit (QLoRA)
path trains, checkpoints, resumes, and its adapter reloads and serves through the forecasters' hf backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distill.config import parse
from distill.train import TrainConfig, prepare_dataset, train

REPO = Path(__file__).resolve().parents[2]


def test_loss_goes_down_on_a_tiny_repeated_set(tiny_vlm, sft_dir, tmp_path):
    cfg = TrainConfig(model=str(tiny_vlm), dataset=str(sft_dir / "cot"), output_dir=str(tmp_path), load_in_4bit=False,
                      learning_rate=1e-2, max_steps=6, gradient_accumulation_steps=1, gradient_checkpointing=False,
                      precision="fp32", warmup_ratio=0.0, lr_scheduler_type="constant", logging_steps=1,
                      save_steps=100, max_train_samples=1, repeat=6, device="cpu", seed=0)
    m = train(cfg)
    losses = [loss for _, loss in m["losses"]]
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.3, losses
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert [h["loss"] for h in log if "loss" in h] == losses
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()


def test_qlora_student_trains_in_4bit_and_freezes_vision(qlora_student):
    from safetensors import safe_open

    out, m = qlora_student
    assert m["global_step"] == 2 and m["trainable"] > 0 and m["trainable"] < m["total"]
    conf = json.loads((out / "train.config.json").read_text())
    assert conf["config"]["load_in_4bit"] and conf["config"]["bnb_4bit_quant_type"] == "nf4"
    assert conf["config"]["lora_r"] == 16 and conf["config"]["lora_alpha"] == 32
    assert conf["max_tokens"] <= conf["config"]["max_length"] and "bitsandbytes" in conf["versions"]
    adapter = out / "adapter"
    acfg = json.loads((adapter / "adapter_config.json").read_text())
    assert set(acfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all("language_model" in k for k in keys)
    assert not any("visual" in k for k in keys)
    assert (out / "checkpoints" / "checkpoint-2").is_dir()


def test_quantized_base_is_4bit(tiny_vlm):
    import torch

    from distill.train import load_model

    cfg = TrainConfig(model=str(tiny_vlm), dataset="-", output_dir="-", device="cpu")
    model = load_model(cfg, cuda=False, dtype=torch.float32)
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    lm = [k for n, k in kinds.items() if "language_model" in n and n.endswith("q_proj")]
    assert lm and set(lm) == {"Linear4bit"}
    assert all(k != "Linear4bit" for n, k in kinds.items() if "visual" in n)  # the vision tower stays unquantized


def test_resume_from_checkpoint(qlora_student, tiny_vlm, sft_dir):
    out, first = qlora_student
    cfg = TrainConfig(model=str(tiny_vlm), dataset=str(sft_dir / "cot"), output_dir=str(out), load_in_4bit=True,
                      learning_rate=2e-3, max_steps=3, gradient_accumulation_steps=1, gradient_checkpointing=False,
                      precision="fp32", warmup_ratio=0.0, logging_steps=1, save_steps=100, max_train_samples=2,
                      device="cpu", seed=0)
    m = train(cfg)
    assert m["resumed_from"].endswith("checkpoint-2")
    assert m["global_step"] == 3 and [s for s, _ in m["losses"]] == [1, 2, 3]
    assert m["losses"][:2] == first["losses"]  # steps 1-2 restored from the checkpoint's history, not rerun


def test_adapter_reloads_and_serves_as_student(qlora_student, tiny_vlm, synth_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from eval.phrases import read_phrases
    from forecasters.runner import RunConfig, run

    out, _ = qlora_student
    adapter = out / "adapter"
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_vlm))
    peft = PeftModel.from_pretrained(base, str(adapter))
    lora_b = [p for n, p in peft.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)  # trained (LoRA B starts at zero)
    phrases = tmp_path / "student.jsonl"
    s = run(RunConfig(data=str(synth_dir), out=str(phrases), forecaster="student", backend="hf", model=str(tiny_vlm),
                      adapter=str(adapter), split="test", limit=2, max_tokens=8, frames=2, device="cpu",
                      progress=False))
    assert s.attempted == 2 and s.failed == 0
    recs = read_phrases(phrases)
    assert len(recs) == 2
    r = next(iter(recs.values()))
    assert r.forecaster == "student" and r.prompt_id == "student_answer" and r.extra["adapter"] == str(adapter)
    conf = json.loads(phrases.with_name("student.config.json").read_text())
    assert conf["identity"]["adapter_hash"]


def test_overlong_examples_are_refused_never_truncated(tiny_vlm, sft_dir, tmp_path):
    from distill.train import training_chat_template
    from forecasters.backends.hf_loading import load_processor

    proc = load_processor(str(tiny_vlm))
    cfg = TrainConfig(model=str(tiny_vlm), dataset=str(sft_dir / "cot"), output_dir=str(tmp_path), max_length=64)
    with pytest.raises(ValueError, match="no supervised tokens"):  # the base template has no assistant markers
        prepare_dataset(cfg, proc)
    proc.chat_template = training_chat_template(proc)
    with pytest.raises(ValueError, match=r"longer than max_length=64.*v\d+"):
        prepare_dataset(cfg, proc)
    cfg.drop_overlong = True
    with pytest.raises(ValueError, match="every example is longer"):
        prepare_dataset(cfg, proc)
    cfg.max_length = 3072
    ds, rep = prepare_dataset(cfg, proc)
    assert len(ds) == 4 and ds.column_names == ["images", "messages"] and max(rep.lengths) <= 3072


def test_config_from_preset_and_command_line(tmp_path):
    from eval.io import FormatError

    preset = REPO / "configs" / "distill" / "tiny-cpu.yaml"
    cfg = parse(TrainConfig, "train", ["--config", str(preset), "--model", "m", "--dataset", "d", "--output_dir", "o",
                                       "--learning_rate", "1e-4", "--lora_target_modules", "[q_proj, v_proj]"],
                prog="t", description="")
    assert cfg.learning_rate == 1e-4 and cfg.max_steps == 12 and cfg.lora_target_modules == ["q_proj", "v_proj"]
    for name in ("qwen3-vl-8b", "qwen3-vl-2b"):
        c = parse(TrainConfig, "train", ["--config", str(REPO / "configs" / "distill" / f"{name}.yaml"),
                                         "--dataset", "d", "--output_dir", "o"], prog="t", description="")
        assert (c.lora_r, c.lora_alpha, c.learning_rate, c.num_train_epochs) == (16, 32, 2e-5, 3.0)
        assert (c.per_device_train_batch_size, c.gradient_accumulation_steps, c.max_length) == (1, 16, 3072)
        assert c.load_in_4bit and c.precision == "bf16" and c.model.startswith("Qwen/Qwen3-VL-")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  learning_rte: 0.1\n")
    with pytest.raises(FormatError, match=r"bad.yaml \[train\].*learning_rte"):
        parse(TrainConfig, "train", ["--config", str(bad)], prog="t", description="")
    with pytest.raises(FormatError, match="max_steps"):
        parse(TrainConfig, "train", ["--model", "m", "--dataset", "d", "--output_dir", "o", "--max_steps", "x"],
              prog="t", description="")


def test_accelerate_launch_entry(tiny_vlm, sft_dir, tmp_path):
    """The documented launcher: ``accelerate launch -m distill.train --config PRESET ...`` (CPU, one process)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [str(accelerate), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "-m", "distill.train", "--config",
           str(REPO / "configs" / "distill" / "tiny-cpu.yaml"), "--model", str(tiny_vlm), "--dataset",
           str(sft_dir / "answer"), "--output_dir", str(tmp_path), "--max_steps", "1", "--load_in_4bit", "false",
           "--max_train_samples", "1"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["global_step"] == 1 and (tmp_path / "adapter" / "adapter_config.json").exists()


def test_merge_into_full_precision_matches_the_unmerged_adapter(qlora_student, tiny_vlm, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from distill.cli import main

    adapter = qlora_student[0] / "adapter"
    out = tmp_path / "merged"
    assert main(["merge", "--model", str(tiny_vlm), "--adapter", str(adapter), "--out", str(out),
                 "--dtype", "float32"]) == 0
    assert main(["merge", "--model", str(tiny_vlm), "--adapter", str(adapter), "--out", str(out),
                 "--dtype", "int4"]) == 2
    ids = torch.tensor([[1, 20, 30, 40, 50, 2]])
    merged = AutoModelForImageTextToText.from_pretrained(str(out)).eval()
    unmerged = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(str(tiny_vlm)),
                                         str(adapter)).eval()
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_vlm)).eval()
    with torch.no_grad():
        a, b, c = (m(input_ids=ids).logits for m in (merged, unmerged, base))
    assert torch.allclose(a, b, atol=1e-4) and not torch.allclose(a, c, atol=1e-4)
    assert json.loads((out / "psr_merge.json").read_text())["dtype"] == "float32"
