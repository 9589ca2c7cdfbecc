"""The paper's Table 3, "Fair MLLM comparison": text predictors (M3, ...) against LFTR in the same spaces.

    python scripts/compare_predictors.py --data DIR --out OUT --phrases m3=runs/m3.jsonl \\
        --text-space bge --text-space gemma --clip-space clip --visual-space dinov2 \\
        [--phrases text-only=runs/text.jsonl] [--lftr-config configs/lftr/paper.yaml] [--lftr-run bge=RUN.parquet ...]

    python scripts/compare_predictors.py --synthetic --data data/psr-synth --out reports/compare   # CPU plumbing

Rows (each a run file in ``OUT/runs/``, built with the retrieval CLI; existing files are kept, so a rerun resumes):

- ``P->S``: predictor P's phrases embedded in text space S, the corpus ranked (``python -m retrieval search``);
- ``P->CLIP t2i``: the phrases as CLIP text queries against the corpus frames (text -> image);
- ``P fused``: z-score fusion of ``P->S1`` and ``P->CLIP t2i`` (``python -m retrieval fuse``);
- ``LFTR->S`` for each text space and ``LFTR->V`` (``python -m retrieval lftr train/predict``, or ``--lftr-run``);
- ``LFTR fused``: z-score fusion of ``LFTR->S1`` and ``LFTR->V``.

Then every row is restricted to the intersection subset: the test queries every run holds and for which every
predictor produced a usable phrase (a failed or unparseable answer would otherwise tie the whole corpus). The subset
runs go to ``OUT/subset/`` and ``python -m eval report`` builds the table with significance (paired bootstrap and
McNemar) against the best text-predictor row (highest R@5 on the subset) in ``OUT/report/``; ``OUT/table3.md``
holds the paper-shaped table (R@1/5/10, MRR, n) and ``OUT/compare.json`` every number and file.

``--synthetic`` builds what the synthetic benchmark lacks, all locally and labelled as plumbing: the benchmark itself
(if DATA is missing), the ``minilm`` text space (the packaged all-MiniLM-L6-v2, the offline stand-in for BGE), a
tiny random CLIP for the ``clip`` space, and M3 phrases from a tiny random Qwen2-VL through the ``hf`` backend;
LFTR uses ``configs/lftr/synth.yaml`` with 4 epochs (``--lftr-set epochs=N`` to change).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sh(*args: str) -> None:
    """Run ``python -m ...`` of this interpreter; stop on failure (the command and its output are shown)."""
    cmd = [sys.executable, "-m", *args]
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO)
    if r.returncode != 0:
        sys.exit(f"compare_predictors: command failed with exit code {r.returncode}: {' '.join(cmd)}")
    print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower()


def pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for it in items:
        if "=" not in it:
            sys.exit(f"compare_predictors: {what} must look like NAME=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def synthetic_setup(data: Path, out: Path, split: str) -> dict:
    """Build the local stand-ins of the synthetic plumbing run (see the module docstring)."""
    if not (data / "manifest.json").exists():
        sh("eval", "synth", "--out", str(data), "--videos", "300")
    feats = data / "features"
    if not (feats / "minilm" / "meta.json").exists():
        sh("retrieval", "encode", "--data", str(data), "--space", "minilm", "--model", "packaged:all-MiniLM-L6-v2")
    models = out / "models"
    if not (feats / "clip" / "meta.json").exists():
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from forecasters.tiny_models import build_tiny_clip

        build_tiny_clip(models / "tiny-clip")
        sh("retrieval", "encode", "--data", str(data), "--space", "clip", "--model", str(models / "tiny-clip"))
    phrases = out / "phrases" / "m3-tiny.jsonl"
    vl = models / "tiny-qwen2-vl"
    if not (vl / "config.json").exists():
        sh("forecasters", "tiny-model", "--out", str(vl), "--kind", "qwen2_vl")
    sh("forecasters", "run", "--data", str(data), "--split", split, "--forecaster", "m3", "--backend", "hf",
       "--model", str(vl), "--out", str(phrases), "--threads", "1", "--no-progress")
    return {"phrases": {"M3 (tiny random Qwen2-VL)": str(phrases)}, "text_spaces": ["minilm"], "clip_space": "clip",
            "visual_space": "pixels", "lftr_config": [str(REPO / "configs" / "lftr" / "synth.yaml")],
            "lftr_set": ["epochs=4"]}


def usable_phrase_ids(path: str) -> set[str]:
    from eval.phrases import read_phrases

    return {q for q, r in read_phrases(path).items() if r.ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--phrases", action="append", default=[], help="NAME=phrase file of a text predictor (repeat)")
    ap.add_argument("--text-space", action="append", default=[], help="semantic space (repeat; first = fusion's)")
    ap.add_argument("--clip-space", help="CLIP/SigLIP image space for text -> image")
    ap.add_argument("--visual-space", help="visual space of LFTR's fusion (paper: dinov2)")
    ap.add_argument("--lftr-config", action="append", default=[], help="LFTR YAML config(s) for training")
    ap.add_argument("--lftr-set", action="append", default=[], help="LFTR config override KEY=VALUE (repeat)")
    ap.add_argument("--lftr-run", action="append", default=[], help="SPACE=existing LFTR run (skips training)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--all-queries", action="store_true", help="do not drop queries without a usable phrase")
    ap.add_argument("--synthetic", action="store_true", help="build local stand-ins (plumbing check; see above)")
    args = ap.parse_args()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    out: Path = args.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    setup = synthetic_setup(args.data, out, args.split) if args.synthetic else {}
    phrases = {**setup.get("phrases", {}), **pairs(args.phrases, "--phrases")}
    text_spaces = args.text_space or setup.get("text_spaces", [])
    clip_space = args.clip_space or setup.get("clip_space")
    visual_space = args.visual_space or setup.get("visual_space")
    lftr_config = args.lftr_config or setup.get("lftr_config", [])
    lftr_set = args.lftr_set or setup.get("lftr_set", [])
    lftr_runs = pairs(args.lftr_run, "--lftr-run")
    if not phrases or not text_spaces:
        sys.exit("compare_predictors: need at least one --phrases and one --text-space (or --synthetic)")
    data, runs = str(args.data), {}

    def run_path(label: str) -> Path:
        return out / "runs" / f"{slug(label)}.parquet"

    predictors = []
    for name, pf in phrases.items():
        predictors.append(name)
        for space in text_spaces + ([clip_space] if clip_space else []):
            label = f"{name}->{space}" + (" t2i" if space == clip_space else "")
            runs[label] = run_path(label)
            if not runs[label].exists():
                sh("retrieval", "search", "--data", data, "--phrases", pf, "--space", space, "--out",
                   str(runs[label]), "--split", args.split, "--method", slug(label))
        if clip_space:
            label = f"{name} fused"
            runs[label] = run_path(label)
            if not runs[label].exists():
                sh("retrieval", "fuse", "--data", data, "--run", str(runs[f"{name}->{text_spaces[0]}"]), "--run",
                   str(runs[f"{name}->{clip_space} t2i"]), "--out", str(runs[label]), "--method", slug(label))
    lftr_spaces = text_spaces + ([visual_space] if visual_space else [])
    for space in lftr_spaces:
        label = f"LFTR->{space}"
        runs[label] = Path(lftr_runs[space]) if space in lftr_runs else run_path(label)
        if runs[label].exists():
            continue
        ckpt = out / "lftr" / space
        cfg = [x for c in lftr_config for x in ("--config", c)] + [x for kv in lftr_set for x in ("--set", kv)]
        sh("retrieval", "lftr", "train", "--data", data, "--space", space, "--out", str(ckpt), "--seed",
           str(args.seed), *cfg)
        sh("retrieval", "lftr", "predict", "--data", data, "--ckpt", str(ckpt), "--out", str(runs[label]),
           "--split", args.split, "--method", slug(label))
    if visual_space:
        label = "LFTR fused"
        runs[label] = run_path(label)
        if not runs[label].exists():
            sh("retrieval", "fuse", "--data", data, "--run", str(runs[f"LFTR->{text_spaces[0]}"]), "--run",
               str(runs[f"LFTR->{visual_space}"]), "--out", str(runs[label]), "--method", slug(label))
    table = build_table(args, runs, phrases, predictors)
    print(table)


def build_table(args, runs: dict[str, Path], phrases: dict[str, str], predictors: list[str]) -> str:
    """Restrict to the intersection subset, pick the reference, run ``eval report``, write table3.md."""
    from eval.benchmark import Benchmark
    from eval.evaluate import Population, QueryLabels, evaluate_run
    from eval.io import write_json
    from eval.runs import read_run, write_run

    out = args.out
    bench = Benchmark.load(args.data)
    loaded = {label: read_run(p) for label, p in runs.items()}
    common = set.intersection(*(set(r.query_ids) for r in loaded.values()))
    n_all = len(common)
    if not args.all_queries:
        for name in predictors:
            common &= usable_phrase_ids(phrases[name])
    order = [q.id for q in bench.queries(args.split) if q.id in common]
    if not order:
        sys.exit("compare_predictors: the intersection subset is empty (no query has a usable phrase in every file)")
    sub_dir = out / "subset"
    sub_dir.mkdir(parents=True, exist_ok=True)
    results, files = {}, {}
    for label, run in loaded.items():
        sub = run.select(order)
        sub.name = slug(label)
        files[label] = write_run(sub_dir / f"{slug(label)}.parquet", sub)
        results[label] = evaluate_run(sub, QueryLabels.from_benchmark(bench, order, label),
                                      population=Population((args.split,)))["main"]
    text_rows = [lb for lb in runs if not lb.startswith("LFTR")]
    reference = max(text_rows, key=lambda lb: results[lb]["R@5"])
    sh("eval", "report", *map(str, files.values()), "--data", str(args.data), "--out", str(out / "report"),
       "--reference", slug(reference), "--resamples", str(args.resamples), "--seed", str(args.seed),
       "--split", args.split, "--intersect")
    sig = {s["run"]: s for s in json.loads((out / "report" / "report.json").read_text())["significance"]}
    lines = [f"Table 3 (fair MLLM comparison) on {bench.name}: {args.split} intersection subset (fair Q1-Q4), "
             f"n = {results[reference]['n']} of {n_all} queries held by every run" + ("" if args.all_queries else " with a usable phrase from every "
                                                        "predictor") + f"; reference = {reference} (best text "
             "predictor); paired bootstrap and McNemar vs the reference.", "",
             "| method | R@1 | R@5 | R@10 | MRR | ΔR@5 vs ref (pp) | p (bootstrap) | p (McNemar) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label in runs:
        m, s = results[label], sig.get(slug(label))
        p_boot = s["bootstrap"]["p_value"] if s else None  # None below eval.stats.MIN_BOOTSTRAP_N queries
        d = (f"{100 * s['bootstrap']['delta']:+.2f} | {'n too small' if p_boot is None else f'{p_boot:.3g}'} | "
             f"{s['mcnemar']['p_value']:.3g}") if s else "— | — | —"
        lines.append(f"| {label} | {100 * m['R@1']:.1f} | {100 * m['R@5']:.1f} | {100 * m['R@10']:.1f} | "
                     f"{100 * m['MRR']:.1f} | {d} |")
    if args.synthetic:
        lines += ["", "Plumbing check only: random tiny models (Qwen2-VL forecaster, CLIP) and a synthetic benchmark; "
                      "the numbers say nothing about the methods."]
    table = "\n".join(lines) + "\n"
    (out / "table3.md").write_text(table, encoding="utf-8")
    write_json(out / "compare.json", {"subset": {"n": len(order), "n_held_by_all": n_all, "query_ids": order},
                                      "reference": reference, "runs": {k: str(v) for k, v in runs.items()},
                                      "phrases": phrases, "main": results, "significance": sig,
                                      "report": str(out / "report")})
    return table


if __name__ == "__main__":
    main()
