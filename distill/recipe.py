"""The chain-of-thought distillation recipe end to end, as one resumable job: ``python -m distill recipe``.

DynaPix §5.1 applied to PSR: predicates -> narration (train, val; test for the leakage probe) -> rationale statistics
-> SFT sets -> CoT, answer-only and trajectory-labels students -> forecasts of the test split by the zero-shot base
and the three students -> retrieval (plain and snapped) -> ``eval report`` (against the zero-shot base, and CoT
against the answer-only control) -> answer accuracy (every pair, bootstrap by video) -> faithfulness of the CoT
student. Every stage is a subprocess running a toolkit command (`plan` builds them; a ``python -m distill`` stage's
flags are written from its config dataclass, `distill_stage`), so training goes through
``accelerate launch`` (``python -m accelerate.commands.launch``) with any accelerate config and process count, and
the forecasts through vLLM's own venv.

GPU (student 8B, teacher Qwen3-32B through in-process vLLM)::

    python -m distill recipe --data data/psr --out runs/distill-8b --config configs/distill/qwen3-vl-8b.yaml \\
        --accelerate configs/accelerate/single_gpu.yaml [--num-processes 4]

CPU demo (tiny random Qwen3-VL, noisy template narrator, a few QLoRA steps, a handful of test queries)::

    python -m distill recipe --cpu-demo --out reports/distill-demo [--data data/psr-synth]

Arguments: `RecipeArgs`, parsed by `transformers.HfArgumentParser` (flag = YAML key = field name; ``--num-processes``,
the spelling ``--help`` shows, or ``--num_processes``). ``--config`` is the distillation preset every stage
reads its own section of; its optional ``recipe:`` section gives this command's defaults, so precedence is
``RecipeArgs`` defaults < the preset's ``recipe:`` section < flags. ``--cpu-demo`` makes
``configs/distill/tiny-cpu.yaml`` the default preset (its ``recipe:`` section holds the demo's settings), runs offline
and builds a synthetic benchmark (`DEMO_SYNTH`) and a tiny Qwen3-VL under ``--out`` when ``--data`` / ``--model`` are not
given.

Each stage prints and logs its exact command line; its output goes to the console and to ``<out>/logs/<stage>.log``
(appended: a resumed stage keeps the log of the try before). A stage is skipped when its outputs are complete
(`Stage.done`), it ran with the same command before (``<out>/recipe.json``; the launcher and interpreter are not part
of the comparison; outputs without a record count as the same, and are recorded under the present command with no
seconds) and no stage it reads from ran in this invocation;
otherwise it runs, and the command itself
resumes its own partial output (narration, forecasts, training) or refuses one of another config. A stage that exits
non-zero stops the recipe with an error naming the stage, its log and the command that resumes. ``--dry-run`` prints
what would run and what would be skipped, and runs nothing.

``--jobs N`` runs up to N stages side by side, each once every stage it reads from (`Stage.after`) is done, in plan
order otherwise (`run_side_by_side`). Side by side a stage's output goes to its log only; the console gets a line as
each starts and ends. A failing stage lets the running ones finish, then stops the recipe as above; an interrupt
stops every running stage. The default, 1, runs the stages one at a time in plan order: on GPUs the training and
serving stages each want the whole device.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.cli_support import Interrupted
from eval.errors import InputError

#: The repository root: relative preset and accelerate-config paths that do not exist from the working directory are
#: looked up here (the defaults name files of the repository).
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PRESET = "configs/distill/qwen3-vl-8b.yaml"
DEMO_PRESET = "configs/distill/tiny-cpu.yaml"
SECTION = "recipe"
#: Forecast methods in table order: the zero-shot base (no adapter), then the students by their SFT variant.
METHODS: dict[str, str | None] = {"zero-shot": None, "answer-only": "answer", "trajectory-labels": "trajectory",
                                  "cot": "cot"}
FORECAST_BACKENDS = ("vllm", "hf")
STATE_FILE = "recipe.json"
OUTPUT_KIND = "distill recipe"
#: The CPU demo's benchmark when ``--data`` is not given: ``python -m eval synth`` with these settings.
DEMO_SYNTH = ("--videos", "40", "--seed", "0", "--workers", "1")


@dataclass
class RecipeArgs:
    """``python -m distill recipe``: the distillation recipe end to end (see `distill.recipe`)."""

    config: str | None = field(default=None, metadata={"help": (
        f"distillation preset (configs/distill/*.yaml): every stage reads its own section, this command its "
        f"'{SECTION}:' section [default: {DEFAULT_PRESET}; {DEMO_PRESET} with --cpu-demo]")})
    data: str | None = field(default=None, metadata={
        "help": f"benchmark directory (required unless --cpu-demo, which builds a synthetic one: python -m eval synth "
                f"{' '.join(DEMO_SYNTH)})"})
    out: str = field(default="runs/distill", metadata={"help": "output directory"})
    model: str | None = field(default=None, metadata={
        "help": "student base model, an id or a directory (default: the preset's train.model_name_or_path)"})
    accelerate: str | None = field(default="configs/accelerate/single_gpu.yaml", metadata={
        "help": "accelerate config of the training stages (configs/accelerate/*.yaml); none: plain python"})
    num_processes: int | None = field(default=None, metadata={
        "help": "accelerate processes (GPUs) [default: the accelerate config's]"})
    narrator: str | None = field(default=None, metadata={
        "help": "teacher | template | template-noisy [default: the preset's narrate.narrator]"})
    teacher_url: str | None = field(default=None, metadata={
        "help": "narrate through a served teacher (OpenAI-compatible, e.g. vllm serve Qwen/Qwen3-32B)"})
    forecast_backend: str = field(default="vllm", metadata={
        "help": "vllm (in vLLM's own venv: scripts/install_vllm.sh --gpu, or $VLLM_PY) | hf"})
    space: str = field(default="bge", metadata={"help": "semantic retrieval space"})
    space_model: str = field(default="BAAI/bge-small-en-v1.5", metadata={"help": "its text encoder"})
    limit: int | None = field(default=None, metadata={"help": "forecast only the first N test queries (smoke runs)"})
    max_tokens: int = field(default=512, metadata={"help": "student generation budget"})
    max_steps: int | None = field(default=None, metadata={
        "help": "optimizer steps per student (smoke runs) [default: the preset's train section]"})
    sft_limit: int | None = field(default=None, metadata={"help": "SFT sets: only the first N train rationales"})
    sft_eval_limit: int | None = field(default=None, metadata={
        "help": "SFT sets: only the first N validation rationales"})
    faithfulness_limit: int | None = field(default=None, metadata={
        "help": "faithfulness: N test queries, stratified by video [default: the preset's faithfulness.limit]"})
    student_input: str = field(default="frames", metadata={
        "help": "frames (the prefix frames) | evidence (the perception-solved student: the simulator's evidence at "
                "the prefix end as text, distill.evidence; trains and scores the three students with "
                "python -m distill study)"})
    top_states: int | None = field(default=None, metadata={
        "help": "closed slice: only queries whose target is one of the K most frequent train targets [default: the "
                "preset's predicates.top_states]"})
    seeds: list[int] | None = field(default=None, metadata={
        "help": "study: training seeds of every student (given with --student-input frames, the study runs too)"})
    budgets: list[str] | None = field(default=None, metadata={
        "help": "study: steps:N (equal optimizer steps) and/or epochs:E (equal epochs) [default: the study's]"})
    study_limit: int | None = field(default=None, metadata={"help": "study: score at most N test queries"})
    leaks_limit: int | None = field(default=None, metadata={
        "help": "validator catch rates (python -m distill leaks): at most N test predicate sets"})
    study_workers: int | None = field(default=None, metadata={
        "help": "study: processes training and answering students side by side, one thread each (0: one per CPU) "
                "[default: the study's, 1]"})
    study_threads: int | None = field(default=None, metadata={
        "help": "study: torch threads (default: torch's; the CPU demo runs its other stages on one thread)"})
    cpu_demo: bool = field(default=False, metadata={
        "help": f"tiny CPU variant: {DEMO_PRESET} (tiny Qwen3-VL, noisy template narrator, packaged MiniLM space, "
                "hf backend), offline; builds the benchmark and the model under --out unless given"})
    python: str | None = field(default=None, metadata={
        "help": "interpreter of the stages [default: the one running this command]"})
    overwrite: bool = field(default=False, metadata={
        "help": "write into an --out that holds something else (each stage still refuses to replace what it did "
                "not write)"})
    dry_run: bool = field(default=False, metadata={"help": "print what would run and what would be skipped"})
    jobs: int = field(default=1, metadata={
        "help": "stages run side by side, each once the stages it reads from are done (0: one per CPU; side by "
                "side, a stage's output goes to its log only) [default: 1, one at a time]"})

    def __post_init__(self):
        if self.accelerate is not None and self.accelerate.strip().lower() in ("", "none", "null"):
            self.accelerate = None
        from distill.evidence import check_input

        check_input(self.student_input)
        if self.forecast_backend not in FORECAST_BACKENDS:
            raise InputError(f"forecast_backend must be one of {list(FORECAST_BACKENDS)}, got "
                             f"{self.forecast_backend!r}")
        for name in ("num_processes", "limit", "max_steps", "sft_limit", "sft_eval_limit", "faithfulness_limit",
                     "top_states", "study_limit", "leaks_limit"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise InputError(f"{name} must be >= 1, got {v}")
        for name in ("study_workers", "jobs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_tokens < 1:
            raise InputError(f"max_tokens must be >= 1, got {self.max_tokens}")


# --- arguments ----------------------------------------------------------------------------------------------------

def make_parser():
    from transformers import HfArgumentParser

    from distill.config import HelpFormatter, accept_null, kebab_first

    parser = HfArgumentParser(RecipeArgs, prog="python -m distill recipe", description=__doc__.split("\n\n")[0],
                              formatter_class=HelpFormatter)
    return kebab_first(accept_null(parser, RecipeArgs))


def repo_path(path: str, option: str) -> str:
    """``path`` as given when it exists from the working directory, else the repository's file of that name."""
    from eval.errors import InputError

    if Path(path).exists():
        return path
    if not Path(path).is_absolute() and (ROOT / path).exists():
        return str(ROOT / path)
    raise InputError(f"{option} {path} does not exist")


def parse_recipe_args(argv: Sequence[str]) -> RecipeArgs:
    """`RecipeArgs` from defaults < the preset's ``recipe:`` section < flags (module docstring); ``config`` is set
    to the preset's path."""
    from distill.config import check, load_section
    from eval.errors import InputError
    from eval.io import FormatError

    def parse(parser) -> RecipeArgs:
        try:
            (args,) = parser.parse_args_into_dataclasses(args=list(argv))
        except ValueError as e:  # unknown flags; a __post_init__ rejecting a value
            raise InputError(f"python -m distill recipe: {e}") from None
        return args

    first = parse(make_parser())
    preset = repo_path(first.config or (DEMO_PRESET if first.cpu_demo else DEFAULT_PRESET), "--config")
    where = f"{preset} [{SECTION}]"
    section = load_section(preset, SECTION)
    if "config" in section:
        raise FormatError(where, "the preset is given by --config, not inside it", field="config")
    args = first
    if section:
        parser = make_parser()
        parser.set_defaults(**check(RecipeArgs, section, where))
        args = parse(parser)
    args.config = preset
    if args.accelerate:
        args.accelerate = repo_path(args.accelerate, "--accelerate")
    return args


# --- stages -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stage:
    """One step of the recipe: a toolkit command (``argv``), complete when ``done`` exists (and, for a forecast,
    its summary says every selected query is answered)."""

    name: str
    argv: list[str]
    done: Path
    after: tuple[str, ...] = ()  # stages whose outputs this one reads: when one of them runs, this one reruns
    quiet: bool = False  # its stdout goes to its log only (a long JSON summary)
    complete: Callable[[Path], bool] | None = None
    config: Any = field(default=None, compare=False)  # a `python -m distill` stage's config (`distill_stage`)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    @property
    def key(self) -> list[str]:
        """The command from its module on (``-m MODULE ARGS``): what a rerun must repeat to count as the same stage
        (the interpreter, and accelerate's launcher options, which do not change what a run computes, are not)."""
        last = max(i for i, a in enumerate(self.argv) if a == "-m")
        return self.argv[last:]

    def is_done(self) -> bool:
        if not self.done.is_file():
            return False
        try:
            return self.complete is None or self.complete(self.done)
        except (OSError, ValueError):
            return False


def forecast_complete(summary: Path) -> bool:
    """A forecast's ``<out stem>.summary.json`` says every selected query has an answer."""
    return json.loads(summary.read_text(encoding="utf-8")).get("complete") is True


def distill_stage(name: str, command: str, python: str, values: dict[str, Any], done: Path, *,
                  preset: str | None = None, **stage: Any) -> Stage:
    """A stage running ``python -m distill COMMAND``. ``values`` are fields of the command's config dataclass
    (`distill.stages.config_class`): they are built into it here, so a wrong name or value fails before any stage runs,
    and passed as its flags in their order (`distill.config.to_argv`); the other fields come from ``preset``'s
    section of the command (``--config PRESET``) or the config's defaults. ``stage``: the other `Stage` fields."""
    from distill.config import build, to_argv
    from distill.stages import config_class

    cfg = build(config_class(command), values, f"distill recipe, stage {name}")
    argv = [python, "-m", "distill", command, *(["--config", preset] if preset else []), *to_argv(cfg, list(values))]
    return Stage(name, argv, done, config=cfg, **stage)


def given(**values: Any) -> dict[str, Any]:
    """``values`` without those that are None: options the recipe leaves to the stage's preset or defaults."""
    return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Inputs:
    """What the stages read besides the preset: the benchmark, the student base, the preset's frame settings."""

    data: str
    model: str
    frames: int
    max_pixels: int | None
    python: str
    forecast_python: str


def resolve_inputs(args: RecipeArgs) -> Inputs:
    """The benchmark and base model (built under ``--out`` in the CPU demo unless given), the preset's SFT frame
    count and pixel cap (the zero-shot base is served with them; an adapter carries its own and must agree), and
    the interpreters. Raises `InputError` for anything missing, before any stage runs."""
    from distill.config import load_section
    from distill.sft import SFTBuildConfig
    from eval.cli_support import check_benchmark_dir
    from eval.errors import InputError

    out = Path(args.out)
    data = args.data or (str(out / "psr-synth") if args.cpu_demo else None)
    if data is None:
        raise InputError("--data is required (a benchmark directory)", fix="pass --data DIR, or --cpu-demo to build "
                                                                           "a small synthetic one")
    if args.data:
        check_benchmark_dir(args.data)
    tiny = "tiny-student" if args.student_input == "evidence" else "tiny-qwen3-vl"
    model = args.model or (str(out / tiny) if args.cpu_demo else None)
    model = model or load_section(args.config, "train").get("model_name_or_path")
    if not model:
        raise InputError(f"no student base model: {args.config} has no train.model_name_or_path",
                         fix="pass --model ID|DIR")
    defaults = {f.name: f.default for f in dataclasses.fields(SFTBuildConfig)}
    sft = {**defaults, **load_section(args.config, "sft")}
    python = args.python or sys.executable
    forecast_python = python
    if args.forecast_backend == "vllm":
        forecast_python = os.environ.get("VLLM_PY") or str(ROOT / ".venv-vllm" / "bin" / "python")
        if not os.access(forecast_python, os.X_OK):
            raise InputError(f"--forecast-backend vllm needs vLLM's venv at {forecast_python}",
                             fix="run scripts/install_vllm.sh --gpu (or set VLLM_PY), or pass --forecast-backend hf")
    return Inputs(data=data, model=model, frames=int(sft["frames"]), max_pixels=sft["max_pixels"], python=python,
                  forecast_python=forecast_python)


def plan(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """Every stage of the recipe in order (module docstring). The evidence input trains and scores its students
    with the study (`distill.study`: three students x seeds x budgets, faithfulness against its floors) instead of
    the per-student training, forecast, retrieval and report stages of the frames input."""
    if args.student_input == "evidence":
        return [*_input_stages(args, inp), *_narration_stages(args, inp), _leaks_stage(args, inp),
                _sft_stage(args, inp), *_tiny_student_stage(args, inp), _study_stage(args, inp)]
    stages = [*_input_stages(args, inp), *_narration_stages(args, inp), *_training_stages(args, inp),
              *_forecast_stages(args, inp), *_evaluation_stages(args, inp)]
    return stages + ([_leaks_stage(args, inp), _study_stage(args, inp)] if args.seeds else [])


def _input_stages(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """The CPU demo's synthetic benchmark and tiny student base, when they are not given."""
    py, stages = inp.python, []
    if args.cpu_demo and not args.data:
        stages.append(Stage("synth", [py, "-m", "eval", "synth", "--out", inp.data, *DEMO_SYNTH],
                            Path(inp.data) / "manifest.json"))
    if args.cpu_demo and not args.model and args.student_input == "frames":
        stages.append(Stage("tiny-model", [py, "-m", "forecasters", "tiny-model", "--kind", "qwen3_vl", "--out",
                                           inp.model], Path(inp.model) / "config.json"))
    return stages


def _narration_stages(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """Predicates of every split; narration of train (SFT), val (eval loss and answer accuracy while training) and
    test (deterministic template: the test side of the leakage probe); the rationale statistics. Train and val
    narrate only as many predicate sets as the SFT sets take (``sft_limit``, ``sft_eval_limit``: the first N of the
    split in the predicates file), not every one of the split."""
    py, out, cfg = inp.python, Path(args.out), args.config
    pred = str(out / "predicates.jsonl")
    teacher = given(narrator=args.narrator)
    if args.teacher_url:
        teacher.update(backend="openai", base_url=args.teacher_url)

    def narrate(split: str, name: str, narrator: dict[str, Any], limit: int | None = None) -> Stage:
        return distill_stage(f"narrate-{split}", "narrate", py,
                             {"data": inp.data, "predicates": pred, **narrator, "split": split, "out": str(out / name),
                              **given(limit=limit)},
                             out / name / "narrate.summary.json", preset=cfg, after=("predicates", "synth"))

    return [
        distill_stage("predicates", "predicates", py,
                      {"data": inp.data, "out": pred, **given(top_states=args.top_states)},
                      out / "predicates.config.json", preset=cfg, after=("synth",)),
        narrate("train", "rationales", teacher, args.sft_limit),
        narrate("val", "rationales-val", teacher, args.sft_eval_limit),
        narrate("test", "rationales-test", {"narrator": "template"}),
        distill_stage("rationale-stats", "rationale-stats", py,
                      {"data": inp.data, "rationales": [str(out / "rationales"), str(out / "rationales-test")],
                       "predicates": pred, "out": str(out / "rationale-stats")},
                      out / "rationale-stats" / "rationale_stats.md", after=("narrate-train", "narrate-test"),
                      quiet=True),
    ]


def _sft_stage(args: RecipeArgs, inp: Inputs) -> Stage:
    """The SFT sets (CoT, answer-only, trajectory-labels; train + validation) of the student input."""
    out = Path(args.out)
    return distill_stage("sft", "sft", inp.python,
                         {"data": inp.data, "rationales": str(out / "rationales"),
                          "eval_rationales": str(out / "rationales-val"), "out": str(out / "sft"),
                          "student_input": args.student_input,
                          **given(limit=args.sft_limit, eval_limit=args.sft_eval_limit)},
                         out / "sft" / "sft.summary.json", preset=args.config, after=("narrate-train", "narrate-val"))


def _tiny_student_stage(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """The CPU demo's evidence student when no ``--model`` is given: a tiny causal LM whose tokenizer fits the SFT
    set (`distill.tiny_student`)."""
    if not args.cpu_demo or args.model:
        return []
    return [distill_stage("tiny-student", "tiny-student", inp.python,
                          {"sft": str(Path(args.out) / "sft"), "out": inp.model}, Path(inp.model) / "config.json",
                          after=("sft",))]


def _leaks_stage(args: RecipeArgs, inp: Inputs) -> Stage:
    """The validator's catch rates on injected and held-out leaks of the test predicate sets (`distill.leaks`)."""
    out = Path(args.out)
    return distill_stage("leaks", "leaks", inp.python,
                         {"data": inp.data, "predicates": str(out / "predicates.jsonl"), "out": str(out / "leaks"),
                          **given(limit=args.leaks_limit)},
                         out / "leaks" / "leaks.json", after=("predicates",), quiet=True)


def _study_stage(args: RecipeArgs, inp: Inputs) -> Stage:
    """Three students x seeds x budgets, scored with video-clustered CIs, and faithfulness (`distill.study`)."""
    out = Path(args.out)
    return distill_stage("study", "study", inp.python, {
        "data": inp.data, "sft": str(out / "sft"), "predicates": str(out / "predicates.jsonl"),
        "out": str(out / "study"), "train_config": args.config, "model": inp.model,
        **given(seeds=args.seeds or None, budgets=args.budgets or None), "max_new_tokens": args.max_tokens,
        **given(limit=args.study_limit, faithfulness_limit=args.faithfulness_limit, num_threads=args.study_threads,
                workers=args.study_workers),
        "progress": False}, out / "study" / "study.json", after=("sft", "tiny-student", "tiny-model", "predicates"),
        quiet=True)


def _training_stages(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """The SFT sets (CoT, answer-only, trajectory-labels; train + validation) and one LoRA student per set, at the
    preset's effective batch on any number of processes (`distill.train_args.resolve_batch`)."""
    from distill.sft import VARIANTS
    from distill.train_args import train_argv

    py, out, cfg = inp.python, Path(args.out), args.config
    stages = [_sft_stage(args, inp)]
    if args.accelerate:
        launch = [py, "-m", "accelerate.commands.launch", "--config_file", args.accelerate,
                  *(["--num_processes", str(args.num_processes)] if args.num_processes else []), "-m", "distill.train"]
    else:
        launch = [py, "-m", "distill.train"]
    for v in VARIANTS:
        flags = train_argv(model_name_or_path=inp.model, dataset_name=str(out / "sft" / v),
                           output_dir=str(out / "students" / v), **given(max_steps=args.max_steps))
        stages.append(Stage(f"train-{v}", [*launch, "--config", cfg, *flags],
                            out / "students" / v / "adapter" / "adapter_config.json", after=("sft", "tiny-model")))
    return stages


def _forecast_stages(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """Forecasts of the test split by the zero-shot base (same prompt, no adapter) and the three students (an adapter
    carries its frames and pixel cap; the values passed here must agree with them). The vllm backend runs in vLLM's
    own venv (vLLM pins an older transformers than the toolkit's), with this checkout on PYTHONPATH (`stage_env`)."""
    out = Path(args.out)
    stages = []
    for method, variant in METHODS.items():
        adapter = ["--adapter", str(out / "students" / variant / "adapter")] if variant else []
        phrases = out / "phrases" / f"{method}.jsonl"
        stages.append(Stage(
            f"forecast-{method}",
            [inp.forecast_python, "-m", "forecasters", "run", "--data", inp.data, "--split", "test", "--forecaster",
             "student", "--backend", args.forecast_backend, "--model", inp.model, *adapter, "--frames",
             f"spaced:{inp.frames}", "--max-pixels", str(inp.max_pixels or 0), "--max-tokens", str(args.max_tokens),
             *(["--limit", str(args.limit)] if args.limit else []), "--out", str(phrases), "--no-progress"],
            phrases.with_name(f"{method}.summary.json"), after=(f"train-{variant}" if variant else "tiny-model",
                                                                "synth"),
            complete=forecast_complete))
    return stages


def _evaluation_stages(args: RecipeArgs, inp: Inputs) -> list[Stage]:
    """Retrieval of every phrase file (plain and snapped to its nearest canonical state), the comparison tables with
    paired significance (vs the zero-shot base; CoT vs the answer-only control), answer accuracy of every pair with a
    bootstrap by video, and the faithfulness of the CoT student (counterfactual evidence: does its answer move?)."""
    py, out, data, space = inp.python, Path(args.out), inp.data, args.space
    features = Path(data) / "features" / space / "meta.json"
    stages = [Stage("encode", [py, "-m", "retrieval", "encode", "--data", data, "--space", space, "--model",
                               args.space_model, "--kind", "semantic"], features, after=("synth",))]
    runs: dict[str, Path] = {}
    for method in METHODS:
        for name, extra in ((method, []), (f"{method}+snap", ["--canonicalize", "1"])):
            runs[name] = out / "runs" / f"{name}.parquet"
            stages.append(Stage(f"search-{name}", [
                py, "-m", "retrieval", "search", "--data", data, "--phrases", str(out / "phrases" / f"{method}.jsonl"),
                "--space", space, "--split", "test", "--method", name, *extra, "--out", str(runs[name])],
                runs[name], after=(f"forecast-{method}", "encode")))
    plain = list(METHODS)
    for name, methods, ref in (("report", plain, "zero-shot"), ("report-cot-vs-answer-only", plain[1:], "answer-only")):
        stages.append(Stage(name, [py, "-m", "eval", "report", *(str(runs[m]) for m in methods), "--data", data,
                                   "--out", str(out / name), "--reference", f"{ref}[{space}]"],
                            out / name / "main.md", after=tuple(f"search-{m}" for m in methods)))

    stages.append(distill_stage("answers", "answers", py, {
        "data": data, "out": str(out / "answers"), "phrases": [str(out / "phrases" / f"{m}.jsonl") for m in METHODS],
        "names": list(METHODS), "snap_runs": [f"{m}={runs[m + '+snap']}" for m in METHODS]},
        out / "answers" / "answers.md", after=(*(f"forecast-{m}" for m in METHODS),
                                                *(f"search-{m}+snap" for m in METHODS))))
    stages.append(distill_stage("faithfulness", "faithfulness", py, {
        "data": data, "model": inp.model, "adapter": str(out / "students" / "cot" / "adapter"),
        "predicates": str(out / "predicates.jsonl"), "out": str(out / "faithfulness"),
        **given(limit=args.faithfulness_limit)},
        out / "faithfulness" / "faithfulness.config.json", preset=args.config, after=("train-cot", "predicates")))
    return stages


# --- running ------------------------------------------------------------------------------------------------------

def with_source_root(pythonpath: str | None) -> str:
    """``pythonpath`` with this source checkout first (when the toolkit runs from one), so every stage runs the
    same toolkit as the recipe whatever the working directory and whatever is installed."""
    root = str(ROOT) if (ROOT / "pyproject.toml").is_file() else None
    return os.pathsep.join(p for p in (root, pythonpath) if p)


def stage_env(args: RecipeArgs) -> dict[str, str]:
    """The stages' environment: unbuffered output (logs fill as the stage runs); the CPU demo runs offline and on
    one thread per process (tiny models run fastest so on small, busy CPUs)."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = with_source_root(env.get("PYTHONPATH"))
    if args.cpu_demo:
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(k, "1")
    return env


class LiveStages:
    """The processes of the stages running side by side: `stop` signals every one and keeps any other from
    starting, whichever thread is about to start it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen] = {}
        self._stopping = False

    def start(self, name: str, argv: list[str], **popen: Any) -> subprocess.Popen | None:
        with self._lock:
            if self._stopping:
                return None
            self._procs[name] = proc = subprocess.Popen(argv, **popen)
            return proc

    def ended(self, name: str) -> None:
        with self._lock:
            self._procs.pop(name, None)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            for proc in self._procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)


def run_stage(stage: Stage, log: Path, env: dict[str, str], *, echo: bool = True,
              live: LiveStages | None = None) -> tuple[int, float]:
    """Run ``stage``, its output copied to the console (when ``echo`` and the stage is not quiet) and appended to
    ``log``; its exit code and CPU seconds (its processes, all threads). With ``live`` (side by side) the stage's
    process starts through it, and not at all once it is stopping (exit code -SIGTERM)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "env": env}
    with open(log, "ab") as f:
        f.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {stage.command}\n".encode())
        f.flush()
        proc = subprocess.Popen(stage.argv, **popen) if live is None else live.start(stage.name, stage.argv, **popen)
        if proc is None:
            f.write(b"=== not started: the recipe was interrupted\n")
            return -signal.SIGTERM, 0.0
        try:
            while chunk := proc.stdout.read1(1 << 16):
                f.write(chunk)
                f.flush()
                if echo and not stage.quiet:
                    sys.stdout.write(decode.decode(chunk))
                    sys.stdout.flush()
        except BaseException:  # interrupted (eval.cli_support.Interrupted): stop the stage, let it clean up
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            raise
        finally:
            rc, cpu = reap(proc)
            if live is not None:
                live.ended(stage.name)
            f.write(f"=== exit {rc}\n".encode())
    return rc, cpu


def reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for ``proc``: its exit code and CPU seconds (its own and its waited-for children's, from ``wait4``)."""
    while True:
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:  # already reaped
            return proc.wait(), 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


class RecipeState:
    """``<out>/recipe.json``: the resolved arguments, per finished stage its command, key and duration, and the wall
    seconds of the last invocation that ran stages."""

    def __init__(self, path: Path, args: RecipeArgs):
        self.path = path
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        self.stages: dict[str, Any] = old.get("stages", {})
        self.last_run: dict[str, Any] | None = old.get("last_run")
        self.config = dataclasses.asdict(args)

    def key(self, name: str) -> list[str] | None:
        return (self.stages.get(name) or {}).get("key")

    def finished(self, stage: Stage, seconds: float, cpu_seconds: float | None = None) -> None:
        self.stages[stage.name] = {"command": stage.command, "key": stage.key, "seconds": round(seconds, 1),
                                   "cpu_seconds": None if cpu_seconds is None else round(cpu_seconds, 1),
                                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.write()

    def adopt(self, stage: Stage) -> None:
        """Record a skipped stage whose outputs are complete but that has no record (it finished just before an
        interrupt reached the recipe, say) under its present command, with no seconds: a later change of its
        command then reruns it."""
        if self.key(stage.name) is None:
            self.stages[stage.name] = {"command": stage.command, "key": stage.key, "seconds": None,
                                       "cpu_seconds": None, "finished": None}
            self.write()

    def ran(self, stages: list[str], seconds: float, jobs: int) -> None:
        """Record the wall seconds of an invocation that ran ``stages`` (``jobs`` at a time)."""
        self.last_run = {"stages": stages, "seconds": round(seconds, 1), "jobs": jobs}
        self.write()

    def write(self) -> None:
        from eval.io import write_json

        write_json(self.path, {"config": self.config, "stages": self.stages,
                               **({"last_run": self.last_run} if self.last_run else {})})


def decide(stage: Stage, state: RecipeState, ran: set[str]) -> str | None:
    """Why ``stage`` must run, or None when it is skipped (module docstring)."""
    if not stage.is_done():
        return "its outputs are not complete"
    recorded = state.key(stage.name)
    if recorded is not None and recorded != stage.key:
        return f"its command changed (was: {shlex.join(recorded)})"
    upstream = [s for s in stage.after if s in ran]
    return f"{', '.join(upstream)} ran" if upstream else None


def run_recipe(args: RecipeArgs, argv: Sequence[str] = ()) -> dict[str, Any]:
    """Run (or, with ``dry_run``, show) every stage; returns {"out", "ran", "skipped", "seconds"}. A failing stage
    raises `IncompleteJob` naming the stage, its log and the command that resumes."""
    inp = resolve_inputs(args)
    stages = plan(args, inp)
    out = Path(args.out)
    if not args.dry_run:
        claim_out(args)
    state = RecipeState(out / STATE_FILE, args)
    env, ran, skipped, t_start = stage_env(args), set(), [], time.perf_counter()
    resume = shlex.join(["python", "-m", "distill", "recipe", *argv])
    jobs = args.jobs or os.cpu_count() or 1
    if jobs > 1 and not args.dry_run:
        run_side_by_side(stages, jobs, out, env, state, resume, ran, skipped)
    else:
        for stage in stages:
            why = decide(stage, state, ran)
            if why is None:
                print(f"\n[{stage.name}] skipped: done ({stage.done})", flush=True)
                skipped.append(stage.name)
                if not args.dry_run:
                    state.adopt(stage)
                continue
            print(f"\n[{stage.name}] ({why}) $ {stage.command}", flush=True)
            ran.add(stage.name)
            if not args.dry_run:
                execute(stage, out / "logs" / f"{stage.name}.log", env, state, resume)
    seconds = round(time.perf_counter() - t_start, 1)
    if not args.dry_run:
        if ran:
            state.ran([s.name for s in stages if s.name in ran], seconds, jobs)
        print_summary(args)
        write_results(args)
    print(f"\ndistill recipe {'planned' if args.dry_run else 'done'} in {seconds:.0f} s: {out}", flush=True)
    return {"out": str(out), "ran": [s.name for s in stages if s.name in ran], "skipped": skipped, "seconds": seconds}


def claim_out(args: RecipeArgs) -> None:
    """Check and mark ``--out`` (`eval.outputs.claim_dir`): missing, empty, an earlier recipe's (its marker says
    `OUTPUT_KIND`), or ``--overwrite``; never an input of the job or a folder holding one."""
    from eval.outputs import claim_dir, read_marker

    out = Path(args.out)
    ours = out.is_dir() and (read_marker(out) or {}).get("kind") == OUTPUT_KIND

    def built_here(p: Path) -> bool:  # the demo's benchmark or model, passed back in from an earlier recipe's --out
        return ours and p.resolve() != out.resolve() and p.resolve().is_relative_to(out.resolve())

    inputs = [p for p in (args.data, args.model) if p and Path(p).exists() and not built_here(Path(p))]
    claim_dir(out, OUTPUT_KIND, inputs=inputs, overwrite=args.overwrite, option="--out")


def execute(stage: Stage, log: Path, env: dict[str, str], state: RecipeState, resume: str) -> None:
    """Run one stage and record it as finished; `IncompleteJob` when it exits non-zero."""
    t0 = time.perf_counter()
    try:
        rc, cpu = run_stage(stage, log, env)
    except (KeyboardInterrupt, Interrupted):
        print(f"\ninterrupted in stage {stage.name} (log: {log}); to resume: {resume}", file=sys.stderr)
        raise
    if rc != 0:
        raise stage_failed(stage.name, rc, log, resume)
    state.finished(stage, time.perf_counter() - t0, cpu)
    print(f"  ({time.perf_counter() - t0:.0f} s, {cpu:.0f} CPU s)", flush=True)


def stage_failed(name: str, rc: int, log: Path, resume: str) -> Exception:
    from eval.errors import IncompleteJob

    return IncompleteJob(f"stage {name} failed (exit code {rc}); its output is in {log}",
                         fix=f"fix the cause and rerun `{resume}` to resume: finished stages are skipped")


def run_side_by_side(stages: list[Stage], jobs: int, out: Path, env: dict[str, str], state: RecipeState,
                     resume: str, ran: set[str], skipped: list[str]) -> None:
    """``--jobs N``: run up to ``jobs`` stages at once, each once every stage of the plan it reads from
    (`Stage.after`) is done or skipped, in plan order among the ready ones; each is decided (`decide`) when it
    becomes ready, so a rerun of a stage still reruns what reads from it. A failure lets the running stages finish
    and record themselves, then raises for the first failed stage in plan order; an interrupt stops every running
    stage (SIGTERM, as one at a time) and re-raises."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    names = {s.name for s in stages}
    order = {s.name: i for i, s in enumerate(stages)}
    pending, settled, failed = list(stages), set(), []
    running: dict[Any, tuple[Stage, float]] = {}
    live = LiveStages()

    def launch() -> None:
        for stage in list(pending):
            if len(running) >= jobs or failed:
                return
            if any(d in names and d not in settled for d in stage.after):
                continue
            pending.remove(stage)
            why = decide(stage, state, ran)
            if why is None:
                print(f"\n[{stage.name}] skipped: done ({stage.done})", flush=True)
                skipped.append(stage.name)
                settled.add(stage.name)
                state.adopt(stage)
                continue
            log = out / "logs" / f"{stage.name}.log"
            print(f"\n[{stage.name}] ({why}; output in {log}) $ {stage.command}", flush=True)
            ran.add(stage.name)
            running[pool.submit(run_stage, stage, log, env, echo=False, live=live)] = (stage, time.perf_counter())

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            launch()
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: order[running[f][0].name]):
                    stage, t0 = running.pop(fut)
                    rc, cpu = fut.result()
                    if rc != 0:
                        failed.append((stage, rc))
                        print(f"[{stage.name}] failed (exit code {rc})", flush=True)
                        continue
                    state.finished(stage, time.perf_counter() - t0, cpu)
                    settled.add(stage.name)
                    print(f"[{stage.name}] done ({time.perf_counter() - t0:.0f} s, {cpu:.0f} CPU s)", flush=True)
                launch()
        except (KeyboardInterrupt, Interrupted):
            live.stop()
            which = ", ".join(s.name for s, _ in sorted(running.values(), key=lambda r: order[r[0].name]))
            print(f"\ninterrupted in stage {which or '(none running)'} (logs: {out / 'logs'}); to resume: {resume}", file=sys.stderr)
            raise
    if failed:
        stage, rc = min(failed, key=lambda f: order[f[0].name])
        raise stage_failed(stage.name, rc, out / "logs" / f"{stage.name}.log", resume)


def print_summary(args: RecipeArgs) -> None:
    """The tables the recipe produced: the comparison and its significance, answer accuracy, the rationale
    statistics with the validator's rejects, and faithfulness."""
    out = Path(args.out)
    parts = [(f"comparison (retrieval, {args.space} space)", ["report/main.md", "report/significance.md",
                                                            "report-cot-vs-answer-only/significance.md"]),
             ("answer accuracy", ["answers/answers.md"]),
             ("rationales and validator", ["rationale-stats/rationale_stats.md", "leaks/leaks.md"]),
             ("faithfulness", ["faithfulness/faithfulness.md"]),
             ("three students at equal budget (python -m distill study)", ["study/study.md"])]
    for title, files in parts:
        print(f"\n== {title} ==")
        for name in files:
            if (out / name).is_file():
                print((out / name).read_text(encoding="utf-8"), end="")
    sys.stdout.flush()


def write_results(args: RecipeArgs) -> None:
    """``<out>/results.md``: the distillation results section (`distill.results.section`) of this run."""
    from distill.results import section

    lines = section(Path(args.out))
    if lines:
        (Path(args.out) / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Sequence[str]) -> int:
    """``python -m distill recipe ARGV``: 0 when every stage is done; errors raise (`eval.cli_support.run_main`)."""
    args = parse_recipe_args(argv)
    run_recipe(args, argv)
    return 0
