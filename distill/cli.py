"""Command line of the `distill` package: ``python -m distill <command> [--config PRESET] [--<field-name> VALUE ...]``.

Every command is one stage of the recipe with a config dataclass, parsed by `transformers.HfArgumentParser`
(`distill.config.parse`): ``--config`` reads the stage's section of a preset (``configs/distill/*.yaml``) and
``--<field-name> VALUE`` (or ``--<field_name>``) overrides any field (``python -m distill <command> --help``).
``train`` is parsed by `trl.TrlParser` (`distill.train_args`): TRL's flags, and ``--config`` a preset or a flat
TRL-style YAML.
Every stage checks ``--data`` and its output before it runs (`distill.outputs`: ``--overwrite`` replaces an output
this toolkit did not write for the stage; never an input). Errors print one line (`eval.cli_support`; ``--debug``
shows the traceback). Exit codes: 0 done, 1 check failed (``validate``), 2 bad input.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict, is_dataclass

COMMANDS: dict[str, tuple[str, str]] = {
    "predicates": ("distill.predicates:PredicatesConfig", "oracle -> qualitative predicates (JSONL), one set per query"),
    "validate": ("distill.validator:ValidateConfig", "check a rationale file for numbers, leaks, length, answer line"),
    "narrate": ("distill.narrate:NarrateConfig", "predicates -> validated rationales (teacher or template narrator)"),
    "sft": ("distill.sft:SFTBuildConfig", "rationales -> CoT and answer-only SFT datasets (TRL VLM format)"),
    "train": ("distill.train_args:PSRTrainArgs", "LoRA / QLoRA SFT of a student: TRL's flags (same as python -m "
                                                 "distill.train)"),
    "faithfulness": ("distill.faithfulness:FaithfulnessConfig", "SCOTT-style check: perturb rationales, watch answers"),
    "counterfactuals": ("distill.faithfulness:CounterfactualsConfig",
                        "counterfactual predicate sets (consistent evidence for another answer), for narration"),
    "rationale-stats": ("distill.rationale_stats:RationaleStatsConfig",
                        "answer restatements, leakage probes (string match, classifier) and validator rejects"),
    "answers": ("distill.answers:AnswersConfig", "answer accuracy of phrase files (exact and snapped reads), every "
                                                 "pair compared with a bootstrap by video"),
    "merge": ("distill.merge:MergeConfig", "merge a LoRA adapter into bf16 base weights (never into 4-bit)"),
    "tiny-student": ("distill.tiny_student:TinyStudentConfig",
                     "a tiny config-built causal LM whose tokenizer fits an SFT set (the CPU evidence student)"),
    "study": ("distill.study:StudyConfig", "three students at equal budget over seeds: exact and motion-class "
                                           "accuracy with video-clustered CIs, faithfulness against its floors"),
    "leaks": ("distill.leaks:LeaksConfig", "the validator's catch rates on injected and on held-out, differently "
                                           "worded leaks, and its false rejections of honest paraphrases"),
    "recipe": ("distill.recipe:RecipeArgs", "the whole recipe, resumable: predicates -> narration -> SFT sets -> "
                                            "students -> forecasts -> retrieval -> report, answers, faithfulness"),
}
SECTIONS = {"predicates": "predicates", "validate": "validate", "narrate": "narrate", "sft": "sft", "train": "train",
            "faithfulness": "faithfulness", "answers": "answers", "merge": "merge",
            "counterfactuals": "counterfactuals", "rationale-stats": "rationale_stats", "tiny-student": "tiny_student",
            "study": "study", "leaks": "leaks"}


def config_class(command: str) -> type:
    """The config dataclass of ``command`` (`COMMANDS`)."""
    import importlib

    module, name = COMMANDS[command][0].split(":")
    return getattr(importlib.import_module(module), name)


def _runner(command: str) -> Callable:
    if command == "predicates":
        from distill.predicates import write_predicates
        return write_predicates
    if command == "validate":
        from distill.validator import validate_file
        return validate_file
    if command == "narrate":
        from distill.narrate import run_narration
        return run_narration
    if command == "sft":
        from distill.sft import build_sft
        return build_sft
    if command == "faithfulness":
        from distill.faithfulness import run_faithfulness
        return run_faithfulness
    if command == "counterfactuals":
        from distill.faithfulness import write_counterfactuals
        return write_counterfactuals
    if command == "rationale-stats":
        from distill.rationale_stats import rationale_stats
        return rationale_stats
    if command == "answers":
        from distill.answers import compare_answers
        return compare_answers
    if command == "merge":
        from distill.merge import merge_adapter
        return merge_adapter
    if command == "tiny-student":
        from distill.tiny_student import build_tiny_student
        return build_tiny_student
    if command == "study":
        from distill.study import run_study
        return run_study
    if command == "leaks":
        from distill.leaks import run_leaks
        return run_leaks
    raise KeyError(command)


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name.ljust(width)}  {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m distill ARGV``: the exit code; errors print one line (`eval.cli_support.run_main`)."""
    from eval.cli_support import run_main

    return run_main(_main, argv)


def _main(argv: list[str]) -> int:
    from distill.config import parse
    from distill.outputs import stage_output, with_overwrite
    from eval.errors import EXIT_CHECK_FAILED, EXIT_USER_ERROR

    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return EXIT_USER_ERROR
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if command == "recipe":
        from distill.recipe import main as recipe_main
        return recipe_main(rest)
    if command == "train":
        from distill.train import main as train_main
        return train_main(rest)
    cls = config_class(command)
    rest, overwrite = with_overwrite(cls, rest)
    cfg = parse(cls, SECTIONS[command], rest, prog=f"python -m distill {command}",
                description=COMMANDS[command][1] + "\n\n" + (cls.__doc__ or ""))
    with stage_output(command, cfg, overwrite):
        result = _runner(command)(cfg)
    if is_dataclass(result):
        result = asdict(result)
    if command == "validate":
        shown = {k: v for k, v in result.items() if k != "rejections"}
        print(json.dumps(shown, indent=2))
        for r in result["rejections"][:20]:
            print(f"{r['query_id']}: " + "; ".join(f"{x['code']}: {x['detail']}" for x in r["reasons"]))
        return EXIT_CHECK_FAILED if result["rejected"] else 0
    print(json.dumps(result, indent=2, default=str))
    return 0
