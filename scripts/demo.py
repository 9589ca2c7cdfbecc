"""`make demo`: the toolkit's main job on the embedded default (the synthetic benchmark), end to end on CPU.

Stages, each a command of a package (the demo doubles as a worked example; every command is logged):
  1. data       build the synthetic benchmark (skipped when --data already holds the same build) and validate it;
  2. retrieval  encode the semantic space (packaged MiniLM), every baseline, every oracle, LFTR in the semantic and
                the pixels space, and their z-score fusion -> OUT/runs/*.parquet;
  3. forecaster plumbing check: a tiny locally built model runs the text-only forecaster over the test split through
                the hf backend, its phrases are retrieved and scored like any predictor (labelled as plumbing: its
                numbers say nothing about forecasting);
  4. report     `python -m eval report` over all runs: main / horizon / question type / tier / GT-definition tables,
                significance against LFTR fusion, plots -> OUT/report/;
  5. canon      canonicalization probes: threshold sweep, re-keying, paraphrase oracle, description probe,
                canonicalize-then-retrieve and the paraphrase-robust encoder -> OUT/canon/;
  6. distill    the distillation recipe's CPU variant (tiny Qwen3-VL, template narrator) -> OUT/distill/.
OUT/README.md indexes the outputs. Stages skip work whose outputs exist (rerun with --force to redo them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
STAGES = ("data", "retrieval", "forecaster", "report", "canon", "distill")
PLUMBING_METHOD = "text-only (tiny model, plumbing check)"


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args, self.log = args, []

    def run(self, cmd: list[str], stage: str) -> None:
        print(f"\n[{stage}] $ {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True, cwd=ROOT)
        self.log.append({"stage": stage, "cmd": shlex.join(cmd), "seconds": round(time.time() - t0, 1)})

    def data(self) -> None:
        a = self.args
        if not synth_is_current(a.data, a.videos, a.seed):
            self.run([PY, "-m", "eval", "synth", "--out", str(a.data), "--videos", str(a.videos), "--seed", str(a.seed)], "data")
        self.run([PY, "-m", "eval", "validate", str(a.data)], "data")

    def retrieval(self) -> None:
        self.run([PY, "-m", "retrieval", "demo", "--data", str(self.args.data), "--out", str(self.runs)], "retrieval")

    def forecaster(self) -> None:
        a, out = self.args, self.args.out / "forecaster"
        model = out / "tiny-qwen2"
        if not (model / "config.json").exists() or a.force:
            self.run([PY, "-m", "forecasters", "tiny-model", "--out", str(model), "--kind", "qwen2",
                      "--fit-data", str(a.data), "--fit-steps", "100"], "forecaster")
        phrases = out / "text-only-tiny.jsonl"
        self.run([PY, "-m", "forecasters", "run", "--data", str(a.data), "--split", "test", "--forecaster", "text-only",
                  "--backend", "hf", "--model", str(model), "--out", str(phrases), "--threads", "1"], "forecaster")
        self.run([PY, "-m", "retrieval", "search", "--data", str(a.data), "--phrases", str(phrases), "--space", "minilm",
                  "--method", PLUMBING_METHOD, "--out", str(self.runs / "text-only-tiny.parquet")], "forecaster")

    #: Table order: naive baselines, the forecaster plumbing check, learned methods, then the oracles (ceilings).
    ORDER = ("random", "question-only", "persistence", "zero-shot", "knn-future", "text-only", "lftr-minilm",
             "lftr-pixels", "lftr-fusion", "oracle-independent-appearance", "oracle-state-prototype",
             "oracle-semantic-text")

    def report(self) -> None:
        def rank(p: Path) -> tuple[int, str]:
            hits = [i for i, prefix in enumerate(self.ORDER) if p.stem.startswith(prefix)]
            return (hits[-1] if hits else len(self.ORDER), p.stem)

        runs = [str(p) for p in sorted(self.runs.glob("*.parquet"), key=rank)]
        self.run([PY, "-m", "eval", "report", *runs, "--data", str(self.args.data), "--out", str(self.args.out / "report"),
                  "--reference", self.reference(runs)], "report")

    def canon(self) -> None:
        a = self.args
        cmd = [PY, "scripts/canon_probes.py", "--data", str(a.data), "--out", str(a.out / "canon")]
        lftr = [p for p in sorted(self.runs.glob("lftr*.parquet"))]
        for p in lftr:
            cmd += ["--predictor", str(p)]
        self.run(cmd + (["--force"] if a.force else []), "canon")

    def distill(self) -> None:
        self.run(["bash", "scripts/distill.sh", "--cpu-demo", "--out", str(self.args.out / "distill"),
                  "--data", str(self.args.data)], "distill")

    @property
    def runs(self) -> Path:
        return self.args.out / "runs"

    @staticmethod
    def reference(runs: list[str]) -> str:
        """The reference of the significance tests: the LFTR fusion run (the paper's headline method)."""
        import pyarrow.parquet as pq

        names = {}
        for r in runs:
            meta = json.loads(pq.read_schema(r).metadata[b"psr_run"])
            names[Path(r).stem] = meta.get("name") or meta["method"]
        fused = [n for stem, n in names.items() if "fusion" in stem or "fused" in stem]
        return fused[0] if fused else next(iter(names.values()))

    def findings(self) -> list[str]:
        """What the numbers say, computed from report.json (never typed in): fusion vs the better single space,
        how each learned method declines with horizon, and the oracle ceiling."""
        path = self.args.out / "report" / "report.json"
        if not path.exists():
            return []
        rep = json.loads(path.read_text())
        runs, sig = rep["runs"], {s["run"]: s for s in rep.get("significance", [])}
        r5 = {n: r["main"]["R@5"] for n, r in runs.items()}
        by_h = {n: {int(h): v["R@5"] for h, v in r.get("by_horizon", {}).items()} for n, r in runs.items()}
        lines = ["## Findings (computed from `report/report.json`)", ""]
        fused = [n for n in runs if n.startswith("lftr-fusion")]
        singles = [n for n in runs if n.startswith("lftr[")]
        if fused and singles:
            f, best = fused[0], max(singles, key=r5.get)
            verdict = "beats" if r5[f] > r5[best] else "does not beat"
            line = (f"- z-score fusion `{f}` {verdict} the better single space `{best}`: R@5 {100 * r5[f]:.1f} vs "
                    f"{100 * r5[best]:.1f}")
            s_best = sig.get(best)
            if s_best and s_best.get("reference") == f:
                b = s_best["bootstrap"]
                line += (f" (paired bootstrap Δ {-100 * b['delta']:+.1f} pp, 95% CI [{-100 * b['ci_high']:+.1f}, "
                         f"{-100 * b['ci_low']:+.1f}], p = {b['p_value']:.2g}; McNemar p = {s_best['mcnemar']['p_value']:.2g})")
            lines.append(line + ".")
        for n in fused + singles:
            hs = sorted(by_h[n])
            if hs:
                curve = " → ".join(f"h{h} {100 * by_h[n][h]:.0f}" for h in hs)
                drop = 100 * (by_h[n][hs[0]] - min(by_h[n].values()))
                lines.append(f"- `{n}` R@5 by horizon: {curve} (h1 to its lowest: -{drop:.0f} pp).")
        oracle = [n for n in runs if n.startswith("semantic-text")]
        if oracle:
            v = [100 * x for x in by_h[oracle[0]].values()]
            predictors = [n for n in runs if not any(n.startswith(o) for o in
                                                      ("semantic-text", "state-prototype", "independent-appearance"))]
            best_pred = max(predictors, key=r5.get)
            lines.append(f"- The semantic-text oracle stays at {min(v):.0f}–{max(v):.0f} R@5 over horizons; the best predictor "
                         f"(`{best_pred}`) reaches {100 * r5[best_pred]:.1f}.")
        return lines + [""]

    def index(self) -> None:
        out = self.args.out
        lines = ["# PSR toolkit demo (synthetic benchmark)", "",
                 f"Benchmark: `{self.args.data}` ({self.args.videos} videos, seed {self.args.seed}). "
                 "Every command below was run by `make demo`; rerun any of them on your own benchmark directory.", "",
                 "| output | what |", "|---|---|",
                 "| [report/main.md](report/main.md) | baselines, oracles, LFTR (semantic, pixels, fusion) and the "
                 "forecaster plumbing check, scored by one evaluator; more tables and plots in `report/` |",
                 f"| `runs/` | one run file per method (the row *{PLUMBING_METHOD}* is a plumbing check of the forecaster "
                 "path with a tiny model, not a baseline) |",
                 "| `canon/` | canonicalization probes: sweep, re-keyed benchmark, paraphrase oracle, description probe, "
                 "robust reads |",
                 "| `distill/` | distillation recipe on CPU with tiny models and the template narrator (plumbing) |", "",
                 *self.findings(), "## Commands", "", "| stage | seconds | command |", "|---|---:|---|"]
        lines += [f"| {x['stage']} | {x['seconds']} | `{x['cmd']}` |" for x in self.log]
        (out / "README.md").write_text("\n".join(lines) + "\n")
        (out / "demo_log.json").write_text(json.dumps(self.log, indent=2) + "\n")


def synth_is_current(data: Path, videos: int, seed: int) -> bool:
    m = data / "manifest.json"
    if not m.exists():
        return False
    extra = json.loads(m.read_text()).get("extra", {})
    return extra.get("videos") == videos and extra.get("seed") == seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/psr-synth"), help="benchmark directory (built if missing)")
    ap.add_argument("--out", type=Path, default=Path("reports/demo"), help="where runs and reports go")
    ap.add_argument("--videos", type=int, default=300, help="size of the synthetic benchmark")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--force", action="store_true", help="redo stages whose outputs exist")
    args = ap.parse_args()
    args.data, args.out = args.data.resolve(), args.out.resolve()
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        ap.error(f"unknown stage(s) {unknown}; choose from {STAGES}")
    if args.force and "retrieval" in stages and (args.out / "runs").exists():
        shutil.rmtree(args.out / "runs")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    demo = Demo(args)
    t0 = time.time()
    for stage in STAGES:
        if stage in stages:
            getattr(demo, stage)()
    demo.index()
    print(f"\ndemo done in {time.time() - t0:.0f} s: {args.out}/README.md")


if __name__ == "__main__":
    main()
