"""One argument convention for every command (DESIGN.md, issue 14): flag name = YAML key = field name.

Walks every command and sub-command of every CLI: the typer apps of ``python -m eval``, ``retrieval`` (with
``retrieval canon``, ``lftr``, ``encoder``) and ``forecasters`` (introspected through ``typer.main.get_command``),
the argparse commands of ``python -m distill`` (the stages' `transformers.HfArgumentParser`, ``distill train``'s
`trl.TrlParser`, ``recipe``) and the ``psr`` console script. For each one:

- ``--help`` exits 0;
- every long option is lowercase kebab-case (``--max-tokens``), or the snake_case alias that HfArgumentParser / TRL
  register beside the kebab-case spelling of the same option (``--max_tokens``);
- where a command's options set the fields of a config dataclass (`CONFIG_COMMANDS`, every distill stage), each
  option outside `NOT_FIELDS` is the kebab spelling of a field (``--no-X`` of a boolean field X counts as X), and
  the parameter it fills is that field.

`test_the_checks_catch_bad_flags` runs the same checks on a deliberately wrong command, so they can fail.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass

import pytest
import typer
import typer.main

from tests.cli_run import run_cli

KEBAB = re.compile(r"--[a-z0-9]+(?:-[a-z0-9]+)*")
#: Options a command may have beside its config's fields: they steer the job, they are not part of the config.
NOT_FIELDS = frozenset({"--help", "--config", "--overwrite", "--verbose", "--debug"})
TYPER_APPS = {"eval": "eval.cli:app", "retrieval": "retrieval.cli:app", "forecasters": "forecasters.cli:app"}
#: Typer commands whose options set the fields of a config dataclass (the command builds it from ``ctx.params``).
CONFIG_COMMANDS = {("forecasters", "run"): "forecasters.runner:RunConfig"}


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _walk(cmd, path: tuple[str, ...]):
    """``(path, command)`` of a click command and of every command below it (groups included)."""
    yield path, cmd
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(None):
            yield from _walk(cmd.get_command(None, name), (*path, name))


def _typer_commands() -> list[tuple[tuple[str, ...], object]]:
    out = []
    for package, spec in TYPER_APPS.items():
        out += list(_walk(typer.main.get_command(_load(spec)), (package,)))
    return out


TYPER_COMMANDS = dict(_typer_commands())


def _long_options(param) -> list[str]:
    return [o for o in [*param.opts, *param.secondary_opts] if o.startswith("--")]


def style_problems(option_groups: list[list[str]]) -> list[str]:
    """Options that are neither kebab-case nor the snake_case alias of a kebab-case option of the same group (one
    group: the spellings of one parameter / argparse action)."""
    bad = []
    for group in option_groups:
        for o in group:
            if KEBAB.fullmatch(o):
                continue
            twin = o.replace("_", "-")
            if not (o == o.lower() and twin in group and KEBAB.fullmatch(twin)):
                bad.append(o)
    return bad


def field_problems(options: dict[str, str], fields: set[str]) -> list[str]:
    """``options``: long option -> the name of the parameter it fills. Every option outside `NOT_FIELDS` must be the
    kebab (or snake alias) spelling of a field, ``--no-`` of a boolean field included, and fill that field."""
    bad = []
    for opt, dest in options.items():
        if opt in NOT_FIELDS:
            continue
        name = opt[2:].replace("-", "_")
        if name not in fields and name.startswith("no_") and name[3:] in fields:
            name = name[3:]
        if name not in fields:
            bad.append(f"{opt}: no field {name!r}")
        elif dest != name:
            bad.append(f"{opt}: sets {dest!r}, not the field {name!r}")
    return bad


def typer_problems(cmd, config: type | None = None) -> list[str]:
    groups = [_long_options(p) for p in cmd.params]
    bad = [f"{o}: not kebab-case" for o in style_problems(groups)]
    if config is not None:
        options = {o: p.name for p in cmd.params for o in _long_options(p)}
        bad += field_problems(options, {f.name for f in dataclasses.fields(config)})
    return bad


def argparse_problems(parser, config: type | None = None) -> list[str]:
    actions = [a for a in parser._actions if a.option_strings]
    bad = [f"{o}: not kebab-case" for o in style_problems([[o for o in a.option_strings if o.startswith("--")]
                                                           for a in actions])]
    if config is not None:
        options = {o: a.dest for a in actions for o in a.option_strings if o.startswith("--")}
        bad += field_problems(options, {f.name for f in dataclasses.fields(config)})
        flags = {o for a in actions for o in a.option_strings}
        bad += [f"field {f.name}: no --{f.name.replace('_', '-')}" for f in dataclasses.fields(config)
                if f"--{f.name.replace('_', '-')}" not in flags]
    return bad


# --- typer apps: eval, retrieval (canon, lftr, encoder), forecasters ----------------------------------------------

@pytest.mark.parametrize("path", sorted(TYPER_COMMANDS), ids=" ".join)
def test_typer_options_are_kebab_case_and_name_config_fields(path):
    config = _load(CONFIG_COMMANDS[path]) if path in CONFIG_COMMANDS else None
    assert typer_problems(TYPER_COMMANDS[path], config) == []


#: LFTR's commands: the config (`LFTRConfig`) comes from YAML files and ``--set key=value``; the options they have
#: beside those are fields of it (spelled as the field), except the job's own inputs and steering options.
LFTR_COMMANDS = {("retrieval", "lftr", "train"): {"--data", "--out", "--set", "--stop-after"},
                 ("retrieval", "lftr", "seeds"): {"--data", "--out", "--set", "--seeds", "--split"}}


@pytest.mark.parametrize("path", sorted(LFTR_COMMANDS), ids=" ".join)
def test_lftr_options_name_config_fields(path):
    from retrieval.lftr.config import LFTRConfig

    cmd = TYPER_COMMANDS[path]
    options = {o: p.name for p in cmd.params for o in _long_options(p) if o not in LFTR_COMMANDS[path]}
    assert "--target-space" in options
    assert field_problems({o: d for o, d in options.items() if o != "--space"},  # --space: the retrieval-wide alias
                          {f.name for f in dataclasses.fields(LFTRConfig)}) == []


@pytest.mark.parametrize("path", sorted(TYPER_COMMANDS), ids=" ".join)
def test_typer_help_exits_0(path):
    res = run_cli(path[0], *path[1:], "--help")
    assert res.code == 0, res.text[-2000:]
    assert "Usage" in res.text


def test_every_config_command_is_walked():
    assert set(CONFIG_COMMANDS) <= set(TYPER_COMMANDS)
    assert ("retrieval", "canon", "apply") in TYPER_COMMANDS and ("forecasters", "probes", "synonyms") in TYPER_COMMANDS


# --- distill: stage parsers (HfArgumentParser), train (TrlParser), recipe -------------------------------------------

def _stages() -> dict[str, str]:
    from distill.stages import COMMANDS

    return {name: c.config for name, c in COMMANDS.items() if name not in ("train", "recipe")}


@pytest.mark.parametrize("stage", sorted(_stages()))
def test_distill_stage_flags_are_its_config_fields(stage):
    from distill.config import stage_parser

    cls = _load(_stages()[stage])
    assert argparse_problems(stage_parser(cls, f"python -m distill {stage}", ""), cls) == []


def test_distill_recipe_flags_are_its_fields():
    """``distill recipe`` has its own parser (its ``--config`` is a field: the preset every stage reads)."""
    from distill.recipe import RecipeArgs, make_parser

    assert argparse_problems(make_parser(), RecipeArgs) == []


def _help_options(text: str) -> list[list[str]]:
    """The option spellings of an argparse help text's option lines (``  --a-b X, --a_b X``), one group a line."""
    groups = []
    for line in text.splitlines():
        m = re.match(r"\s{2}(-{1,2}\w.*?)(?:\s{2,}|$)", line)
        if m:
            groups.append([w.split()[0] for w in m.group(1).split(", ") if w.startswith("--")])
    return groups


@pytest.mark.parametrize("command", ["predicates", "validate", "narrate", "sft", "faithfulness", "counterfactuals",
                                     "rationale-stats", "answers", "merge", "recipe"])
def test_distill_help_exits_0_and_shows_kebab_options(command):
    from distill.stages import COMMANDS

    assert command in COMMANDS
    res = run_cli("distill", command, "--help")
    assert res.code == 0, res.text[-2000:]
    groups = _help_options(res.out)
    assert groups and style_problems(groups) == []


def test_every_distill_command_is_covered():
    from distill.stages import COMMANDS

    covered = set(_stages()) | {"train", "recipe"}
    assert covered == set(COMMANDS)


@pytest.mark.slow
def test_distill_train_flags_follow_the_convention():
    from distill.train_args import make_parser

    assert argparse_problems(make_parser()) == []
    res = run_cli("distill", "train", "--help")
    assert res.code == 0, res.text[-2000:]
    assert style_problems(_help_options(res.out)) == []


def test_distill_help_lists_the_commands():
    res = run_cli("distill", "--help")
    assert res.code == 0 and "commands:" in res.out


# --- psr ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["--help"], ["env", "--help"], ["distill", "--help"]])
def test_psr_help_exits_0(argv, capsys):
    from eval.console import main

    assert main(argv) == 0
    assert style_problems(_help_options(capsys.readouterr().out)) == []


# --- the checks can fail ---------------------------------------------------------------------------------------------

@dataclass
class _Config:
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    progress: bool = True


def test_the_checks_catch_bad_flags():
    app = typer.Typer(add_completion=False)

    @app.command()
    def run(tensor_parallel_size: int = typer.Option(1, "--tp"),
            gpu_memory_utilization: float = typer.Option(0.9, "--gpu_memory_utilization"),
            progress: bool = typer.Option(True, "--progress/--no-progress"),
            threads: int = typer.Option(1, "--threads"),
            config: str = typer.Option(None, "--config")) -> None:
        ...

    problems = typer_problems(typer.main.get_command(app), _Config)
    assert problems == ["--gpu_memory_utilization: not kebab-case", "--tp: no field 'tp'",
                        "--threads: no field 'threads'"]

    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--tensor-parallel-size", "--tensor_parallel_size", dest="tensor_parallel_size")
    ap.add_argument("--gpu_mem", dest="gpu_memory_utilization")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    assert argparse_problems(ap, _Config) == ["--gpu_mem: not kebab-case", "--gpu_mem: no field 'gpu_mem'",
                                              "field gpu_memory_utilization: no --gpu-memory-utilization",
                                              "field progress: no --progress"]
