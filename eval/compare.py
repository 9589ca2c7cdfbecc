"""The paper's Table 3, "Fair MLLM comparison": text predictors (M3, ...) against LFTR in the same spaces.

    python -m eval compare --data DIR --out OUT --phrases m3=runs/m3.jsonl \\
        --text-space bge --text-space gemma --clip-space clip --visual-space dinov2 \\
        [--phrases text-only=runs/text.jsonl] [--lftr-config configs/lftr/paper.yaml] [--lftr-run bge=RUN.parquet ...]

    python -m eval compare --synthetic --data data/psr-synth --out reports/compare   # CPU plumbing

Rows (`plan_rows`; each a run file in ``OUT/runs/``; existing files are kept, so a rerun resumes):

- ``P->S``: predictor P's phrases embedded in text space S, the corpus ranked (``python -m retrieval search``);
- ``P->CLIP t2i``: the phrases as CLIP text queries against the corpus frames (text -> image);
- ``P fused``: z-score fusion of ``P->S1`` and ``P->CLIP t2i`` (``python -m retrieval fuse``);
- ``LFTR->S`` for each text space and ``LFTR->V`` (``python -m retrieval lftr train/predict``, or ``--lftr-run``);
- ``LFTR fused``: z-score fusion of ``LFTR->S1`` and ``LFTR->V``.

Then every row is restricted to the intersection subset (`intersection_subset`): the queries of the split that
every run holds and for which every predictor produced a usable phrase (a failed or unparseable answer would
otherwise tie the whole corpus). The subset runs go to ``OUT/subset/``; `eval.report.build_report` builds the
report with significance (paired bootstrap and McNemar) against the best text-predictor row (highest R@5 on the
subset) in ``OUT/report/``; ``OUT/table3.md`` holds the paper-shaped table (R@1/5/10, MRR, n) and
``OUT/compare.json`` every number and file.

eval imports nothing of the other packages (DESIGN: eval depends on nothing of ours): the rows are built by their
own commands, run as ``python -m retrieval ...`` / ``python -m forecasters ...`` subprocesses in the current
directory, and met through the run files they write.

``--synthetic`` (`synthetic_setup`) builds what the synthetic benchmark lacks, all locally and labelled as plumbing:
the benchmark itself (if DATA is missing), the ``minilm`` text space (the packaged all-MiniLM-L6-v2, the offline
stand-in for BGE), a tiny random CLIP for the ``clip`` space, and M3 phrases from a tiny random Qwen2-VL through the
``hf`` backend; LFTR uses ``configs/lftr/synth.yaml`` with 4 epochs (``--lftr-set epochs=N`` to change).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eval.errors import IncompleteJob, InputError

if TYPE_CHECKING:
    from eval.report_result import Note

OUTPUT_KIND = "eval compare"
#: Everything the command writes into ``--out`` (`is_compare_output` recognises an unmarked folder by these names).
OUTPUT_NAMES = frozenset({"runs", "subset", "report", "lftr", "models", "phrases", "table3.md", "compare.json"})
SYNTH_LFTR_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "lftr" / "synth.yaml"
SYNTH_VIDEOS = 300
PACKAGED_TEXT_MODEL = "packaged:all-MiniLM-L6-v2"  # retrieval.encoders.PACKAGED_MINILM (eval cannot import it)
PLUMBING_NOTE = ("Plumbing check only: random tiny models (Qwen2-VL forecaster, CLIP) and a synthetic benchmark; "
                 "the numbers say nothing about the methods.")
#: Builds the tiny random CLIP of `synthetic_setup` in a subprocess (forecasters is not imported by eval).
TINY_CLIP_CODE = "import sys; from forecasters.tiny_models import build_tiny_clip; build_tiny_clip(sys.argv[1])"

#: Runs one step: the arguments after the Python interpreter (``("-m", "retrieval", "search", ...)``).
StepRunner = Callable[[Sequence[str]], None]


@dataclass(frozen=True)
class CompareConfig:
    """What to compare. ``phrases``: predictor name -> phrase file, in table order; ``text_spaces``: the first is
    the one fused with CLIP / the visual space; ``lftr_runs``: space -> an existing LFTR run (skips training)."""

    data: Path
    out: Path
    phrases: dict[str, str]
    text_spaces: tuple[str, ...]
    clip_space: str | None = None
    visual_space: str | None = None
    lftr_config: tuple[str, ...] = ()
    lftr_set: tuple[str, ...] = ()
    lftr_runs: dict[str, str] = field(default_factory=dict)
    split: str = "test"
    seed: int = 0
    resamples: int = 10_000
    all_queries: bool = False
    synthetic: bool = False  # the table is labelled as a plumbing check

    @property
    def lftr_spaces(self) -> tuple[str, ...]:
        return self.text_spaces + ((self.visual_space,) if self.visual_space else ())


@dataclass(frozen=True)
class Row:
    """A row of Table 3: its run file and the steps that build it when the file is missing. ``predictor``: the
    text predictor of the row (None for LFTR rows); the reference is the best text-predictor row."""

    label: str
    path: Path
    steps: tuple[tuple[str, ...], ...] = ()
    predictor: str | None = None


@dataclass(frozen=True)
class Comparison:
    """The table and its numbers: ``main`` and ``significance`` by row label / run name, as in compare.json."""

    table: str
    reference: str
    subset: list[str]
    n_held_by_all: int
    main: dict[str, dict]
    significance: dict[str, dict]
    #: the report's notes (full text and one terminal line)
    notes: list[Note]


def slug(label: str) -> str:
    """A row's file and run name: ``"M3->bge"`` -> ``"m3-bge"``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower()


def parse_pairs(items: Sequence[str], option: str, example: str = "m3=runs/m3.jsonl") -> dict[str, str]:
    """``["m3=runs/m3.jsonl", ...]`` -> ``{"m3": "runs/m3.jsonl"}`` (a repeated name keeps the last value)."""
    out = {}
    for it in items:
        name, sep, value = it.partition("=")
        if not sep or not name or not value:
            raise InputError(f"{option} must look like NAME=VALUE, got {it!r}", fix=f"e.g. {option} {example}")
        out[name] = value
    return out


def run_step(args: Sequence[str]) -> None:
    """Run ``python ARGS`` with this interpreter in the current directory; a failure raises `IncompleteJob`
    (the step's own error is printed above it)."""
    cmd = [sys.executable, *args]
    print("+ " + shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd).returncode
    if code != 0:
        raise IncompleteJob(f"compare: step failed with exit code {code}: {shlex.join(cmd)}",
                            fix="fix the error above and rerun the same command: rows already in OUT/runs are kept")
    print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)


# --- the rows -------------------------------------------------------------------------------------------------

def run_path(out: Path, label: str) -> Path:
    return out / "runs" / f"{slug(label)}.parquet"


def _predictor_rows(cfg: CompareConfig, name: str, phrase_file: str) -> list[Row]:
    """``P->S`` for every text space, ``P->CLIP t2i`` and ``P fused`` (their z-score fusion)."""
    rows, data = [], str(cfg.data)
    for space in cfg.text_spaces + ((cfg.clip_space,) if cfg.clip_space else ()):
        label = f"{name}->{space}" + (" t2i" if space == cfg.clip_space else "")
        path = run_path(cfg.out, label)
        search = ("-m", "retrieval", "search", "--data", data, "--phrases", phrase_file, "--space", space, "--out",
                  str(path), "--split", cfg.split, "--method", slug(label))
        rows.append(Row(label, path, (search,), name))
    if cfg.clip_space:
        text, image = run_path(cfg.out, f"{name}->{cfg.text_spaces[0]}"), run_path(cfg.out, f"{name}->{cfg.clip_space} t2i")
        rows.append(_fused(cfg, f"{name} fused", text, image, name))
    return rows


def _fused(cfg: CompareConfig, label: str, a: Path, b: Path, predictor: str | None) -> Row:
    path = run_path(cfg.out, label)
    fuse = ("-m", "retrieval", "fuse", "--data", str(cfg.data), "--run", str(a), "--run", str(b), "--out", str(path),
            "--method", slug(label))
    return Row(label, path, (fuse,), predictor)


def _lftr_rows(cfg: CompareConfig) -> list[Row]:
    """``LFTR->S`` for every text space and the visual space (trained and predicted unless ``--lftr-run``), and
    ``LFTR fused`` (``LFTR->S1`` with ``LFTR->V``)."""
    rows, data = [], str(cfg.data)
    overrides = tuple(x for c in cfg.lftr_config for x in ("--config", c)) + \
        tuple(x for kv in cfg.lftr_set for x in ("--set", kv))
    for space in cfg.lftr_spaces:
        label = f"LFTR->{space}"
        if space in cfg.lftr_runs:
            rows.append(Row(label, Path(cfg.lftr_runs[space])))
            continue
        path, ckpt = run_path(cfg.out, label), cfg.out / "lftr" / space
        train = ("-m", "retrieval", "lftr", "train", "--data", data, "--space", space, "--out", str(ckpt), "--seed",
                 str(cfg.seed), *overrides)
        predict = ("-m", "retrieval", "lftr", "predict", "--data", data, "--ckpt", str(ckpt), "--out", str(path),
                   "--split", cfg.split, "--method", slug(label))
        rows.append(Row(label, path, (train, predict)))
    if cfg.visual_space:
        by_label = {r.label: r.path for r in rows}
        rows.append(_fused(cfg, "LFTR fused", by_label[f"LFTR->{cfg.text_spaces[0]}"],
                           by_label[f"LFTR->{cfg.visual_space}"], None))
    return rows


def plan_rows(cfg: CompareConfig) -> list[Row]:
    """Every row of the table in table order (a fused row after the rows it fuses)."""
    rows = [r for name, pf in cfg.phrases.items() for r in _predictor_rows(cfg, name, pf)] + _lftr_rows(cfg)
    names = [slug(r.label) for r in rows]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        same = [r.label for r in rows if slug(r.label) == dup]
        raise InputError(f"rows {same[0]!r} and {same[1]!r} share the run file {dup}.parquet",
                         fix="give the predictors and spaces names that differ in letters or digits")
    return rows


def build_rows(rows: Sequence[Row], run: StepRunner = run_step) -> None:
    """Run the steps of every row whose run file is missing, in table order."""
    for row in rows:
        if row.path.exists():
            continue
        for step in row.steps:
            run(step)
        if not row.path.exists():
            raise IncompleteJob(f"compare: row {row.label!r}: its steps ran but {row.path} was not written",
                                fix="check the output of the steps above and rerun the same command")


# --- the synthetic plumbing run -------------------------------------------------------------------------------

def synthetic_setup(data: Path, out: Path, split: str, run: StepRunner = run_step) -> dict:
    """Build the local stand-ins of the synthetic plumbing run (module docstring); returns the `CompareConfig`
    fields they provide (an option given on the command line wins, see `with_synthetic`)."""
    if not (data / "manifest.json").exists():
        run(("-m", "eval", "synth", "--out", str(data), "--videos", str(SYNTH_VIDEOS)))
    feats, models = data / "features", out / "models"
    if not (feats / "minilm" / "meta.json").exists():
        run(("-m", "retrieval", "encode", "--data", str(data), "--space", "minilm", "--model", PACKAGED_TEXT_MODEL))
    if not (feats / "clip" / "meta.json").exists():
        run(("-c", TINY_CLIP_CODE, str(models / "tiny-clip")))
        run(("-m", "retrieval", "encode", "--data", str(data), "--space", "clip", "--model", str(models / "tiny-clip")))
    phrases, vl = out / "phrases" / "m3-tiny.jsonl", models / "tiny-qwen2-vl"
    if not (vl / "config.json").exists():
        run(("-m", "forecasters", "tiny-model", "--out", str(vl), "--kind", "qwen2_vl"))
    run(("-m", "forecasters", "run", "--data", str(data), "--split", split, "--forecaster", "m3", "--backend", "hf",
         "--model", str(vl), "--out", str(phrases), "--num-threads", "1", "--no-progress"))
    return {"phrases": {"M3 (tiny random Qwen2-VL)": str(phrases)}, "text_spaces": ("minilm",), "clip_space": "clip",
            "visual_space": "pixels", "lftr_config": (str(SYNTH_LFTR_CONFIG),), "lftr_set": ("epochs=4",)}


def with_synthetic(cfg: CompareConfig, setup: dict) -> CompareConfig:
    """``cfg`` completed by `synthetic_setup`'s stand-ins: phrase files are added (a name given on the command line
    wins); every other field keeps the command line's value when it has one."""
    given = {k: getattr(cfg, k) for k in setup if k != "phrases"}
    fill = {k: v for k, v in setup.items() if k != "phrases" and not given[k]}
    return dataclasses.replace(cfg, phrases={**setup["phrases"], **cfg.phrases}, **fill)


# --- checks before anything runs ------------------------------------------------------------------------------

def check_inputs(cfg: CompareConfig, *, before_setup: bool = False) -> None:
    """Every input the rows need, checked before anything runs: `InputError` naming the option and the path.
    ``before_setup``: of a ``--synthetic`` run, whose setup provides the phrases and spaces not given."""
    from eval.cli_support import check_benchmark_dir
    from eval.schema import SPLITS

    if cfg.split not in SPLITS:
        raise InputError(f"--split {cfg.split!r} is not a split", fix=f"pass one of {', '.join(SPLITS)}")
    if not cfg.synthetic or cfg.data.exists():
        check_benchmark_dir(cfg.data)
    for name, path in cfg.phrases.items():
        _must_exist(path, f"--phrases {name}=", "a phrase file (python -m forecasters run writes one)")
    for space, path in cfg.lftr_runs.items():
        _must_exist(path, f"--lftr-run {space}=", "a run file (python -m retrieval lftr predict writes one)")
    for path in cfg.lftr_config:
        _must_exist(path, "--lftr-config ", "an LFTR YAML config (configs/lftr/)")
    if cfg.synthetic and before_setup:
        return
    if not cfg.phrases or not cfg.text_spaces:
        raise InputError("compare needs at least one --phrases and one --text-space",
                         fix="pass --phrases NAME=FILE --text-space SPACE, or --synthetic for the CPU plumbing run")
    for space, path in cfg.lftr_runs.items():
        if space not in cfg.lftr_spaces:
            raise InputError(f"--lftr-run {space}={path}: {space!r} is not an LFTR space of this table",
                             fix=f"name one of {', '.join(cfg.lftr_spaces)} (the text spaces and --visual-space)")


def _must_exist(path: str, option: str, what: str) -> None:
    if not Path(path).is_file():
        how = "is not a file" if Path(path).exists() else "does not exist"
        raise InputError(f"{option}{path} {how}", fix=f"pass {what}")


def job_inputs(cfg: CompareConfig) -> list[str | Path]:
    """The files and folders the job reads: ``--out`` may not be or hold any of them (`eval.outputs`)."""
    return [cfg.data, *cfg.phrases.values(), *cfg.lftr_runs.values(), *cfg.lftr_config]


def is_compare_output(path: Path) -> bool:
    """An unmarked folder that holds this command's output: ``runs/`` and no name outside `OUTPUT_NAMES`."""
    return (path / "runs").is_dir() and {p.name for p in path.iterdir()} <= OUTPUT_NAMES


# --- the table ------------------------------------------------------------------------------------------------

def intersection_subset(cfg: CompareConfig, bench, runs: dict) -> tuple[list[str], int]:
    """The subset's query ids in the split's file order, and how many queries (any split) every run holds. Without
    ``all_queries`` a query also needs a usable phrase (`eval.phrases.PhraseRecord.ok`) from every predictor."""
    from eval.phrases import read_phrases

    common = set.intersection(*(set(r.query_ids) for r in runs.values()))
    n_all = len(common)
    if not cfg.all_queries:
        for path in cfg.phrases.values():
            common &= {q for q, r in read_phrases(path).items() if r.ok}
    order = [q.id for q in bench.queries(cfg.split) if q.id in common]
    if not order:
        raise InputError(f"compare: the intersection subset is empty: no {cfg.split} query is held by every run"
                         + ("" if cfg.all_queries else " and has a usable phrase in every phrase file"),
                         fix="check that the runs and phrase files cover the split (or pass --all-queries)")
    return order, n_all


def write_subset(cfg: CompareConfig, bench, runs: dict, order: list[str]) -> tuple[dict[str, Path], dict[str, dict]]:
    """Each row's run restricted to ``order`` (named by its slug) in ``OUT/subset/``, and its main metrics over the
    split's evaluated population (`eval.evaluate.evaluate_run`: fair Q1-Q4 queries)."""
    from eval.evaluate import Population, QueryLabels, evaluate_run
    from eval.runs import write_run

    sub_dir = cfg.out / "subset"
    sub_dir.mkdir(parents=True, exist_ok=True)
    files, results = {}, {}
    for label, run in runs.items():
        sub = run.select(order)
        sub.name = slug(label)
        files[label] = write_run(sub_dir / f"{slug(label)}.parquet", sub)
        results[label] = evaluate_run(sub, QueryLabels.from_benchmark(bench, order, label),
                                      population=Population((cfg.split,)))["main"]
    return files, results


def significance_report(cfg: CompareConfig, bench, files: dict[str, Path], reference: str) -> tuple[dict, list[str]]:
    """``OUT/report/`` (as ``python -m eval report SUBSET... --reference REF --split SPLIT --intersect``): the
    significance rows by run name, read back from its report.json, and the report's notes."""
    from eval.report import ReportConfig, build_report
    from eval.runs import read_run

    paths = list(files.values())
    rc = ReportConfig(reference=slug(reference), n_resamples=cfg.resamples, seed=cfg.seed, data=str(cfg.data),
                      runs=[str(p) for p in paths], split=(cfg.split,), intersect=True)
    rep = build_report([read_run(p) for p in paths], bench, cfg.out / "report", rc, progress=True,
                       inputs=[cfg.data, *paths])
    report = json.loads((cfg.out / "report" / "report.json").read_text(encoding="utf-8"))
    return {s["run"]: s for s in report["significance"]}, list(rep.notes)


def table3_markdown(cfg: CompareConfig, bench_name: str, labels: Sequence[str], results: dict[str, dict],
                    sig: dict[str, dict], reference: str, n_all: int) -> str:
    """The paper-shaped table: R@1/5/10 and MRR (x100), ΔR@5 vs the reference in pp, bootstrap and McNemar p."""
    usable = "" if cfg.all_queries else " with a usable phrase from every predictor"
    lines = [f"Table 3 (fair MLLM comparison) on {bench_name}: {cfg.split} intersection subset (fair Q1-Q4), "
             f"n = {results[reference]['n']} of {n_all} queries held by every run{usable}; reference = {reference} "
             "(best text predictor); paired bootstrap and McNemar vs the reference.", "",
             "| method | R@1 | R@5 | R@10 | MRR | ΔR@5 vs ref (pp) | p (bootstrap) | p (McNemar) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label in labels:
        m, s = results[label], sig.get(slug(label))
        p_boot = s["bootstrap"]["p_value"] if s else None  # None below eval.stats.MIN_BOOTSTRAP_N queries
        d = (f"{100 * s['bootstrap']['delta']:+.2f} | {'n too small' if p_boot is None else f'{p_boot:.3g}'} | "
             f"{s['mcnemar']['p_value']:.3g}") if s else "— | — | —"
        lines.append(f"| {label} | {100 * m['R@1']:.1f} | {100 * m['R@5']:.1f} | {100 * m['R@10']:.1f} | "
                     f"{100 * m['MRR']:.1f} | {d} |")
    if cfg.synthetic:
        lines += ["", PLUMBING_NOTE]
    return "\n".join(lines) + "\n"


def build_table(cfg: CompareConfig, rows: Sequence[Row]) -> Comparison:
    """Restrict the rows to the intersection subset, pick the reference (the text-predictor row with the highest
    R@5), build the report, write ``table3.md`` and ``compare.json``."""
    from eval.benchmark import Benchmark
    from eval.io import atomic_path, write_json
    from eval.runs import read_run

    bench = Benchmark.load(cfg.data)
    runs = {r.label: read_run(r.path) for r in rows}
    order, n_all = intersection_subset(cfg, bench, runs)
    files, results = write_subset(cfg, bench, runs, order)
    reference = max((r.label for r in rows if r.predictor is not None), key=lambda lb: results[lb]["R@5"])
    sig, notes = significance_report(cfg, bench, files, reference)
    table = table3_markdown(cfg, bench.name, [r.label for r in rows], results, sig, reference, n_all)
    with atomic_path(cfg.out / "table3.md") as tmp:
        tmp.write_text(table, encoding="utf-8")
    write_json(cfg.out / "compare.json", {"subset": {"n": len(order), "n_held_by_all": n_all, "query_ids": order},
                                          "reference": reference, "runs": {r.label: str(r.path) for r in rows},
                                          "phrases": cfg.phrases, "main": results, "significance": sig,
                                          "report": str(cfg.out / "report")})
    return Comparison(table, reference, order, n_all, results, sig, notes)


def compare(cfg: CompareConfig, *, overwrite: bool = False, run: StepRunner = run_step) -> Comparison:
    """The whole job: check the inputs, claim ``--out`` (`eval.outputs`: only an earlier compare output is resumed,
    others need ``overwrite``), build the stand-ins (``--synthetic``) and the missing rows, then the table."""
    from eval.outputs import claimed_dir

    check_inputs(cfg, before_setup=True)
    if not cfg.synthetic:
        plan_rows(cfg)  # its errors before anything is written
    with claimed_dir(cfg.out, OUTPUT_KIND, inputs=job_inputs(cfg), overwrite=overwrite, recognise=is_compare_output):
        (cfg.out / "runs").mkdir(parents=True, exist_ok=True)
        if cfg.synthetic:
            cfg = with_synthetic(cfg, synthetic_setup(cfg.data, cfg.out, cfg.split, run))
            check_inputs(cfg)
        rows = plan_rows(cfg)
        build_rows(rows, run)
        return build_table(cfg, rows)
