"""Command line of the `forecasters` package: ``python -m forecasters --help``."""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

from eval.cli_support import data_callback, data_option, install, overwrite_option, report_error
from eval.errors import IncompleteJob, PSRError
from forecasters.phrasefile import check_phrase_out

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
    from forecasters.runner import RunConfig

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


@app.command()
def run(
    ctx: typer.Context,
    data: Path = data_option(),
    out: Path = typer.Option(..., "--out", help="phrase file to write / resume (JSONL), e.g. runs/m3.jsonl"),
    forecaster: str = typer.Option("m3", "--forecaster", "-f", help="m3 | text-only | llava | llava-video | student | "
                                    "likelihood"),
    backend: str = typer.Option("hf", "--backend", "-b", help="hf | vllm | openai"),
    model: str = typer.Option(None, "--model", "-m", help="preset (m3, text-only, llava, ...), HF id, local path, "
                                                          "or served model name (openai); default: the forecaster's"),
    adapter: str = typer.Option(None, "--adapter", help="LoRA adapter dir (hf/vllm, unmerged) or served adapter name "
                                                        "(openai)"),
    prompt: str = typer.Option(None, "--prompt", help="override the template: a prompts id or a .txt template file"),
    split: str = typer.Option("test", "--split", help="train | val | test | all"),
    fair_only: bool = typer.Option(False, "--fair-only", help="only queries whose GT is in the corpus"),
    qtypes: list[str] = typer.Option(None, "--qtypes", help="restrict to question types (repeatable: --qtypes Q1 "
                                    "--qtypes Q2)"),
    shard: str = typer.Option("0/1", "--shard", help="i/n: this job takes shard i (0-based) of n, split by prefix"),
    limit: int = typer.Option(None, "--limit", min=1, help="only the first N queries of the shard (smoke tests)"),
    samples: int = typer.Option(1, "--samples", min=1, help="K phrases per query (needs --temperature > 0)"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy (the paper)"),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1, help="default: 24 (baselines), 512 (student)"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    frames: str = typer.Option(None, "--frames", help="prefix frames per request: all (default) | last (the "
                               "last-frame-only ablation) | K (the K last frames) | spaced:K (K evenly spaced)"),
    max_pixels: int = typer.Option(None, "--max-pixels", min=0, help="resize frames to at most N pixels before "
                                   "sending (every backend); default: the forecaster's (448x448; student 336x336); "
                                   "0 = full size"),
    min_pixels: int = typer.Option(None, "--min-pixels", help="hf / vllm: Qwen-VL processor floor (pixels)"),
    dtype: str = typer.Option("auto", "--dtype", help="auto | float32 | bfloat16 | float16"),
    device: str = typer.Option("auto", "--device", help="hf backend: auto | cpu | cuda"),
    batch_size: int = typer.Option(None, "--batch-size", min=1, help="hf / vllm: requests per engine call (default 8 / "
                                   "256); openai: requests admitted ahead, in flight or waiting for a retry "
                                   "(default 4 x concurrency)"),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="openai: requests in flight at the server"),
    base_url: str = typer.Option(None, "--base-url", help="openai: server URL, e.g. http://127.0.0.1:8000/v1"),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="env var holding the API key"),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="openai: per-request timeout (s)"),
    max_attempts: int = typer.Option(6, "--max-attempts", min=1, help="calls per request, retries included"),
    wait_initial: float = typer.Option(1.0, "--wait-initial", help="first backoff cap (s), doubling per retry"),
    wait_max: float = typer.Option(60.0, "--wait-max", help="largest backoff (s)"),
    tensor_parallel_size: int = typer.Option(None, "--tensor-parallel-size", help="vllm: tensor parallel size"),
    max_model_len: int = typer.Option(None, "--max-model-len", help="vllm: context cap"),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization",
                                                 help="vllm: fraction of GPU memory"),
    enforce_eager: bool = typer.Option(None, "--enforce-eager/--no-enforce-eager",
                                       help="vllm: no CUDA graphs (default: on for CPU)"),
    max_lora_rank: int = typer.Option(16, "--max-lora-rank"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    redo_failed: bool = typer.Option(False, "--redo-failed", help="rerun queries whose line recorded an error"),
    drop_foreign: bool = typer.Option(False, "--drop-foreign", help="move lines of another config out of --out (to "
                                      "OUT.foreign), keeping this run's lines"),
    overwrite: bool = typer.Option(False, "--overwrite", help="discard an existing --out file (lines of another "
                                                              "config, or a file this toolkit did not write)"),
    max_consecutive_failures: int = typer.Option(100, "--max-consecutive-failures", min=1,
                                                 help="stop after this many failed requests in a row"),
    num_threads: int = typer.Option(None, "--num-threads", min=1, help="hf: torch CPU threads"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    candidates: str = typer.Option(None, "--candidates", help="likelihood: states (every canonical state) | topN:RUN "
                                   "(rerank the first N distinct states of a retrieval run file)"),
    length_norm: str = typer.Option("mean", "--length-norm", help="likelihood: mean (log-likelihood per answer "
                                    "token) | sum"),
    cpn_alpha: float = typer.Option(1.0, "--cpn-alpha", help="likelihood: weight of the candidate prior (the "
                                    "answer's log-likelihood under the content-free prompt) subtracted; 0 = off"),
    candidate_batch_size: int = typer.Option(32, "--candidate-batch-size", min=1,
                                             help="likelihood, hf: answers per forward pass on the prompt's KV cache"),
    run_out: Path = typer.Option(None, "--run-out", help="likelihood: run file written when every query is "
                                 "answered (default OUT's .run.parquet)"),
    allow_empty: bool = typer.Option(False, "--allow-empty", help="a selection without any query is done (exit 0, "
                                     "nothing written) instead of an error"),
    config: Path = typer.Option(None, "--config", help="YAML file of run options (command-line values win)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a forecaster over a benchmark split: one phrase-file line per query, resumable, shardable.

    Writes OUT (JSONL, eval.phrases format), OUT's .config.json (resolved config) and .summary.json (what OUT holds
    for the selected queries). Exit code 0 when every selected query has an answer; 3 when some failed or are
    missing (stopped early, or failed requests: the message gives the command that finishes); 2 on bad input, an
    unreachable server or a model it does not serve.
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from forecasters.runner import RunConfig
    from forecasters.runner import run as run_job

    values = _load_yaml(config)
    cli = {k: v for k, v in ctx.params.items() if k not in ("config", "verbose")}
    for k, v in cli.items():
        src = ctx.get_parameter_source(k)
        if k not in values or getattr(src, "name", "") in ("COMMANDLINE", "ENVIRONMENT"):
            values[k] = v
    values["data"], values["out"] = str(values["data"]), str(values["out"])
    values["run_out"] = str(values["run_out"]) if values.get("run_out") else None
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
    steps: int = typer.Option(60, "--fit-steps", min=1, help="steps of 8 examples (about 0.2 s each on CPU)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Build a tiny random-weight model (a few MB, no download) for plumbing checks; optionally fit it briefly."""
    from eval.outputs import claimed_dir
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

            loss = fit_on_benchmark(path, fit_data, forecaster=forecaster, steps=steps, seed=seed)
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
