"""Command line of the `eval` package: ``python -m eval --help``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from eval.cli_support import data_option, install, overwrite_option
from eval.errors import EXIT_CHECK_FAILED

app = typer.Typer(help="PSR benchmark: validate, build the synthetic benchmark, score runs, build reports, push to the Hub.",
                  no_args_is_help=True, add_completion=False)
install(app)
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
    data: Path = typer.Argument(..., help="benchmark directory or Hub dataset (owner/name[@revision])"),
    no_frames: bool = typer.Option(False, "--no-frames", help="skip checking that frame files exist"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Check a benchmark directory: fields, ids, GT references, leakage, feature files. Exit code 1 on any error."""
    from eval.hub import resolve_data
    from eval.validate import validate as run_validate

    report = run_validate(resolve_data(data, ""), check_frames=not no_frames)
    if as_json:
        print(json.dumps({"ok": report.ok, "problems": [p.__dict__ for p in report.problems],
                          "summary": report.summary}, indent=2))
        raise typer.Exit(0 if report.ok else EXIT_CHECK_FAILED)
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
        raise typer.Exit(EXIT_CHECK_FAILED)
    for t in _summary_tables(report.summary):
        console.print(t)
    console.print(f"[green bold]{data}: valid[/] ({len(report.warnings)} warning(s))")


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="directory to write the benchmark into"),
    preset: str = typer.Option("demo", "--preset", help="build size: demo (default, ~17k segments) or psr "
                                                          "(~218k segments, ~20k queries)"),
    videos: int = typer.Option(0, "--videos", min=0, help="number of simulated videos (0 = the preset's)"),
    query_videos: int = typer.Option(0, "--query-videos", min=0,
                                     help="videos that get prefixes and queries (0 = the preset's)"),
    seed: int = typer.Option(0, "--seed", help="random seed (the build is byte-identical for a seed)"),
    workers: int = typer.Option(0, "--workers", help="processes (0 = all cores)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Build the simulator-truth synthetic benchmark (pymunk physics, Pillow frames, raw descriptions).

    Step 1 of the construction; `python -m retrieval synth` runs it and the canonicalization (step 2) together."""
    from eval.synth import build_benchmark

    path = build_benchmark(out, videos=videos or None, seed=seed, workers=workers or None, progress=True,
                           preset=preset, query_videos=query_videos or None, overwrite=overwrite)
    console.print(f"[green]wrote[/] {path}")


@app.command()
def card(
    data: Path = typer.Argument(..., help="benchmark directory"),
    out: Path = typer.Option(None, "--out", help="folder for card.md and card.json (default: print only)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """The benchmark card: is this benchmark PSR-shaped? States, segments per state, pool sizes, horizon mix,
    prefix-to-target gap, exact chance R@5, canonicalization errors -- beside the paper's values."""
    from eval.card import make_card, write_card

    c = make_card(data)
    typer.echo(c.markdown())
    if out is not None:
        md, js = write_card(c, out, overwrite=overwrite)
        console.print(f"[green]wrote[/] {md} and {js}")


@app.command()
def predictability(
    data: Path = typer.Option(..., "--data", help="a synthetic benchmark (`python -m retrieval synth` or `eval synth`)"),
    out: Path = typer.Option(..., "--out", help="folder for predictability.json and predictability.md"),
    levels: str = typer.Option("0:0,0.2:0.01,1:0.05", "--levels",
                               help="comma-separated perturbations POS_SD:VEL_SD (position sd in world units, the world "
                                    "being 400 wide; relative velocity and spin sd); 0:0 re-simulates unperturbed"),
    split: str = typer.Option("test", "--split", help="the split whose fair Q1-Q4 queries are measured"),
    workers: int = typer.Option(0, "--workers", min=0, help="processes (0 = all cores)"),
    doc: Path = typer.Option(None, "--doc", help="also write the Markdown, with the command that made it, to this file"),
    overwrite: bool = overwrite_option(),
) -> None:
    """The predictability ceiling: re-simulate each query's video with a perturbation just after the prefix's last
    frame and count the answers whose true state is kept; the R@5 that foreseeing them reaches (eval.synth.predictability)."""
    from eval.synth.predictability import Perturbation, check_outputs, measure, write_outputs

    parsed = [Perturbation.parse(x.strip()) for x in levels.split(",") if x.strip()]
    check_outputs(data, out, doc, overwrite=overwrite)  # before the minutes of re-simulation
    m = measure(data, parsed, split=split, workers=workers or None, progress=True)
    md = write_outputs(m, data, out, doc, split=split, overwrite=overwrite)
    typer.echo(md)
    console.print(f"[green]wrote[/] {out / 'predictability.json'}" + (f" and {doc}" if doc is not None else ""))


@app.command()
def findings(
    report: Path = typer.Argument(..., help="report directory (holds report.json)"),
    card: Path = typer.Option(None, "--card", help="card.json of the benchmark: prints it beside the paper's values, "
                                                   "and its state-tie ceilings join the calibration, the decomposition "
                                                   "and the findings"),
    calibration: bool = typer.Option(False, "--calibration", help="also check the synthetic benchmark's calibration "
                                                                  "targets (synthetic README section)"),
    predictability: Path = typer.Option(None, "--predictability",
                                        help="predictability.json of `python -m eval predictability`: its ceilings "
                                             "join the ceiling decomposition"),
    complementarity: Path = typer.Option(None, "--complementarity",
                                         help="complementarity.json of `retrieval complementarity` (or the demo's "
                                              "runs/): the calibration checks that each learned visual space is a "
                                              "space (effective dimension, state-prototype oracle)"),
) -> None:
    """What a report's numbers say: headline comparisons, and (--calibration) the synthetic benchmark's targets."""
    from eval import findings as F

    rep = F.load(report / "report.json")
    card_json = F.load(card) if card is not None else None
    geometry = _read_geometry(complementarity) if complementarity is not None else None
    if card_json is not None:
        typer.echo("## Benchmark card beside the paper\n\n" + F.card_beside_paper(card_json))
    if calibration:
        typer.echo("## Calibration\n\n" + F.calibration_markdown(F.calibration(rep, card_json, geometry)))
        ceiling = F.ceiling_markdown(rep, F.load(predictability) if predictability is not None else None,
                                     card_json)
        if ceiling:
            typer.echo("## Ceiling decomposition\n\n" + ceiling)
    typer.echo("## Findings\n\n" + "\n".join(F.findings(rep, card_json)) + "\n")


# --- evaluation: score one run, report many (owned by the evaluator; see eval/report.py) ---

def _parse_gains(text: str | None) -> dict[str, float] | None:
    """``"in_dataset=1,cross_dataset=1,bge_similar=0.5"`` -> dict (None = the defaults)."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        name, sep, val = part.partition("=")
        try:
            out[name.strip()] = float(val)
        except ValueError:
            raise typer.BadParameter(f"expected TIER=GAIN pairs separated by commas, got {part!r}") from None
        if not sep:
            raise typer.BadParameter(f"expected TIER=GAIN, got {part!r}")
    return out


def _report_config(data: Path, runs: list[Path], reference: str | None, tie: str, ndcg_k: int, gains: str | None,
                   resamples: int, seed: int, split: str = "test", fair: bool = True, qtypes: str = "Q1,Q2,Q3,Q4",
                   intersect: bool = False, pairs: list[str] | None = None):
    from eval.metrics import TIE_MODES
    from eval.report import ReportConfig
    from eval.schema import QUESTION_TYPES, SPLITS

    if tie not in TIE_MODES:
        raise typer.BadParameter(f"--tie must be one of {TIE_MODES}")
    splits = None if split.strip() == "all" else tuple(x.strip() for x in split.split(",") if x.strip())
    if splits is not None and (not splits or set(splits) - set(SPLITS)):
        raise typer.BadParameter(f"--split takes 'all' or a comma list of {SPLITS}, got {split!r}")
    qts = tuple(x.strip() for x in qtypes.split(",") if x.strip())
    if not qts or set(qts) - set(QUESTION_TYPES):
        raise typer.BadParameter(f"--qtypes takes a comma list of {QUESTION_TYPES}, got {qtypes!r}")
    return ReportConfig(tie=tie, ndcg_k=ndcg_k, gains=_parse_gains(gains), reference=reference, n_resamples=resamples,
                        seed=seed, data=str(data), runs=[str(r) for r in runs], split=splits, fair=fair, qtypes=qts,
                        intersect=intersect, pairs=tuple(_parse_pair(p) for p in pairs or ()))


def _parse_pair(text: str) -> tuple[str, str]:
    """``RUN:AGAINST`` -> (RUN, AGAINST); run names hold no ':' but may hold '[', '+' and spaces."""
    a, sep, b = text.rpartition(":")
    if not sep or not a.strip() or not b.strip():
        raise typer.BadParameter(f"expected RUN:AGAINST (two run names), got {text!r}", param_hint="--pair")
    return a.strip(), b.strip()


def _load_runs(paths: list[Path]):
    from eval.runs import read_run

    runs = [read_run(p) for p in paths]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):  # two files with the same run name: tell them apart by file name
        for r, p in zip(runs, paths, strict=True):
            r.name = p.stem
    return runs


_TIE_HELP = "ties: expected (exact mean over random order of tied items), row, optimistic or pessimistic"
_SPLIT_HELP = "evaluated population: split(s), comma-separated, or 'all' (default: test, as the paper)"
_FAIR_HELP = "evaluated population: only fair queries (main GT pool non-empty; the paper's fair test set)"
_QTYPES_HELP = "evaluated population: question types (default Q1-Q4; Q5 groups get their own joint table)"


def _read_card(path: Path) -> dict:
    """A card.json (`eval.card.write_card`); a missing or unreadable file is a one-line error."""
    from eval.errors import InputError

    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"--card {path}: not a readable card.json ({e})",
                         fix="write one with `python -m eval card DATA --out DIR`") from None
    if not isinstance(card, dict) or "values" not in card:
        raise InputError(f"--card {path}: not a card.json (no 'values')",
                         fix="write one with `python -m eval card DATA --out DIR`")
    return card


def _read_geometry(path: Path) -> dict:
    """The spaces' geometry of a complementarity.json (`retrieval.complementarity`); a missing or unreadable file,
    or one without geometry, is a one-line error."""
    from eval.errors import InputError

    fix = "write one with `python -m retrieval complementarity` (`retrieval demo` writes runs/complementarity.json)"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"--complementarity {path}: not a readable complementarity.json ({e})", fix=fix) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("geometry"), dict):
        raise InputError(f"--complementarity {path}: no 'geometry' of the spaces in it", fix=fix)
    return doc["geometry"]


def _print_notes(report) -> None:
    """One line per note (`eval.report_result.Note.line`); report.md holds each in full."""
    for note in report.notes:
        err.print(f"[yellow]note:[/] {note.line}", highlight=False, soft_wrap=True)
_GAINS_HELP = "nDCG tier gains, e.g. in_dataset=1,cross_dataset=1,bge_similar=0.5 (the default)"


@app.command()
def score(
    data: Path = data_option(help="benchmark directory the run was scored on"),
    run: Path = typer.Option(..., "--run", help="run file (.parquet, written by eval.runs.write_run)"),
    out: Path = typer.Option(..., "--out", help="report directory"),
    overwrite: bool = overwrite_option(),
    tie: str = typer.Option("expected", "--tie", help=_TIE_HELP),
    ndcg_k: int = typer.Option(10, "--ndcg-k", help="cut-off of the tier-weighted nDCG"),
    gains: str = typer.Option(None, "--gains", help=_GAINS_HELP),
    seed: int = typer.Option(0, "--seed", help="seed of the bootstrap CIs in the plots"),
    split: str = typer.Option("test", "--split", help=_SPLIT_HELP),
    fair: bool = typer.Option(True, "--fair/--no-fair", help=_FAIR_HELP),
    qtypes: str = typer.Option("Q1,Q2,Q3,Q4", "--qtypes", help=_QTYPES_HELP),
) -> None:
    """Evaluate one run over the evaluated population: every metric and stratum, tables (md/csv/tex), plots and
    report.json in OUT."""
    from eval.benchmark import Benchmark
    from eval.report import build_report

    cfg = _report_config(data, [run], None, tie, ndcg_k, gains, 10_000, seed, split, fair, qtypes)
    rep = build_report(_load_runs([run]), Benchmark.load(data), out, cfg, progress=True, inputs=[data, run],
                       overwrite=overwrite)
    _print_notes(rep)
    main = next(iter(rep.runs.values())).main
    console.print(" ".join(f"{k}={100 * v:.2f}" for k, v in main.values.items() if k.startswith(("R@", "MRR", "macro"))
                           and v is not None) + f"  n={main.n}  ({rep.population.describe()})")
    console.print(f"[green]wrote[/] {out}")


@app.command()
def report(
    runs: list[Path] = typer.Argument(..., help="run files (.parquet); seed variants NAME-seedN are grouped"),
    data: Path = data_option(help="benchmark directory the runs were scored on"),
    out: Path = typer.Option(..., "--out", help="report directory"),
    overwrite: bool = overwrite_option(),
    reference: str = typer.Option(None, "--reference", help="run (or seed group) name to test every run against"),
    pair: list[str] = typer.Option([], "--pair", help="RUN:AGAINST -- also test run RUN against run AGAINST "
                                                      "(paired bootstrap + McNemar, pairs.md; repeatable); two seed "
                                                      "groups' labels: each query's hit averaged over their common "
                                                      "seeds, and a paired t-test over those seeds"),
    tie: str = typer.Option("expected", "--tie", help=_TIE_HELP),
    ndcg_k: int = typer.Option(10, "--ndcg-k", help="cut-off of the tier-weighted nDCG"),
    gains: str = typer.Option(None, "--gains", help=_GAINS_HELP),
    resamples: int = typer.Option(10_000, "--resamples", min=100, help="paired bootstrap resamples"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
    split: str = typer.Option("test", "--split", help=_SPLIT_HELP),
    fair: bool = typer.Option(True, "--fair/--no-fair", help=_FAIR_HELP),
    qtypes: str = typer.Option("Q1,Q2,Q3,Q4", "--qtypes", help=_QTYPES_HELP),
    intersect: bool = typer.Option(False, "--intersect", help="evaluate over the population queries every run holds "
                                                              "(with a note) instead of refusing a run lacking some"),
    card: Path = typer.Option(None, "--card", help="card.json of the benchmark (`eval card --out`): its horizon "
                                                   "shares are plotted beside the population's"),
) -> None:
    """Paper-shaped tables for many runs over one evaluated population (main, by horizon, question type, tier, GT
    definition, domain, triplets, multi-object Q5, significance vs --reference) as md/csv/tex, PNG plots and
    report.json in OUT."""
    from eval.benchmark import Benchmark
    from eval.report import build_report

    cfg = _report_config(data, runs, reference, tie, ndcg_k, gains, resamples, seed, split, fair, qtypes, intersect,
                         pair)
    card_json = _read_card(card) if card is not None else None
    rep = build_report(_load_runs(runs), Benchmark.load(data), out, cfg, progress=True, inputs=[data, *runs],
                       overwrite=overwrite, card=card_json)
    _print_notes(rep)
    typer.echo((out / "main.md").read_text(encoding="utf-8"))
    console.print(f"[green]wrote[/] {out}")


# --- the paper's Table 3: text predictors against LFTR in the same spaces (see eval/compare.py) ---

@app.command()
def compare(
    data: Path = typer.Option(..., "--data", help="benchmark directory (with --synthetic: built when missing)"),
    out: Path = typer.Option(..., "--out", help="output folder: runs/, subset/, report/, table3.md, compare.json "
                                                "(a rerun keeps the run files there and resumes)"),
    overwrite: bool = overwrite_option(),
    phrases: list[str] = typer.Option([], "--phrases", help="NAME=FILE: a text predictor's phrase file (repeat; "
                                                            "rows in this order)"),
    text_space: list[str] = typer.Option([], "--text-space", help="semantic space (repeat); the first is the one "
                                                                  "fused with --clip-space and --visual-space"),
    clip_space: str = typer.Option(None, "--clip-space", help="CLIP/SigLIP image space: the phrases as text -> image "
                                                              "queries, and their fusion with the first text space"),
    visual_space: str = typer.Option(None, "--visual-space", help="visual space of LFTR and of its fusion with the "
                                                                  "first text space (paper: dinov2)"),
    lftr_config: list[str] = typer.Option([], "--lftr-config", help="LFTR YAML config for training (repeat; applied "
                                                                    "in order over the defaults)"),
    lftr_set: list[str] = typer.Option([], "--lftr-set", help="LFTR config override KEY=VALUE (repeat)"),
    lftr_run: list[str] = typer.Option([], "--lftr-run", help="SPACE=RUN: an existing LFTR run file for SPACE "
                                                              "(skips training; repeat)"),
    split: str = typer.Option("test", "--split", help="split of the table: train | val | test"),
    seed: int = typer.Option(0, "--seed", help="seed of LFTR training and of the paired bootstrap"),
    resamples: int = typer.Option(10_000, "--resamples", min=100, help="paired bootstrap resamples"),
    all_queries: bool = typer.Option(False, "--all-queries", help="keep queries without a usable phrase from every "
                                                                  "predictor in the subset"),
    synthetic: bool = typer.Option(False, "--synthetic", help="CPU plumbing run: build the benchmark, a MiniLM text "
                                                              "space, a tiny random CLIP and tiny-model M3 phrases "
                                                              "locally (options given still win)"),
) -> None:
    """The paper's Table 3 (fair MLLM comparison): each predictor's phrases in every text space, CLIP text -> image
    and their fusion, against LFTR in the same spaces and its fusion, over the intersection subset, with
    significance against the best text-predictor row. Rows missing from OUT/runs/ are built by the retrieval
    commands (eval/compare.py)."""
    from eval.compare import CompareConfig, parse_pairs
    from eval.compare import compare as run_compare

    cfg = CompareConfig(data=data, out=out, phrases=parse_pairs(phrases, "--phrases"), text_spaces=tuple(text_space),
                        clip_space=clip_space, visual_space=visual_space, lftr_config=tuple(lftr_config),
                        lftr_set=tuple(lftr_set), lftr_runs=parse_pairs(lftr_run, "--lftr-run", "bge=lftr-bge.parquet"),
                        split=split, seed=seed, resamples=resamples, all_queries=all_queries, synthetic=synthetic)
    result = run_compare(cfg, overwrite=overwrite)
    _print_notes(result)
    typer.echo(result.table)
    console.print(f"[green]wrote[/] {out / 'table3.md'}, {out / 'compare.json'} and {out / 'report'}")


# --- export for other evaluators (see eval/trec.py) ---

@app.command("export-trec")
def export_trec(
    run: Path = typer.Argument(..., help="run file (.parquet, written by eval.runs.write_run)"),
    data: Path = data_option(help="benchmark directory the run was scored on"),
    out: Path = typer.Option(..., "--out", help="TREC run file to write (qid Q0 docid rank score tag)"),
    qrels: Path = typer.Option(None, "--qrels", help="also write the ground truth as a qrels file (qid 0 docid 1)"),
    k: int = typer.Option(100, "--k", min=1, help="items per query (at most the run's own top-k)"),
    tag: str = typer.Option(None, "--tag", help="run tag column (default: the run name)"),
    scores: str = typer.Option("run", "--scores", help="score column: run (the method's scores; tools break ties "
                                                       "their own way) or rank (n+1-rank: every tool reproduces the "
                                                       "listed order, i.e. --tie row)"),
    gt: str = typer.Option("type2-all", "--gt", help="GT definition of --qrels (type2-all = the main pool)"),
    split: str = typer.Option("test", "--split", help=_SPLIT_HELP),
    fair: bool = typer.Option(True, "--fair/--no-fair", help=_FAIR_HELP),
    qtypes: str = typer.Option("Q1,Q2,Q3,Q4", "--qtypes", help=_QTYPES_HELP),
    overwrite: bool = overwrite_option(),
) -> None:
    """Write a run as a TREC run file (and --qrels the GT) for trec_eval / ranx: the run's queries in the evaluated
    population, ties as listed (by corpus row); see eval/trec.py for how the numbers compare with eval score."""
    from eval.trec import SCORE_MODES
    from eval.trec import export_trec as export

    if scores not in SCORE_MODES:
        raise typer.BadParameter(f"--scores must be one of {SCORE_MODES}, got {scores!r}")
    population = _report_config(data, [run], None, "expected", 10, None, 100, 0, split, fair, qtypes).population()
    res = export(run, data, out, qrels=qrels, k=k, tag=tag, scores=scores, gt=gt, population=population,
                 overwrite=overwrite)
    console.print(f"[green]wrote[/] {res.run_path} ({res.n_run_lines} lines, {res.n_queries} queries, "
                  f"k={res.k} of the run's {res.run_k})"
                  + (f" and {res.qrels_path} ({res.n_qrels_lines} lines)" if res.qrels_path else ""))


# --- the Hub (see eval/hub.py, eval/push.py) ---

@app.command()
def push(
    data: Path = typer.Argument(..., help="benchmark directory (validated first; refused when it does not validate)"),
    repo_id: str = typer.Argument(..., help="Hub dataset repo to create or update: owner/name"),
    private: bool = typer.Option(False, "--private", help="create the repo private (an existing repo keeps its "
                                                          "visibility)"),
    revision: str = typer.Option(None, "--revision", help="branch to commit to (created from main when missing; "
                                                          "default: main)"),
) -> None:
    """Upload a built, validated benchmark as a Hub dataset repo (one commit; its .cache/ and output marker stay
    local). Every --data then takes REPO_ID[@REVISION]."""
    from eval.push import push_benchmark

    res = push_benchmark(data, repo_id, private=private, revision=revision, log=console.print)
    console.print(f"[green]pushed[/] {res.files} file(s) to {res.url} (revision {res.revision}); use it as "
                  f"--data {res.repo_id}" + (f"@{res.revision}" if res.revision != "main" else ""))
