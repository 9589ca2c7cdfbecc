"""`distill.train` on CPU with a tiny random Qwen3-VL: the loss goes down on a tiny repeated set; the 4-bit (QLoRA)
path trains with fp32 adapters, evaluates per epoch, checkpoints with its config hash, resumes only the same config,
counts 4-bit parameters and the loss of every step; its adapter carries its preprocessing, reloads and serves
through the forecasters' hf backend, which takes that preprocessing and refuses a conflicting one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distill.train import train

REPO = Path(__file__).resolve().parents[2]


def test_loss_goes_down_on_a_tiny_repeated_set(tiny_train_args, sft_dir, tmp_path):
    m = train(*tiny_train_args(sft_dir / "cot", tmp_path, "--load_in_4bit", "false", "--learning_rate", "1e-2",
                               "--max_steps", 6, "--max_train_samples", 1, "--repeat", 6, "--save_steps", 100,
                               "--eval_strategy", "no", "--seed", 0))
    losses = [loss for _, loss in m["losses"]]
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.3, losses
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert [h["loss"] for h in log if "loss" in h] == losses
    # every entry carries the CPU and wall seconds since training began (bench_train_load reads them per step)
    cpu, wall = [h["cpu_s"] for h in log], [h["wall_s"] for h in log]
    assert cpu == sorted(cpu) and wall == sorted(wall) and cpu[0] > 0 and wall[-1] > wall[0]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()


def test_qlora_student_trains_in_4bit_and_freezes_vision(qlora_student):
    from safetensors import safe_open

    out, m = qlora_student
    assert m["global_step"] == 4 and 0 < m["trainable"] < m["total"] and m["adapter_dtype"] == "float32"
    conf = json.loads((out / "train.config.json").read_text())
    assert conf["model"]["load_in_4bit"] and conf["model"]["bnb_4bit_quant_type"] == "nf4"
    assert conf["model"]["lora_r"] == 16 and conf["model"]["lora_alpha"] == 32
    assert conf["batch"] == {"effective_batch_size": 2, "per_device_train_batch_size": 1,
                             "gradient_accumulation_steps": 2, "world_size": 1}
    assert conf["max_tokens"] <= conf["sft"]["max_length"] and "bitsandbytes" in conf["versions"]
    adapter = out / "adapter"
    acfg = json.loads((adapter / "adapter_config.json").read_text())
    assert set(acfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all("language_model" in k for k in keys)
    assert not any("visual" in k for k in keys)
    for step in (2, 4):
        ckpt = json.loads((out / "checkpoints" / f"checkpoint-{step}" / "psr_train.json").read_text())
        assert ckpt["config_hash"] == conf["config_hash"]


def test_eval_loss_and_answer_accuracy_every_epoch(qlora_student):
    _, m = qlora_student
    assert [e["epoch"] for e in m["eval"]] == [1.0, 2.0]
    for e in m["eval"]:
        assert e["eval_loss"] > 0 and 0 <= e["eval_answer_accuracy"] <= e["eval_answer_parsed"] <= 1
        assert e["eval_answer_n"] == 2  # the SFT set's validation split (2 val queries)


def test_4bit_parameters_are_counted_by_their_logical_size(qlora_student, tiny_vlm):
    from transformers import AutoModelForImageTextToText

    _, m = qlora_student
    full = sum(p.numel() for p in AutoModelForImageTextToText.from_pretrained(str(tiny_vlm)).parameters())
    assert m["total"] == full + m["trainable"]  # numel() of packed 4-bit weights would be about half


def test_quantized_base_is_4bit(tiny_train_args):
    from distill.train import load_model

    psr, sft, model_args = tiny_train_args("-", "-")
    model = load_model(psr, sft, model_args)
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    lm = [k for n, k in kinds.items() if "language_model" in n and n.endswith("q_proj")]
    assert lm and set(lm) == {"Linear4bit"}
    assert all(k != "Linear4bit" for n, k in kinds.items() if "visual" in n)  # the vision tower stays unquantized
    head = [k for n, k in kinds.items() if n.endswith("lm_head")]
    assert head and "Linear4bit" not in head


def _interrupted_copy(out: Path, dest: Path) -> Path:
    """``out`` as a run cut after its step-2 checkpoint: the last checkpoint, the adapter and metrics removed."""
    shutil.copytree(out, dest)
    shutil.rmtree(dest / "checkpoints" / "checkpoint-4")
    shutil.rmtree(dest / "adapter")
    (dest / "metrics.json").unlink()
    return dest


def test_resume_continues_the_same_config_and_counts_every_step(qlora_student, tiny_train_args, student_flags,
                                                               sft_dir, tmp_path):
    out, first = qlora_student
    run = _interrupted_copy(out, tmp_path / "cot")
    m = train(*tiny_train_args(sft_dir / "cot", run, *student_flags))
    assert m["resumed_from"].endswith("checkpoint-2") and m["global_step"] == 4
    assert [s for s, _ in m["losses"]] == [1, 2, 3, 4]
    assert m["losses"][:2] == first["losses"][:2]  # steps 1-2 restored from the checkpoint's history, not rerun
    assert [loss for _, loss in m["losses"][2:]] == pytest.approx([loss for _, loss in first["losses"][2:]], rel=1e-3)
    mean_all = sum(loss for _, loss in m["losses"]) / 4
    assert m["train_loss"] == pytest.approx(mean_all, rel=1e-6)
    assert m["train_loss_this_run"] == pytest.approx((m["losses"][2][1] + m["losses"][3][1]) / 2, rel=1e-6)
    assert [e["epoch"] for e in m["eval"]] == [1.0, 2.0]


def test_resume_refuses_another_config(qlora_student, tiny_train_args, student_flags, sft_dir, tmp_path):
    from eval.errors import InputError, OutputRefused

    out, _ = qlora_student
    run = _interrupted_copy(out, tmp_path / "cot")
    before = (run / "train.config.json").read_bytes()
    with pytest.raises(OutputRefused, match=r"another config.*learning_rate"):
        train(*tiny_train_args(sft_dir / "cot", run, *student_flags, "--learning_rate", "1e-4"))
    with pytest.raises(OutputRefused, match=r"another config.*dataset_sha256"):  # the answer-only set
        train(*tiny_train_args(sft_dir / "answer", run, *student_flags))
    assert (run / "train.config.json").read_bytes() == before
    ckpt = str(run / "checkpoints" / "checkpoint-2")
    with pytest.raises(InputError, match=r"checkpoint-2 was trained with config .*learning_rate"):
        train(*tiny_train_args(sft_dir / "cot", tmp_path / "new", *student_flags, "--learning_rate", "1e-4",
                               "--resume_from_checkpoint", ckpt))
    (run / "checkpoints" / "checkpoint-2" / "psr_train.json").unlink()  # cut while saving (or not ours)
    with pytest.raises(InputError, match="has no psr_train.json"):  # named explicitly: refused
        train(*tiny_train_args(sft_dir / "cot", tmp_path / "new2", *student_flags, "--resume_from_checkpoint", ckpt))
    from distill.checkpoints import resolve_resume

    plan_identity = type("I", (), {"config_hash": json.loads((run / "train.config.json").read_text())["config_hash"]})
    assert resolve_resume("auto", run, plan_identity) is None  # `auto` passes over it: a rerun starts over and finishes


def test_adapter_reloads_and_serves_with_its_preprocessing(qlora_student, tiny_vlm, synth_dir, tmp_path):
    import prompts
    from eval.errors import InputError
    from eval.phrases import read_phrases
    from forecasters.runner import RunConfig, plan, run

    out, _ = qlora_student
    adapter = out / "adapter"
    pre = json.loads((adapter / "psr_student.json").read_text())["preprocessing"]
    student_prompt = prompts.load("student_answer")
    assert pre["frames"] == 2 and pre["max_pixels"] == 336 * 336 and pre["image_tokens_per_frame"]
    assert (pre["prompt_id"], pre["prompt_hash"]) == (student_prompt.id, student_prompt.hash)
    phrases = tmp_path / "student.jsonl"
    cfg = RunConfig(data=str(synth_dir), out=str(phrases), forecaster="student", backend="hf", model=str(tiny_vlm),
                    adapter=str(adapter), split="test", limit=2, max_tokens=8, device="cpu", progress=False)
    s = run(cfg)
    assert s.attempted == 2 and s.coverage.failed == 0
    r = next(iter(read_phrases(phrases).values()))
    assert r.forecaster == "student" and r.prompt_id == "student_answer" and r.extra["adapter"] == str(adapter)
    conf = json.loads(phrases.with_name("student.config.json").read_text())
    assert conf["identity"]["adapter_hash"]
    assert (conf["run"]["frames"], conf["run"]["max_pixels"]) == ("spaced:2", 336 * 336)  # taken from the adapter
    assert conf["identity"]["frames"] == "spaced:2"  # 2 evenly spaced frames, as distill.sft trained it
    assert conf["backend"]["max_pixels"] == 336 * 336
    for bad in ({"frames": 8}, {"max_pixels": 64 * 64}, {"prompt": "m3"}):
        with pytest.raises(InputError, match="adapter's training preprocessing"):
            plan(RunConfig(**{**cfg.__dict__, "out": str(tmp_path / "x.jsonl"), **bad}))


def test_overlong_examples_are_refused_never_truncated(tiny_vlm, sft_dir):
    from distill.sft import load_sft
    from distill.train import prepare_dataset, training_chat_template
    from forecasters.backends.hf_loading import load_processor

    proc = load_processor(str(tiny_vlm))
    raw = load_sft(sft_dir / "cot", "train")
    with pytest.raises(ValueError, match="no supervised tokens"):  # the base template has no assistant markers
        prepare_dataset(raw, proc, max_length=64)
    proc.chat_template = training_chat_template(proc)
    with pytest.raises(ValueError, match=r"longer than max_length=64.*v\d+"):
        prepare_dataset(raw, proc, max_length=64)
    with pytest.raises(ValueError, match="every example is longer"):
        prepare_dataset(raw, proc, max_length=64, drop_overlong=True)
    ds, rep = prepare_dataset(raw, proc, max_length=3072)
    assert len(ds) == 4 and ds.column_names == ["images", "messages"] and max(rep.lengths) <= 3072
    cut = sorted(rep.lengths)[1]
    ds, _ = prepare_dataset(raw, proc, max_length=cut, drop_overlong=True)
    assert len(ds) == sum(n <= cut for n in rep.lengths)


@pytest.mark.slow
def test_two_processes_keep_the_effective_batch(tiny_vlm, sft_dir, tmp_path):
    """Two processes (DDP over gloo on CPU; ``torchrun``, since ``accelerate launch --cpu`` starts one process): an
    effective batch of 4 gives each process 2 accumulation steps, so the 4 training examples make exactly one
    optimizer step per epoch (with the accumulation of a single process it would take 2)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [str(torchrun), "--nproc_per_node", "2", "-m", "distill.train", "--config",
           str(REPO / "configs" / "distill" / "tiny-cpu.yaml"), "--model_name_or_path", str(tiny_vlm),
           "--dataset_name", str(sft_dir / "answer"), "--output_dir", str(tmp_path), "--max_steps", "-1",
           "--num_train_epochs", "1", "--effective_batch_size", "4", "--load_in_4bit", "false",
           "--eval_strategy", "no"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "effective batch 4 = per-device 1 x accumulation 2 x 2 process(es)" in p.stderr
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["gradient_accumulation_steps"] == 2 and m["global_step"] == 1
    assert (tmp_path / "adapter" / "adapter_config.json").exists()


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
