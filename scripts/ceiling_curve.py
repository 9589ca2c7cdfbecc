"""The perfect-perception ceiling against the amount of training data: a learning curve of ``lftr-sim``.

    python scripts/ceiling_curve.py --data data/psr-synth --out reports/ceiling-curve
    python scripts/ceiling_curve.py --data DIR --out DIR --fractions 0.25,1 --seeds 0,1 --doc docs/ceiling-curve.md

``lftr-sim[<semantic>]`` is LFTR reading the simulator's exact state at the prefix's end (the ``sim`` prefix space,
`eval.synth.simspace`) into the semantic space: the forecaster with perfect perception, whose R@5 against the
semantic-text oracle is the benchmark's predictability ceiling (`python -m eval findings --calibration`). This
script asks whether that ceiling is set by the world or by the amount of data: it trains the same head on nested
shares of the training videos (``--fractions``; LFTR's ``train_fraction``, `retrieval.lftr.train.fraction_videos`),
each for the same number of optimizer steps (``epochs = round(E / fraction)``, E the config's epochs, validated
every ``round(1 / fraction)`` epochs; the checkpoint of the best validation R@5 is kept, and validation always uses
the whole validation split), predicts
the test split and scores every head and the semantic-text oracle with one `python -m eval report` (the main
table's population: fair test queries, Q1-Q4).

Beside each head, on the same share and seed (unless ``--no-classifier``): the state classifier
(`retrieval.classifier`, ``python -m retrieval baseline state-classifier --train-fraction F``), an MLP from the same
prefix tokens to the target's canonical state: a learner built for the task, not the paper's. Where the two curves
agree, the ceiling is what the data teaches, not LFTR.

Reported (``OUT/curve.md``, ``OUT/curve.json``; ``--doc FILE`` also writes the Markdown there): per share, the
training videos and queries, the epochs, R@5 (mean +- std over ``--seeds``), its share of the oracle and R@5 by
horizon, and the state classifier's R@5 and share; the least-squares slope of R@5 against log2(training queries)
(points per doubling of the data) for each learner and, only as a log-linear extrapolation, the data at which
``lftr-sim``'s slope would reach 30% of the oracle (the issue's lower bound). Commands run as subprocesses (`python -m
retrieval lftr train | predict`, `python -m retrieval baseline state-classifier`, `python -m retrieval oracle`,
`python -m eval report`), ``--workers`` jobs at a time (each head trains on the config's threads).

Resumable: a head resumes from its ``last.pt`` (a finished head trains nothing; a head folder of another config is
refused by ``lftr train``), a prediction newer than its head's ``best.pt``, a classifier run and the oracle run are
kept (a run of another benchmark is refused by ``eval report``); nothing is deleted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
PY = sys.executable
ORACLE = "oracle-semantic-text"


def run(cmd: list[str], log: Path) -> None:
    """Run one toolkit command, its output into ``log``; a failure stops the script naming the command and log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise SystemExit(f"failed (exit {rc}): {shlex.join(cmd)}\nlog: {log}\n{tail}")


def head_name(semantic: str, fraction: float, seed: int) -> str:
    return f"lftr-sim[{semantic}] train {fraction:g} seed {seed}"


def train_and_predict(a: argparse.Namespace, base_epochs: int, fraction: float, seed: int) -> Path:
    """Train one head on ``fraction`` of the training videos and predict the test split; the run file."""
    stem = f"f{fraction:g}-s{seed}"
    ck, run_file = a.out / "heads" / stem, a.out / "runs" / f"lftr-sim-{stem}.parquet"
    epochs = max(1, round(base_epochs / fraction))
    configs = [x for c in a.config for x in ("--config", str(c))]
    rb = [PY, "-m", "retrieval", "lftr"]
    run([*rb, "train", "--data", str(a.data), "--space", a.semantic_space, "--prefix-space", a.prefix_space,
         "--question-space", a.semantic_space, *configs, "--set", f"train_fraction={fraction}",
         "--set", f"epochs={epochs}", "--set", f"val_every={max(1, round(1 / fraction))}", "--seed", str(seed),
         "--out", str(ck)], a.out / "logs" / f"train-{stem}.log")
    # the train command resumes: a finished head trains nothing, and another config in its folder is refused, so
    # a prediction newer than the head's checkpoint is that head's
    if run_file.exists() and run_file.stat().st_mtime_ns >= (ck / "best.pt").stat().st_mtime_ns:
        return run_file
    run([*rb, "predict", "--data", str(a.data), "--ckpt", str(ck), "--out", str(run_file), "--split", "test",
         "--method", head_name(a.semantic_space, fraction, seed)], a.out / "logs" / f"predict-{stem}.log")
    return run_file


def classifier_name(semantic: str, prefix: str, fraction: float, seed: int) -> str:
    return f"state-classifier-{prefix}[{semantic}] train {fraction:g} seed {seed}"


def classify(a: argparse.Namespace, fraction: float, seed: int) -> Path:
    """The state classifier (`retrieval.classifier`) on ``fraction`` of the training videos, its test run (kept
    when it exists)."""
    run_file = a.out / "runs" / f"state-classifier-f{fraction:g}-s{seed}.parquet"
    if not run_file.exists():
        run([PY, "-m", "retrieval", "baseline", "state-classifier", "--data", str(a.data), "--space",
             a.semantic_space, "--prefix-space", a.prefix_space, "--seed", str(seed), "--train-fraction",
             str(fraction), "--split", "test", "--out", str(run_file), "--method",
             classifier_name(a.semantic_space, a.prefix_space, fraction, seed)],
            a.out / "logs" / f"classifier-f{fraction:g}-s{seed}.log")
    return run_file


def slope_per_doubling(n: list[float], r5: list[float]) -> float | None:
    """Least-squares slope of ``r5`` against log2(``n``) (None with fewer than two distinct sizes)."""
    if len(set(n)) < 2:
        return None
    return float(np.polyfit(np.log2(np.asarray(n, float)), np.asarray(r5, float), 1)[0])


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _seed_stats(runs: dict, names: list[str]) -> tuple[list[float], float, float, dict[str, float]]:
    """R@5 x100 of each named run, their mean and std, and the mean R@5 by horizon."""
    vals = [100 * runs[n]["main"]["R@5"] for n in names]
    by_h: dict[str, list[float]] = {}
    for n in names:
        for h, v in runs[n].get("by_horizon", {}).items():
            if v.get("R@5") is not None:
                by_h.setdefault(h, []).append(100 * v["R@5"])
    std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
    return vals, float(np.mean(vals)), std, {h: float(np.mean(v)) for h, v in sorted(by_h.items())}


def table(a: argparse.Namespace, report: dict, info: dict[float, dict], base_epochs: int) -> tuple[str, dict]:
    """The Markdown page and its JSON from the report (module docstring)."""
    runs = report["runs"]
    oracle = 100 * runs[f"{ORACLE}[{a.semantic_space}]"]["main"]["R@5"]
    n_pop = report["population"].get("n") if isinstance(report.get("population"), dict) else None
    rows, points, cpoints = [], [], []
    for f in a.fractions:
        vals, mean, std, by_h = _seed_stats(runs, [head_name(a.semantic_space, f, s) for s in a.seeds])
        points.append((info[f]["train_queries"], mean))
        row = dict(fraction=f, train_videos=info[f]["train_videos"], train_queries=info[f]["train_queries"],
                   epochs=max(1, round(base_epochs / f)), r5=vals, r5_mean=mean, r5_std=std,
                   share_of_oracle=mean / oracle if oracle else None, by_horizon=by_h)
        if a.classifier:
            cvals, cmean, cstd, _ = _seed_stats(
                runs, [classifier_name(a.semantic_space, a.prefix_space, f, s) for s in a.seeds])
            nq = info[f].get("classifier_train_queries")
            cpoints.append((nq or info[f]["train_queries"], cmean))  # its own training queries (Q1-Q4)
            row.update(classifier_train_queries=nq, classifier_r5=cvals, classifier_r5_mean=cmean,
                       classifier_r5_std=cstd, classifier_share_of_oracle=cmean / oracle if oracle else None)
        rows.append(row)
    slope = slope_per_doubling([p[0] for p in points], [p[1] for p in points])
    cslope = slope_per_doubling([p[0] for p in cpoints], [p[1] for p in cpoints]) if cpoints else None
    full = max(rows, key=lambda r: r["fraction"])
    target = 0.3 * oracle
    factor = None
    if slope and slope > 0 and full["r5_mean"] < target:
        factor = 2 ** ((target - full["r5_mean"]) / slope)
    cmd = shlex.join(["python", "scripts/ceiling_curve.py", *sys.argv[1:]])
    seeds = ", ".join(map(str, a.seeds))

    def pm(mean: float, std: float) -> str:
        return f"{mean:.2f}" + (f" ± {std:.2f}" if len(a.seeds) > 1 else "")

    hs = list(rows[0]["by_horizon"])
    lines = [
        "# The perfect-perception ceiling against the training data",
        "",
        f"Generated by `{cmd}`; do not edit by hand: rerun the command to regenerate. Benchmark "
        f"`{a.data}`; `lftr-sim[{a.semantic_space}]` (LFTR from the `{a.prefix_space}` prefix space: the "
        "simulator's exact state at the prefix's end) trained on nested shares of the training videos, each for "
        f"the same number of optimizer steps; seeds {seeds}; config {', '.join(_shown(c) for c in a.config)}. "
        + (f"Beside it, on the same shares and seeds, `state-classifier-{a.prefix_space}[{a.semantic_space}]` "
           "(`retrieval.classifier`: an MLP from the same prefix tokens and the question's type, horizon and "
           "time to the target's canonical state, early-stopped on validation; its prediction is that state's "
           "embedding), a learner built for the task rather than the paper's method. " if a.classifier else "")
        + "R@5 x100 on the main table's population (fair test queries, Q1-Q4"
        + (f"; n = {n_pop:,}" if n_pop else "") + "), scored by `python -m eval report`.",
        "",
        "| share of training videos | videos | training queries | epochs | R@5 | share of the oracle | "
        + " | ".join(f"h{h}" for h in hs) + " |" + (" state classifier R@5 | its share of the oracle |"
                                                     if a.classifier else ""),
        "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(hs) + ("---:|---:|" if a.classifier else ""),
    ]
    for r in rows:
        line = (f"| {r['fraction']:g} | {r['train_videos']:,} | {r['train_queries']:,} | {r['epochs']} | "
                f"{pm(r['r5_mean'], r['r5_std'])} | {100 * r['share_of_oracle']:.0f}% | "
                + " | ".join(f"{v:.1f}" for v in r["by_horizon"].values()) + " |")
        if a.classifier:
            line += (f" {pm(r['classifier_r5_mean'], r['classifier_r5_std'])} | "
                     f"{100 * r['classifier_share_of_oracle']:.0f}% |")
        lines.append(line)
    lines += ["", f"Semantic-text oracle (`{ORACLE}[{a.semantic_space}]`): R@5 {oracle:.2f}; 30% of it: "
              f"{target:.2f}."]
    if slope is not None:
        lines.append(f"Slope: R@5 {slope:+.2f} points per doubling of the training queries (least squares over "
                     f"log2 of the training queries, seeds' means)"
                     + (f"; the state classifier's {cslope:+.2f}." if cslope is not None else "."))
    if factor is not None:
        lines.append(f"Log-linear extrapolation (an assumption: the slope holds beyond the measured range): 30% of "
                     f"the oracle at about {factor:.0f}x the full training set "
                     f"({factor * full['train_queries']:,.0f} training queries).")
    if a.classifier:
        gap = full["classifier_r5_mean"] - full["r5_mean"]
        nq = full.get("classifier_train_queries")
        lines.append(f"On all the training data the state classifier scores {gap:+.2f} R@5 against `lftr-sim` "
                     f"({full['classifier_r5_mean']:.2f} against {full['r5_mean']:.2f})"
                     + (f"; it learns from the {nq:,} Q1-Q4 queries among the training queries (LFTR also trains "
                        "on Q5)." if nq else "."))
    md = "\n".join(lines) + "\n"
    data = dict(command=cmd, data=str(a.data), oracle_r5=oracle, target_r5=target, slope_per_doubling=slope,
                classifier_slope_per_doubling=cslope, extrapolated_factor=factor, rows=rows)
    return md, data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", type=Path, required=True, help="a built benchmark with the sim prefix space")
    p.add_argument("--out", type=Path, required=True, help="folder of the heads, runs, report and curve")
    p.add_argument("--fractions", default="0.125,0.25,0.5,1", help="comma-separated shares of the training videos")
    p.add_argument("--seeds", default="0", help="comma-separated seeds per share")
    p.add_argument("--semantic-space", default="minilm", help="the target (and question) space")
    p.add_argument("--prefix-space", default="sim", help="the perfect-perception prefix space")
    p.add_argument("--config", type=Path, action="append", default=None,
                   help="LFTR config file(s) (default: configs/lftr/synth.yaml, the demo's)")
    p.add_argument("--workers", type=int, default=2, help="heads trained at a time")
    p.add_argument("--doc", type=Path, default=None, help="also write the Markdown page here")
    p.add_argument("--no-classifier", dest="classifier", action="store_false",
                   help="train only lftr-sim, not the state classifier beside it")
    a = p.parse_args(argv)
    try:
        a.fractions = sorted({float(x) for x in a.fractions.split(",") if x.strip()})
        a.seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    except ValueError as e:
        p.error(f"--fractions / --seeds: {e}")
    if not a.fractions or any(not 0 < f <= 1 for f in a.fractions) or not a.seeds:
        p.error("--fractions must be shares in (0, 1] and --seeds at least one seed")
    a.config = a.config or [ROOT / "configs" / "lftr" / "synth.yaml"]
    sim_meta = a.data / "features" / a.prefix_space / "meta.json"
    sem_meta = a.data / "features" / a.semantic_space / "meta.json"
    for need, how in ((sim_meta, "build the benchmark with `python -m retrieval synth` (it writes the sim space)"),
                      (sem_meta, f"encode it: python -m retrieval encode --data {a.data} --space "
                                 f"{a.semantic_space} --model packaged:all-MiniLM-L6-v2 --kind semantic")):
        if not need.exists():
            raise SystemExit(f"{need} is missing: {how}")

    from retrieval.lftr.config import load_config

    base_epochs = load_config([str(c) for c in a.config]).epochs
    a.out.mkdir(parents=True, exist_ok=True)
    oracle = a.out / "runs" / f"{ORACLE}.parquet"
    if not oracle.exists():
        run([PY, "-m", "retrieval", "oracle", "semantic-text", "--data", str(a.data), "--out", str(oracle),
             "--split", "test", "--space", a.semantic_space], a.out / "logs" / "oracle.log")
    jobs = [(f, s) for f in a.fractions for s in a.seeds]
    print(f"{len(jobs)} head(s), {a.workers} at a time; logs in {a.out / 'logs'}", flush=True)
    with ThreadPoolExecutor(max(1, a.workers)) as pool:
        run_files = list(pool.map(lambda js: train_and_predict(a, base_epochs, *js), jobs))
        if a.classifier:
            run_files += list(pool.map(lambda js: classify(a, *js), jobs))
    info = {}
    for f in a.fractions:
        ti = json.loads((a.out / "heads" / f"f{f:g}-s{a.seeds[0]}" / "train_info.json").read_text())
        info[f] = dict(train_queries=int(ti["train_queries"]), train_videos=int(ti["train_videos"]))
        if a.classifier:
            from eval.runs import read_run

            fit = read_run(a.out / "runs" / f"state-classifier-f{f:g}-s{a.seeds[0]}.parquet").config.get("fit", {})
            info[f]["classifier_train_queries"] = fit.get("train_queries")
    run([PY, "-m", "eval", "report", str(oracle), *map(str, run_files), "--data", str(a.data), "--out",
         str(a.out / "report"), "--split", "test"], a.out / "logs" / "report.log")
    report = json.loads((a.out / "report" / "report.json").read_text())
    md, data = table(a, report, info, base_epochs)
    (a.out / "curve.md").write_text(md, encoding="utf-8")
    (a.out / "curve.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if a.doc:
        a.doc.write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
