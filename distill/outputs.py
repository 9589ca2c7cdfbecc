"""Where each distillation stage writes, checked before it runs (`eval.outputs`: a stage replaces only what a stage
of the same kind wrote; never an input of the job).

A stage's ``--out`` (``--output_dir`` for ``train``) may be missing, empty, or an earlier output of the same stage;
anything else is refused unless ``--overwrite``. Directory stages get the marker of their kind when they start (they
resume in place); file stages (``predicates``, ``validate``) are recognised by their content. ``--data`` must be a
benchmark directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from eval.cli_support import check_benchmark_dir
from eval.outputs import (
    check_output_dir,
    check_output_file,
    claim_dir,
    claimed_dir,
    json_with_keys,
    jsonl_with_keys,
)

#: Config fields that name inputs of a stage (files, folders, local models).
INPUT_FIELDS = ("data", "predicates", "rationales", "perturbed", "dataset", "phrases", "snap_runs", "adapter", "model",
                "sft", "train_config")
#: stage -> (output field, "dir" | "file" | "atomic", how an output of the stage without a marker is recognised: a
#: file by its content, a directory by these file names).
OUTPUTS: dict[str, tuple[str, str, Any]] = {
    "predicates": ("out", "file", jsonl_with_keys("query_id", "facts")),
    "counterfactuals": ("out", "file", jsonl_with_keys("query_id", "facts")),
    "rationale-stats": ("out", "dir", ("rationale_stats.json",)),
    "validate": ("out", "file", json_with_keys("checked", "rejected", "by_code")),
    "narrate": ("out", "dir", ("narrate.config.json",)),
    "sft": ("out", "dir", ("sft.config.json",)),
    "faithfulness": ("out", "dir", ("faithfulness.json",)),
    "answers": ("out", "dir", ("answers.json",)),
    "merge": ("out", "atomic", ("psr_merge.json",)),  # built beside and swapped in (distill.merge)
    "tiny-student": ("out", "dir", ("config.json",)),
    "study": ("out", "dir", ("study.json",)),
    "leaks": ("out", "dir", ("leaks.json",)),
}
OVERWRITE_FLAG = "--overwrite"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def output_kind(stage: str) -> str:
    return f"distill {stage}"


def pop_overwrite(argv: Sequence[str]) -> tuple[list[str], bool | None]:
    """``argv`` without ``--overwrite [true|false]`` / ``--overwrite=VALUE``, and its value (bare flag: true; None
    when absent)."""
    rest, value, argv = [], None, list(argv)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == OVERWRITE_FLAG:
            nxt = argv[i + 1].lower() if i + 1 < len(argv) else ""
            if nxt in _TRUE + _FALSE:
                value, i = nxt in _TRUE, i + 2
                continue
            value, i = True, i + 1
            continue
        if a.startswith(OVERWRITE_FLAG + "="):
            value = a.split("=", 1)[1].lower() in _TRUE
        else:
            rest.append(a)
        i += 1
    return rest, value


def _inputs(cfg) -> list[str]:
    """Every input path of a stage config (``NAME=PATH`` items count by their path)."""
    out = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name in INPUT_FIELDS and v:
            out += [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
    return [x.split("=", 1)[1] if "=" in x and not os.path.lexists(x) else x for x in out]


def with_overwrite(cls, argv: Sequence[str]) -> tuple[list[str], bool]:
    """Accept ``--overwrite`` with or without a value for every stage: a stage whose config has an ``overwrite``
    field gets it as ``--overwrite true|false`` (its config records it); for the others it is taken off ``argv``."""
    rest, value = pop_overwrite(argv)
    if value is not None and "overwrite" in {f.name for f in dataclasses.fields(cls)}:
        rest += [OVERWRITE_FLAG, "true" if value else "false"]
    return rest, bool(value)


@contextlib.contextmanager
def stage_output(stage: str, cfg, overwrite: bool = False) -> Iterator[Path | None]:
    """`prepare_output` around a stage's run: a directory it created is removed again when the stage fails before
    writing anything (`eval.outputs.claimed_dir`)."""
    name, how, recognise = OUTPUTS.get(stage, (None, None, None))
    target = getattr(cfg, name, None) if name else None
    if how != "dir" or not target:
        yield prepare_output(stage, cfg, overwrite)
        return
    if getattr(cfg, "data", None):
        check_benchmark_dir(cfg.data)
    with claimed_dir(target, output_kind(stage), inputs=_inputs(cfg), recognise=recognise, option=f"--{name}",
                     overwrite=overwrite or bool(getattr(cfg, "overwrite", False))) as p:
        yield p


#: Files that identify a `distill.train` output directory that holds no marker.
TRAIN_FILES = ("train.config.json",)


def train_output(psr, sft, model_args, *, overwrite: bool = False):
    """`eval.outputs.claimed_dir` of ``python -m distill.train``'s ``--output_dir`` (its inputs: the SFT dataset and
    a local base model); `distill.checkpoints.check_output_dir` then checks the run's config hash inside it."""
    inputs = [psr.dataset_name, model_args.model_name_or_path]
    return claimed_dir(sft.output_dir, output_kind("train"), inputs=inputs, overwrite=overwrite, recognise=TRAIN_FILES,
                       option="--output_dir")


def prepare_output(stage: str, cfg, overwrite: bool = False) -> Path | None:
    """Check ``--data`` and the stage's output before it runs; directory stages are created and marked.

    Returns the output path (None for a stage without one, e.g. ``validate`` without ``--out``)."""
    if getattr(cfg, "data", None):
        check_benchmark_dir(cfg.data)
    if stage not in OUTPUTS:
        return None
    name, how, recognise = OUTPUTS[stage]
    target = getattr(cfg, name, None)
    if not target:
        return None
    overwrite = overwrite or bool(getattr(cfg, "overwrite", False))
    option = f"--{name}"
    if how == "file":
        out = check_output_file(target, output_kind(stage), recognise=recognise, inputs=_inputs(cfg),
                                overwrite=overwrite, option=option)
        side = out.with_name(out.name.removesuffix(".jsonl") + ".config.json")
        if stage == "predicates":
            check_output_file(side, "stage config", recognise=json_with_keys("config"), inputs=_inputs(cfg),
                              overwrite=overwrite, option=f"{option}'s sidecar")
        return out
    if how == "atomic":
        return check_output_dir(target, output_kind(stage), inputs=_inputs(cfg), overwrite=overwrite,
                                recognise=recognise, option=option)
    return claim_dir(target, output_kind(stage), inputs=_inputs(cfg), overwrite=overwrite, recognise=recognise,
                     option=option)
