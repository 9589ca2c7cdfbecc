"""Arguments of `distill.train`: TRL's own groups plus ours, parsed by `trl.TrlParser`.

``TrlParser((PSRTrainArgs, SFTConfig, ModelConfig))``, so every flag of ``trl sft`` works under its TRL name
(``--model_name_or_path``, ``--use_peft``, ``--load_in_4bit``, ``--lora_r``, ``--learning_rate``, ``--report_to``,
``--push_to_hub``, ``--deepspeed``, ...) and `PSRTrainArgs` adds what the PSR recipe needs. Precedence::

    TRL's defaults < PSR defaults (`psr_defaults`: DynaPix Table 10) < --config FILE < --<flag> VALUE

``--config`` takes a flat TRL-style YAML (``learning_rate: 1.0e-4``, ``load_in_4bit: false``, an ``env:`` mapping
of environment variables, as `trl.TrlParser` reads it) or a distillation preset with stage sections, of which the
``train:`` section is read. Every key must be a flag of one of the three groups: an unknown key is an error naming
the file (with the closest known names).

The effective batch is a config value (`PSRTrainArgs.effective_batch_size`, 16 as in Table 10); the per-device
gradient accumulation is derived from it at run time, ``effective / (per_device_train_batch_size x world size)``
(`derive_accumulation`), so the same config trains at batch 16 on 1, 2, 4 or 8 GPUs.

`TrainIdentity` is what a run's config hash covers (`distill.train` resumes only a checkpoint of the same hash).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.stages import COMMANDS
from eval.errors import InputError

log = logging.getLogger("distill.train")

LANGUAGE_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
#: Modules LoRA never touches: vision towers and projectors of Qwen-VL (``visual``) and LLaVA (``vision_tower``,
#: ``multi_modal_projector``). Their names end in q_proj/... in some families (Qwen2.5-VL's vision MLP), hence the regex.
VISION_MODULES_REGEX = r".*(?:visual|vision_tower|vision_model|multi_modal_projector).*"
#: Modules the 4-bit load leaves unquantized (transformers matches each as a name prefix, regex or suffix): the frozen
#: vision tower and projector keep their precision, and so does the output head.
QUANT_SKIP_MODULES = (r".*visual", r".*vision_tower", r".*multi_modal_projector", "lm_head")
#: Sections of a distillation preset (``configs/distill/*.yaml``): every command's (`distill.stages`; ``train`` is
#: this command's) and the recipe's own.
PRESET_SECTIONS = frozenset({c.section for c in COMMANDS.values() if c.section} | {"recipe"})
#: Keys this command does not read, each with the TRL flag that sets the same thing (named in the unknown-key error).
RENAMED = {"model": "model_name_or_path", "dataset": "dataset_name", "bnb_4bit_use_double_quant": "use_bnb_nested_quant",
           "precision": "bf16 / fp16 (and dtype)", "device": "use_cpu", "warmup_ratio": "warmup_steps (a float < 1)",
           "gradient_accumulation_steps": "effective_batch_size (accumulation is derived)",
           "max_pixels": "max_pixels is taken from the SFT set (psr_sft.json)"}


@dataclass
class PSRTrainArgs:
    """What the PSR recipe adds to TRL's `SFTConfig` and `ModelConfig` (``python -m distill.train --help``)."""

    dataset_name: str | None = field(default=None, metadata={
        "help": "SFT set: a directory written by `python -m distill sft` (<out>/cot or <out>/answer), or any dataset "
                "datasets.load_dataset reads in TRL's vision format (a Parquet directory, a Hub id)"})
    dataset_train_split: str = field(default="train", metadata={"help": "split to train on"})
    dataset_test_split: str | None = field(default="validation", metadata={
        "help": "split for eval loss and answer accuracy (each eval_strategy interval, default every epoch); "
                "skipped when the set has none"})
    effective_batch_size: int = field(default=16, metadata={
        "help": "examples per optimizer step over all processes; gradient_accumulation_steps is derived as "
                "effective / (per_device_train_batch_size x world size) (0: use gradient_accumulation_steps)"})
    drop_overlong: bool = field(default=False, metadata={
        "help": "drop examples longer than max_length instead of failing (never truncated)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training examples"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N eval examples"})
    repeat: int = field(default=1, metadata={"help": "repeat the training set N times (tiny overfitting checks)"})
    max_pixels: int | None = field(default=None, metadata={
        "help": "processor cap on pixels per frame (default: the SFT set's max_pixels; another value is an error)"})
    min_pixels: int | None = field(default=None, metadata={"help": "processor floor on pixels per frame"})
    eval_answer_accuracy: bool = field(default=True, metadata={
        "help": "at each eval, generate on the eval split and score the Answer: line against the target"})
    eval_answer_samples: int | None = field(default=200, metadata={
        "help": "answer accuracy on a seeded sample of this many eval examples (generation is costly; null: all)"})
    eval_max_new_tokens: int = field(default=512, metadata={"help": "generation budget of the answer accuracy eval"})
    quant_skip_modules: list[str] = field(default_factory=lambda: list(QUANT_SKIP_MODULES), metadata={
        "help": "modules kept unquantized in 4-bit loading (prefix, suffix or regex of module names)"})
    lora_exclude_modules: str = field(default=VISION_MODULES_REGEX, metadata={
        "help": "regex of modules LoRA must not touch (the vision tower stays frozen)"})
    snapshot_steps: list[int] = field(default_factory=list, metadata={
        "help": "also write the final-format weights (adapter or model, with psr_student.json) at these optimizer "
                "steps to <output_dir>/step-N/: under a constant schedule without warmup they are the students of "
                "runs stopped at N steps (distill.study's equal-steps budget); one process or DDP only"})
    full_finetune: bool = field(default=False, metadata={
        "help": "train every weight of the language model instead of LoRA adapters (tiny models on CPU; the vision "
                "tower stays frozen); needs --use_peft false and --load_in_4bit false. Writes <output_dir>/model "
                "(a full checkpoint) instead of <output_dir>/adapter"})

    def __post_init__(self):
        if self.repeat < 1:
            raise InputError(f"repeat must be >= 1, got {self.repeat}")
        if self.effective_batch_size < 0:
            raise InputError(f"effective_batch_size must be >= 1 (or 0: off), got {self.effective_batch_size}")
        if any(n < 1 for n in self.snapshot_steps):
            raise InputError(f"snapshot_steps must be >= 1, got {self.snapshot_steps}")
        if self.dataset_test_split in ("", "none", "null"):
            self.dataset_test_split = None


def psr_defaults() -> dict[str, Any]:
    """The recipe's defaults over TRL's (DynaPix Table 10: LoRA r 16 / alpha 32 on the language tower's projections,
    4-bit NF4 base with nested quantization, lr 2e-5, 3 epochs, micro batch 1 with an effective batch of 16, max
    length 3,072, bf16 where the GPU has it; loss on the assistant turn; resume from the newest checkpoint)."""
    import torch

    cuda = torch.cuda.is_available()
    return dict(
        use_peft=True, load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True, lora_r=16,
        lora_alpha=32, lora_dropout=0.05, lora_target_modules=list(LANGUAGE_PROJECTIONS), dtype="auto",
        output_dir="", learning_rate=2e-5, num_train_epochs=3.0, per_device_train_batch_size=1,
        per_device_eval_batch_size=1, max_length=3072, assistant_only_loss=True, warmup_steps=0.03,
        lr_scheduler_type="cosine", logging_steps=10, logging_first_step=True, save_strategy="steps", save_steps=200,
        save_total_limit=2, eval_strategy="epoch", resume_from_checkpoint="auto", report_to="none", seed=42,
        remove_unused_columns=False, bf16=bool(cuda and torch.cuda.is_bf16_supported()), use_cpu=not cuda,
    )


def make_parser(prog: str = "python -m distill.train"):
    """TRL's parser of the three groups; each flag shown in kebab-case (``--model-name-or-path``), TRL's spelling
    (``--model_name_or_path``) read as well."""
    from trl import ModelConfig, SFTConfig, TrlParser

    from distill.config import kebab_first

    return kebab_first(TrlParser(
        (PSRTrainArgs, SFTConfig, ModelConfig), prog=prog,
        description="LoRA / QLoRA SFT of a PSR student: TRL's SFTConfig and ModelConfig flags plus PSRTrainArgs. "
                    "--config FILE: a distillation preset (its train: section) or a flat TRL-style YAML; precedence: "
                    "defaults < --config < flags (see distill.train_args)."))


#: Scalar TRL fields the recipe sets on every training stage, with the TRL class that declares each: `train_argv`
#: writes them without importing TRL (whose import costs seconds in every recipe run, a rerun that only skips
#: included). A test checks each against TRL's dataclasses.
TRL_SCALAR_FIELDS = {"model_name_or_path": "ModelConfig", "output_dir": "SFTConfig", "max_steps": "SFTConfig"}


def train_argv(**values: Any) -> list[str]:
    """The flags that set ``values`` on `make_parser`'s command line, in TRL's spelling (``--field_name VALUE``, as
    ``trl sft`` documents them): each name must be a field of `PSRTrainArgs`, `trl.SFTConfig` or `trl.ModelConfig`.
    TRL is imported only for a name outside `PSRTrainArgs` and `TRL_SCALAR_FIELDS` (or a non-scalar value of one)."""
    from distill.config import field_argv

    fields = {f.name: f for f in dataclasses.fields(PSRTrainArgs)}
    scalar = (str, int, float)
    if any(k not in fields and not (k in TRL_SCALAR_FIELDS and type(v) in scalar) for k, v in values.items()):
        from trl import ModelConfig, SFTConfig

        fields.update({f.name: f for cls in (SFTConfig, ModelConfig) for f in dataclasses.fields(cls)})
    else:
        fields.update({k: _scalar_field(k) for k in values if k not in fields})
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ValueError(f"not a field of PSRTrainArgs, SFTConfig or ModelConfig: {unknown}")
    return [w for k, v in values.items() for w in field_argv(fields[k], v, snake=True)]


def _scalar_field(name: str) -> dataclasses.Field:
    """A stand-in `dataclasses.Field` named ``name`` for `distill.config.field_argv` (which reads only the name of a
    field whose value is a string or a number)."""
    return dataclasses.fields(dataclasses.make_dataclass("_F", [(name, Any, None)]))[0]


# --- --config: a flat TRL-style YAML or a preset's train section ------------------------------------------------

def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The training keys of ``path``: its ``train:`` section when it is a distillation preset (every top-level key a
    stage section), else the whole mapping (a flat TRL-style YAML). An ``env:`` mapping sets environment variables."""
    from eval.io import FormatError, read_yaml

    path = Path(path)
    try:
        doc = read_yaml(path)  # UTF-8 and YAML errors name the line
    except FileNotFoundError:
        raise FormatError(path, "config file does not exist") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise FormatError(path, f"expected a mapping of training arguments, got {type(doc).__name__}")
    if isinstance(doc.get("train"), dict) and set(doc) <= PRESET_SECTIONS:
        doc = dict(doc["train"])
    env = doc.pop("env", None) or {}
    if not isinstance(env, dict):
        raise FormatError(path, "must be a mapping of environment variables", field="env")
    for k, v in env.items():
        os.environ[str(k)] = str(v)
    return doc


def _coerce(action, key: str, value: Any, where: str) -> Any:
    """A YAML value as argparse would have parsed it from the command line (type-checked; choices checked)."""
    from eval.io import FormatError

    if value is None:
        return None
    many = action.nargs in ("+", "*")
    if many and not isinstance(value, list):
        value = [value]
    if isinstance(value, dict):
        return json.dumps(value)  # TrainingArguments parses dict fields from JSON strings

    def one(v):
        if action.type is None or (isinstance(v, bool) and action.type is not int):
            return v
        return action.type(v if isinstance(v, str) else str(v))

    try:
        out = [one(v) for v in value] if many else one(value)
    except (TypeError, ValueError) as e:
        raise FormatError(where, f"{value!r} is not a valid value ({e})", field=key) from None
    if action.choices and any(v not in action.choices for v in (out if many else [out])):
        raise FormatError(where, f"{value!r} is not one of {list(action.choices)}", field=key)
    return out


def apply_config_file(parser, path: str | os.PathLike) -> None:
    """Set ``path``'s values as the parser's defaults (so flags still override them); unknown keys are errors."""
    from eval.io import FormatError

    values = read_config_file(path)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    unknown = sorted(k for k in values if k not in actions)
    if unknown:
        hints = {k: RENAMED.get(k) or ", ".join(difflib.get_close_matches(k, list(actions), n=3)) or "?"
                 for k in unknown}
        raise FormatError(path, "unknown key(s) for distill.train (TRL SFTConfig / ModelConfig or PSRTrainArgs): "
                                + "; ".join(f"{k} (known: {h})" for k, h in hints.items()))
    remaining = parser.set_defaults_with_config(**{k: _coerce(actions[k], k, v, str(path)) for k, v in values.items()})
    assert not remaining, remaining  # every key was checked against the parser's actions above


def _pop_config(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--config":
            if i + 1 >= len(argv):
                from eval.errors import InputError

                raise InputError("--config needs a file")
            path = argv[i + 1]
            del argv[i:i + 2]
            return path
        if a.startswith("--config="):
            del argv[i]
            return a.split("=", 1)[1]
    return None


def parse_train_args(argv: Sequence[str] | None = None):
    """``(PSRTrainArgs, SFTConfig, ModelConfig)`` from defaults < ``--config`` < flags (module docstring)."""
    from eval.errors import InputError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    parser.set_defaults_with_config(**psr_defaults())
    config = _pop_config(argv)
    if config:
        apply_config_file(parser, config)
    try:
        psr, sft, model = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as e:  # unknown flags; a __post_init__ rejecting a value
        raise InputError(f"{config + ' + ' if config else ''}command line: {e}") from None
    missing = [n for n, v in (("--model_name_or_path", model.model_name_or_path), ("--dataset_name", psr.dataset_name),
                              ("--output_dir", sft.output_dir)) if not v]
    if missing:
        raise InputError(f"distill.train needs {', '.join(missing)}", fix="pass them as flags or in --config")
    return psr, sft, model


# --- the effective batch ----------------------------------------------------------------------------------------

def derive_accumulation(effective: int, per_device: int, world_size: int) -> int:
    """Gradient accumulation steps ``effective / (per_device x world_size)``; an error unless it divides exactly."""
    from eval.errors import InputError

    per_step = per_device * world_size
    if effective % per_step:
        raise InputError(f"effective_batch_size {effective} is not a multiple of per_device_train_batch_size "
                         f"{per_device} x {world_size} process(es) = {per_step}",
                         fix="choose an effective batch, micro batch and process count that divide")
    return effective // per_step


def resolve_batch(psr: PSRTrainArgs, sft, world_size: int) -> dict[str, int]:
    """Set ``sft.gradient_accumulation_steps`` from the effective batch (unless it is 0) and return the batch
    arithmetic (logged and recorded in ``train.config.json``)."""
    from eval.errors import InputError

    given = sft.gradient_accumulation_steps
    if not psr.effective_batch_size:
        accum = given
    else:
        accum = derive_accumulation(psr.effective_batch_size, sft.per_device_train_batch_size, world_size)
        if given not in (1, accum):
            raise InputError(f"gradient_accumulation_steps {given} contradicts effective_batch_size "
                             f"{psr.effective_batch_size} / (per-device {sft.per_device_train_batch_size} x "
                             f"{world_size} process(es)) = {accum}",
                             fix="set effective_batch_size only (or effective_batch_size 0 to give the "
                                 "accumulation yourself)")
    batch = {"effective_batch_size": sft.per_device_train_batch_size * accum * world_size,
             "per_device_train_batch_size": sft.per_device_train_batch_size, "gradient_accumulation_steps": accum,
             "world_size": world_size}
    log.info("effective batch %(effective_batch_size)d = per-device %(per_device_train_batch_size)d x accumulation "
             "%(gradient_accumulation_steps)d x %(world_size)d process(es)", batch)
    return batch


# --- the config hash ----------------------------------------------------------------------------------------------

#: SFTConfig fields that change what a run learns (everything else, e.g. logging, saving, eval cadence, trackers,
#: the hub, dataloader workers, is free to differ between a run and its resumption).
HASHED_SFT_FIELDS = ("learning_rate", "num_train_epochs", "max_steps", "weight_decay", "adam_beta1", "adam_beta2",
                     "adam_epsilon", "max_grad_norm", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
                     "optim", "optim_args", "seed", "data_seed", "bf16", "fp16", "max_length", "assistant_only_loss",
                     "completion_only_loss", "packing", "loss_type", "neftune_noise_alpha", "label_smoothing_factor")
#: PSRTrainArgs fields outside the hash: the dataset path (its content hash is in), eval-only settings.
UNHASHED_PSR_FIELDS = ("dataset_name", "dataset_test_split", "max_eval_samples", "eval_answer_accuracy",
                       "eval_answer_samples", "eval_max_new_tokens")


@dataclass(frozen=True)
class TrainIdentity:
    """What the config hash of a training run covers: the base model, quantization and LoRA (all of ModelConfig but
    ``attn_implementation``), the data (content hash of the SFT set, split, sample selection), the optimisation
    (`HASHED_SFT_FIELDS`, the effective batch) and the preprocessing the adapter will carry."""

    model: dict
    training: dict
    data: dict
    preprocessing: dict

    @property
    def config_hash(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def diff(self, other: dict) -> list[str]:
        """Dotted keys whose values differ from ``other`` (an identity as saved with `to_dict`)."""
        mine = _flatten(self.to_dict())
        theirs = _flatten(other)
        return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def model_fingerprint(name_or_path: str) -> str | None:
    """For a local model directory, a hash of its small files (config, tokenizer, chat template) and of its weight
    files' names and sizes: a model rebuilt in the same directory (a new tiny student) is another config. None for a
    hub id (its revision is in the config)."""
    d = Path(name_or_path)
    if not d.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in d.iterdir() if p.is_file()):
        h.update(f.name.encode())
        if f.suffix in (".json", ".jinja", ".txt", ".model"):
            h.update(f.read_bytes())
        else:
            h.update(str(f.stat().st_size).encode())
    return h.hexdigest()[:16]


def train_identity(psr: PSRTrainArgs, sft, model_args, *, effective_batch_size: int, dataset_sha256: str,
                   preprocessing: dict) -> TrainIdentity:
    model = {k: v for k, v in dataclasses.asdict(model_args).items() if k != "attn_implementation"}
    model["fingerprint"] = model_fingerprint(model_args.model_name_or_path)
    training = {k: getattr(sft, k) for k in HASHED_SFT_FIELDS if hasattr(sft, k)}
    training["effective_batch_size"] = effective_batch_size
    data = {k: v for k, v in dataclasses.asdict(psr).items() if k not in UNHASHED_PSR_FIELDS}
    data["dataset_sha256"] = dataset_sha256
    return TrainIdentity(model=model, training=training, data=data, preprocessing=preprocessing)
