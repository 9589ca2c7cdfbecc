"""CPU seconds per training epoch with and without a background load, for the toolkit's training loops.

    python scripts/bench_train_load.py --data DIR --out reports/bench_train_load.json
    python scripts/bench_train_load.py --data DIR --jobs ssl --epochs 3 --load 4 --policies passive,default

Each job is the toolkit's own command, run as a fresh process (so the OpenMP wait policy is read as a user's run
reads it), into a scratch folder under ``--work``:

- ``ssl``: ``python -m retrieval encoder ssl --config configs/encoders/ssl-demo.yaml`` (the demo's SSL tower) on
  ``--max-frames`` train frames;
- ``lftr``: ``python -m retrieval lftr train --space pixels --prefix-space pixels --question-space minilm --config
  configs/lftr/synth.yaml`` (the demo's LFTR; the benchmark needs a ``minilm`` space:
  ``python -m retrieval encode --data DIR --space minilm --model packaged:all-MiniLM-L6-v2 --kind semantic``);
- ``distill``: ``python -m distill.train --config configs/distill/tiny-cpu.yaml`` (the CPU preset's QLoRA loop: a
  4-bit tiny random Qwen3-VL, 8 frames an example) for ``--epochs`` + 1 optimizer steps (the first is left out of
  the median like a first epoch), logging every step, on a CoT set built once under ``--work`` from the benchmark
  (predicates, template narration, ``--distill-examples`` train examples; `prepare_distill`). Its "epoch" is an
  optimizer step: the CPU and wall seconds of each step come from the ``cpu_s`` / ``wall_s`` stamps of
  ``train_log.json`` (`distill.checkpoints.clock_callback`);
- ``forecast``: ``python -m forecasters run --backend hf --forecaster describe`` over ``--forecast-queries`` test
  queries with a tiny random Qwen2-VL built once under ``--work`` (decoding: many short OpenMP regions). Its
  "epoch" is the whole command, imports included: CPU seconds of the process and its threads (``wait4``), repeated
  ``--epochs`` times, all in the median.

Every job runs at load 0 (nothing of ours in the background) and at load ``--load`` (that many busy processes,
`scripts/busy_load.py`), under each OpenMP wait policy of ``--policies``: ``passive`` (what the training commands
set, `eval.threads`) and ``default`` (libgomp's spin-then-sleep; ``OMP_WAIT_POLICY=""``).
Threads: the command's own choice (the CPUs this process may use, `eval.threads`; the LFTR demo config says 1).
Per run, from the job's own history (``train/history.jsonl`` of a tower, ``history.jsonl`` of LFTR,
``train_log.json`` of distillation): CPU seconds
(all threads) and wall seconds per epoch, the median over epochs after the first (warm-up), and the 1-minute load
average. Reported: ``cpu_ratio = CPU s/epoch at load N / at load 0`` per job and policy (target, issue 23:
<= 1.3 with the passive policy). The machine's own load (other users) is recorded, not removed. The table of
`markdown` is printed and recorded (`eval.measured`: docs/perf/bench_train_load.json, which docs/performance.md
shows; ``--record-dir`` / ``--no-record`` / ``--record-name``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
PY = sys.executable
POLICIES = {"passive": None, "default": "", "active": "ACTIVE"}  # None: leave unset, the command sets PASSIVE


def command(job: str, a: argparse.Namespace, out: Path, repeat: int = 0) -> tuple[list[str], Path, str]:
    """The job's command line, its history file and the history's CPU / wall field prefix (``repeat``: the forecast
    job's run, each into its own phrase file)."""
    rb = [PY, "-m", "retrieval"]
    if job == "ssl":
        return ([*rb, "encoder", "ssl", "--data", str(a.data), "--out", str(out), "--config",
                 str(ROOT / "configs" / "encoders" / "ssl-demo.yaml"), "--set", f"optim.epochs={a.epochs}",
                 "--set", f"max_frames={a.max_frames}"], out / "train" / "history.jsonl", "")
    if job == "lftr":
        return ([*rb, "lftr", "train", "--data", str(a.data), "--space", "pixels", "--prefix-space", "pixels",
                 "--question-space", "minilm", "--config", str(ROOT / "configs" / "lftr" / "synth.yaml"),
                 "--set", f"epochs={a.epochs}", "--set", "val_every=1000", "--out", str(out)],
                out / "history.jsonl", "train_")
    if job == "distill":
        sft, model = prepare_distill(a)
        return ([PY, "-m", "distill.train", "--config", str(ROOT / "configs" / "distill" / "tiny-cpu.yaml"),
                 "--model_name_or_path", str(model), "--dataset_name", str(sft / "cot"), "--output_dir", str(out),
                 "--max_steps", str(a.epochs + 1), "--logging_steps", "1", "--save_steps", "100000",
                 "--eval_strategy", "no", "--seed", "0"], out / "train_log.json", "")
    if job == "forecast":
        model = prepare_forecast(a)
        return ([PY, "-m", "forecasters", "run", "--data", str(a.data), "--split", "test", "--forecaster", "describe",
                 "--backend", "hf", "--model", str(model), "--device", "cpu", "--dtype", "float32", "--limit",
                 str(a.forecast_queries), "--no-progress", "--out", str(out / f"phrases-{repeat}.jsonl")], out, "")
    raise SystemExit(f"unknown job {job!r} (ssl, lftr, distill, forecast)")


def prepare_forecast(a: argparse.Namespace) -> Path:
    """The forecast job's tiny random Qwen2-VL, built once under ``a.work``."""
    model, done = a.work / "forecast-model", a.work / ".forecast-model.bench-train-load"
    if done.exists():
        return model
    if model.exists():
        raise SystemExit(f"{model} exists and was not written by this script; remove it or pick another --work")
    from forecasters.tiny_models import build_tiny_model

    build_tiny_model(model, "qwen2_vl", seed=0)
    done.touch()
    return model


def prepare_distill(a: argparse.Namespace) -> tuple[Path, Path]:
    """The distill job's inputs, built once under ``a.work`` (reused by every run): a CoT SFT set of the benchmark's
    train split (predicates from the simulator, template narration, ``--distill-examples`` examples of 8 frames) and
    a tiny random Qwen3-VL. Returns (SFT folder, model folder)."""
    root = a.work / "distill-inputs"
    sft, model, done = root / "sft", root / "qwen3_vl", root / ".bench-train-load-done"
    built_for = f"{a.data}\n{a.distill_examples}\n"
    if done.exists() and done.read_text(encoding="utf-8") == built_for:
        return sft, model
    if root.exists() and not (a.work / ".distill-inputs.bench-train-load").exists():
        raise SystemExit(f"{root} exists and was not written by this script; remove it or pick another --work")
    (a.work / ".distill-inputs.bench-train-load").touch()
    shutil.rmtree(root, ignore_errors=True)  # ours (marked): unfinished, or built from another benchmark or size
    from distill.narrate import NarrateConfig, run_narration
    from distill.predicates import PredicatesConfig, write_predicates
    from distill.sft import SFTBuildConfig, build_sft
    from forecasters.tiny_models import build_tiny_vlm

    print(f"distill: building the SFT set and the tiny student under {root}", flush=True)
    write_predicates(PredicatesConfig(data=str(a.data), out=str(root / "predicates.jsonl"), progress=False))
    run_narration(NarrateConfig(data=str(a.data), predicates=str(root / "predicates.jsonl"),
                                out=str(root / "rationales"), narrator="template", progress=False))
    build_sft(SFTBuildConfig(data=str(a.data), rationales=str(root / "rationales"), out=str(sft), frames=8,
                             variants=["cot"], limit=a.distill_examples, progress=False))
    build_tiny_vlm(model, "qwen3_vl", seed=0)
    done.write_text(built_for, encoding="utf-8")
    return sft, model


def per_epoch(history: Path, prefix: str) -> tuple[list[float], list[float], list]:
    """CPU and wall seconds of each epoch (distill: each optimizer step) and the load average of each, from a
    job's history file."""
    if history.suffix == ".json":  # distill.train's train_log.json: cumulative cpu_s / wall_s per logged step
        steps = sorted((h["step"], h["cpu_s"], h["wall_s"]) for h in json.loads(history.read_text("utf-8"))
                       if "loss" in h)
        prev = [(0, 0.0, 0.0), *steps[:-1]]
        cpu = [(c - pc) / (s - ps) for (s, c, _), (ps, pc, _) in zip(steps, prev, strict=True)]
        sec = [(w - pw) / (s - ps) for (s, _, w), (ps, _, pw) in zip(steps, prev, strict=True)]
        return cpu, sec, [None] * len(steps)
    hist = [json.loads(x) for x in history.read_text(encoding="utf-8").splitlines() if x.strip()]
    return ([h[f"{prefix}cpu_seconds"] for h in hist], [h[f"{prefix}seconds"] for h in hist],
            [h.get("load_avg") for h in hist])


def run_job(job: str, policy: str, load: int, a: argparse.Namespace) -> dict:
    from busy_load import busy

    out = a.work / f"{job}-{policy}-load{load}"
    mark = a.work / f".{out.name}.bench-train-load"  # written beside each folder this script trains into
    if out.exists():
        if not mark.exists():
            raise SystemExit(f"{out} exists and was not written by this script; remove it or pick another --work")
        shutil.rmtree(out)  # our own scratch folder from an earlier run of this script
    a.work.mkdir(parents=True, exist_ok=True)
    mark.touch()
    cmd, history, prefix = command(job, a, out)
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if POLICIES[policy] is not None:
        env["OMP_WAIT_POLICY"] = POLICIES[policy]
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    log = a.work / f"{out.name}.log"
    repeats = a.epochs if job == "forecast" else 1  # a forecast "epoch" is a whole command
    cpu, sec, loads = [], [], []
    with busy(load) as pids:
        time.sleep(2.0 if load else 0.0)  # let the load settle on the cores
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        for i in range(repeats):
            if i:
                cmd = command(job, a, out, repeat=i)[0]  # a fresh phrase file: the runner resumes an existing one
            out.mkdir(parents=True, exist_ok=True)
            ti = time.perf_counter()
            with open(log, "a" if i else "w", encoding="utf-8") as f:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
                _, status, usage = os.wait4(proc.pid, 0)
            rc = os.waitstatus_to_exitcode(status)
            if rc != 0:
                raise SystemExit(f"{' '.join(cmd)} failed (exit {rc}); its log: {log}")
            cpu.append(usage.ru_utime + usage.ru_stime)
            sec.append(time.perf_counter() - ti)
            loads.append(os.getloadavg()[0])
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()[0]
    if job != "forecast":
        cpu, sec, loads = per_epoch(history, prefix)
    steady = slice(1, None) if len(cpu) > 1 and job != "forecast" else slice(None)
    return {"job": job, "policy": policy, "load": load, "busy_pids": pids, "epochs": len(cpu),
            "unit": {"distill": "step", "forecast": "run"}.get(job, "epoch"),
            "cpu_s_per_epoch": statistics.median(cpu[steady]), "wall_s_per_epoch": statistics.median(sec[steady]),
            "cpu_s_all": cpu, "wall_s_all": sec, "load_avg_epochs": loads,
            "load_before": load_before, "load_after": load_after, "command_wall_s": wall, "command": cmd}


def markdown(rows: list[dict]) -> str:
    """A row per run: CPU and wall seconds per epoch (median after the first epoch) and, for a loaded run, its
    ratios to the same job and policy at load 0."""
    lines = ["| job | OpenMP policy | busy processes | epochs | CPU s/epoch | wall s/epoch | load avg before | "
             "CPU ratio | wall ratio |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratios = (f"**{r['cpu_ratio']:.2f}** | {r['wall_ratio']:.2f}" if "cpu_ratio" in r else " | ")
        unit = {"step": " (steps)", "run": " (runs)"}.get(r.get("unit"), "")
        digits = 2 if r.get("unit") == "step" else 1
        lines.append(f"| {r['job']} | {r['policy']} | {r['load']} | {r['epochs']}{unit} | "
                     f"{r['cpu_s_per_epoch']:.{digits}f} | {r['wall_s_per_epoch']:.{digits}f} | "
                     f"{r['load_before']:.1f} | {ratios} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a built benchmark (frames; pixels and minilm spaces)")
    ap.add_argument("--jobs", default="ssl,lftr", help="comma-separated, of ssl, lftr, distill, forecast")
    ap.add_argument("--policies", default="passive,default", help=f"comma-separated, of {sorted(POLICIES)}")
    ap.add_argument("--load", type=int, default=4, help="busy processes of the loaded runs")
    ap.add_argument("--epochs", type=int, default=3, help="epochs a run (distill: optimizer steps after the first)")
    ap.add_argument("--max-frames", type=int, default=1024, help="ssl: train frames")
    ap.add_argument("--distill-examples", type=int, default=16, help="distill: train examples of the CoT set")
    ap.add_argument("--forecast-queries", type=int, default=600, help="forecast: test queries a run")
    ap.add_argument("--work", type=Path, default=Path("/tmp/psr-bench-train-load"), help="scratch folder")
    ap.add_argument("--out", type=Path, default=None, help="JSON file of the results")
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "bench_train_load")
    a = ap.parse_args()
    load_before = load_now()
    a.data, a.work = a.data.resolve(), a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for job in a.jobs.split(","):
        for policy in a.policies.split(","):
            if policy not in POLICIES:
                raise SystemExit(f"unknown policy {policy!r} ({sorted(POLICIES)})")
            base = run_job(job, policy, 0, a)
            loaded = run_job(job, policy, a.load, a)
            ratio = loaded["cpu_s_per_epoch"] / base["cpu_s_per_epoch"]
            rows += [base, {**loaded, "cpu_ratio": ratio,
                            "wall_ratio": loaded["wall_s_per_epoch"] / base["wall_s_per_epoch"]}]
            print(f"{job} / {policy}: CPU s/epoch {base['cpu_s_per_epoch']:.1f} at load 0 (load avg "
                  f"{base['load_before']:.1f}) -> {loaded['cpu_s_per_epoch']:.1f} with {a.load} busy processes (load "
                  f"avg {loaded['load_before']:.1f}): x{ratio:.2f}; wall s/epoch {base['wall_s_per_epoch']:.1f} -> "
                  f"{loaded['wall_s_per_epoch']:.1f}", flush=True)
    if a.out:
        from eval.io import write_json

        write_json(a.out, {"command": " ".join(["python", "scripts/bench_train_load.py", *sys.argv[1:]]),
                           "cpus": len(os.sched_getaffinity(0)), "runs": rows})
    md = markdown(rows)
    print("\n" + md, end="")
    record_from_args(a, "bench_train_load", title="Training CPU seconds per epoch beside a background load",
                     markdown=f"{a.epochs} epoch(s) a run (distill: {a.epochs + 1} optimizer steps), the first left "
                              f"out of the median (forecast: {a.epochs} whole runs of {a.forecast_queries} queries, "
                              f"all in it); loaded runs beside {a.load} busy processes.\n\n" + md,
                     data={"cpus": len(os.sched_getaffinity(0)), "runs": rows}, load=(load_before, load_now()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
