"""``python -m retrieval canon ...``: canonicalization (sweep, cluster, assign, apply) and its probes (finetune,
report).

The snap (canonicalize-then-retrieve) is an option of phrase search: ``python -m retrieval search ... --canonicalize
TOP_M``. The phrase sources of the probes are forecasters: ``python -m forecasters run --forecaster paraphrase |
describe`` and, without a model, ``python -m forecasters probes synonyms``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from eval.cli_support import data_option, overwrite_option
from eval.errors import InputError
from eval.tracking import REPORT_TO_HELP

app = typer.Typer(help="Canonicalization: greedy clustering sweep, one saved clustering, assigning and re-keying "
                       "phrases and benchmarks; probes: robust encoder, report.",
                  no_args_is_help=True, add_completion=False)
console = Console()

MODEL = typer.Option("BAAI/bge-small-en-v1.5", "--model",
                     help="sentence-transformers text model (HF id or path; 'packaged:all-MiniLM-L6-v2' offline)")


TIES = typer.Option("first", "--ties", help="visiting order of phrases of equal count: 'first' (first occurrence in "
                                             "the input) or 'text' (phrase text, code-point order)")
PHRASES_HELP = ("phrase file: .txt (one per line), .csv/.tsv (header naming a 'phrase' column; optional 'count', "
                "'label', 'query_id'), .json (array) or .jsonl (objects with 'phrase', or a forecaster's phrase file)")


def _log(msg: str) -> None:
    console.print(escape(msg))


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from None


@app.command()
def sweep(
    out: Path = typer.Option(..., "--out", help="output directory (tables, sweep.json, clusters, plot)"),
    data: Path = data_option(None, help="benchmark directory: cluster its corpus's raw descriptions"),
    phrases: Path = typer.Option(None, "--phrases", help="or a " + PHRASES_HELP),
    thresholds: str = typer.Option("0.80,0.85,0.90", "--thresholds", help="comma-separated cosine thresholds"),
    model: str = MODEL,
    ties: str = TIES,
    batch_size: int = typer.Option(128, "--batch-size", min=1),
    device: str = typer.Option(None, "--device"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Cluster the raw state vocabulary at each threshold: vocabulary size, merge rate, cluster sizes, and purity /
    inverse purity / ARI against the true synonym sets when known; per threshold the clusters and the per-phrase
    map."""
    from retrieval.canon.sweep import SweepConfig, run_sweep

    cfg = SweepConfig(out=str(out), data=str(data) if data else None, phrases=str(phrases) if phrases else None,
                      thresholds=_floats(thresholds), model=model, ties=ties, batch_size=batch_size, device=device,
                      overwrite=overwrite)
    doc = run_sweep(cfg, log=_log)
    typer.echo(doc["markdown"])
    console.print(f"[green]wrote[/] {escape(str(out))}")


@app.command()
def cluster(
    out: Path = typer.Option(..., "--out", help="output directory (states, per-phrase map, seed embeddings)"),
    data: Path = data_option(None, help="benchmark directory: cluster its corpus's raw descriptions"),
    phrases: Path = typer.Option(None, "--phrases", help="or a " + PHRASES_HELP),
    threshold: float = typer.Option(0.85, "--threshold", help="cosine threshold"),
    model: str = MODEL,
    ties: str = TIES,
    batch_size: int = typer.Option(128, "--batch-size", min=1),
    device: str = typer.Option(None, "--device"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Canonicalize phrases at one threshold and save the clustering (for `canon assign` and `canon apply
    --phrases`): states.jsonl, phrases.jsonl (phrase -> state id, seed, cosine, query ids), seeds.npy."""
    from retrieval.canon.store import ClusterConfig, run_cluster

    cfg = ClusterConfig(out=str(out), data=str(data) if data else None, phrases=str(phrases) if phrases else None,
                        threshold=threshold, model=model, ties=ties, batch_size=batch_size, device=device,
                        overwrite=overwrite)
    run_cluster(cfg, log=_log)
    console.print(f"[green]wrote[/] {escape(str(out))}")


NEW_STATES = typer.Option(True, "--new-states/--no-new-states",
                          help="a phrase that joins no seed founds a new state (default), or keeps no state")


@app.command()
def assign(
    clustering: Path = typer.Option(..., "--clustering", help="directory written by `canon cluster`"),
    phrases: Path = typer.Option(..., "--phrases", help="new phrases: a " + PHRASES_HELP),
    out: Path = typer.Option(..., "--out", help="output .jsonl: one row per phrase"),
    model: str = typer.Option(None, "--model", help="text model (default: the clustering's)"),
    ties: str = TIES,
    new_states: bool = NEW_STATES,
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out file"),
    batch_size: int = typer.Option(128, "--batch-size", min=1),
    device: str = typer.Option(None, "--device"),
) -> None:
    """Assign new phrases to a saved clustering with its rule (phrase -> state id, seed, cosine, status)."""
    from retrieval.canon.assign import AssignConfig, run_assign

    cfg = AssignConfig(clustering=str(clustering), phrases=str(phrases), out=str(out), model=model, ties=ties,
                       new_states=new_states, overwrite=overwrite, batch_size=batch_size, device=device)
    run_assign(cfg, log=_log)


@app.command()
def apply(
    out: Path = typer.Option(..., "--out", help="directory of the re-keyed benchmark, or the re-keyed phrase file"),
    data: Path = data_option(None, help="source benchmark directory (read only)"),
    phrases: Path = typer.Option(None, "--phrases", help="or a forecaster's phrase file (.jsonl) to re-key to the "
                                                         "states of --clustering"),
    clustering: Path = typer.Option(None, "--clustering", help="with --phrases: a directory written by `canon "
                                                               "cluster`"),
    threshold: float = typer.Option(0.85, "--threshold", min=0.0, max=1.0),
    model: str = typer.Option(None, "--model", help="text model (default: BAAI/bge-small-en-v1.5 with --data, the "
                                                    "clustering's with --phrases)"),
    ties: str = TIES,
    similar_threshold: float = typer.Option(None, "--similar-threshold",
                                            help="cosine of the bge_similar tier's neighbour states (default T-0.10)"),
    copy: bool = typer.Option(False, "--copy", help="copy frames and visual features instead of linking them"),
    new_states: bool = NEW_STATES,
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out this command did not write "
                                                              "(never an input of the job)"),
    batch_size: int = typer.Option(128, "--batch-size", min=1),
    device: str = typer.Option(None, "--device"),
    mine_budget: int = typer.Option(None, "--mine-budget", min=1,
                                    help="with --data: GT candidates mined per tier (most similar raw description "
                                         "first; default: every segment of the state)"),
    verify: bool = typer.Option(False, "--verify", help="with --data: emulate the verification of mined candidates "
                                                       "against the simulator truth (synthetic builds)"),
    verify_tpr: float = typer.Option(0.95, "--verify-tpr", min=0.0, max=1.0),
    verify_fpr: float = typer.Option(0.25, "--verify-fpr", min=0.0, max=1.0),
    verify_seed: int = typer.Option(0, "--verify-seed"),
    name: str = typer.Option(None, "--name", help="with --data: name of the output benchmark"),
) -> None:
    """Canonicalize a benchmark's raw vocabulary at one threshold and write a re-keyed benchmark (GT pools
    recomputed); or, with --phrases and --clustering, re-key a phrase file to a saved clustering's states."""
    if ties not in ("first", "text"):
        raise InputError(f"--ties must be 'first' or 'text', got {ties!r}")
    if (data is None) == (phrases is None):
        raise InputError("give exactly one of --data (a benchmark) or --phrases (a phrase file, with --clustering)")
    if phrases is not None:
        from retrieval.canon.assign import AssignConfig, apply_phrase_file

        if clustering is None:
            raise InputError("--phrases needs --clustering (a directory written by `canon cluster`)")
        apply_phrase_file(AssignConfig(clustering=str(clustering), phrases=str(phrases), out=str(out),
                                       model=model, ties=ties, new_states=new_states, overwrite=overwrite,
                                       batch_size=batch_size, device=device), log=_log)
        return
    from retrieval.canon.apply import ApplyConfig, apply_canonicalization

    if clustering is not None:
        raise InputError("--clustering goes with --phrases; with --data the clustering is made at --threshold")
    cfg = ApplyConfig(data=str(data), out=str(out), threshold=threshold, model=model or ApplyConfig.model,
                      similar_threshold=similar_threshold, batch_size=batch_size, device=device, copy=copy,
                      ties=ties, overwrite=overwrite, mine_budget=mine_budget, verify=verify,
                      verify_tpr=verify_tpr, verify_fpr=verify_fpr, verify_seed=verify_seed, name=name)
    apply_canonicalization(cfg, log=_log)
    console.print(f"[green]wrote[/] {escape(str(out))}; check it with `python -m eval validate {escape(str(out))}`")


@app.command()
def finetune(
    data: Path = data_option(),
    out: Path = typer.Option(..., "--out", help="output directory (model/, holdout.json, pairs, logs)"),
    base_model: str = typer.Option("BAAI/bge-small-en-v1.5", "--base-model", help="sentence-transformers model"),
    split: str = typer.Option("train", "--split", help="split whose clusters give the training pairs"),
    holdout: float = typer.Option(0.3, "--holdout", min=0.0, max=0.99, help="fraction of states held out"),
    seed: int = typer.Option(0, "--seed"),
    epochs: int = typer.Option(4, "--epochs", min=1),
    batch_size: int = typer.Option(64, "--batch-size", min=2),
    mini_batch_size: int = typer.Option(0, "--mini-batch-size", min=0,
                                        help="gradient-cache chunk (CachedMNRL) for a batch larger than memory; 0 or "
                                             ">= --batch-size: no cache (the same loss, one forward pass fewer)"),
    lr: float = typer.Option(1e-4, "--lr"),
    dims: str = typer.Option("", "--matryoshka-dims", help="comma-separated widths (default: d, 2^j < d, ..., 64)"),
    device: str = typer.Option(None, "--device"),
    report_to: str = typer.Option("none", "--report-to", help=REPORT_TO_HELP),
    overwrite: bool = overwrite_option(),
) -> None:
    """Fine-tune the text encoder on (member phrase -> canonical state) pairs with MatryoshkaLoss over
    CachedMultipleNegativesRankingLoss; encode a space with OUT/model to get the paraphrase-robust index."""
    from retrieval.canon.finetune import FinetuneConfig
    from retrieval.canon.finetune import finetune as run

    cfg = FinetuneConfig(data=str(data), out=str(out), base_model=base_model, split=split, holdout_fraction=holdout,
                         seed=seed, epochs=epochs, batch_size=batch_size, mini_batch_size=mini_batch_size,
                         learning_rate=lr, matryoshka_dims=[int(x) for x in _floats(dims)], device=device,
                         overwrite=overwrite, report_to=report_to)
    run(cfg, log=_log)


@app.command()
def report(
    data: Path = data_option(help="benchmark directory the runs were scored on"),
    out: Path = typer.Option(..., "--out", help="report directory"),
    overwrite: bool = overwrite_option(),
    exact: Path = typer.Option(..., "--exact", help="run of the exact-string oracle (oracle semantic-text)"),
    paraphrase: Path = typer.Option(..., "--paraphrase", help="run of the paraphrase oracle (plain read)"),
    predictor: list[Path] = typer.Option([], "--predictor", help="predictor runs (repeat); the best is reported"),
    describe: list[Path] = typer.Option([], "--describe", help="description-probe runs (repeat)"),
    other: list[str] = typer.Option([], "--other", help="LABEL=RUN: another probe row (e.g. an LLM paraphrase)"),
    robust: list[str] = typer.Option([], "--robust", help="LABEL=RUN: a robust read of the paraphrase phrases"),
    holdout: Path = typer.Option(None, "--holdout", help="holdout.json of `canon finetune` (seen / held-out rows)"),
    k: int = typer.Option(5, "--k", min=1),
    resamples: int = typer.Option(10_000, "--resamples", min=100),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """The decomposition table (exact-string oracle vs paraphrase oracle vs best predictor) and the robust reads
    against the plain read, with paired bootstrap and McNemar tests."""
    from retrieval.canon.report import CanonReportConfig, write_report

    cfg = CanonReportConfig(data=str(data), out=str(out), exact=str(exact), paraphrase=str(paraphrase),
                            predictors=[str(p) for p in predictor], describe=[str(p) for p in describe],
                            others=list(other), robust=list(robust), holdout=str(holdout) if holdout else None, k=k,
                            n_resamples=resamples, seed=seed, overwrite=overwrite)
    doc = write_report(cfg)
    typer.echo(doc["markdown"])
    console.print(f"[green]wrote[/] {escape(str(out))}")
