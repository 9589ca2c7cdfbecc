"""Command line of the `eval` package: ``python -m eval --help``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="PSR benchmark: validate, build the synthetic benchmark, score runs, build reports.",
                  no_args_is_help=True, add_completion=False)
console = Console(stderr=False)
err = Console(stderr=True)

MAX_SHOWN_PER_KIND = 20


def _summary_tables(summary: dict) -> list[Table]:
    t = Table(title="benchmark", show_header=False)
    for k in ("queries", "fair", "corpus", "states", "videos", "prefixes"):
        t.add_row(k, f"{summary.get(k, 0):,}")
    out = [t]
    for key, title in (("by_split", "split"), ("by_qtype", "question type"), ("by_report_horizon", "horizon (h>=6 as 5)"),
                       ("by_domain", "domain")):
        tt = Table(title=f"queries by {title}")
        tt.add_column(title)
        tt.add_column("n", justify="right")
        for k, v in summary.get(key, {}).items():
            tt.add_row(str(k), f"{v:,}")
        out.append(tt)
    tiers = Table(title="GT pools by tier")
    for c in ("tier", "queries with GT", "mean size"):
        tiers.add_column(c, justify="right" if c != "tier" else "left")
    for k, v in summary.get("by_tier", {}).items():
        tiers.add_row(k, f"{v['queries_with_gt']:,}", f"{v['mean_size']:.1f}")
    out.append(tiers)
    return out


@app.command()
def validate(
    data: Path = typer.Argument(..., help="benchmark directory"),
    no_frames: bool = typer.Option(False, "--no-frames", help="skip checking that frame files exist"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Check a benchmark directory: fields, ids, GT references, leakage, feature files. Exit code 1 on any error."""
    from eval.validate import validate as run_validate

    report = run_validate(data, check_frames=not no_frames)
    if as_json:
        print(json.dumps({"ok": report.ok, "problems": [p.__dict__ for p in report.problems],
                          "summary": report.summary}, indent=2))
        raise typer.Exit(0 if report.ok else 1)
    shown: Counter = Counter()
    for p in report.problems:
        shown[p.kind] += 1
        if shown[p.kind] <= MAX_SHOWN_PER_KIND:
            (err.print if p.severity == "error" else console.print)(
                str(p), style="red" if p.severity == "error" else "yellow", markup=False, highlight=False)
    for kind, n in shown.items():
        if n > MAX_SHOWN_PER_KIND:
            err.print(f"... and {n - MAX_SHOWN_PER_KIND} more '{kind}' problems")
    if not report.ok:
        err.print(f"[red bold]{data}: {len(report.errors)} error(s), {len(report.warnings)} warning(s)[/]")
        raise typer.Exit(1)
    for t in _summary_tables(report.summary):
        console.print(t)
    console.print(f"[green bold]{data}: valid[/] ({len(report.warnings)} warning(s))")


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="directory to write the benchmark into"),
    videos: int = typer.Option(300, "--videos", min=4, help="number of simulated videos"),
    seed: int = typer.Option(0, "--seed", help="random seed (the build is byte-identical for a seed)"),
    workers: int = typer.Option(0, "--workers", help="processes (0 = all cores)"),
) -> None:
    """Build the simulator-backed synthetic PSR benchmark (pymunk physics, Pillow frames)."""
    from eval.synth import build_benchmark

    path = build_benchmark(out, videos=videos, seed=seed, workers=workers or None, progress=True)
    console.print(f"[green]wrote[/] {path}")
