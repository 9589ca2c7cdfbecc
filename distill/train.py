"""LoRA / QLoRA supervised fine-tuning of a vision-language student with TRL (DynaPix §5.1, appendix "Training",
Table 10): LoRA r 16 / alpha 32 on the language tower's attention and MLP projections, the vision encoder frozen,
the base loaded in 4-bit NF4 (bitsandbytes), lr 2e-5, 3 epochs, micro batch 1 x accumulation 16, max length 3,072,
bf16 on GPU. Every value comes from the preset's ``train`` section and is overridable with ``--<field> VALUE``.

One GPU::

    accelerate launch --config_file configs/accelerate/single_gpu.yaml -m distill.train \\
        --config configs/distill/qwen3-vl-8b.yaml --dataset runs/distill/sft/cot --output_dir runs/distill/students/cot

Several GPUs (DDP; the effective batch is processes x micro batch x accumulation)::

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 4 -m distill.train \\
        --config configs/distill/qwen3-vl-8b.yaml --dataset ... --output_dir ... --gradient_accumulation_steps 4

FSDP with the 4-bit base (QLoRA-compatible: quantized weights stored as bf16 so FSDP can shard them)::

    accelerate launch --config_file configs/accelerate/fsdp_qlora.yaml -m distill.train --config ... \\
        --bnb_4bit_quant_storage bfloat16

CPU (tests, the demo): ``python -m distill.train --config configs/distill/tiny-cpu.yaml --model DIR ...``.

Outputs under ``output_dir``: ``checkpoints/`` (Trainer checkpoints; ``resume_from_checkpoint: auto`` continues from
the newest), ``adapter/`` (the final LoRA adapter, written atomically; serve it unmerged with
``python -m forecasters run --forecaster student --model <base> --adapter <output_dir>/adapter``, or merge it into
bf16 weights, never into the 4-bit ones), ``train.config.json`` (resolved config, versions), ``train_log.json``
(the Trainer's log history: loss per logging step) and ``metrics.json``.

Sequences are never truncated: every example is measured first (the same chat template and processor the collator
uses) and an example longer than ``max_length`` is an error naming it (or dropped with ``drop_overlong``); the trainer
then runs with no truncation, so no image-token run is ever cut. Loss is on the assistant turn only
(``assistant_only_loss``; the chat template gets ``{% generation %}`` markers, `training_chat_template`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("distill.train")

LANGUAGE_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
#: Modules LoRA never touches: vision towers and projectors of Qwen-VL (``visual``) and LLaVA (``vision_tower``,
#: ``multi_modal_projector``). Their names end in q_proj/... in some families (Qwen2.5-VL's vision MLP), hence the regex.
VISION_MODULES_REGEX = r".*(?:visual|vision_tower|vision_model|multi_modal_projector).*"
#: Modules the 4-bit load leaves unquantized (transformers matches each as a name prefix, regex or suffix): the frozen
#: vision tower and projector keep their precision, and so does the output head.
QUANT_SKIP_MODULES = (r".*visual", r".*vision_tower", r".*multi_modal_projector", "lm_head")


@dataclass
class TrainConfig:
    """``python -m distill.train`` / ``accelerate launch -m distill.train`` (see the module docstring)."""

    model: str = field(metadata={"help": "base VLM: HF id or local path"})
    dataset: str = field(metadata={"help": "SFT dataset directory (python -m distill sft: <out>/cot or <out>/answer)"})
    output_dir: str = field(metadata={"help": "where checkpoints/, adapter/ and logs go"})
    load_in_4bit: bool = field(default=True, metadata={"help": "QLoRA: load the base in 4-bit (bitsandbytes)"})
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"help": "nf4 | fp4"})
    bnb_4bit_use_double_quant: bool = field(default=True, metadata={"help": "quantize the quantization constants"})
    bnb_4bit_compute_dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU) | dtype"})
    bnb_4bit_quant_storage: str | None = field(default=None, metadata={
        "help": "storage dtype of 4-bit weights; bfloat16 for FSDP (set automatically under FSDP)"})
    quant_skip_modules: list[str] = field(default_factory=lambda: list(QUANT_SKIP_MODULES), metadata={
        "help": "modules kept unquantized in 4-bit loading (prefix, suffix or regex of module names)"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout"})
    lora_target_modules: list[str] = field(default_factory=lambda: list(LANGUAGE_PROJECTIONS), metadata={
        "help": "LoRA targets (module name suffixes): the language tower's attention and MLP projections"})
    lora_exclude_modules: str = field(default=VISION_MODULES_REGEX, metadata={
        "help": "regex of modules LoRA must not touch (the vision tower stays frozen)"})
    learning_rate: float = field(default=2e-5, metadata={"help": "peak learning rate"})
    num_train_epochs: float = field(default=3.0, metadata={"help": "epochs"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps (overrides epochs when > 0)"})
    per_device_train_batch_size: int = field(default=1, metadata={"help": "micro batch per device"})
    gradient_accumulation_steps: int = field(default=16, metadata={"help": "micro batches per optimizer step"})
    max_length: int = field(default=3072, metadata={"help": "longest example (tokens, image tokens included)"})
    drop_overlong: bool = field(default=False, metadata={"help": "drop examples over max_length instead of failing"})
    warmup_ratio: float = field(default=0.03, metadata={"help": "linear warmup, a fraction of the steps in [0, 1)"})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "transformers scheduler name"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping"})
    optim: str = field(default="adamw_torch", metadata={"help": "transformers optimizer name"})
    precision: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU) | bf16 | fp16 | fp32"})
    gradient_checkpointing: bool = field(default=True, metadata={"help": "trade compute for memory"})
    attn_implementation: str | None = field(default=None, metadata={"help": "sdpa | flash_attention_2 | eager"})
    max_pixels: int | None = field(default=None, metadata={"help": "processor cap on pixels per frame"})
    min_pixels: int | None = field(default=None, metadata={"help": "processor floor on pixels per frame"})
    assistant_only_loss: bool = field(default=True, metadata={"help": "loss on the assistant turn only"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N examples"})
    repeat: int = field(default=1, metadata={"help": "repeat the dataset N times (tiny overfitting checks)"})
    logging_steps: int = field(default=10, metadata={"help": "log the loss every N steps"})
    save_steps: int = field(default=200, metadata={"help": "checkpoint every N steps"})
    save_total_limit: int | None = field(default=2, metadata={"help": "checkpoints kept"})
    resume_from_checkpoint: str | None = field(default="auto", metadata={
        "help": "auto (newest checkpoint in output_dir/checkpoints, if any) | a checkpoint path | null"})
    seed: int = field(default=42, metadata={"help": "seed of the Trainer (data order, dropout, LoRA init)"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    dataloader_num_workers: int = field(default=0, metadata={"help": "dataloader workers"})
    report_to: list[str] = field(default_factory=list, metadata={"help": "trackers (wandb, tensorboard, ...)"})

    def __post_init__(self):
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(f"precision must be auto | bf16 | fp16 | fp32, got {self.precision!r}")
        if self.repeat < 1 or self.max_length < 1:
            raise ValueError("repeat and max_length must be >= 1")

    @property
    def checkpoints_dir(self) -> Path:
        return Path(self.output_dir) / "checkpoints"

    @property
    def adapter_dir(self) -> Path:
        return Path(self.output_dir) / "adapter"


# --- small pure functions: device, precision, quantization, LoRA ---------------------------------------------

def use_cuda(cfg: TrainConfig) -> bool:
    import torch

    if cfg.device == "cpu":
        return False
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but CUDA is not available")
    return torch.cuda.is_available()


def fsdp_enabled() -> bool:
    """True under ``accelerate launch`` with an FSDP config."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def compute_dtype(cfg: TrainConfig, cuda: bool):
    """bf16 on a GPU that supports it (fp16 otherwise), fp32 on CPU, unless ``precision`` says otherwise."""
    import torch

    if cfg.precision == "auto":
        if not cuda:
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.precision]


def quantization_config(cfg: TrainConfig, dtype):
    """The bitsandbytes 4-bit NF4 config of QLoRA (None without ``load_in_4bit``)."""
    import torch
    from transformers import BitsAndBytesConfig

    if not cfg.load_in_4bit:
        return None
    cdt = dtype if cfg.bnb_4bit_compute_dtype == "auto" else getattr(torch, cfg.bnb_4bit_compute_dtype)
    storage = cfg.bnb_4bit_quant_storage
    if storage is None and fsdp_enabled():
        storage = "bfloat16" if cdt == torch.bfloat16 else str(cdt).removeprefix("torch.")
        log.info("FSDP: storing 4-bit weights as %s so FSDP can shard them", storage)
    kw = {"bnb_4bit_quant_storage": getattr(torch, storage)} if storage else {}
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=cfg.bnb_4bit_quant_type,
                              bnb_4bit_use_double_quant=cfg.bnb_4bit_use_double_quant, bnb_4bit_compute_dtype=cdt,
                              llm_int8_skip_modules=list(cfg.quant_skip_modules), **kw)


def lora_config(cfg: TrainConfig):
    """LoRA on the language tower's projections; the vision tower excluded by regex, so it stays frozen."""
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, bias="none",
                      target_modules=list(cfg.lora_target_modules), exclude_modules=cfg.lora_exclude_modules,
                      task_type="CAUSAL_LM")


def device_map(cfg: TrainConfig, cuda: bool) -> Any:
    """Where the base loads: the process's GPU for a quantized base (one copy per DDP rank); none under FSDP
    (it shards the model itself) or when not quantized (the Trainer moves it)."""
    if fsdp_enabled() or not cfg.load_in_4bit:
        return None
    if cuda:
        from accelerate import PartialState

        return {"": PartialState().local_process_index}
    return {"": "cpu"}


# --- chat template with assistant masks -------------------------------------------------------------------

_CHATML_CONTENT = (
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] in ['image', 'image_url', 'image_pil'] %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] in ['video', 'video_url'] %}<|vision_start|><|video_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}")
#: A ChatML training template: renders like the plain ChatML template of Qwen-family models, with the assistant's
#: content and its end-of-turn token inside {% generation %} so they (and only they) carry the loss.
CHATML_TRAINING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}" + _CHATML_CONTENT + "<|im_end|>\n{% endgeneration %}"
    "{% else %}" + _CHATML_CONTENT + "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def training_chat_template(processor) -> str | None:
    """A chat template with ``{% generation %}`` markers for ``processor`` (None when its own has them): TRL's
    training variant of a known template (Qwen3-VL, Qwen2.5-VL, ...), else `CHATML_TRAINING_TEMPLATE` for other
    ChatML templates (e.g. the tiny test models); anything else is an error."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    tpl = processor.chat_template
    if isinstance(tpl, dict):
        tpl = tpl.get("default")
    if not tpl:
        raise ValueError("the processor has no chat template; assistant-only loss needs one")
    if has_generation_markers(tpl):
        return None
    try:
        patched = get_training_chat_template(processor)
    except (ValueError, KeyError):
        patched = None
    if patched:
        return patched
    if "<|im_start|>" in tpl and "<|im_end|>" in tpl:
        return CHATML_TRAINING_TEMPLATE
    raise ValueError("no training chat template (with {% generation %} markers) is known for this model's template; "
                     "set assistant_only_loss false or add markers to its chat template")


# --- data ---------------------------------------------------------------------------------------------------

@dataclass
class LengthReport:
    """Token lengths of the examples (image tokens included) and supervised (assistant) tokens."""

    lengths: list[int]
    supervised: list[int]
    overlong: list[str]


def measure(dataset, processor, max_length: int) -> LengthReport:
    """Tokenize every example exactly as TRL's vision collator does and report lengths and assistant tokens."""
    from trl.data_utils import prepare_multimodal_messages

    lengths, supervised, overlong = [], [], []
    for ex in dataset:
        msgs = prepare_multimodal_messages(ex["messages"], images=ex["images"])
        out = processor.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="pt",
                                            return_assistant_tokens_mask=True,
                                            processor_kwargs={"add_special_tokens": False})
        n = int(out["input_ids"].shape[-1])
        lengths.append(n)
        supervised.append(int(out["assistant_masks"].sum()))
        if n > max_length:
            overlong.append(ex["query_id"])
    return LengthReport(lengths, supervised, overlong)


def prepare_dataset(cfg: TrainConfig, processor):
    """Load the SFT dataset, check lengths and assistant masks (see the module docstring), repeat if asked."""
    import datasets

    from distill.sft import load_sft

    ds = load_sft(cfg.dataset)
    if cfg.max_train_samples is not None:
        ds = ds.select(range(min(cfg.max_train_samples, len(ds))))
    if len(ds) == 0:
        raise ValueError(f"{cfg.dataset}: the dataset is empty")
    rep = measure(ds, processor, cfg.max_length)
    empty = [q for q, s in zip(ds["query_id"], rep.supervised, strict=True) if s == 0]
    if empty and cfg.assistant_only_loss:
        raise ValueError(f"{cfg.dataset}: {len(empty)} example(s) with no supervised tokens, e.g. {empty[:3]}")
    if rep.overlong:
        if not cfg.drop_overlong:
            raise ValueError(f"{cfg.dataset}: {len(rep.overlong)} example(s) longer than max_length={cfg.max_length} "
                             f"tokens (longest {max(rep.lengths)}), e.g. {rep.overlong[:3]}; raise max_length, use "
                             "fewer frames / lower max_pixels, or set drop_overlong true (never truncated)")
        bad = set(rep.overlong)
        ds = ds.filter(lambda q: q not in bad, input_columns=["query_id"])
        log.warning("dropped %d example(s) longer than %d tokens", len(bad), cfg.max_length)
        if len(ds) == 0:
            raise ValueError(f"{cfg.dataset}: every example is longer than max_length={cfg.max_length} tokens")
    ds = ds.select_columns(["images", "messages"])
    if cfg.repeat > 1:
        ds = datasets.concatenate_datasets([ds] * cfg.repeat)
    return ds, rep


# --- the run ------------------------------------------------------------------------------------------------

def resolve_resume(cfg: TrainConfig) -> str | None:
    """The checkpoint to resume from: ``auto`` -> the newest under ``checkpoints/`` (None if there is none)."""
    if cfg.resume_from_checkpoint in (None, "", "none", "null"):
        return None
    if cfg.resume_from_checkpoint == "auto":
        from transformers.trainer_utils import get_last_checkpoint

        d = cfg.checkpoints_dir
        return get_last_checkpoint(str(d)) if d.is_dir() else None
    if not Path(cfg.resume_from_checkpoint).is_dir():
        raise FileNotFoundError(f"resume_from_checkpoint {cfg.resume_from_checkpoint} does not exist")
    return cfg.resume_from_checkpoint


def sft_config(cfg: TrainConfig, cuda: bool, dtype):
    import torch
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(cfg.checkpoints_dir), learning_rate=cfg.learning_rate, num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps, per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, warmup_steps=cfg.warmup_ratio,
        lr_scheduler_type=cfg.lr_scheduler_type, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        optim=cfg.optim, bf16=cuda and dtype == torch.bfloat16, fp16=cuda and dtype == torch.float16,
        gradient_checkpointing=cfg.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if cfg.gradient_checkpointing else None,
        max_length=None,  # lengths were checked in prepare_dataset: never truncate (image tokens stay whole)
        assistant_only_loss=cfg.assistant_only_loss, logging_steps=cfg.logging_steps, logging_first_step=True,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit, seed=cfg.seed,
        use_cpu=not cuda, dataloader_num_workers=cfg.dataloader_num_workers, report_to=list(cfg.report_to) or "none",
        remove_unused_columns=False, disable_tqdm=False)


def load_model(cfg: TrainConfig, cuda: bool, dtype):
    from transformers import AutoModelForImageTextToText

    kw: dict[str, Any] = {"dtype": dtype}
    q = quantization_config(cfg, dtype)
    if q is not None:
        kw["quantization_config"] = q
    dm = device_map(cfg, cuda)
    if dm is not None:
        kw["device_map"] = dm
    if cfg.attn_implementation:
        kw["attn_implementation"] = cfg.attn_implementation
    return AutoModelForImageTextToText.from_pretrained(cfg.model, **kw)


def check_frozen_vision(model) -> dict[str, int]:
    """Trainable parameter counts; raises when anything outside LoRA, or any vision-tower parameter, is trainable."""
    import re

    trainable = [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    vision = [n for n, _ in trainable if re.match(VISION_MODULES_REGEX, n)]
    non_lora = [n for n, _ in trainable if "lora_" not in n]
    if vision or non_lora:
        raise RuntimeError(f"unexpected trainable parameters: vision {vision[:3]}, non-LoRA {non_lora[:3]}")
    return {"trainable": sum(n for _, n in trainable), "total": sum(p.numel() for p in model.parameters())}


def _versions() -> dict[str, str]:
    import platform

    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run one fine-tuning job (see the module docstring); returns the metrics written to ``metrics.json``."""
    from accelerate import PartialState
    from trl import SFTTrainer

    from distill.config import write_resolved
    from eval.io import write_json
    from forecasters.backends.hf_loading import load_processor

    t0 = time.perf_counter()
    state = PartialState()
    cuda = use_cuda(cfg)
    dtype = compute_dtype(cfg, cuda)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    proc_kw = {k: v for k, v in (("max_pixels", cfg.max_pixels), ("min_pixels", cfg.min_pixels)) if v}
    processor = load_processor(cfg.model, **proc_kw)
    if cfg.assistant_only_loss:
        tpl = training_chat_template(processor)
        if tpl is not None:
            processor.chat_template = tpl
    dataset, lengths = prepare_dataset(cfg, processor)
    resume = resolve_resume(cfg)
    if state.is_main_process:
        write_resolved(cfg, out / "train.config.json", versions=_versions(), cuda=cuda, dtype=str(dtype),
                       fsdp=fsdp_enabled(), num_processes=state.num_processes, resume_from=resume,
                       examples=len(dataset), max_tokens=max(lengths.lengths),
                       mean_tokens=round(sum(lengths.lengths) / len(lengths.lengths), 1))
    model = load_model(cfg, cuda, dtype)
    trainer = SFTTrainer(model=model, args=sft_config(cfg, cuda, dtype), train_dataset=dataset,
                         processing_class=processor, peft_config=lora_config(cfg))
    params = check_frozen_vision(trainer.model)
    result = trainer.train(resume_from_checkpoint=resume)
    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    tmp = out / ".adapter.tmp"
    if state.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    trainer.save_model(str(tmp))
    metrics: dict[str, Any] = {}
    if state.is_main_process:
        if cfg.adapter_dir.exists():
            shutil.rmtree(cfg.adapter_dir)
        os.replace(tmp, cfg.adapter_dir)
        write_json(cfg.adapter_dir / "psr_student.json", {"base_model": cfg.model, "dataset": cfg.dataset,
                                                          "load_in_4bit": cfg.load_in_4bit})
        history = trainer.state.log_history
        losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
        metrics = {"train_loss": result.training_loss, "global_step": trainer.state.global_step,
                   "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
                   "losses": losses, "resumed_from": resume, "wall_s": round(time.perf_counter() - t0, 2), **params}
        write_json(out / "train_log.json", history)
        write_json(out / "metrics.json", metrics)
    state.wait_for_everyone()
    return metrics


def main(argv: list[str] | None = None) -> int:
    """``python -m distill.train ARGV``: the exit code; errors print one line (`eval.cli_support.run_main`)."""
    from eval.cli_support import run_main

    return run_main(_main, argv)


def _main(argv: list[str]) -> int:
    from distill.config import parse
    from distill.outputs import stage_output, with_overwrite

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv, overwrite = with_overwrite(TrainConfig, argv)
    cfg = parse(TrainConfig, "train", argv, prog="python -m distill.train",
                description=__doc__.split("\n\n")[0] + "\n\nSee the module docstring of distill.train.")
    with stage_output("train", cfg, overwrite):
        metrics = train(cfg)
    if metrics:
        print(json.dumps({k: v for k, v in metrics.items() if k != "losses"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
