"""The canonicalization probes end to end on one benchmark: sweep, apply, both probes, both robust reads, report.

    python scripts/canon_probes.py --data data/psr-synth --out reports/canon

Every stage is a CLI command of a package (logged with its wall time in OUT/canon_log.json), so this is also the
worked example of the commands. A stage whose output exists is skipped (--force redoes everything).

  1. python -m retrieval canon sweep       thresholds -> OUT/sweep/
  2. python -m retrieval canon apply       re-keyed benchmark at --threshold -> OUT/canon-T/bench/ (+ eval validate)
  3. python -m retrieval encode            the semantic space (--space, --model) of the benchmark, if missing
  4. python -m retrieval oracle semantic-text                      exact-string oracle -> OUT/runs/exact.parquet
  5. python -m forecasters probes synonyms + retrieval search      paraphrase oracle (synonym sets, no model)
  6. python -m retrieval baseline question-only | knn-future       predictors (plus any --predictor RUN)
  7. python -m forecasters tiny-model/run --forecaster paraphrase | describe + search
                                           the LLM paraphrase and the VLM description through the real backends, with
                                           tiny fitted models offline (plumbing: their numbers mean nothing); on a GPU
                                           pass --llm / --vlm (e.g. the text-only and llava presets) and --backend vllm
  8. python -m retrieval canon finetune    paraphrase-robust encoder -> OUT/finetune/ ; encode space <space>-robust
  9. python -m retrieval search ... --canonicalize 3 [--canonicalize-holdout]   the snap
 10. python -m retrieval canon report      OUT/report/ (decomposition + robust reads), and OUT/canon-T/report/
                                           (exact vs paraphrase oracle on the re-keyed benchmark)
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
LOG = "canon_log.json"
#: requests per engine call for the tiny models this script builds (the hf backend's default, 8, suits real models)
TINY_BATCH = 64


class Stages:
    def __init__(self, out: Path, force: bool):
        self.out, self.force, self.log = out, force, []
        try:  # the costs of the stages an earlier call ran, kept for those this call skips
            self.earlier = {x["cmd"]: x for x in json.loads((out / LOG).read_text())}
        except (OSError, ValueError, TypeError, KeyError):
            self.earlier = {}

    def run(self, cmd: list[str], output: Path | None = None, force: bool | None = None) -> None:
        """Run ``cmd`` unless ``output`` exists (and --force, or ``force``, is off)."""
        if output is not None and output.exists() and not (self.force if force is None else force):
            print(f"\n# skip (exists: {output}): {shlex.join(cmd)}", flush=True)
            if shlex.join(cmd) in self.earlier:
                self.log.append(self.earlier[shlex.join(cmd)])
            return
        print(f"\n$ {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True)
        self.log.append({"cmd": shlex.join(cmd), "seconds": round(time.time() - t0, 1)})

    def write_log(self) -> float:
        """Write OUT/canon_log.json; -> the seconds of its commands."""
        (self.out / LOG).write_text(json.dumps(self.log, indent=2) + "\n")
        return sum(x["seconds"] for x in self.log)


def space_model(data: Path, space: str) -> str | None:
    meta = data / "features" / space / "meta.json"
    return json.loads(meta.read_text()).get("model") if meta.exists() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/psr-synth"), help="benchmark directory")
    ap.add_argument("--out", type=Path, default=Path("reports/canon"), help="output directory")
    ap.add_argument("--model", default="packaged:all-MiniLM-L6-v2", help="text model (BAAI/bge-small-en-v1.5 online)")
    ap.add_argument("--space", default="minilm", help="semantic space name of --model in the benchmark")
    ap.add_argument("--threshold", type=float, default=0.85, help="canon apply threshold")
    ap.add_argument("--sweep", default="0.50,0.60,0.70,0.80,0.85,0.90", help="sweep thresholds")
    ap.add_argument("--split", default="test")
    ap.add_argument("--predictor", type=Path, action="append", default=[], help="more predictor runs (repeat)")
    ap.add_argument("--llm", default="", help="paraphrase model (preset/id/path); default: a tiny fitted Qwen2")
    ap.add_argument("--vlm", default="", help="description model; default: a tiny fitted Qwen2-VL")
    ap.add_argument("--backend", default="hf", help="forecaster backend for --llm / --vlm")
    ap.add_argument("--no-models", action="store_true", help="skip the LLM paraphrase and the VLM description")
    ap.add_argument("--epochs", type=int, default=1,
                    help="fine-tune epochs (on the demo build one epoch closes as much of the canonicalization "
                         "channel as four: the loss has converged within it)")
    ap.add_argument("--holdout", type=float, default=0.3, help="fraction of states held out of the fine-tune")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--force", action="store_true", help="redo stages whose outputs exist")
    ap.add_argument("--finetune-only", action="store_true",
                    help="run only stage 8, the fine-tune and its space, which read nothing but the benchmark "
                         "(make demo runs it early, beside the towers' pretraining; a later full call reuses it)")
    ap.add_argument("--keep-finetune", action="store_true", help="with --force: reuse a finished fine-tune")
    a = ap.parse_args()
    out, d = a.out, a.data
    for sub in ("runs", "phrases", "models"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    s = Stages(out, a.force)
    R, F = [PY, "-m", "retrieval"], [PY, "-m", "forecasters"]
    split = ["--split", a.split]
    t = f"{a.threshold:g}"
    robust_space, ft = f"{a.space}-robust", out / "finetune"

    def finetune() -> None:  # 8: the paraphrase-robust encoder and its space
        redo = a.force and not a.keep_finetune
        s.run(R + ["canon", "finetune", "--data", str(d), "--base-model", a.model, "--out", str(ft), "--epochs",
                   str(a.epochs), "--holdout", str(a.holdout)], ft / "model", force=redo)
        if space_model(d, robust_space) != str(ft / "model") or redo:
            s.run(R + ["encode", "--data", str(d), "--space", robust_space, "--model", str(ft / "model"),
                       "--kind", "semantic"])

    if a.finetune_only:
        finetune()
        print(f"\nthe fine-tune done in {s.write_log():.0f} s of commands: {ft}")
        return
    # 1-2: sweep, apply
    s.run(R + ["canon", "sweep", "--data", str(d), "--thresholds", a.sweep, "--model", a.model,
               "--out", str(out / "sweep")], out / "sweep" / "sweep.json")
    canon = out / f"canon-{t}"
    s.run(R + ["canon", "apply", "--data", str(d), "--threshold", t, "--model", a.model,
               "--out", str(canon / "bench")], canon / "bench" / "manifest.json")
    s.run([PY, "-m", "eval", "validate", str(canon / "bench")])
    # 3-6: spaces, exact-string oracle, synonym paraphrase oracle, predictors
    for bench in (d, canon / "bench"):
        if space_model(bench, a.space) != a.model:
            s.run(R + ["encode", "--data", str(bench), "--space", a.space, "--model", a.model, "--kind", "semantic"])
    runs, ph = out / "runs", out / "phrases"

    def search(phrases: Path, run: Path, *extra: str, data: Path = d, space: str = a.space) -> Path:
        s.run(R + ["search", "--data", str(data), "--phrases", str(phrases), "--space", space, "--out", str(run),
                   *split, *extra], run)
        return run

    s.run(R + ["oracle", "semantic-text", "--data", str(d), "--space", a.space, "--out", str(runs / "exact.parquet"),
               *split], runs / "exact.parquet")
    s.run(F + ["probes", "synonyms", "--data", str(d), "--out", str(ph / "paraphrase.jsonl"), *split],
          ph / "paraphrase.jsonl")
    para = search(ph / "paraphrase.jsonl", runs / "paraphrase.parquet")
    predictors = []
    for name in ("question-only", "knn-future"):
        run = runs / f"{name}.parquet"
        s.run(R + ["baseline", name, "--data", str(d), "--space", a.space, "--out", str(run), *split], run)
        predictors.append(run)
    predictors += a.predictor
    # 7: the LLM paraphrase and the VLM description through the forecasters' backends
    others, describe = [], []
    if not a.no_models:
        models, built = {}, set()
        for role, kind, given in (("paraphrase", "qwen2", a.llm), ("describe", "qwen2_vl", a.vlm)):
            if given:
                models[role] = given
                continue
            built.add(role)
            path = out / "models" / f"tiny-{kind}"
            s.run(F + ["tiny-model", "--out", str(path), "--kind", kind, "--fit-data", str(d), "--fit-forecaster",
                       role, "--fit-steps", "40"], path / "config.json")
            models[role] = str(path)
        for role in ("paraphrase", "describe"):
            phrases = ph / f"{role}-model.jsonl"
            s.run(F + ["run", "--data", str(d), "--forecaster", role, "--backend", a.backend, "--model", models[role],
                       "--out", str(phrases), *split, "--no-progress"] +
                  (["--device", "cpu", "--dtype", "float32"] if a.backend == "hf" else []) +
                  # a tiny model of a few MB decodes far faster in larger batches than the backend's default
                  (["--batch-size", str(TINY_BATCH)] if role in built else []), phrases)
            run = search(phrases, runs / f"{role}-model.parquet")
            (describe.append(run) if role == "describe" else others.append(f"paraphrase oracle (LLM)={run}"))
    # 8-9: robust reads
    finetune()
    robust = [f"snap top-3={search(ph / 'paraphrase.jsonl', runs / 'paraphrase+snap3.parquet', '--canonicalize', '3')}",
              "snap top-3, held-out phrasings out of the index=" + str(search(
                  ph / "paraphrase.jsonl", runs / "paraphrase+snap3-holdout.parquet", "--canonicalize", "3",
                  "--canonicalize-holdout", str(ft / "holdout.json"))),
              f"fine-tuned index={search(ph / 'paraphrase.jsonl', runs / 'paraphrase-robust.parquet', space=robust_space)}"]
    exact_ft = runs / "exact-robust.parquet"
    s.run(R + ["oracle", "semantic-text", "--data", str(d), "--space", robust_space, "--out", str(exact_ft), *split],
          exact_ft)
    others.append(f"exact-string oracle (fine-tuned index)={exact_ft}")
    # 10: reports
    cmd = R + ["canon", "report", "--data", str(d), "--out", str(out / "report"), "--exact", str(runs / "exact.parquet"),
               "--paraphrase", str(para), "--holdout", str(ft / "holdout.json"), "--resamples", str(a.resamples)]
    for p in predictors:
        cmd += ["--predictor", str(p)]
    for p in describe:
        cmd += ["--describe", str(p)]
    for o in others:
        cmd += ["--other", o]
    for r in robust:
        cmd += ["--robust", r]
    s.run(cmd)
    cr = canon / "runs"
    cr.mkdir(parents=True, exist_ok=True)
    s.run(R + ["oracle", "semantic-text", "--data", str(canon / "bench"), "--space", a.space,
               "--out", str(cr / "exact.parquet"), *split], cr / "exact.parquet")
    s.run(F + ["probes", "synonyms", "--data", str(canon / "bench"), "--synonyms", str(d / "states.jsonl"),
               "--out", str(cr / "paraphrase.jsonl"), *split], cr / "paraphrase.jsonl")
    search(cr / "paraphrase.jsonl", cr / "paraphrase.parquet", data=canon / "bench")
    s.run(R + ["canon", "report", "--data", str(canon / "bench"), "--out", str(canon / "report"),
               "--exact", str(cr / "exact.parquet"), "--paraphrase", str(cr / "paraphrase.parquet"),
               "--resamples", str(a.resamples)])
    total = s.write_log()
    print(f"\ncanonicalization probes done in {total:.0f} s of commands: {out}/report/report.md, "
          f"{canon}/report/report.md, {out}/sweep/sweep.md")


if __name__ == "__main__":
    main()
