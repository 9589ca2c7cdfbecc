"""LoRA / QLoRA supervised fine-tuning of a vision-language student with TRL (DynaPix §5.1, appendix "Training",
Table 10): LoRA r 16 / alpha 32 on the language tower's attention and MLP projections, the vision encoder frozen,
the base loaded in 4-bit NF4 (bitsandbytes), lr 2e-5, 3 epochs, micro batch 1 and an effective batch of 16, max
length 3,072, bf16 on GPU. Arguments are TRL's (`trl.SFTConfig`, `trl.ModelConfig`) plus `PSRTrainArgs`, parsed by
`trl.TrlParser` with the recipe's defaults (`distill.train_args`): defaults < ``--config FILE`` < flags.

One GPU::

    accelerate launch --config_file configs/accelerate/single_gpu.yaml -m distill.train \\
        --config configs/distill/qwen3-vl-8b.yaml --dataset_name runs/distill/sft/cot --output_dir runs/distill/students/cot

Several GPUs (DDP, or DeepSpeed ZeRO-2/3: ``configs/accelerate/zero2.yaml``, ``zero3.yaml``): the same command with
another ``--config_file`` and ``--num_processes N``. The effective batch stays ``effective_batch_size`` (16): each
process accumulates ``16 / (per_device_train_batch_size x N)`` micro batches (derived, logged, and an error when it
does not divide).

FSDP with the 4-bit base (QLoRA-compatible: quantized weights stored as bf16 so FSDP can shard them)::

    accelerate launch --config_file configs/accelerate/fsdp_qlora.yaml -m distill.train --config ...

CPU (tests, the demo): ``python -m distill.train --config configs/distill/tiny-cpu.yaml --model_name_or_path DIR ...``.

Precision: the trainable LoRA weights stay in fp32 (TRL casts them to bf16 on a quantized base, where a small step
is lost to rounding: at lr 2e-5 most ``lora_A`` updates round away); compute runs under bf16 autocast (``bf16``).
Under DeepSpeed the optimizer keeps fp32 master weights itself; under FSDP the adapters share the flat parameters'
storage dtype (bf16), as FSDP-QLoRA requires (recorded as ``adapter_dtype``).

Outputs under ``output_dir``: ``checkpoints/`` (Trainer checkpoints, each with ``psr_train.json`` holding the config
hash; ``resume_from_checkpoint: auto`` continues from the newest one of the same hash and refuses any other),
``adapter/`` (the final LoRA adapter with ``psr_student.json``: base model, config hash and the preprocessing the
student is served with: frames, max/min pixels, image tokens per frame, prompt id + hash; written atomically; serve
it unmerged with ``python -m forecasters run --forecaster student --model <base> --adapter <output_dir>/adapter``, or
merge it into bf16 weights, never into the 4-bit ones), ``train.config.json`` (config hash, resolved arguments, batch
arithmetic, versions; a directory holding another config's is refused), ``train_log.json`` (the Trainer's log
history: loss per logging step, eval loss and answer accuracy per evaluation, each entry with the CPU and wall
seconds since training began in this process, ``cpu_s`` / ``wall_s``) and ``metrics.json``.

A text-only SFT set (the evidence input, `distill.evidence`) trains a causal LM (``AutoModelForCausalLM``, its
tokenizer as processor). ``--full_finetune true`` (with ``--use_peft false --load_in_4bit false``) trains every
language-model weight (tiny models on CPU; a vision tower stays frozen) and writes ``model/`` instead of
``adapter/``; a run that would train non-LoRA weights without the flag is refused. ``--snapshot_steps N`` also writes
the weights at step N to ``step-N/`` (`snapshot_dir`). A rerun of a finished run (its final weights and snapshots carry
this config hash, `finished_metrics`) is a no-op.

Sequences are never truncated: every example is measured first (the same chat template and processor the collator
uses) and an example longer than ``max_length`` is an error naming it (or dropped with ``drop_overlong``); the trainer
then runs with no truncation, so no image-token run is ever cut. Loss is on the assistant turn only
(``assistant_only_loss``; the chat template gets ``{% generation %}`` markers, `training_chat_template`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distill.checkpoints import (
    TRAIN_CONFIG,
    check_output_dir,
    checkpoint_callback,
    clock_callback,
    eval_history,
    loss_over_all_steps,
    resolve_resume,
)
from distill.train_args import (  # noqa: F401  (re-exported: the recipe's constants)
    LANGUAGE_PROJECTIONS,
    QUANT_SKIP_MODULES,
    VISION_MODULES_REGEX,
    PSRTrainArgs,
    parse_train_args,
    resolve_batch,
    train_identity,
)
from eval.environment import loaded_versions
from eval.errors import EngineError, InputError, loading_model

log = logging.getLogger("distill.train")

STUDENT_INFO = "psr_student.json"
#: libraries whose versions the run's record holds (those imported by the run)
RECORDED_LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "deepspeed")


# --- device, precision, quantization, LoRA: TRL's helpers plus what the recipe needs -------------------------

def fsdp_enabled() -> bool:
    """True under ``accelerate launch`` with an FSDP config."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def deepspeed_enabled(sft) -> bool:
    """True under DeepSpeed (``accelerate launch`` with a DeepSpeed config, or ``--deepspeed FILE``)."""
    return bool(getattr(sft, "deepspeed", None)) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") == "true"


def compute_dtype(sft):
    """The compute dtype of the run: bf16 with ``bf16``, fp16 with ``fp16``, else fp32."""
    import torch

    return torch.bfloat16 if sft.bf16 else torch.float16 if sft.fp16 else torch.float32


def load_dtype(model_args):
    """dtype of the base's unquantized weights: ``model_args.dtype`` (``auto``: as saved in the checkpoint)."""
    import torch

    return "auto" if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)


def quantization_config(psr: PSRTrainArgs, sft, model_args):
    """`trl.get_quantization_config` (4-bit NF4 with nested quantization in the recipe), computing in the run's dtype,
    with the vision tower, projector and head left unquantized; under FSDP the 4-bit weights are stored in bf16 so
    FSDP can shard them with the rest."""
    import copy

    import torch
    from trl import get_quantization_config

    if model_args.load_in_4bit and model_args.dtype in (None, "auto"):
        # TRL passes the load dtype on as the compute dtype, which must name a torch dtype: "auto" does not
        model_args = copy.copy(model_args)
        model_args.dtype = str(compute_dtype(sft)).removeprefix("torch.")
    q = get_quantization_config(model_args)
    if q is None or not model_args.load_in_4bit:
        return q
    q.bnb_4bit_compute_dtype = compute_dtype(sft)
    q.llm_int8_skip_modules = list(psr.quant_skip_modules)
    if model_args.bnb_4bit_quant_storage is None and fsdp_enabled():
        q.bnb_4bit_quant_storage = torch.bfloat16
        log.info("FSDP: storing 4-bit weights as bfloat16 so FSDP can shard them")
    elif model_args.bnb_4bit_quant_storage is not None:
        q.bnb_4bit_quant_storage = getattr(torch, model_args.bnb_4bit_quant_storage)
    return q


def lora_config(psr: PSRTrainArgs, model_args):
    """`trl.get_peft_config` with the vision modules excluded by regex (so the vision tower stays frozen); None for a
    full fine-tuning (``full_finetune``)."""
    from trl import get_peft_config

    if psr.full_finetune:
        return None
    cfg = get_peft_config(model_args)
    if cfg is not None:
        cfg.exclude_modules = psr.lora_exclude_modules
    return cfg


def kbit_device_map(sft) -> Any:
    """Where a quantized base loads (TRL 0.x's ``get_kbit_device_map``, gone from TRL 1.x): the process's GPU (one
    copy per DDP rank); None under FSDP / DeepSpeed (they place the model) and on CPU."""
    import torch

    if fsdp_enabled() or deepspeed_enabled(sft) or sft.use_cpu or not torch.cuda.is_available():
        return None
    from accelerate import PartialState

    return {"": PartialState().local_process_index}


def is_vision_model(name_or_path: str, trust_remote_code: bool = False) -> bool:
    """The checkpoint has a vision tower (an image-text-to-text model) rather than being a text-only causal LM."""
    from transformers import AutoConfig

    from forecasters.backends.hf_loading import is_vision_config

    with loading_model(name_or_path, flag="--model_name_or_path"):
        return is_vision_config(AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code))


def load_model(psr: PSRTrainArgs, sft, model_args):
    """The base model: a VLM (``AutoModelForImageTextToText``) for the frames input, a causal LM
    (``AutoModelForCausalLM``) for the text-only evidence input; 4-bit when ``load_in_4bit``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    kw: dict[str, Any] = {"dtype": load_dtype(model_args), "revision": model_args.model_revision,
                          "trust_remote_code": getattr(sft, "trust_remote_code", False)}
    q = quantization_config(psr, sft, model_args)
    if q is not None:
        kw["quantization_config"] = q
        dm = kbit_device_map(sft)
        if dm is not None:
            kw["device_map"] = dm
    if model_args.attn_implementation:
        kw["attn_implementation"] = model_args.attn_implementation
    auto = AutoModelForImageTextToText if is_vision_model(model_args.model_name_or_path, kw["trust_remote_code"]) \
        else AutoModelForCausalLM
    with loading_model(model_args.model_name_or_path, flag="--model_name_or_path"):
        loaded = auto.from_pretrained(model_args.model_name_or_path, **kw)
    model = keep_4bit_training_layout(loaded)
    if psr.full_finetune:
        freeze_vision(model)
    return model


def freeze_vision(model) -> int:
    """Freeze the vision tower and projector (`VISION_MODULES_REGEX`) of a fully fine-tuned model; returns the number
    of parameters frozen (0 for a text-only model)."""
    import re

    n = 0
    for name, p in model.named_parameters():
        if re.match(VISION_MODULES_REGEX, name):
            p.requires_grad_(False)
            n += p.numel()
    return n


def keep_4bit_training_layout(model):
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel. On CPUs with AVX512-BF16 the
    first eval-mode forward (an evaluation, the answer-accuracy generation) repacks each weight and nothing unpacks
    it; training steps after that run the packed kernel, which passes no gradient to the layers below (measured
    here: the gradient norm of the step after an eval fell from 1.28 to 0.35)."""
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    return model


def keep_adapters_fp32(model) -> str:
    """Cast the trainable (LoRA) weights back to fp32 after TRL cast them to bf16 on a quantized base, so a small
    update is not rounded away; returns their dtype. Compute still runs in bf16 under autocast."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        if p.dtype != torch.float32:
            p.data = p.data.float()
    return str(trainable[0].dtype).removeprefix("torch.") if trainable else "none"


def adapter_dtype(model) -> str:
    p = next((p for p in model.parameters() if p.requires_grad), None)
    return str(p.dtype).removeprefix("torch.") if p is not None else "none"


def count_parameters(model, *, full_finetune: bool = False) -> dict[str, int]:
    """Trainable and total parameter counts; a 4-bit weight counts its logical elements (``quant_state.shape``),
    not the packed bytes ``numel`` sees (two 4-bit values per element); raises when a vision-tower parameter is
    trainable, or anything outside LoRA unless ``full_finetune`` (the explicit flag that trains every weight of the
    language model)."""
    import re

    def n(p) -> int:
        qs = getattr(p, "quant_state", None)
        return int(qs.shape.numel()) if qs is not None and getattr(qs, "shape", None) is not None else p.numel()

    trainable = [(name, n(p)) for name, p in model.named_parameters() if p.requires_grad]
    vision = [name for name, _ in trainable if re.match(VISION_MODULES_REGEX, name)]
    non_lora = [] if full_finetune else [name for name, _ in trainable if "lora_" not in name]
    if vision or non_lora:
        raise EngineError(f"unexpected trainable parameters: vision {vision[:3]}, non-LoRA {non_lora[:3]}")
    return {"trainable": sum(c for _, c in trainable), "total": sum(n(p) for p in model.parameters())}


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
        raise InputError("the processor has no chat template; assistant-only loss needs one")
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
    raise InputError("no training chat template (with {% generation %} markers) is known for this model's template; "
                     "set assistant_only_loss false or add markers to its chat template")


# --- data ---------------------------------------------------------------------------------------------------

@dataclass
class LengthReport:
    """Per example: token length (image tokens included), supervised (assistant) tokens, image tokens per frame;
    the ids of examples over ``max_length``."""

    lengths: list[int]
    supervised: list[int]
    image_tokens_per_frame: list[float]
    overlong: list[str]


def _image_token_id(processor) -> int | None:
    tid = getattr(processor, "image_token_id", None)
    if tid is None and getattr(processor, "image_token", None):
        tid = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return tid


def measure(dataset, processor, max_length: int) -> LengthReport:
    """Tokenize every example exactly as TRL does (its vision collator; for a text-only set, without an ``images``
    column, its chat-template tokenization) and report lengths and assistant tokens."""
    import numpy as np
    from trl.data_utils import prepare_multimodal_messages

    text_only = "images" not in dataset.column_names
    image_id = None if text_only else _image_token_id(processor)
    lengths, supervised, per_frame, overlong = [], [], [], []
    for i, ex in enumerate(dataset):
        if text_only:  # as TRL tokenizes a conversational text dataset
            out = processor.apply_chat_template(ex["messages"], tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
            ids = np.asarray(out["input_ids"])
            n = int(ids.shape[-1])
            lengths.append(n)
            supervised.append(int(np.sum(out["assistant_masks"])))
            if n > max_length:
                overlong.append(ex.get("query_id") or f"row {i}")
            continue
        msgs = prepare_multimodal_messages(ex["messages"], images=ex["images"])
        out = processor.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="pt",
                                            return_assistant_tokens_mask=True,
                                            processor_kwargs={"add_special_tokens": False})
        ids = out["input_ids"]
        n = int(ids.shape[-1])
        lengths.append(n)
        supervised.append(int(out["assistant_masks"].sum()))
        if image_id is not None and ex["images"]:
            per_frame.append(int((ids == image_id).sum()) / len(ex["images"]))
        if n > max_length:
            overlong.append(ex.get("query_id") or f"row {i}")
    return LengthReport(lengths, supervised, per_frame, overlong)


def load_splits(psr: PSRTrainArgs):
    """(train split, eval split or None, the set's ``psr_sft.json`` or None) of ``dataset_name``, read with
    ``datasets.load_dataset`` (a directory of `distill.sft`, any Parquet directory, a Hub id)."""
    import datasets

    from distill.sft import read_set_info
    from eval.errors import InputError

    name = psr.dataset_name
    info = read_set_info(name) if Path(name).is_dir() else None
    try:
        dd = datasets.load_dataset(name)
    except (FileNotFoundError, ValueError, OSError, ConnectionError) as e:
        raise InputError(f"dataset {name}: cannot be loaded ({type(e).__name__}: {e})",
                         fix="pass an SFT set directory (python -m distill sft) or a dataset id") from None
    if psr.dataset_train_split not in dd:
        raise InputError(f"dataset {name} has no split {psr.dataset_train_split!r} (splits: {sorted(dd)})")
    eval_ds = dd.get(psr.dataset_test_split) if psr.dataset_test_split else None
    if psr.dataset_test_split and eval_ds is None:
        log.warning("dataset %s has no split %r: no eval loss / answer accuracy", name, psr.dataset_test_split)
    return dd[psr.dataset_train_split], eval_ds, info


def prepare_dataset(ds, processor, *, max_length: int, drop_overlong: bool = False, assistant_only_loss: bool = True,
                    limit: int | None = None, repeat: int = 1, name: str = "dataset"):
    """Check lengths and assistant masks of ``ds`` (see the module docstring), keep ``limit``, repeat if asked;
    returns (dataset with ``images`` and ``messages`` only, `LengthReport`)."""
    import datasets

    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if len(ds) == 0:
        raise InputError(f"{name}: the dataset is empty")
    rep = measure(ds, processor, max_length)
    ids = ds["query_id"] if "query_id" in ds.column_names else [f"row {i}" for i in range(len(ds))]
    empty = [q for q, s in zip(ids, rep.supervised, strict=True) if s == 0]
    if empty and assistant_only_loss:
        raise InputError(f"{name}: {len(empty)} example(s) with no supervised tokens, e.g. {empty[:3]}")
    if rep.overlong:
        if not drop_overlong:
            raise InputError(f"{name}: {len(rep.overlong)} example(s) longer than max_length={max_length} "
                             f"tokens (longest {max(rep.lengths)}), e.g. {rep.overlong[:3]}; raise max_length, use "
                             "fewer frames / lower max_pixels, or set drop_overlong true (never truncated)")
        keep = [i for i, n in enumerate(rep.lengths) if n <= max_length]
        if not keep:
            raise InputError(f"{name}: every example is longer than max_length={max_length} tokens")
        ds = ds.select(keep)
        log.warning("%s: dropped %d example(s) longer than %d tokens", name, len(rep.overlong), max_length)
    ds = ds.select_columns([c for c in ("images", "messages") if c in ds.column_names])
    if repeat > 1:
        ds = datasets.concatenate_datasets([ds] * repeat)
    return ds, rep


def run_preprocessing(psr: PSRTrainArgs, info: dict | None) -> dict[str, Any]:
    """What the adapter must be served with: the SFT set's frames, pixel cap and prompt (id + hash), the processor's
    pixel floor. ``--max_pixels`` may only repeat the set's cap (train and serve must see the same image tokens)."""
    from eval.errors import InputError

    pre = dict((info or {}).get("preprocessing") or {})
    set_px = pre.get("max_pixels")
    if psr.max_pixels is not None and set_px is not None and psr.max_pixels != set_px:
        raise InputError(f"max_pixels {psr.max_pixels} differs from the SFT set's {set_px} "
                         f"({psr.dataset_name}/psr_sft.json): the student would train on other image tokens than "
                         "its frames carry", fix="drop --max_pixels, or rebuild the set with that cap")
    return {"student_input": pre.get("student_input", "frames"), "frames": pre.get("frames"),
            "max_pixels": set_px if psr.max_pixels is None else psr.max_pixels, "min_pixels": psr.min_pixels,
            "prompt_id": pre.get("prompt_id"), "prompt_hash": pre.get("prompt_hash")}


# --- the run ------------------------------------------------------------------------------------------------

def _processor(model_args, pre: dict, assistant_only_loss: bool):
    from forecasters.backends.hf_loading import load_processor

    kw = {k: pre[k] for k in ("max_pixels", "min_pixels") if pre.get(k)}
    if not is_vision_model(model_args.model_name_or_path, getattr(model_args, "trust_remote_code", False)):
        kw = {}  # a text-only model's processor is its tokenizer
    processor = load_processor(model_args.model_name_or_path, **kw)
    if assistant_only_loss:
        tpl = training_chat_template(processor)
        if tpl is not None:
            processor.chat_template = tpl
    return processor


def _dataset_hash(info: dict | None, ds) -> str:
    """The SFT set's content hash (``psr_sft.json``), else the fingerprint `datasets` gives the loaded split."""
    return (info or {}).get("sha256") or ds._fingerprint


#: Where a run's final weights go: the LoRA adapter, or (``full_finetune``) the whole fine-tuned model.
ADAPTER_DIR, MODEL_DIR = "adapter", "model"


def student_weights(output_dir: str | os.PathLike) -> tuple[Path, bool] | None:
    """(the final weights of a `train` run, whether they are a full model) -- ``adapter/`` (LoRA, served on its base)
    or ``model/`` (a full fine-tuning, served as the model itself) -- or None when the run has not finished."""
    out = Path(output_dir)
    for name, full in ((ADAPTER_DIR, False), (MODEL_DIR, True)):
        if (out / name / STUDENT_INFO).is_file():
            return out / name, full
    return None


def snapshot_dir(output_dir: str | os.PathLike, step: int) -> Path:
    """Where ``snapshot_steps`` puts the weights at optimizer step ``step`` (`student_weights` reads it)."""
    return Path(output_dir) / f"step-{step}"


def finished_metrics(out: Path, identity, snapshot_steps=()) -> dict[str, Any] | None:
    """The ``metrics.json`` of a run of this config that already wrote its final weights and its snapshots (None
    otherwise): rerunning a finished run is a no-op."""
    from eval.io import read_json

    for d in (out, *(snapshot_dir(out, n) for n in snapshot_steps)):
        found = student_weights(d)
        if found is None or read_json(found[0] / STUDENT_INFO).get("config_hash") != identity.config_hash:
            return None
    return read_json(out / "metrics.json") if (out / "metrics.json").is_file() else None


def snapshot_callback(steps, out: Path, record: dict, full: bool):
    """A Trainer callback writing the weights at each of ``steps`` (optimizer steps) to `snapshot_dir` in the final
    format (``model/`` or ``adapter/`` with ``psr_student.json``, ``snapshot_step`` added), atomically."""
    from transformers import TrainerCallback

    from eval.io import write_json

    class Snapshots(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step not in steps or not state.is_world_process_zero:
                return control
            final = snapshot_dir(out, state.global_step) / (MODEL_DIR if full else ADAPTER_DIR)
            tmp = final.with_name(f".{final.name}.tmp")
            if tmp.exists():
                shutil.rmtree(tmp)
            model.save_pretrained(str(tmp))
            if processing_class is not None:
                processing_class.save_pretrained(str(tmp))
            write_json(tmp / STUDENT_INFO, {**record, "snapshot_step": state.global_step})
            if final.exists():
                shutil.rmtree(final)  # ours: a snapshot of this run's directory
            os.replace(tmp, final)
            return control

    return Snapshots()


def checkpoint_step(ckpt: str | os.PathLike) -> int:
    """The optimizer step a Trainer checkpoint was saved at (its ``trainer_state.json``)."""
    from eval.io import read_json

    return int(read_json(Path(ckpt) / "trainer_state.json").get("global_step", 0))


def finish_from_checkpoint(trainer, ckpt: str):
    """A ``max_steps`` run whose last checkpoint is at ``max_steps`` but whose final weights were never written (a
    crash while saving them): take the checkpoint's weights and state instead of resuming, which would train one step
    more. Returns a `transformers.trainer_utils.TrainOutput` (the checkpoint's step; its loss from the log history)."""
    from transformers.trainer_callback import TrainerState
    from transformers.trainer_utils import TrainOutput

    trainer._load_from_checkpoint(ckpt)  # the Trainer's own loader: full weights or the PEFT adapter
    trainer.state = TrainerState.load_from_json(str(Path(ckpt) / "trainer_state.json"))
    loss = loss_over_all_steps(trainer.state.log_history, trainer.state.global_step, 0.0, trainer.state.global_step)
    log.info("%s is at max_steps %d: its weights are the final ones (nothing trained)", ckpt, trainer.state.global_step)
    return TrainOutput(trainer.state.global_step, loss or 0.0, {})


def _write_adapter(trainer, out: Path, record: dict, is_main: bool, *, full: bool = False) -> Path:
    """Save the adapter to ``out/adapter`` (a full fine-tuning: the model to ``out/model``) atomically (every rank
    calls: FSDP gathers the full state dict)."""
    from eval.io import write_json

    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    name = MODEL_DIR if full else ADAPTER_DIR
    tmp = out / f".{name}.tmp"
    if is_main and tmp.exists():
        shutil.rmtree(tmp)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(tmp))
    final = out / name
    if is_main:
        write_json(tmp / STUDENT_INFO, record)
        if final.exists():
            shutil.rmtree(final)  # ours: the output directory passed check_output_dir
        os.replace(tmp, final)
    return final


def build_trainer(psr: PSRTrainArgs, sft, model_args, *, train_ds, eval_ds=None, processor, identity, batch,
                  answer_eval=None, record: dict | None = None):
    """The `StudentTrainer` of a run: TrainingArguments with the derived accumulation, checkpoints under
    ``output_dir/checkpoints``, no truncation; LoRA weights in fp32 (except under FSDP / DeepSpeed, see the module
    docstring). Returns (trainer, adapter dtype)."""
    from distill.train_eval import student_trainer_class

    args = dataclasses.replace(sft, output_dir=str(Path(sft.output_dir) / "checkpoints"),
                               gradient_accumulation_steps=batch["gradient_accumulation_steps"],
                               max_length=None,  # lengths were checked: never truncate (image tokens stay whole)
                               eval_strategy=sft.eval_strategy if eval_ds is not None else "no")
    model = load_model(psr, sft, model_args)
    callbacks = [checkpoint_callback(identity), clock_callback()]
    if psr.snapshot_steps:
        if fsdp_enabled() or deepspeed_enabled(sft):
            from eval.errors import InputError

            raise InputError("snapshot_steps saves the weights from one process: not under FSDP / DeepSpeed")
        callbacks.append(snapshot_callback(set(psr.snapshot_steps), Path(sft.output_dir), record or {},
                                           psr.full_finetune))
    trainer = student_trainer_class()(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=processor,
        peft_config=lora_config(psr, model_args), callbacks=callbacks,
        answer_eval=answer_eval, answer_max_new_tokens=psr.eval_max_new_tokens)
    sharded = fsdp_enabled() or deepspeed_enabled(sft)
    dtype = adapter_dtype(trainer.model) if sharded else keep_adapters_fp32(trainer.model)
    return trainer, dtype


@dataclass
class RunPlan:
    """Everything decided before the model loads: data (checked), batch arithmetic, preprocessing, config identity,
    the checkpoint to resume from."""

    out: Path
    train_ds: Any
    eval_ds: Any
    answers: list | None
    lengths: LengthReport
    batch: dict[str, int]
    preprocessing: dict[str, Any]
    identity: Any
    resume: str | None
    processor: Any


def check_training_mode(psr: PSRTrainArgs, model_args) -> None:
    """LoRA (``use_peft``) or, behind the explicit ``full_finetune`` flag, every language-model weight; never both,
    never neither, and never a full fine-tuning of 4-bit weights."""
    from eval.errors import InputError

    if psr.full_finetune and (model_args.use_peft or model_args.load_in_4bit):
        raise InputError("full_finetune trains every weight: it needs --use_peft false and --load_in_4bit false "
                         f"(got use_peft {model_args.use_peft}, load_in_4bit {model_args.load_in_4bit})")
    if not psr.full_finetune and not model_args.use_peft:
        raise InputError("use_peft false without full_finetune: nothing would say which weights to train",
                         fix="pass --full_finetune true to train every weight (tiny models), or --use_peft true")


def plan_identity(psr: PSRTrainArgs, sft, model_args):
    """(train split, eval split, set info, batch arithmetic, preprocessing, config identity) of a run: everything
    the config hash needs, before any tokenization or model loading."""
    train_raw, eval_raw, info = load_splits(psr)
    batch = resolve_batch(psr, sft, sft.world_size)
    pre = run_preprocessing(psr, info)
    identity = train_identity(psr, sft, model_args, effective_batch_size=batch["effective_batch_size"],
                              dataset_sha256=_dataset_hash(info, train_raw), preprocessing=pre)
    return train_raw, eval_raw, info, batch, pre, identity


def plan_run(psr: PSRTrainArgs, sft, model_args, planned=None) -> RunPlan:
    """Load and check the data, derive the batch, hash the config, check the output directory and the checkpoint
    (``planned``: `plan_identity`'s result, when already computed)."""
    from distill.train_eval import answer_examples

    out = Path(sft.output_dir)
    train_raw, eval_raw, info, batch, pre, identity = planned or plan_identity(psr, sft, model_args)
    check_output_dir(out, identity)
    resume = resolve_resume(sft.resume_from_checkpoint, out, identity)
    processor = _processor(model_args, pre, sft.assistant_only_loss)
    common = dict(max_length=sft.max_length, drop_overlong=psr.drop_overlong,
                  assistant_only_loss=sft.assistant_only_loss)
    train_ds, rep = prepare_dataset(train_raw, processor, limit=psr.max_train_samples, repeat=psr.repeat,
                                    name=f"{psr.dataset_name} [{psr.dataset_train_split}]", **common)
    eval_ds = answers = None
    if eval_raw is not None and sft.eval_strategy != "no":
        eval_ds, _ = prepare_dataset(eval_raw, processor, limit=psr.max_eval_samples,
                                     name=f"{psr.dataset_name} [{psr.dataset_test_split}]", **common)
        if psr.eval_answer_accuracy:
            pool = eval_raw.select(range(min(len(eval_raw), psr.max_eval_samples or len(eval_raw))))
            answers = answer_examples(pool, psr.eval_answer_samples, sft.seed)
    pre = {**pre, "image_tokens_per_frame": sorted(set(rep.image_tokens_per_frame))}
    return RunPlan(out, train_ds, eval_ds, answers, rep, batch, pre, identity, resume, processor)


def _write_train_config(plan: RunPlan, psr: PSRTrainArgs, sft, model_args) -> None:
    from eval.io import write_json

    plan.out.mkdir(parents=True, exist_ok=True)
    lengths = plan.lengths.lengths
    write_json(plan.out / TRAIN_CONFIG, {
        "config_hash": plan.identity.config_hash, "identity": plan.identity.to_dict(), "batch": plan.batch,
        "preprocessing": plan.preprocessing, "psr": dataclasses.asdict(psr), "model": dataclasses.asdict(model_args),
        "sft": json.loads(json.dumps(sft.to_dict(), default=str)), "versions": loaded_versions(RECORDED_LIBRARIES),
        "fsdp": fsdp_enabled(), "deepspeed": deepspeed_enabled(sft), "resume_from": plan.resume,
        "examples": {"train": len(plan.train_ds), "eval": len(plan.eval_ds) if plan.eval_ds is not None else 0},
        "max_tokens": max(lengths), "mean_tokens": round(sum(lengths) / len(lengths), 1),
        "supervised_tokens": int(sum(plan.lengths.supervised))})


def _metrics(trainer, result, plan: RunPlan, adapter: str, params: dict, t0: float, c0: float) -> dict[str, Any]:
    history = trainer.state.log_history
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
    resumed_at = int(Path(plan.resume).name.split("-")[-1]) if plan.resume else 0
    return {"train_loss": loss_over_all_steps(history, resumed_at, result.training_loss, trainer.state.global_step),
            "train_loss_this_run": result.training_loss, "global_step": trainer.state.global_step,
            "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
            "epoch": trainer.state.epoch, "losses": losses, "eval": eval_history(history), "resumed_from": plan.resume,
            "adapter_dtype": adapter,
            "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2),
            **plan.batch, **params}


def train(psr: PSRTrainArgs, sft, model_args) -> dict[str, Any]:
    """Run one fine-tuning job (see the module docstring); returns the metrics written to ``metrics.json``."""
    from accelerate import PartialState

    from eval.io import write_json

    t0, c0 = time.perf_counter(), time.process_time()
    check_training_mode(psr, model_args)
    sft.world_size  # noqa: B018  (sets up the distributed state as the Trainer will: PartialState(cpu=use_cpu))
    state = PartialState()
    planned = plan_identity(psr, sft, model_args)
    done = finished_metrics(Path(sft.output_dir), planned[-1], psr.snapshot_steps)
    if done is not None:
        log.info("%s: a finished run of this config (hash %s): nothing to do", sft.output_dir,
                 planned[-1].config_hash)
        return {**done, "skipped": True}
    plan = plan_run(psr, sft, model_args, planned)
    if state.is_main_process:
        _write_train_config(plan, psr, sft, model_args)
    record = {"base_model": model_args.model_name_or_path, "dataset": psr.dataset_name,
              "load_in_4bit": model_args.load_in_4bit, "config_hash": plan.identity.config_hash,
              "full_finetune": psr.full_finetune, "preprocessing": plan.preprocessing}
    trainer, adapter = build_trainer(psr, sft, model_args, train_ds=plan.train_ds, eval_ds=plan.eval_ds,
                                     processor=plan.processor, identity=plan.identity, batch=plan.batch,
                                     answer_eval=plan.answers, record=record)
    params = count_parameters(trainer.model, full_finetune=psr.full_finetune)
    log.info("trainable %s weights in %s; %d of %d parameters trainable",
             "language-model" if psr.full_finetune else "LoRA", adapter, params["trainable"], params["total"])
    if plan.resume and 0 < sft.max_steps <= checkpoint_step(plan.resume):
        result = finish_from_checkpoint(trainer, plan.resume)
    else:
        result = trainer.train(resume_from_checkpoint=plan.resume)
    _write_adapter(trainer, plan.out, record, state.is_main_process, full=psr.full_finetune)
    if sft.push_to_hub:
        trainer.push_to_hub(dataset_name=psr.dataset_name)
    metrics: dict[str, Any] = {}
    if state.is_main_process:
        metrics = _metrics(trainer, result, plan, adapter, params, t0, c0)
        write_json(plan.out / "train_log.json", trainer.state.log_history)
        write_json(plan.out / "metrics.json", metrics)
    state.wait_for_everyone()
    return metrics


def main(argv: list[str] | None = None) -> int:
    """``python -m distill.train ARGV``: the exit code; errors print one line (`eval.cli_support.run_main`)."""
    from eval.cli_support import run_main
    from eval.threads import prefer_passive_wait

    prefer_passive_wait()  # before torch loads: waiting OpenMP workers sleep (eval.threads)
    return run_main(_main, argv)


def _main(argv: list[str]) -> int:
    from distill.outputs import pop_overwrite, train_output

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv, overwrite = pop_overwrite(argv)
    psr, sft, model_args = parse_train_args(argv)
    from eval.threads import training_threads

    with train_output(psr, sft, model_args, overwrite=bool(overwrite)), training_threads():
        metrics = train(psr, sft, model_args)
    if metrics:
        print(json.dumps({k: v for k, v in metrics.items() if k not in ("losses", "eval")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
