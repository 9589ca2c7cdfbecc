"""A stage's command line from its config dataclass (`distill.config.to_argv`): every stage config reads back the
config it was written from, the recipe's stage commands are built from the stages' configs and parse to them, every
distill command shows the kebab-case spelling of its flags first, and the recipe writes only into a folder it
marked itself."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from distill.config import _allowed, build, parse, stage_parser, to_argv
from distill.stages import COMMANDS, config_class

REPO = Path(__file__).resolve().parents[2]
STAGES = sorted(c for c in COMMANDS if c not in ("recipe", "train"))


def _example(tp) -> object:
    """A value of the annotation ``tp`` for a required field."""
    allowed = _allowed(tp)
    if list in allowed:
        return [1, 2] if typing.get_args(tp) and int in _allowed(typing.get_args(tp)[0]) else ["a.jsonl", "b.jsonl"]
    return 3 if int in allowed else 0.5 if float in allowed else "x"


def _others(f: dataclasses.Field, tp) -> list[object]:
    """Values other than the default of the field ``f`` (some may be refused by the config's checks)."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    allowed = _allowed(tp)
    out: list[object] = [None] if type(None) in allowed and default is not None else []
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int) or (default is None and int in allowed):
        out.append((default or 0) + 2)
    if isinstance(default, float) or (default is None and float in allowed and int not in allowed):
        out.append((default or 0.0) / 2 + 0.25)
    if default is None and str in allowed:
        out.append("some/path")
    if default is None and list in allowed:
        out.append(["p", "q"])
    return out


def _config(cls):
    """An instance of ``cls`` with its required fields set and as many others as it accepts moved off their
    defaults."""
    hints = typing.get_type_hints(cls)
    values = {f.name: _example(hints[f.name]) for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    cfg = build(cls, values, "test")
    for f in dataclasses.fields(cls):
        for v in _others(f, hints[f.name]):
            try:
                cfg = build(cls, {**values, f.name: v}, "test")
            except Exception:  # noqa: BLE001 - a value the config's checks refuse: try the next one
                continue
            values[f.name] = v
            break
    return cfg, values


@pytest.mark.parametrize("command", STAGES)
def test_every_stage_config_reads_back_from_its_argv(command):
    cls = config_class(command)
    cfg, values = _config(cls)
    moved = [f.name for f in dataclasses.fields(cls) if f.name in values]
    assert len(moved) > len([f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING])
    argv = to_argv(cfg)
    assert parse(cls, COMMANDS[command].section, argv, prog=command, description="") == cfg, argv
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and
                f.default_factory is dataclasses.MISSING]
    some = required + [n for n in moved if n not in required][:1]  # the others: the config's defaults
    part = parse(cls, COMMANDS[command].section, to_argv(cfg, some), prog=command, description="")
    assert part == build(cls, {k: values[k] for k in some}, "test")


def test_recipe_and_train_arguments_read_back_from_their_argv():
    from distill.recipe import RecipeArgs, make_parser
    from distill.train_args import PSRTrainArgs, parse_train_args

    args = RecipeArgs(data="d", out="o", accelerate=None, num_processes=2, seeds=[0, 1], budgets=["steps:4"],
                      cpu_demo=True, max_tokens=64, dry_run=True)
    assert make_parser().parse_args_into_dataclasses(args=to_argv(args)) == (args,)
    psr = PSRTrainArgs(dataset_name="sets/cot", dataset_test_split=None, drop_overlong=True, max_train_samples=5,
                       snapshot_steps=[2, 4], eval_answer_accuracy=False, quant_skip_modules=["lm_head"])
    read, sft, model = parse_train_args([*to_argv(psr, snake=True), "--model_name_or_path", "m", "--output_dir", "o"])
    assert read == psr and to_argv(PSRTrainArgs(), snake=True)[:2] == ["--dataset_name", "null"]


def test_null_sets_optional_fields_to_none():
    cls = config_class("answers")
    cfg = parse(cls, "answers", ["--data", "d", "--phrases", "a.jsonl", "--out", "o", "--names", "null", "--pairs",
                                 "a:b", "--reference", "none"], prog="answers", description="")
    assert (cfg.names, cfg.pairs, cfg.reference) == (None, ["a:b"], None)
    assert to_argv(cfg, ["names", "reference"]) == ["--names", "null", "--reference", "null"]


def test_values_without_a_command_line_form_are_errors():
    from distill.train_args import train_argv

    with pytest.raises(ValueError, match="no field"):
        to_argv(config_class("leaks")(data="d", predicates="p", out="o"), ["no_such_field"])
    with pytest.raises(ValueError, match="empty list"):
        to_argv(config_class("answers")(data="d", phrases=[], out="o"))
    with pytest.raises(ValueError, match="not a field"):
        train_argv(model="m")


def test_train_flags_the_recipe_sets_are_written_without_importing_trl():
    """`train_argv`'s TRL-free path: each name of `TRL_SCALAR_FIELDS` is a scalar field of the TRL class it names, the
    flags equal those written from TRL's own fields, and a fresh interpreter writing the recipe's flags never imports
    TRL (a recipe rerun that only skips would pay its import)."""
    import subprocess
    import sys

    from trl import ModelConfig, SFTConfig

    from distill.config import field_argv
    from distill.train_args import TRL_SCALAR_FIELDS, train_argv

    classes = {"ModelConfig": ModelConfig, "SFTConfig": SFTConfig}
    values = {"model_name_or_path": "m/x", "dataset_name": "sft/cot", "output_dir": "out/cot", "max_steps": 7}
    assert set(TRL_SCALAR_FIELDS) <= set(values)
    for name, cls in TRL_SCALAR_FIELDS.items():
        f = {f.name: f for f in dataclasses.fields(classes[cls])}[name]
        assert typing.get_origin(f.type) is None and "bool" not in str(f.type) and "list" not in str(f.type), f
        assert field_argv(f, values[name], snake=True) == train_argv(**{name: values[name]})
    assert train_argv(**values) == ["--model_name_or_path", "m/x", "--dataset_name", "sft/cot", "--output_dir",
                                    "out/cot", "--max_steps", "7"]
    assert train_argv(use_peft=False) == ["--use_peft", "false"]  # a bool of TRL's: through TRL's fields
    code = ("import sys; from distill.train_args import train_argv; "
            f"train_argv(**{values!r}); print(sorted(m for m in sys.modules if m.split('.')[0] == 'trl'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("preset", [None, "configs/distill/evidence-cpu.yaml"])
def test_recipe_stage_commands_are_built_from_the_stage_configs(tmp_path, preset):
    """Each ``python -m distill`` stage of a plan carries the config its flags set, and the stage's own parser,
    reading the stage's argv (its preset included), resolves those fields to the same values."""
    from distill.config import load_section
    from distill.recipe import parse_recipe_args, plan, resolve_inputs
    from distill.train_args import parse_train_args

    flags = ["--cpu-demo", "--out", str(tmp_path / "out"), "--seeds", "0", "1", "--budgets", "steps:2",
             "--leaks-limit", "2", "--top-states", "5", "--narrator", "template", "--teacher-url", "http://h/v1"]
    args = parse_recipe_args(flags + (["--config", str(REPO / preset)] if preset else []))
    stages = plan(args, resolve_inputs(args))
    checked = set()
    for s in stages:
        if s.argv[1:3] == ["-m", "distill"]:
            command, rest = s.argv[3], s.argv[4:]
            cls = config_class(command)
            assert isinstance(s.config, cls), s.name
            read = parse(cls, COMMANDS[command].section, rest, prog=command, description="")
            section = load_section(args.config, COMMANDS[command].section) if "--config" in rest else {}
            passed = {f.name: getattr(s.config, f.name) for f in dataclasses.fields(cls)
                      if {f"--{f.name.replace('_', '-')}", f"--no-{f.name.replace('_', '-')}"} & set(rest)}
            assert passed and read == build(cls, {**section, **passed}, "test"), s.name
            checked.add(command)
        elif "distill.train" in s.argv:
            rest = s.argv[s.argv.index("distill.train") + 1:]
            psr, sft, model = parse_train_args(rest)
            assert (model.model_name_or_path, psr.dataset_name) == (args.model or str(tmp_path / "out" / (
                "tiny-student" if args.student_input == "evidence" else "tiny-qwen3-vl")), rest[rest.index(
                    "--dataset_name") + 1])
            checked.add("train")
    expected = {"predicates", "narrate", "rationale-stats", "sft", "leaks", "study"}
    expected |= {"tiny-student"} if preset else {"answers", "faithfulness", "train"}
    assert checked == expected
    narrate = {s.name: s.config for s in stages if s.name.startswith("narrate-")}
    assert narrate["narrate-train"].base_url == "http://h/v1" and narrate["narrate-test"].narrator == "template"


def test_a_wrong_stage_value_fails_when_the_recipe_plans(tmp_path):
    from distill.recipe import parse_recipe_args, plan, resolve_inputs
    from eval.io import FormatError

    args = parse_recipe_args(["--cpu-demo", "--out", str(tmp_path / "out"), "--narrator", "oracle"])
    with pytest.raises(FormatError, match="stage narrate-train.*narrator"):
        plan(args, resolve_inputs(args))


def _parsers():
    from distill.recipe import make_parser as recipe_parser
    from distill.train_args import make_parser as train_parser

    yield "recipe", recipe_parser()
    yield "train", train_parser()
    for command in STAGES:
        yield command, stage_parser(config_class(command), command, "")


def test_every_distill_command_shows_kebab_case_first_and_reads_snake_case():
    for command, parser in _parsers():
        for a in parser._actions:
            longs = [o for o in a.option_strings if o.startswith("--")]
            if any("-" in o[2:] for o in longs):
                assert "_" not in a.option_strings[0], (command, a.option_strings)
    from distill.recipe import make_parser

    parser = make_parser()
    assert "--num-processes NUM_PROCESSES, --num_processes NUM_PROCESSES" in parser.format_help()
    (args,) = parser.parse_args_into_dataclasses(args=["--num_processes", "2", "--forecast_backend", "hf"])
    assert (args.num_processes, args.forecast_backend) == (2, "hf")


def test_the_recipe_writes_only_into_a_folder_it_marked(tmp_path):
    from distill.recipe import OUTPUT_KIND, RecipeArgs, claim_out
    from eval.errors import OutputRefused
    from eval.outputs import read_marker

    out = tmp_path / "out"
    (out / "rationales").mkdir(parents=True)
    (out / "predicates.jsonl").write_text("{}\n")
    with pytest.raises(OutputRefused, match="not written by this toolkit"):
        claim_out(RecipeArgs(out=str(out)))  # names a recipe writes, but no marker: not ours
    assert read_marker(out) is None
    claim_out(RecipeArgs(out=str(out), overwrite=True))
    assert read_marker(out)["kind"] == OUTPUT_KIND
    claim_out(RecipeArgs(out=str(out)))  # marked by a recipe: resumed
