"""QLoRA precision: with a 4-bit base and bf16 compute, the trainable LoRA weights stay fp32, so a small-lr step
moves them as an all-fp32 run does. The control (adapters cast to bf16, what TRL does on a quantized base) loses most
of the same update to rounding, which is what this test guards against."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _lora_a_update(tiny_train_args, dataset, out, *, bf16: bool, bf16_adapters: bool = False):
    """(adapter dtype, the flattened change of every ``lora_A`` weight) after 3 steps at lr 2e-5 on a 4-bit base."""
    from distill.train import build_trainer, plan_run

    psr, sft, model_args = tiny_train_args(
        dataset, out, "--learning_rate", "2e-5", "--max_steps", 3, "--max_train_samples", 1, "--repeat", 3,
        "--save_strategy", "no", "--eval_strategy", "no", "--lora_dropout", 0, "--seed", 0,
        "--bf16", str(bf16).lower(), "--dtype", "bfloat16" if bf16 else "float32")
    plan = plan_run(psr, sft, model_args)
    trainer, dtype = build_trainer(psr, sft, model_args, train_ds=plan.train_ds, processor=plan.processor,
                                   identity=plan.identity, batch=plan.batch)
    if bf16_adapters:
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
        dtype = "bfloat16"
    params = {n: p for n, p in trainer.model.named_parameters() if "lora_A" in n}
    before = {n: p.detach().float().clone() for n, p in params.items()}
    trainer.train()
    return dtype, torch.cat([(p.detach().float() - before[n]).flatten() for n, p in params.items()])


@pytest.mark.slow
def test_small_lr_step_is_not_lost_in_bf16(tiny_train_args, sft_dir, tmp_path):
    data = sft_dir / "cot"
    ref_dtype, ref = _lora_a_update(tiny_train_args, data, tmp_path / "fp32", bf16=False)
    dtype, mixed = _lora_a_update(tiny_train_args, data, tmp_path / "bf16", bf16=True)
    _, lossy = _lora_a_update(tiny_train_args, data, tmp_path / "bf16-adapters", bf16=True, bf16_adapters=True)
    assert ref_dtype == dtype == "float32"
    moved = {name: float((d != 0).float().mean()) for name, d in (("ref", ref), ("mixed", mixed), ("lossy", lossy))}
    size = {name: float(d.abs().mean()) for name, d in (("ref", ref), ("mixed", mixed), ("lossy", lossy))}
    # Adam moves every element with a gradient by about lr per step from step 2 on (lora_B starts at zero)
    assert moved["ref"] > 0.99 and 1e-5 < size["ref"] < 6e-5, (moved, size)
    assert moved["mixed"] > 0.99 and size["mixed"] == pytest.approx(size["ref"], rel=0.1), (moved, size)
    assert float((mixed - ref).abs().mean()) < 0.2 * size["ref"]
    assert moved["lossy"] < 0.5 and size["lossy"] < 0.6 * size["ref"], (moved, size)
