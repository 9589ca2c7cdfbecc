"""Benchmark LFTR at PSR shape on random data: training seconds per epoch and inference ms per query.

PSR shape: 14,390 training queries, 5,061 prefixes of 8 x 1,024 prefix tokens, a 218,276-segment visual corpus
of 1,024-d targets, the paper's full configuration (width 512, 3 layers, 8 heads, H=8, K=32, 384 random + 128
hard negatives, batch 256). Random features (L2-normalised Gaussian) stand in for encoder outputs: the cost does not
depend on the values.

- training: ``--epochs`` timed epochs (after one warm-up step) of the real training step (`retrieval.lftr.losses.LFTRLoss`,
  AdamW, cosine schedule) over all training queries; reports seconds per epoch (mean of the timed epochs);
- inference: for ``--infer-queries`` queries, the LFTR forward (K = 32 samples at the matched step) plus exact
  retrieval over all 218,276 items (top-50 by max over the K samples: FAISS ``IndexFlatIP``); reports ms per query
  for the forward, the retrieval and both.

- validation (``--validation-benchmark DIR``): real `retrieval.lftr.train.train` runs on a benchmark, once per
  validation scorer (``stream``: eval's numba scorer on the CPU; ``torch``: on the training
  device), validating every epoch; reports training seconds per epoch before and after the first validation,
  validation seconds, and the load average during each epoch (the machine is shared: compare within one run).

Both print their results as JSON, write them to ``--out`` and record the table of `markdown` /
`validation_markdown` (`eval.measured`: docs/perf/bench_lftr.json or bench_lftr_validation.json, which
docs/performance.md shows; ``--record-dir`` / ``--no-record``).

Usage::

    python scripts/bench_lftr.py                      # full PSR shape, CPU (writes bench_lftr.json)
    python scripts/bench_lftr.py --epochs 1 --train-queries 2048 --items 50000   # a quicker look
    python scripts/bench_lftr.py --validation-benchmark data/psr-synth --space pixels --threads 2 --epochs 4
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from a checkout: find the packages

from eval.io import write_json  # noqa: E402
from eval.measured import add_record_options, load_now, record_from_args  # noqa: E402
from retrieval.index import FlatIPIndex  # noqa: E402
from retrieval.lftr.batches import TrainBatches  # noqa: E402
from retrieval.lftr.config import LFTRConfig  # noqa: E402
from retrieval.lftr.data import HardNegatives, LFTRData  # noqa: E402
from retrieval.lftr.losses import LFTRLoss  # noqa: E402
from retrieval.lftr.model import LFTR, count_parameters  # noqa: E402


def random_data(n_train: int, n_prefixes: int, n_items: int, dim: int, n_states: int, seed: int) -> LFTRData:
    rng = np.random.default_rng(seed)

    def unit(*shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    n_pos = 8
    items = unit(n_items, dim)
    pos_items = rng.integers(0, n_items, n_train * n_pos)
    return LFTRData(
        prefix=unit(n_prefixes, 8, dim), prefix_row=rng.integers(0, n_prefixes, n_train),
        qtype=rng.integers(0, 4, n_train), horizon=rng.integers(1, 8, n_train), question=unit(n_train, 384),
        target_state=rng.integers(0, n_states, n_train), pos_ptr=np.arange(0, n_train * n_pos + 1, n_pos),
        pos_items=pos_items, centroid=unit(n_train, dim), items=items,
        item_state=rng.integers(0, n_states, n_items), split=np.asarray(["train"] * n_train))


def random_hard_negatives(n_items: int, n_candidates: int, seed: int) -> HardNegatives:
    """Random neighbours for every item (the training step's cost does not depend on which items they are; mining
    the exact ones at PSR scale is a benchmark of its own)."""
    rng = np.random.default_rng(seed)
    return HardNegatives(item_rows=np.arange(n_items), slot=np.arange(n_items),
                         neighbours=rng.integers(0, n_items, (n_items, n_candidates)).astype(np.int32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-queries", type=int, default=14_390)
    ap.add_argument("--prefixes", type=int, default=5_061)
    ap.add_argument("--items", type=int, default=218_276)
    ap.add_argument("--dim", type=int, default=1024, help="prefix token and target width")
    ap.add_argument("--states", type=int, default=51_362)
    ap.add_argument("--epochs", type=int, default=1, help="timed epochs")
    ap.add_argument("--infer-queries", type=int, default=512, help="queries of the inference benchmark")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_lftr.json"))
    ap.add_argument("--validation-benchmark", type=Path, default=None,
                    help="benchmark dir: measure epochs around validation with each scorer instead")
    ap.add_argument("--space", default="pixels", help="validation benchmark: target and prefix space")
    ap.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "configs/lftr/synth.yaml")
    add_record_options(ap, "bench_lftr, or bench_lftr_validation with --validation-benchmark")
    args = ap.parse_args()
    args.load_before = load_now()
    if args.validation_benchmark is not None:
        return bench_validation(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = LFTRConfig(target_space="bench", device=args.device)
    data = random_data(args.train_queries, args.prefixes, args.items, args.dim, args.states, args.seed)
    rows = np.arange(args.train_queries)
    hard = random_hard_negatives(args.items, 2 * cfg.n_hard_negatives, args.seed)
    trainer = TrainBatches(cfg, data, hard, rows, args.device)
    model = LFTR(cfg, args.dim, args.dim, 384).to(args.device)
    loss_fn = LFTRLoss(model, trainer, cfg)
    n_params = count_parameters(model)
    print(f"LFTR {n_params:,} parameters; {args.train_queries:,} training queries; {args.items:,} items x {args.dim}; "
          f"device {args.device}, {torch.get_num_threads()} threads")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = int(np.ceil(args.train_queries / cfg.batch_size))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps * max(1, args.epochs))
    gen = torch.Generator().manual_seed(args.seed)

    def step(batch_rows):
        loss, _ = loss_fn(trainer.batch(batch_rows, gen), gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        return float(loss.detach())

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    model.train()
    step(rows[:cfg.batch_size])  # warm-up
    epoch_s = []
    for e in range(args.epochs):
        perm = rows[torch.randperm(len(rows), generator=gen).numpy()]
        sync()
        t0 = time.perf_counter()
        for s in range(0, len(perm), cfg.batch_size):
            step(perm[s:s + cfg.batch_size])
        sync()
        epoch_s.append(time.perf_counter() - t0)
        print(f"epoch {e + 1}: {epoch_s[-1]:.1f} s ({steps} steps, {epoch_s[-1] / steps * 1000:.0f} ms/step)")

    # inference: forward (K samples at the matched step) + exact retrieval over all items
    model.eval()
    nq = args.infer_queries
    q_rows = rows[:nq] if nq <= len(rows) else np.arange(nq) % len(rows)
    index = FlatIPIndex(data.items)
    t0 = time.perf_counter()
    with torch.no_grad():
        vecs = []
        for s in range(0, nq, 512):
            r = torch.from_numpy(q_rows[s:s + 512])
            b = trainer.batch(r.numpy(), gen)
            samples, _ = model(b.prefix, b.qtype, b.horizon, b.question)
            vecs.append(samples.float().cpu().numpy())
        sync()
    t_fwd = time.perf_counter() - t0
    q = np.concatenate(vecs)
    t0 = time.perf_counter()
    index.search(q, 50)
    t_ret = time.perf_counter() - t0
    res = {
        "parameters": n_params, "train_queries": args.train_queries, "items": args.items, "dim": args.dim,
        "batch_size": cfg.batch_size, "n_samples": cfg.n_samples, "negatives": [cfg.n_random_negatives,
                                                                                  cfg.n_hard_negatives],
        "device": args.device, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "seconds_per_epoch": float(np.mean(epoch_s)), "epochs_timed": args.epochs,
        "infer_queries": nq, "ms_per_query_forward": 1000 * t_fwd / nq, "ms_per_query_retrieval": 1000 * t_ret / nq,
        "ms_per_query_total": 1000 * (t_fwd + t_ret) / nq, "faiss_gpu": index.on_gpu,
    }
    write_json(args.out, res)
    print(json.dumps(res, indent=2))
    md = markdown(res)
    print("\n" + md, end="")
    record_from_args(args, "bench_lftr", title="LFTR training and inference at PSR shape (random data)", markdown=md,
                     data=res, load=(args.load_before, load_now()))


def markdown(res: dict) -> str:
    """A sentence on the shape and configuration, then seconds per epoch and milliseconds per query."""
    steps = -(-res["train_queries"] // res["batch_size"])
    return "\n".join([
        f"{res['train_queries']:,} training queries, {res['items']:,} items x {res['dim']:,}, "
        f"{res['parameters']:,} parameters, batch {res['batch_size']}, K = {res['n_samples']}, "
        f"{res['negatives'][0]} + {res['negatives'][1]} negatives; device {res['device']}, {res['threads']} threads; "
        f"retrieval on {'the GPU' if res['faiss_gpu'] else 'the CPU'} (FAISS `IndexFlatIP`).", "",
        "| measure | value |", "|---|---:|",
        f"| training, seconds per epoch ({steps} steps of {res['batch_size']} queries; mean of "
        f"{res['epochs_timed']} epoch(s)) | **{res['seconds_per_epoch']:.1f} s** |",
        f"| inference, ms per query: LFTR forward ({res['n_samples']} samples) | {res['ms_per_query_forward']:.1f} ms |",
        f"| inference, ms per query: exact top-50 over {res['items']:,} items ({res['n_samples']} samples, max) | "
        f"{res['ms_per_query_retrieval']:.1f} ms |",
        f"| inference, ms per query: total ({res['infer_queries']:,} queries) | **{res['ms_per_query_total']:.1f} ms** |",
    ]) + "\n"


def validation_markdown(res: dict) -> str:
    """A row per scorer and epoch: training and validation seconds and the load average the epoch ran under."""
    lines = [f"Real LFTR training on `{res['benchmark']}` (space {res['space']}), {res['epochs']} epoch(s) per "
             f"validation scorer, {res['threads']} threads; validating every epoch.", "",
             "| scorer | epoch | train s | validation s | load avg |", "|---|---:|---:|---:|---:|"]
    for scorer, r in res["scorers"].items():
        for e, (t, v, load) in enumerate(zip(r["train_seconds"], r["val_seconds"], r["load_avg"], strict=True), 1):
            lines.append(f"| {scorer} | {e} | {t:.1f} | {v:.1f} | {load:.1f} |")
    lines += ["", "Best validation score: " + ", ".join(f"{scorer} {r['best_val']:.3f}"
                                                        for scorer, r in res["scorers"].items()) + "."]
    return "\n".join(lines) + "\n"


def bench_validation(args) -> None:
    """Per-epoch training and validation seconds of real LFTR training with each validation scorer."""
    import os
    import tempfile

    from eval.benchmark import Benchmark
    from retrieval.lftr.config import load_config
    from retrieval.lftr.predict import validation_recall
    from retrieval.lftr.train import train

    bench = Benchmark.load(args.validation_benchmark)
    res = {"benchmark": str(args.validation_benchmark), "space": args.space, "threads": args.threads,
           "epochs": args.epochs, "cpu_count": os.cpu_count(), "torch": torch.__version__, "scorers": {}}
    for scorer in ("stream", "torch"):
        cfg = load_config([args.config], [f"val_scorer={scorer}", f"epochs={args.epochs}", f"threads={args.threads}",
                                          f"seed={args.seed}"], target_space=args.space, prefix_space=args.space)
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            out = train(bench, cfg, d, validate=validation_recall, progress=False, log=lambda s: None)
            wall = time.perf_counter() - t0
        h = out["history"]
        res["scorers"][scorer] = {
            "train_seconds": [round(x["train_seconds"], 2) for x in h],
            "val_seconds": [round(x["val_seconds"], 2) for x in h],
            "load_avg": [round(x["load_avg"], 2) for x in h],
            "first_epoch_s": h[0]["train_seconds"],
            "later_epochs_s": float(np.mean([x["train_seconds"] for x in h[1:]])) if len(h) > 1 else None,
            "val_s": float(np.mean([x["val_seconds"] for x in h])), "wall_s": wall, "best_val": out["best_val"]}
        print(scorer, json.dumps(res["scorers"][scorer]), flush=True)
    write_json(args.out, res)
    md = validation_markdown(res)
    print("\n" + md, end="")
    record_from_args(args, "bench_lftr_validation", title="LFTR training with validation, per validation scorer",
                     markdown=md, data=res, load=(args.load_before, load_now()))


if __name__ == "__main__":
    main()
