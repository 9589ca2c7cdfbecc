"""`distill.train`'s arguments: TRL's groups through `trl.TrlParser`, the recipe's defaults < ``--config`` (a preset's
train section or a flat TRL-style YAML) < flags, unknown keys refused, and the effective batch rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.train_args import derive_accumulation, parse_train_args, resolve_batch
from eval.errors import InputError
from eval.io import FormatError

REPO = Path(__file__).resolve().parents[2]
PATHS = ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "o"]


def test_presets_hold_table_10():
    for name in ("qwen3-vl-8b", "qwen3-vl-2b"):
        psr, sft, m = parse_train_args(["--config", str(REPO / "configs" / "distill" / f"{name}.yaml"),
                                        "--dataset_name", "d", "--output_dir", "o", "--use_cpu", "--bf16", "false"])
        assert m.model_name_or_path.startswith("Qwen/Qwen3-VL-") and m.use_peft and m.load_in_4bit
        assert (m.lora_r, m.lora_alpha, m.bnb_4bit_quant_type, m.use_bnb_nested_quant) == (16, 32, "nf4", True)
        assert (sft.learning_rate, sft.num_train_epochs, sft.max_length) == (2e-5, 3.0, 3072)
        assert (sft.per_device_train_batch_size, psr.effective_batch_size) == (1, 16)
        assert sft.assistant_only_loss and sft.eval_strategy == "epoch" and sft.resume_from_checkpoint == "auto"


def test_defaults_are_the_recipe_and_flags_are_trl(tmp_path):
    psr, sft, m = parse_train_args(PATHS + ["--use_cpu", "--report_to", "tensorboard", "--push_to_hub",
                                            "--hub_model_id", "me/student", "--lora_r", "8"])
    assert (sft.learning_rate, psr.effective_batch_size, m.lora_r, m.lora_alpha) == (2e-5, 16, 8, 32)
    assert m.load_in_4bit and m.use_peft and sft.report_to == ["tensorboard"] and sft.push_to_hub
    assert sft.hub_model_id == "me/student"


def test_flat_trl_yaml_is_honoured_and_flags_win(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("learning_rate: 1e-4\nnum_train_epochs: 1\nload_in_4bit: false\nlora_target_modules: all-linear\n"
                    "effective_batch_size: 8\nenv:\n  PSR_TEST_ENV: yes-set\n")
    psr, sft, m = parse_train_args(["--config", str(flat), *PATHS, "--use_cpu"])
    assert (sft.learning_rate, sft.num_train_epochs, m.load_in_4bit) == (1e-4, 1.0, False)
    assert m.lora_target_modules == "all-linear" and psr.effective_batch_size == 8
    import os

    assert os.environ.pop("PSR_TEST_ENV") == "yes-set"
    _, sft, _ = parse_train_args([f"--config={flat}", *PATHS, "--use_cpu", "--learning_rate", "3e-4"])
    assert sft.learning_rate == 3e-4  # defaults < file < flags
    _, sft, _ = parse_train_args(["--config", str(REPO / "configs" / "distill" / "tiny-cpu.yaml"), *PATHS])
    assert sft.max_steps == 12 and sft.use_cpu and not sft.bf16  # a preset: its train section


def test_unknown_or_bad_keys_are_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  learning_rte: 0.1\n  model: x\n")
    with pytest.raises(FormatError, match=r"bad.yaml.*learning_rte \(known: learning_rate.*model \(known: "
                                          r"model_name_or_path"):
        parse_train_args(["--config", str(bad), *PATHS])
    typo = tmp_path / "typo.yaml"
    typo.write_text("num_train_epochs: three\n")
    with pytest.raises(FormatError, match=r"typo.yaml.*num_train_epochs"):
        parse_train_args(["--config", str(typo), *PATHS])
    choice = tmp_path / "choice.yaml"
    choice.write_text("bnb_4bit_quant_type: nf3\n")
    with pytest.raises(FormatError, match="bnb_4bit_quant_type"):
        parse_train_args(["--config", str(choice), *PATHS])
    with pytest.raises(InputError, match="learning_rte"):
        parse_train_args([*PATHS, "--learning_rte", "0.1"])
    with pytest.raises(InputError, match="--dataset_name"):
        parse_train_args(["--model_name_or_path", "m", "--output_dir", "o"])


def test_accumulation_is_derived_from_the_effective_batch():
    assert [derive_accumulation(16, 1, w) for w in (1, 2, 4, 8, 16)] == [16, 8, 4, 2, 1]
    assert derive_accumulation(16, 2, 4) == 2
    for args in ((16, 1, 3), (16, 3, 1), (16, 4, 8)):
        with pytest.raises(InputError, match="not a multiple"):
            derive_accumulation(*args)


def test_resolve_batch_sets_checks_and_reports(caplog):
    psr, sft, _ = parse_train_args(PATHS + ["--use_cpu"])
    with caplog.at_level("INFO", logger="distill.train"):
        b = resolve_batch(psr, sft, world_size=4)
    assert b == {"effective_batch_size": 16, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4,
                 "world_size": 4}
    assert "effective batch 16 = per-device 1 x accumulation 4 x 4 process(es)" in caplog.text
    psr, sft, _ = parse_train_args(PATHS + ["--use_cpu", "--gradient_accumulation_steps", "16"])
    with pytest.raises(InputError, match="contradicts effective_batch_size 16"):
        resolve_batch(psr, sft, world_size=4)  # the multi-GPU trap: 16 per device x 4 = 64
    psr, sft, _ = parse_train_args(PATHS + ["--use_cpu", "--gradient_accumulation_steps", "4",
                                            "--effective_batch_size", "0"])
    assert resolve_batch(psr, sft, world_size=2)["effective_batch_size"] == 8  # opted out: given accumulation


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    d = REPO / "configs" / "accelerate"
    kinds = {p.stem: load_config_from_file(str(p)) for p in sorted(d.glob("*.yaml"))}
    assert {"single_gpu", "multi_gpu", "fsdp_qlora", "zero2", "zero3"} <= set(kinds)
    for stage in (2, 3):
        c = kinds[f"zero{stage}"]
        assert c.distributed_type == "DEEPSPEED" and c.deepspeed_config["zero_stage"] == stage
        assert c.mixed_precision == "bf16"
    assert kinds["fsdp_qlora"].distributed_type == "FSDP" and kinds["multi_gpu"].distributed_type == "MULTI_GPU"


@pytest.mark.parametrize("flags, dtype", [(["--bf16", "true"], "bfloat16"), (["--use_cpu", "--bf16", "false"], "float32"),
                                          (["--bf16", "true", "--dtype", "bfloat16"], "bfloat16")])
def test_4bit_config_computes_in_the_run_dtype_whatever_the_load_dtype(flags, dtype):
    """The recipe's default load dtype is ``auto`` (as saved), which TRL would pass on as the 4-bit compute dtype; the
    quantization config computes in the run's dtype instead (built without a GPU: only the model load needs one)."""
    import torch

    from distill.train import quantization_config

    psr, sft, m = parse_train_args(PATHS + flags)
    q = quantization_config(psr, sft, m)
    assert m.load_in_4bit and q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant
    assert q.bnb_4bit_compute_dtype == getattr(torch, dtype)
    assert q.llm_int8_skip_modules == list(psr.quant_skip_modules)
