"""``python -m retrieval canon ...``: the canonicalization probes (sweep, apply, finetune, report).

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

app = typer.Typer(help="Canonicalization probes: greedy clustering sweep, re-keying, robust encoder, report.",
                  no_args_is_help=True, add_completion=False)
console = Console()

MODEL = typer.Option("BAAI/bge-small-en-v1.5", "--model",
                     help="sentence-transformers text model (HF id or path; 'packaged:all-MiniLM-L6-v2' offline)")


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
    phrases: Path = typer.Option(None, "--phrases", help="or a phrase list: .txt (one per line), .tsv "
                                                         "(phrase, count[, label]) or .jsonl (phrase[, count, label])"),
    thresholds: str = typer.Option("0.80,0.85,0.90", "--thresholds", help="comma-separated cosine thresholds"),
    model: str = MODEL,
    batch_size: int = typer.Option(128, "--batch-size", min=1),
    device: str = typer.Option(None, "--device"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Cluster the raw state vocabulary at each threshold: vocabulary size, merge rate, cluster sizes, and purity /
    inverse purity / ARI against the true synonym sets when known."""
    from retrieval.canon.sweep import SweepConfig, run_sweep

    cfg = SweepConfig(out=str(out), data=str(data) if data else None, phrases=str(phrases) if phrases else None,
                      thresholds=_floats(thresholds), model=model, batch_size=batch_size, device=device,
                      overwrite=overwrite)
    doc = run_sweep(cfg, log=_log)
    typer.echo(doc["markdown"])
    console.print(f"[green]wrote[/] {escape(str(out))}")


@app.command()
def apply(
    data: Path = data_option(help="source benchmark directory (read only)"),
    out: Path = typer.Option(..., "--out", help="directory of the re-keyed benchmark"),
    threshold: float = typer.Option(0.85, "--threshold", min=0.0, max=1.0),
    model: str = MODEL,
    similar_threshold: float = typer.Option(None, "--similar-threshold",
                                            help="cosine of the bge_similar tier's neighbour states (default T-0.10)"),
    copy: bool = typer.Option(False, "--copy", help="copy frames and visual features instead of linking them"),
    batch_size: int = typer.Option(128, "--batch-size", min=1),
    device: str = typer.Option(None, "--device"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Canonicalize the raw vocabulary at one threshold and write a re-keyed benchmark (GT pools recomputed)."""
    from retrieval.canon.apply import ApplyConfig, apply_canonicalization

    cfg = ApplyConfig(data=str(data), out=str(out), threshold=threshold, model=model,
                      similar_threshold=similar_threshold, batch_size=batch_size, device=device, copy=copy,
                      overwrite=overwrite)
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
    mini_batch_size: int = typer.Option(32, "--mini-batch-size", min=1, help="CachedMNRL gradient-cache chunk"),
    lr: float = typer.Option(1e-4, "--lr"),
    dims: str = typer.Option("", "--matryoshka-dims", help="comma-separated widths (default: d, 2^j < d, ..., 64)"),
    device: str = typer.Option(None, "--device"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Fine-tune the text encoder on (member phrase -> canonical state) pairs with MatryoshkaLoss over
    CachedMultipleNegativesRankingLoss; encode a space with OUT/model to get the paraphrase-robust index."""
    from retrieval.canon.finetune import FinetuneConfig
    from retrieval.canon.finetune import finetune as run

    cfg = FinetuneConfig(data=str(data), out=str(out), base_model=base_model, split=split, holdout_fraction=holdout,
                         seed=seed, epochs=epochs, batch_size=batch_size, mini_batch_size=mini_batch_size,
                         learning_rate=lr, matryoshka_dims=[int(x) for x in _floats(dims)], device=device,
                         overwrite=overwrite)
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
