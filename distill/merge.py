"""Merge a student's LoRA adapter into full-precision base weights (for engines that serve without LoRA support).

The base is loaded unquantized in ``dtype`` (bf16 by default) -- never in 4-bit: merging into 4-bit weights would
re-quantize the sum and lose the adapter's update. ``W' = W + (alpha / r) B A`` per adapted projection
(`peft.PeftModel.merge_and_unload`). The merged model and the base's processor are written to ``out`` (built in a
temporary directory beside it, then moved into place), with ``psr_merge.json`` recording base, adapter and dtype.
Serving the adapter unmerged (``python -m forecasters run --forecaster student --adapter DIR``) needs no merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eval.errors import InputError, MissingInput, loading_model
from eval.io import atomic_dir


@dataclass
class MergeConfig:
    """``python -m distill merge``: base + LoRA adapter -> merged full-precision weights."""

    model: str = field(metadata={"help": "base model (HF id or path), loaded unquantized"})
    adapter: str = field(metadata={"help": "LoRA adapter directory (distill.train: <output_dir>/adapter)"})
    out: str = field(metadata={"help": "directory for the merged model"})
    dtype: str = field(default="bfloat16", metadata={"help": "bfloat16 | float16 | float32 (never 4-bit)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an --out that is not an earlier merge"})

    def __post_init__(self):
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise InputError(f"dtype must be bfloat16, float16 or float32 (merging into 4-bit is not allowed), "
                             f"got {self.dtype!r}")


def merge_adapter(cfg: MergeConfig) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from eval.io import write_json
    from forecasters.backends.hf_loading import is_vision_config, load_processor

    if not (Path(cfg.adapter) / "adapter_config.json").exists():
        raise MissingInput(f"{cfg.adapter}: no adapter_config.json (not a LoRA adapter directory)")
    with loading_model(cfg.model):
        auto = AutoModelForImageTextToText if is_vision_config(AutoConfig.from_pretrained(cfg.model)) \
            else AutoModelForCausalLM
        base = auto.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype))
    with loading_model(cfg.adapter, flag="--adapter"):
        merged = PeftModel.from_pretrained(base, cfg.adapter).merge_and_unload()
    out = Path(cfg.out)
    info = {"base_model": cfg.model, "adapter": cfg.adapter, "dtype": cfg.dtype}
    with atomic_dir(out, kind="distill merge", tag="merging", inputs=[cfg.model, cfg.adapter],
                    overwrite=cfg.overwrite, recognise=("psr_merge.json",)) as stage:
        merged.save_pretrained(stage)
        load_processor(cfg.model).save_pretrained(stage)
        write_json(stage / "psr_merge.json", info)
    return {**info, "out": str(out)}
