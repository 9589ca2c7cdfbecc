"""The distill commands, one registry: each command's config dataclass, the function that runs it, its section of a
preset (``configs/distill/*.yaml``) and its one-line help. `distill.cli` dispatches from it and `distill.recipe`
builds each stage's argv from the same config classes; adding a stage is one `Command` here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One ``python -m distill <name>`` command. ``config`` and ``run`` are ``module:attribute`` (imported on use, so
    ``--help`` stays fast); ``run`` is None for the commands with their own parser and main (``train``, ``recipe``);
    ``section`` is the key of its settings in a preset (None: the command reads no section)."""

    config: str
    help: str
    run: str | None = None
    section: str | None = None


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


COMMANDS: dict[str, Command] = {
    "predicates": Command("distill.predicates:PredicatesConfig",
                          "oracle -> qualitative predicates (JSONL), one set per query",
                          "distill.predicates:write_predicates", "predicates"),
    "validate": Command("distill.validator:ValidateConfig",
                        "check a rationale file for numbers, leaks, length, answer line",
                        "distill.validator:validate_file", "validate"),
    "narrate": Command("distill.narrate:NarrateConfig",
                       "predicates -> validated rationales (teacher or template narrator)",
                       "distill.narrate:run_narration", "narrate"),
    "sft": Command("distill.sft:SFTBuildConfig", "rationales -> CoT and answer-only SFT datasets (TRL VLM format)",
                   "distill.sft:build_sft", "sft"),
    "train": Command("distill.train_args:PSRTrainArgs",
                     "LoRA / QLoRA SFT of a student: TRL's flags (same as python -m distill.train)",
                     section="train"),
    "faithfulness": Command("distill.faithfulness:FaithfulnessConfig",
                            "SCOTT-style check: perturb rationales, watch answers",
                            "distill.faithfulness:run_faithfulness", "faithfulness"),
    "counterfactuals": Command("distill.faithfulness:CounterfactualsConfig",
                               "counterfactual predicate sets (consistent evidence for another answer), for narration",
                               "distill.faithfulness:write_counterfactuals", "counterfactuals"),
    "rationale-stats": Command("distill.rationale_stats:RationaleStatsConfig",
                               "answer restatements, leakage probes (string match, classifier) and validator rejects",
                               "distill.rationale_stats:rationale_stats", "rationale_stats"),
    "answers": Command("distill.answers:AnswersConfig",
                       "answer accuracy of phrase files (exact and snapped reads), every pair compared with a "
                       "bootstrap by video", "distill.answers:compare_answers", "answers"),
    "merge": Command("distill.merge:MergeConfig", "merge a LoRA adapter into bf16 base weights (never into 4-bit)",
                     "distill.merge:merge_adapter", "merge"),
    "tiny-student": Command("distill.tiny_student:TinyStudentConfig",
                            "a tiny config-built causal LM whose tokenizer fits an SFT set (the CPU evidence student)",
                            "distill.tiny_student:build_tiny_student", "tiny_student"),
    "study": Command("distill.study:StudyConfig",
                     "three students at equal budget over seeds: exact and motion-class accuracy with "
                     "video-clustered CIs, faithfulness against its floors", "distill.study:run_study", "study"),
    "leaks": Command("distill.leaks:LeaksConfig",
                     "the validator's catch rates on injected and on held-out, differently worded leaks, and its "
                     "false rejections of honest paraphrases", "distill.leaks:run_leaks", "leaks"),
    "recipe": Command("distill.recipe:RecipeArgs",
                      "the whole recipe, resumable: predicates -> narration -> SFT sets -> students -> forecasts -> "
                      "retrieval -> report, answers, faithfulness"),
}


def config_class(command: str) -> type:
    """The config dataclass of ``command``."""
    return _load(COMMANDS[command].config)


def runner(command: str) -> Callable:
    """The function that runs ``command`` on its parsed config (a stage with its own main has none)."""
    spec = COMMANDS[command].run
    if spec is None:
        raise KeyError(f"{command!r} has its own main, not a stage runner")
    return _load(spec)
