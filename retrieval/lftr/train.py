"""Training LFTR: multi-query max-similarity InfoNCE with random + hard negatives, plus grounding.

The losses are `retrieval.lftr.losses` (their formulas there); the batches and candidate masks
`retrieval.lftr.batches`. AdamW with a per-step cosine schedule; after each epoch (every ``val_every``) the
validation R@k is computed (`retrieval.lftr.predict.validation_recall`: torch on the training device by default);
``best.pt`` keeps the best-val-R@k weights, ``last.pt`` everything needed to resume (weights, optimiser, schedule, RNG
states, history) and is rewritten atomically every epoch.

Checkpoint folder::

    config.yaml      resolved config         history.jsonl    one line per epoch: loss terms, val R@k, seconds
    last.pt          resume state            best.pt          best-val weights + config + dims
    train_info.json  parameter count, dims, spaces, query counts, device
    runs/            with report_to tensorboard: the history as TensorBoard scalars (`eval.tracking`)
    wandb/, wandb-run-id   with report_to wandb: W&B's local files and the id a resume continues
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from eval.benchmark import Benchmark
from eval.errors import InputError, MissingInput
from eval.io import FormatError, atomic_path, write_json
from eval.threads import retain_freed_memory
from eval.threads import training_threads as torch_threads  # noqa: F401  (threads + wait policy; re-exported)
from eval.tracking import EpochReporter, parse_report_to
from retrieval.encoders import autocast, pick_device, resolve_precision
from retrieval.lftr.batches import TrainBatches
from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.data import (
    ConcatPrefixes,
    LFTRData,
    build_data,
    cache_dir,
    load_prefix_space,
    mine_hard_negatives,
    question_embeddings,
)
from retrieval.lftr.losses import LFTRLoss
from retrieval.lftr.model import LFTR, count_parameters
from retrieval.seeding import rng_state, seed_everything, set_rng_state
from retrieval.spaces import Space, pick_prefix_space


@dataclass
class Prepared:
    """Everything a training or prediction job derives from the benchmark (spaces, tensors, dims)."""

    bench: Benchmark
    target: Space
    prefix_space: Space | ConcatPrefixes
    data: LFTRData
    cache: Path

    @property
    def dims(self) -> tuple[int, int, int]:
        d_text = 0 if self.data.question is None else self.data.question.shape[1]
        return self.data.prefix.shape[-1], self.data.items.shape[1], d_text


def prepare(bench: Benchmark, cfg: LFTRConfig, out: Path, device: str, *, targets: bool = True) -> Prepared:
    """The spaces and `LFTRData` of a job (``targets=False``: for prediction only, no GT read, `build_data`)."""
    if not cfg.target_space:
        raise InputError("LFTR config needs target_space (--space NAME)")
    target = Space.load(bench, cfg.target_space)
    prefix_space = load_prefix_space(bench, pick_prefix_space(bench, cfg.prefix_space))
    cache = cache_dir(bench, out / "cache")
    question = None
    if cfg.question_space and cfg.condition_question:
        question = question_embeddings(bench, cfg.question_space, cache, device=device)
    return Prepared(bench, target, prefix_space, build_data(bench, target, prefix_space, question, targets=targets),
                    cache)


def build_model(cfg: LFTRConfig, dims: tuple[int, int, int]) -> LFTR:
    return LFTR(cfg, *dims)


class PrefixAdapter(Protocol):
    """A trainable prefix encoder trained end-to-end through the head (the LoRA baseline, `retrieval.lora`).

    ``module``: its trainable parameters (handed to the optimiser with the head's, saved in the checkpoints);
    ``tokens(prefix_rows)``: ``(B, 8, d_in)`` prefix tokens with gradients; ``refresh(prep, rows)``: rewrite the
    prefix tokens of the queries ``rows`` in ``prep.data.prefix`` with the current encoder (before validation and
    prediction); ``fingerprint``: part of the training hash."""

    module: torch.nn.Module
    fingerprint: str

    def tokens(self, prefix_rows: torch.Tensor) -> torch.Tensor: ...

    def refresh(self, prep: Prepared, rows: np.ndarray) -> None: ...


def train(bench: Benchmark, cfg: LFTRConfig, out: str | Path, *, validate: Callable[[LFTR, Prepared], float],
          progress: bool = True, log: Callable[[str], None] = print, stop_after: int | None = None,
          adapter_factory: Callable[[Prepared, str], PrefixAdapter] | None = None) -> dict:
    """Train (or resume) LFTR into the folder ``out``; returns the final summary dict.

    ``validate(model, prepared) -> float`` returns the validation R@k used to select ``best.pt``.
    ``stop_after``: run at most this many epochs in this call (a wall-time slice; the next call resumes).
    ``adapter_factory(prepared, device)``: a `PrefixAdapter` whose encoder is trained with the head (None: the
    frozen encoder's precomputed prefix tokens, the paper's LFTR).

    The process keeps the memory it frees from here on (`eval.threads.retain_freed_memory`: each step reuses the
    last step's pages instead of faulting in new ones).
    """
    trackers = parse_report_to(cfg.report_to)  # a tracker that is not installed stops the job before any work
    retain_freed_memory()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads), contextlib.ExitStack() as closing:
        job = _start(bench, cfg, out, adapter_factory=adapter_factory, progress=progress, log=log)
        end_epoch = cfg.epochs if stop_after is None else min(cfg.epochs, job.start_epoch + stop_after)
        history = job.history
        report = closing.enter_context(EpochReporter(trackers, out, run_name=out.name, config=cfg.to_dict(),
                                                     resume_step=history[-1]["epoch"] if history else None))
        if history:  # the last finished epoch again: the call that wrote it may have stopped before reporting it
            report.log(history[-1], step=history[-1]["epoch"])
        for epoch in range(job.start_epoch, end_epoch):
            rec = _train_epoch(job, epoch, progress)
            if (epoch + 1) % cfg.val_every == 0 or epoch + 1 == cfg.epochs:
                rec |= _validate(job, epoch, validate)
            history.append(rec)
            _log_epoch(cfg, rec, log)
            _save_last(job, epoch)
            report.log(rec, step=rec["epoch"])  # after the checkpoint: a tracker never shows an epoch a resume redoes
    return {"best_val": job.best, "epochs_done": end_epoch, "epochs": cfg.epochs, "parameters": job.n_params,
            "out": str(out), "history": history}


@dataclass
class _Job:
    """A training job in progress: its data, model, loss, optimiser state and history."""

    cfg: LFTRConfig
    out: Path
    prep: Prepared
    adapter: PrefixAdapter | None
    training_hash: str
    batches: TrainBatches
    model: LFTR
    loss: LFTRLoss
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    gen: torch.Generator
    device: str = "cpu"
    precision: str = "fp32"  # the training step's, resolved (`retrieval.encoders.resolve_precision`)
    history: list[dict] = field(default_factory=list)
    best: float = -1.0
    start_epoch: int = 0

    @property
    def n_params(self) -> int:
        return count_parameters(self.model)

    @property
    def train_rows(self) -> np.ndarray:
        return self.batches.train_rows

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.train_rows) / self.cfg.batch_size)


def _start(bench: Benchmark, cfg: LFTRConfig, out: Path, *, adapter_factory, progress: bool, log) -> _Job:
    """Prepare the data, build model, loss and optimiser (seeded by ``cfg.seed``), resume from ``out/last.pt``."""
    device = pick_device(cfg.device or None)
    last = out / "last.pt"
    state = torch.load(last, map_location="cpu", weights_only=False) if last.exists() else None
    seed_everything(cfg.seed)
    prep = prepare(bench, cfg, out, device)
    adapter = adapter_factory(prep, device) if adapter_factory is not None else None
    thash = cfg.training_hash() + (f"+{adapter.fingerprint}" if adapter is not None else "")
    if state is not None and state["training_hash"] != thash:
        raise InputError(f"{out} holds a run with a different training config (hash {state['training_hash']} vs "
                         f"{thash}); use another --out or delete {last}")
    cfg.save(out / "config.yaml")
    seed_everything(cfg.seed)
    train_rows = prep.data.rows(cfg.train_split)
    if cfg.train_fraction < 1:
        train_rows = fraction_rows(bench, train_rows, cfg.train_fraction)
    if len(train_rows) == 0:
        raise InputError(f"no {cfg.train_split!r} queries with a non-empty main GT pool in {bench.root}")
    hard = None
    if cfg.n_hard_negatives:
        hard = mine_hard_negatives(prep.data, train_rows, cfg.n_hard_candidates, prep.cache,
                                   tag=f"{cfg.target_space}|{bench.root.resolve()}", device=device, progress=progress)
    batches = TrainBatches(cfg, prep.data, hard, train_rows, device, adapter)
    model = build_model(cfg, prep.dims).to(device)
    params = list(model.parameters())
    if adapter is not None:
        params += [p for p in adapter.module.parameters() if p.requires_grad]
        log(f"prefix encoder trained with the head: {count_parameters(adapter.module):,} trainable parameters")
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.epochs * math.ceil(len(train_rows) / cfg.batch_size)))
    job = _Job(cfg, out, prep, adapter, thash, batches, model, LFTRLoss(model, batches, cfg), params, opt, sched,
               torch.Generator().manual_seed(cfg.seed), device, resolve_precision(cfg.precision, device))
    _write_train_info(job, device, log)
    if state is not None:
        _resume(job, state)
        log(f"resumed from {last} after epoch {job.start_epoch} (best val R@{cfg.val_k} {job.best:.4f})")
    return job


def fraction_videos(video_ids: list[str], fraction: float) -> set[str]:
    """The first ``ceil(fraction * n)`` of the distinct ``video_ids`` in the order of the SHA-256 of each id (at
    least one): the same for every seed and machine, and nested (a smaller fraction's videos are among a larger
    one's)."""
    order = sorted(set(video_ids), key=lambda v: hashlib.sha256(v.encode()).hexdigest())
    return set(order[:max(1, math.ceil(fraction * len(order)))])


def _videos(bench: Benchmark, rows: np.ndarray) -> np.ndarray:
    """The video id of each query row."""
    return np.asarray(bench.queries_ds["video_id"][:], dtype=object)[rows]


def fraction_rows(bench: Benchmark, rows: np.ndarray, fraction: float) -> np.ndarray:
    """The query ``rows`` whose video is among `fraction_videos` of the rows' videos (``train_fraction``)."""
    videos = _videos(bench, rows)
    keep = fraction_videos(list(videos), fraction)
    return rows[np.fromiter((v in keep for v in videos), bool, count=len(rows))]


def _write_train_info(job: _Job, device: str, log) -> None:
    cfg, prep, n_params, n_train = job.cfg, job.prep, job.n_params, len(job.train_rows)
    log(f"LFTR: {n_params:,} trainable parameters ({n_params / 1e6:.2f}M); prefix {prep.prefix_space.name} "
        f"d_in={prep.dims[0]}, target {cfg.target_space} d_out={prep.dims[1]}, question d={prep.dims[2]}; "
        f"{n_train:,} training queries; device {device}, {job.precision}")
    write_json(job.out / "train_info.json", {
        "parameters": n_params, "d_in": prep.dims[0], "d_out": prep.dims[1], "d_text": prep.dims[2],
        "prefix_space": prep.prefix_space.name, "target_space": cfg.target_space, "n_items": int(prep.data.items.shape[0]),
        "train_queries": int(n_train), "train_videos": len(set(_videos(job.prep.bench, job.train_rows))),
        "val_queries": int(len(prep.data.rows(cfg.val_split, main_only=True))),
        "device": device, "precision": job.precision, "full_softmax": job.batches.full_softmax, "torch": torch.__version__,
        "adapter_parameters": count_parameters(job.adapter.module) if job.adapter is not None else 0})


def _resume(job: _Job, state: dict) -> None:
    job.model.load_state_dict(state["model"])
    if job.adapter is not None:
        job.adapter.module.load_state_dict(state["adapter"])
    job.opt.load_state_dict(state["optimizer"])
    job.sched.load_state_dict(state["scheduler"])
    job.gen.set_state(state["generator"])
    set_rng_state(state["rng"])
    job.history, job.best, job.start_epoch = state["history"], state["best"], state["epoch"] + 1


def _train_epoch(job: _Job, epoch: int, progress: bool) -> dict:
    """One pass over the shuffled training queries; the epoch's record (mean loss terms, lr, seconds)."""
    cfg = job.cfg
    t0, c0 = time.time(), time.process_time()
    job.model.train()
    if job.adapter is not None:
        job.adapter.module.train()
    perm = job.train_rows[torch.randperm(len(job.train_rows), generator=job.gen).numpy()]
    sums = {"loss": 0.0, "nce": 0.0, "ground": 0.0} | ({"inter": 0.0} if cfg.intermediate_weight else {})
    bar = tqdm(range(0, len(perm), cfg.batch_size), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch",
               disable=not progress, leave=False)
    for s in bar:
        with autocast(job.precision, job.device):
            loss, terms = job.loss(job.batches.batch(perm[s:s + cfg.batch_size], job.gen), job.gen)
        job.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(job.params, cfg.grad_clip)
        job.opt.step()
        job.sched.step()
        sums["loss"] += float(loss.detach())
        for k, v in terms.items():
            sums[k] += v
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
    return {"epoch": epoch + 1, **{k: v / job.steps_per_epoch for k, v in sums.items()},
            "lr": job.sched.get_last_lr()[0], "train_seconds": time.time() - t0,
            "train_cpu_seconds": time.process_time() - c0, "load_avg": os.getloadavg()[0]}


def _validate(job: _Job, epoch: int, validate: Callable[[LFTR, Prepared], float]) -> dict:
    """Validation R@k after ``epoch``; a new best is saved to ``best.pt``. Returns the record's validation fields."""
    cfg, prep = job.cfg, job.prep
    t1 = time.time()
    job.model.eval()
    with torch.no_grad():
        if job.adapter is not None:
            job.adapter.module.eval()
            job.adapter.refresh(prep, prep.data.rows(cfg.val_split, main_only=True))
        val = float(validate(job.model, prep))
    rec = {f"val_R@{cfg.val_k}": val, "val_seconds": time.time() - t1}
    if val > job.best:
        job.best = val
        _save({"model": job.model.state_dict(), "config": cfg.to_dict(), "dims": prep.dims, "epoch": epoch + 1,
               "val": val, **_adapter_state(job.adapter)}, job.out / "best.pt")
        rec["best"] = True
    return rec


def _log_epoch(cfg: LFTRConfig, rec: dict, log) -> None:
    val = rec.get(f"val_R@{cfg.val_k}")
    val_s = f", val R@{cfg.val_k} {val:.4f}" if val is not None else ""
    log(f"epoch {rec['epoch']}/{cfg.epochs}: loss {rec['loss']:.4f} (nce {rec['nce']:.4f}, ground "
        f"{rec['ground']:.4f}){val_s} [{rec['train_seconds']:.1f}s]")


def _save_last(job: _Job, epoch: int) -> None:
    """``last.pt`` (everything a resume needs) and ``history.jsonl``, each written atomically."""
    _save({"model": job.model.state_dict(), "optimizer": job.opt.state_dict(), "scheduler": job.sched.state_dict(),
           "generator": job.gen.get_state(), "rng": rng_state(), "history": job.history, "best": job.best,
           "epoch": epoch, "training_hash": job.training_hash, "config": job.cfg.to_dict(), "dims": job.prep.dims,
           **_adapter_state(job.adapter)}, job.out / "last.pt")
    with atomic_path(job.out / "history.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(h) + "\n" for h in job.history)


def _cosine(total_steps: int) -> Callable[[int], float]:
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))


def _save(obj: dict, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _adapter_state(adapter: PrefixAdapter | None) -> dict:
    return {} if adapter is None else {"adapter": adapter.module.state_dict(), "adapter_fingerprint": adapter.fingerprint}


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[LFTR, LFTRConfig, dict]:
    """Load ``best.pt`` (or any checkpoint written by `train`); a folder means its ``best.pt``."""
    path = Path(path)
    if path.is_dir():
        path = path / "best.pt"
    if not path.exists():
        raise MissingInput(f"{path}: no checkpoint (train first with `python -m retrieval lftr train`)")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        cfg = LFTRConfig.from_dict(ck["config"], source=str(path))
    except Exception as e:  # not a torch file, a torn write, another program's checkpoint
        raise FormatError(path, f"not a checkpoint written by `python -m retrieval lftr train` "
                                f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    model = build_model(cfg, tuple(ck["dims"]))
    model.load_state_dict(ck["model"])
    return model.to(device).eval(), cfg, ck
