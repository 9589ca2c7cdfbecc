"""Time LFTR's real training step on a built benchmark: torch's dropout against `retrieval.lftr.model.MaskDropout`,
torch's attention against `retrieval.lftr.model.SelfAttention`'s written-out pass, glibc's default malloc against
`eval.threads.retain_freed_memory`, every token through the context encoder's last layer against the context token
alone (`retrieval.lftr.model._context_token_layer`: the only output the head reads), and float32 against bfloat16
autocast (config key ``precision``; ``auto``, the demo's, takes bf16 where the CPU computes it natively).

Each contender is a fresh child process (malloc's thresholds are per process and cannot be undone): it loads the
benchmark, prepares the head as `retrieval.lftr.train.train` does (`--config`, the demo's by default, in `--space`),
runs two warm-up steps, then times ``--steps`` training steps (batch, `LFTRLoss`, backward, gradient clipping,
AdamW, schedule) on ``--threads`` threads. The contenders take turns, ``--repeats`` rounds; each keeps its median.
The baseline, measured in the same run, is torch's dropout and attention with the default malloc: the last column
is each contender's time over it.

    python scripts/bench_lftr_step.py --data data/psr-synth --space pixels

Prints the table and records it (`eval.measured`: docs/perf/bench_lftr_step.json; ``--record-dir`` /
``--no-record``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from a checkout: find the packages

#: (name, dropout, attention, retained malloc, last layer, precision); the first is the baseline
CONTENDERS = (("torch dropout and attention, default malloc, every token", "torch", "torch", False, "every", "fp32"),
              ("MaskDropout, torch attention, default malloc, every token", "mask", "torch", False, "every", "fp32"),
              ("MaskDropout, torch attention, retained memory, every token", "mask", "torch", True, "every", "fp32"),
              ("MaskDropout, written-out attention, retained memory, every token", "mask", "written", True, "every",
               "fp32"),
              ("MaskDropout, written-out attention, retained memory, context token, float32", "mask", "written", True,
               "context", "fp32"),
              ("the same in bfloat16 autocast (the toolkit's where the CPU has native bf16)", "mask", "written", True,
               "context", "bf16"))


def child(a: argparse.Namespace) -> None:
    """One contender: print the seconds of each timed step as JSON."""
    import torch
    from torch import nn

    from eval.benchmark import Benchmark
    from eval.threads import retain_freed_memory
    from retrieval.encoders import autocast
    from retrieval.lftr import model as M
    from retrieval.lftr import train as T
    from retrieval.lftr.config import load_config
    from retrieval.lftr.model import MaskDropout, SelfAttention

    if a.memory == "retained" and not retain_freed_memory():
        raise SystemExit("retain_freed_memory() did not take effect here (not glibc)")
    torch.set_num_threads(a.threads)
    if a.attention == "torch":
        SelfAttention.forward = nn.MultiheadAttention.forward  # this child process only
    if a.last_layer == "every":  # the whole last layer, then its context token (this child process only)
        M._context_token_layer = lambda layer, x: layer(x)[:, :1]
    cfg = load_config([a.config], target_space=a.space, prefix_space=a.space, question_space=a.question_space or None)
    cfg.precision = a.precision
    with tempfile.TemporaryDirectory() as tmp:
        job = T._start(Benchmark.load(a.data), cfg, Path(tmp), adapter_factory=None, progress=False, log=lambda m: None)
        if a.dropout == "torch":
            for m in job.model.modules():
                for name, sub in list(m.named_children()):
                    if isinstance(sub, MaskDropout):
                        setattr(m, name, nn.Dropout(sub.p))
        rows, B, times = job.train_rows, cfg.batch_size, []
        for i in range(a.steps + 2):
            s = (i * B) % max(1, len(rows) - B)
            t0 = time.perf_counter()
            with autocast(a.precision, "cpu"):
                loss, _ = job.loss(job.batches.batch(rows[s:s + B], job.gen), job.gen)
            job.opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(job.params, cfg.grad_clip)
            job.opt.step()
            job.sched.step()
            if i >= 2:
                times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": times, "parameters": job.n_params, "batch": B}))


def _pick(spec: str) -> tuple:
    """The contenders that ``--contenders`` names (1-based), the baseline first."""
    if not spec.strip():
        return CONTENDERS
    try:
        picked = sorted({1} | {int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--contenders: comma-separated numbers 1-{len(CONTENDERS)}, got {spec!r}") from None
    if picked[0] < 1 or picked[-1] > len(CONTENDERS):
        raise SystemExit(f"--contenders: numbers 1-{len(CONTENDERS)}, got {spec!r}")
    return tuple(CONTENDERS[i - 1] for i in picked)


def markdown(res: dict) -> str:
    lines = [f"`{res['space']}` head of {res['config']} on {res['data']} ({res['parameters']:,} parameters, batch "
             f"{res['batch']}, {res['threads']} thread(s)); median over {res['steps']} steps per round, median of "
             f"{res['repeats']} rounds, the contenders taking turns, each in a fresh process.", "",
             "| contender | ms per step | x baseline |", "|---|---:|---:|"]
    base = res["contenders"][0]["ms"]
    for c in res["contenders"]:
        lines.append(f"| {c['name']} | {c['ms']:.1f} | {c['ms'] / base:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "psr-synth", help="a built benchmark")
    ap.add_argument("--space", default="pixels", help="target and prefix space of the head")
    ap.add_argument("--question-space", default="minilm", help="space of the question texts ('' for none)")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "lftr" / "synth.yaml")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo trains its heads on 1 each)")
    ap.add_argument("--contenders", default="", help="comma-separated 1-based numbers of the contenders to run, in "
                    "the table's order (default: all; the first is the baseline and always runs)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dropout", choices=("torch", "mask"), default="mask", help=argparse.SUPPRESS)
    ap.add_argument("--memory", choices=("default", "retained"), default="retained", help=argparse.SUPPRESS)
    ap.add_argument("--attention", choices=("torch", "written"), default="written", help=argparse.SUPPRESS)
    ap.add_argument("--last-layer", choices=("every", "context"), default="context", help=argparse.SUPPRESS)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help=argparse.SUPPRESS)
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "bench_lftr_step")
    a = ap.parse_args()
    if a.child:
        return child(a)
    contenders = _pick(a.contenders)
    if not (a.data / "features" / a.space).exists():
        raise SystemExit(f"{a.data} has no space {a.space!r} (features/{a.space}/): build it first (make demo)")
    load_before = load_now()
    medians: dict[str, list[float]] = {name: [] for name, *_ in contenders}
    info: dict = {}
    for r in range(a.repeats):
        for name, dropout, attention, retained, last_layer, precision in contenders:
            cmd = [sys.executable, __file__, "--child", "--data", str(a.data), "--space", a.space, "--config",
                   str(a.config), "--question-space", a.question_space, "--steps", str(a.steps), "--threads",
                   str(a.threads), "--dropout", dropout, "--attention", attention,
                   "--memory", "retained" if retained else "default", "--last-layer", last_layer,
                   "--precision", precision]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            info = json.loads(out.strip().splitlines()[-1])
            medians[name].append(statistics.median(info["step_s"]))
            print(f"round {r + 1}: {name}: {1000 * medians[name][-1]:.1f} ms/step", flush=True)
    res = {"data": str(a.data), "space": a.space, "config": a.config.name, "threads": a.threads, "steps": a.steps,
           "repeats": a.repeats, "parameters": info["parameters"], "batch": info["batch"],
           "contenders": [{"name": n, "ms": 1000 * statistics.median(medians[n]),
                           "rounds_ms": [1000 * x for x in medians[n]]} for n, *_ in contenders]}
    md = markdown(res)
    print("\n" + md, end="")
    record_from_args(a, "bench_lftr_step", title="LFTR's training step: dropout, attention, malloc, last layer, precision",
                     markdown=md, data=res, load=(load_before, load_now()))


if __name__ == "__main__":
    main()
