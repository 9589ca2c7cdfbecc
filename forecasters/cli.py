"""Command line of the `forecasters` package: ``python -m forecasters --help``."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import shlex
import types
import typing
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from eval.cli_support import data_callback, data_option, install, overwrite_option, report_error
from eval.errors import IncompleteJob, PSRError
from forecasters.phrasefile import check_phrase_out
from forecasters.run_config import RunConfig

app = typer.Typer(help="Forecasters: multimodal-LLM / text-only / student phrase predictors as resumable batch jobs.",
                  no_args_is_help=True, add_completion=False)

from forecasters.probes import app as probes_app  # noqa: E402  (canonicalization probes without a model)

install(app)
app.add_typer(probes_app, name="probes")
console = Console()
err = Console(stderr=True)


def _load_yaml(path: Path | None) -> dict:
    if path is None:
        return {}
    from eval.io import FormatError, read_yaml

    d = read_yaml(path)
    if not isinstance(d, dict):
        raise FormatError(path, f"expected a mapping of run options, got {type(d).__name__}")
    names = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise FormatError(path, f"unknown option(s) {unknown}; known: {sorted(names)}")
    return d


def _summary_table(s) -> Table:
    t = Table(title=f"forecast run -> {s.out}", show_header=False)
    c = s.coverage
    rows = [("selected queries", c.queries), ("  answered: phrase parsed", c.ok),
            ("  answered: parse failure", c.parse_failures), ("  failed (error recorded)", c.failed),
            ("  missing (no line yet)", c.missing), ("  outside 2-5 words", c.length_flags),
            ("this run: already done", s.skipped_done), ("this run: attempted", s.attempted),
            ("this run: failed", s.attempted_failed), ("completion tokens/s", f"{s.tokens_per_s:.1f}"),
            ("queries/s", f"{s.queries_per_s:.2f}"), ("wall time", f"{s.wall_s:.1f} s"), ("engine", s.engine),
            ("config hash", s.config_hash)]
    if c.error_kinds:
        rows.append(("failed lines by kind", json.dumps(c.error_kinds)))
    if s.run_file:
        rows.append(("run file", s.run_file))
    if s.aborted:
        rows.append(("STOPPED EARLY", s.aborted))
    rows.append(("complete", "yes" if s.complete else "NO"))
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def _exit_for(e: PSRError) -> NoReturn:
    """Print a toolkit error as one line and exit with its code (`eval.cli_support.report_error`: 3 for an
    `IncompleteJob`, 2 otherwise)."""
    raise typer.Exit(report_error(e)) from None


def _command_line(ctx: typer.Context) -> str:
    """The command as given on the command line (the options the user set), rebuilt from the parsed parameters."""
    parts = ["python", "-m", "forecasters", ctx.info_name or "run"]
    for param in ctx.command.params:
        if getattr(ctx.get_parameter_source(param.name), "name", "") != "COMMANDLINE" or not param.opts:
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False):
            flag = param.opts[0] if value else (param.secondary_opts or [None])[0]
            parts += [flag] if flag else []
        else:
            for v in value if getattr(param, "multiple", False) else [value]:
                parts += [param.opts[0], str(v)]
    return " ".join(shlex.quote(a) for a in parts)


#: checks of a `RunConfig` option's value before the command runs
OPTION_CALLBACKS = {"data": data_callback}


def _cli_type(hint: Any, cli: dict) -> Any:
    """The command-line type of a `RunConfig` field: its type without ``None`` (``cli["type"]`` for a union)."""
    if "type" in cli:
        return cli["type"]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def run_options() -> list[inspect.Parameter]:
    """The options of ``forecasters run``: one per `RunConfig` field (flags, help and limits from its metadata,
    `forecasters.run_config.option`), then ``--config`` and ``--verbose``."""
    hints = typing.get_type_hints(RunConfig)
    params = []
    for f in dataclasses.fields(RunConfig):
        meta = f.metadata
        cli = {k: v for k, v in meta["cli"].items() if k != "type"}
        default = ... if f.default is dataclasses.MISSING else f.default
        flags = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        opt = typer.Option(default, *flags, help=meta["help"], callback=OPTION_CALLBACKS.get(f.name), **cli)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                                        annotation=_cli_type(hints[f.name], meta["cli"])))
    params += [
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Path, default=typer.Option(
            None, "--config", help="YAML file of run options (command-line values win)")),
        inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--verbose", "-v", help="log what the job does")),
    ]
    return params


def run(ctx: typer.Context, **options: Any) -> None:
    """Run a forecaster over a benchmark split: one phrase-file line per query, resumable, shardable.

    Writes OUT (JSONL, eval.phrases format), OUT's .config.json (resolved config) and .summary.json (what OUT holds
    for the selected queries). Exit code 0 when every selected query has an answer; 3 when some failed or are
    missing (stopped early, or failed requests: the message gives the command that finishes); 2 on bad input, an
    unreachable server or a model it does not serve. Each option is a field of forecasters.run_config.RunConfig
    (its YAML key in --config: the option's name with _ for -).
    """
    config, verbose = options.pop("config"), options.pop("verbose")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from forecasters.runner import run as run_job

    values = _load_yaml(config)
    for k, v in options.items():
        src = ctx.get_parameter_source(k)
        if k not in values or getattr(src, "name", "") in ("COMMANDLINE", "ENVIRONMENT"):
            values[k] = v
    values["data"], values["out"] = str(values["data"]), str(values["out"])
    if values.get("split") == "all":
        values["split"] = None
    values["qtypes"] = list(values["qtypes"]) if values.get("qtypes") else None
    check_phrase_out(Path(values["out"]), [values["data"], values.get("adapter"), values.get("prompt"), config],
                     bool(values.get("overwrite")), sidecars=("config", "summary"))
    cfg = RunConfig(**values)
    summary = run_job(cfg)
    console.print(_summary_table(summary))
    incomplete = summary.incomplete(_command_line(ctx))
    if incomplete is not None:
        _exit_for(incomplete)


run.__signature__ = inspect.Signature(
    [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context), *run_options()])
app.command()(run)


@app.command()
def merge(
    inputs: list[Path] = typer.Argument(..., help="shard phrase files of one run"),
    out: Path = typer.Option(..., "--out", help="merged phrase file"),
    data: Path = data_option(None, help="benchmark directory: order by it and check coverage"),
    split: str = typer.Option("test", "--split", help="with --data: the split the run covered (all = every query)"),
    require_complete: bool = typer.Option(False, "--require-complete", help="with --data: exit 3 unless every query "
                                          "of the split has an answer (a line without an error)"),
    allow_mixed: bool = typer.Option(False, "--allow-mixed", help="merge lines of different configs"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Merge shard phrase files into one (each query once; the last successful line wins)."""
    from forecasters.phrasefile import merge_phrase_files

    check_phrase_out(out, [*inputs, data], overwrite)
    if require_complete and data is None:
        _exit_for(PSRError("--require-complete needs --data: the split's queries say what complete means",
                           fix="add --data DIR (and --split)"))
    expected = None
    if data is not None:
        from eval.benchmark import Benchmark

        bench = Benchmark.load(data)
        expected = [q.id for q in bench.queries(None if split == "all" else split)]
    rep = merge_phrase_files(inputs, out, expected_ids=expected, allow_mixed=allow_mixed)
    console.print(f"merged {rep.n_inputs} file(s), {rep.n_lines} line(s) -> {out}: {rep.n_queries} queries "
                  f"({rep.n_ok} ok, {rep.n_failed} failed), config {rep.config_hash}")
    if rep.missing:
        err.print(f"[yellow]{len(rep.missing)} quer(ies) of the split missing[/], e.g. {rep.missing[:5]}")
    if rep.unexpected:
        err.print(f"[yellow]{len(rep.unexpected)} line(s) for queries outside the split[/], e.g. {rep.unexpected[:5]}")
    if require_complete and not rep.coverage.complete:
        c = rep.coverage
        _exit_for(IncompleteJob(f"{out}, split {split!r}: {c.describe()}",
                                fix="finish each shard (its `forecasters run` command, with --redo-failed for failed "
                                    "lines), then merge again"))


@app.command("likelihood-run")
def likelihood_run(
    data: Path = typer.Option(..., "--data", help="benchmark directory"),
    phrases: Path = typer.Option(..., "--phrases", help="phrase file of a likelihood run (e.g. merged shards)"),
    out: Path = typer.Option(..., "--out", help="run file to write (.parquet)"),
    method: str = typer.Option(None, "--method", help="method name stored in the run (default likelihood[MODEL])"),
    k: int = typer.Option(50, "--k", min=1, help="top-k list length kept in the run"),
) -> None:
    """Build the run file of a likelihood forecast (its candidates' scores, expanded to segments; a query without a
    successful line is a miss) for `python -m eval score` / `report`."""
    from eval.benchmark import Benchmark
    from forecasters.likelihood_run import write_likelihood_run

    try:
        path = write_likelihood_run(Benchmark.load(data), phrases, out, method=method, k=k, progress=True)
    except PSRError as e:
        _exit_for(e)
    console.print(f"[green]wrote[/] {path}")


@app.command("tiny-model")
def tiny_model(
    out: Path = typer.Option(..., "--out", help="directory to write the model into"),
    kind: str = typer.Option("qwen2", "--kind", help="qwen2 | qwen3 | qwen2_vl | qwen2_5_vl | qwen3_vl | llava | "
                                                     "llava_next | llava_next_video"),
    template: str = typer.Option(None, "--template", help="chat template: native (the real checkpoint's) | chatml; "
                                                          "default: the kind's (forecasters.tiny_models)"),
    seed: int = typer.Option(0, "--seed"),
    fit_data: Path = typer.Option(None, "--fit-data", help="benchmark dir: fit the tiny model on its train split so "
                                                           "it answers with state phrases (plumbing checks)",
                                  callback=data_callback),
    forecaster: str = typer.Option("text-only", "--fit-forecaster", help="whose prompts to fit on"),
    steps: int = typer.Option(60, "--fit-steps", min=1, help="steps of 8 examples"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="a progress bar of the fit"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Build a tiny random-weight model (a few MB, no download) for plumbing checks; optionally fit it briefly."""
    from eval.outputs import claimed_dir
    from eval.threads import prefer_passive_wait

    prefer_passive_wait()  # before torch loads (eval.threads)
    from forecasters.tiny_models import TINY_KINDS, build_tiny_model, chat_template

    if kind not in TINY_KINDS:
        raise typer.BadParameter(f"--kind must be one of {TINY_KINDS}")
    try:
        chat_template(kind, template)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--template") from None
    with claimed_dir(out, "forecasters tiny-model", inputs=[fit_data], overwrite=overwrite):
        path = build_tiny_model(out, kind, seed=seed, template=template)
        if fit_data is not None:
            from forecasters.tiny_fit import fit_on_benchmark

            loss = fit_on_benchmark(path, fit_data, forecaster=forecaster, steps=steps, seed=seed, progress=progress)
            console.print(f"fitted {steps} steps on {fit_data} ({forecaster} prompts): final loss {loss:.3f}")
    console.print(f"[green]wrote[/] {path}")


@app.command("list")
def list_all() -> None:
    """Forecasters, backends, model presets and prompt templates."""
    import prompts
    from forecasters.backends import BACKENDS
    from forecasters.presets import PRESETS
    from forecasters.registry import FORECASTERS

    t = Table(title="forecasters")
    for c in ("name", "prompt", "default model", "media", "max tokens", "description"):
        t.add_column(c)
    for s in FORECASTERS.values():
        t.add_row(s.name, s.prompt, s.default_model, s.media_kind, str(s.max_tokens), s.description)
    console.print(t)
    console.print("backends: " + ", ".join(BACKENDS))
    p = Table(title="model presets")
    p.add_column("preset")
    p.add_column("model")
    for k, v in PRESETS.items():
        p.add_row(k, v)
    console.print(p)
    pt = Table(title="prompt templates")
    for c in ("id", "hash", "verbatim", "placeholders"):
        pt.add_column(c)
    for i in prompts.list_templates():
        tt = prompts.load(i)
        pt.add_row(i, tt.hash, "yes" if tt.verbatim else "", ", ".join(tt.placeholders))
    console.print(pt)
