"""Training LFTR: multi-query max-similarity InfoNCE with random + hard negatives, plus grounding.

For a query b with samples ``y_{b,1..K}`` (`LFTR.sample`) and candidate item x, ``s(b, x) = max_k <y_{b,k}, x>``.
With its positive ``p_b`` (one GT item drawn uniformly per step), ``R`` random items shared by the batch and its
``M`` cached hard negatives ``n_{b,1..M}``::

    L_nce(b)    = -log softmax_j( s(b, c_j) / tau )[p_b]        c = [p_b, random_1..R, hard_{b,1..M}]
    L_ground(b) = || normalise(P(mu_h)) - centroid_b ||^2      (centroid of the GT items in the target space)
    L           = mean_b L_nce(b) + grounding_weight * mean_b L_ground(b)

Candidates of the query's target state other than ``p_b`` are masked out of the softmax. When the whole item set
is no larger than ``1 + R + M`` (a small semantic space) every item is a candidate (a full softmax).
AdamW with a per-step cosine schedule; after each epoch (every ``val_every``) the validation R@k is computed by
the evaluator's streaming scorer; ``best.pt`` keeps the best-val-R@k weights, ``last.pt`` everything needed to
resume (weights, optimiser, schedule, RNG states, history) and is rewritten atomically every epoch.

Checkpoint folder::

    config.yaml      resolved config         history.jsonl    one line per epoch: loss terms, val R@k, seconds
    last.pt          resume state            best.pt          best-val weights + config + dims
    train_info.json  parameter count, dims, spaces, query counts, device
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from eval.benchmark import Benchmark
from eval.io import FormatError, atomic_path, write_json
from retrieval.encoders import pick_device
from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.data import (
    LFTRData,
    build_data,
    cache_dir,
    mine_hard_negatives,
    pick_prefix_space,
    question_embeddings,
)
from retrieval.lftr.model import LFTR, count_parameters
from retrieval.spaces import Space


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with ``n`` torch CPU threads (0: unchanged); small heads on a shared CPU train fastest on one."""
    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Batch:
    prefix: torch.Tensor
    qtype: torch.Tensor
    horizon: torch.Tensor
    question: torch.Tensor | None
    target_state: torch.Tensor
    positive: torch.Tensor
    centroid: torch.Tensor
    hard: torch.Tensor | None


class Trainer:
    """Holds the data on the training device and computes the loss of a batch of query rows."""

    def __init__(self, cfg: LFTRConfig, data: LFTRData, hard: np.ndarray | None, train_rows: np.ndarray,
                 device: str):
        self.cfg, self.data, self.device = cfg, data, device
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        self.prefix, self.prefix_row = t(data.prefix), t(data.prefix_row)
        self.qtype, self.horizon, self.target_state = t(data.qtype), t(data.horizon), t(data.target_state)
        self.question = t(data.question) if data.question is not None else None
        self.pos_ptr, self.pos_items = t(data.pos_ptr), t(data.pos_items)
        self.centroid, self.items, self.item_state = t(data.centroid), t(data.items), t(data.item_state)
        self.train_rows = train_rows
        self.hard_of_row = None
        if hard is not None and hard.shape[1] > 0:
            self.hard_of_row = torch.full((len(data.qtype), hard.shape[1]), -1, dtype=torch.int64, device=device)
            self.hard_of_row[t(train_rows)] = t(hard)
        n_items = self.items.shape[0]
        self.full_softmax = n_items <= 1 + cfg.n_random_negatives + cfg.n_hard_negatives

    def batch(self, rows: np.ndarray, generator: torch.Generator) -> Batch:
        r = torch.from_numpy(rows).to(self.device)
        start, count = self.pos_ptr[r], self.pos_ptr[r + 1] - self.pos_ptr[r]
        u = torch.rand(len(rows), generator=generator).to(self.device)
        pick = start + (u * count).long().clamp(max=count - 1)
        return Batch(
            prefix=self.prefix[self.prefix_row[r]], qtype=self.qtype[r], horizon=self.horizon[r],
            question=self.question[r] if self.question is not None else None, target_state=self.target_state[r],
            positive=self.pos_items[pick], centroid=self.centroid[r],
            hard=self.hard_of_row[r] if self.hard_of_row is not None and not self.full_softmax else None)

    def loss(self, model: LFTR, b: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        samples, mu_r = model(b.prefix, b.qtype, b.horizon, b.question)  # (B, K, d), (B, D)
        B = samples.shape[0]
        if self.full_softmax:
            logits = torch.einsum("bkd,nd->bkn", samples, self.items).amax(1)  # (B, n_items)
            same = self.item_state[None, :] == b.target_state[:, None]
            same[torch.arange(B, device=self.device), b.positive] = False
            logits = logits.masked_fill(same, -torch.inf)
            labels = b.positive
        else:
            pos = torch.einsum("bkd,bd->bk", samples, self.items[b.positive]).amax(1, keepdim=True)
            parts, masks = [pos], [torch.zeros_like(pos, dtype=torch.bool)]
            if cfg.n_random_negatives:
                rnd = torch.randint(0, self.items.shape[0], (cfg.n_random_negatives,), generator=generator)
                rnd = rnd.to(self.device)
                parts.append(torch.einsum("bkd,rd->bkr", samples, self.items[rnd]).amax(1))
                masks.append(self.item_state[rnd][None, :] == b.target_state[:, None])
            if b.hard is not None:
                hard = b.hard.clamp(min=0)
                parts.append(torch.einsum("bkd,bmd->bkm", samples, self.items[hard]).amax(1))
                masks.append(b.hard < 0)
            logits = torch.cat(parts, 1).masked_fill(torch.cat(masks, 1), -torch.inf)
            labels = torch.zeros(B, dtype=torch.int64, device=self.device)
        nce = F.cross_entropy(logits / cfg.tau, labels)
        ground = ((model.project_mean(mu_r) - b.centroid) ** 2).sum(-1).mean()
        loss = nce + cfg.grounding_weight * ground if cfg.grounding_weight else nce
        return loss, {"nce": float(nce.detach()), "ground": float(ground.detach())}


def _cosine(total_steps: int) -> Callable[[int], float]:
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))


def _save(obj: dict, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _rng_state() -> dict:
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


@dataclass
class Prepared:
    """Everything a training or prediction job derives from the benchmark (spaces, tensors, dims)."""

    bench: Benchmark
    target: Space
    prefix_space: Space
    data: LFTRData
    cache: Path

    @property
    def dims(self) -> tuple[int, int, int]:
        d_text = 0 if self.data.question is None else self.data.question.shape[1]
        return self.data.prefix.shape[-1], self.data.items.shape[1], d_text


def prepare(bench: Benchmark, cfg: LFTRConfig, out: Path, device: str) -> Prepared:
    if not cfg.target_space:
        raise ValueError("LFTR config needs target_space (--space NAME)")
    target = Space.load(bench, cfg.target_space)
    prefix_space = Space.load(bench, pick_prefix_space(bench, cfg.prefix_space))
    cache = cache_dir(bench, out / "cache")
    question = None
    if cfg.question_space and cfg.condition_question:
        question = question_embeddings(bench, cfg.question_space, cache, device=device)
    return Prepared(bench, target, prefix_space, build_data(bench, target, prefix_space, question), cache)


def build_model(cfg: LFTRConfig, dims: tuple[int, int, int]) -> LFTR:
    return LFTR(cfg, *dims)


def train(bench: Benchmark, cfg: LFTRConfig, out: str | Path, *, validate: Callable[[LFTR, Prepared], float],
          progress: bool = True, log: Callable[[str], None] = print, stop_after: int | None = None) -> dict:
    """Train (or resume) LFTR into the folder ``out``; returns the final summary dict.

    ``validate(model, prepared) -> float`` returns the validation R@k used to select ``best.pt``.
    ``stop_after``: run at most this many epochs in this call (a wall-time slice; the next call resumes).
    """
    with torch_threads(cfg.threads):
        return _train(bench, cfg, out, validate=validate, progress=progress, log=log, stop_after=stop_after)


def _train(bench: Benchmark, cfg: LFTRConfig, out: str | Path, *, validate, progress: bool, log, stop_after) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.device or None)
    last = out / "last.pt"
    state = torch.load(last, map_location="cpu", weights_only=False) if last.exists() else None
    if state is not None and state["training_hash"] != cfg.training_hash():
        raise ValueError(f"{out} holds a run with a different training config (hash {state['training_hash']} vs "
                         f"{cfg.training_hash()}); use another --out or delete {last}")
    cfg.save(out / "config.yaml")
    seed_everything(cfg.seed)
    prep = prepare(bench, cfg, out, device)
    train_rows = prep.data.rows(cfg.train_split)
    if len(train_rows) == 0:
        raise ValueError(f"no {cfg.train_split!r} queries with a non-empty main GT pool in {bench.root}")
    hard = None
    if cfg.n_hard_negatives:
        hard = mine_hard_negatives(prep.data, train_rows, cfg.n_hard_negatives, prep.cache,
                                   tag=f"{cfg.target_space}|{bench.root.resolve()}", device=device, progress=progress)
    trainer = Trainer(cfg, prep.data, hard, train_rows, device)
    model = build_model(cfg, prep.dims).to(device)
    n_params = count_parameters(model)
    log(f"LFTR: {n_params:,} trainable parameters ({n_params / 1e6:.2f}M); prefix {prep.prefix_space.name} "
        f"d_in={prep.dims[0]}, target {cfg.target_space} d_out={prep.dims[1]}, question d={prep.dims[2]}; "
        f"{len(train_rows):,} training queries; device {device}")
    write_json(out / "train_info.json", {
        "parameters": n_params, "d_in": prep.dims[0], "d_out": prep.dims[1], "d_text": prep.dims[2],
        "prefix_space": prep.prefix_space.name, "target_space": cfg.target_space, "n_items": int(prep.data.items.shape[0]),
        "train_queries": int(len(train_rows)), "val_queries": int(len(prep.data.rows(cfg.val_split))),
        "device": device, "full_softmax": trainer.full_softmax, "torch": torch.__version__})
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train_rows) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.epochs * steps_per_epoch))
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    best, start_epoch = -1.0, 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        gen.set_state(state["generator"])
        _set_rng_state(state["rng"])
        history, best, start_epoch = state["history"], state["best"], state["epoch"] + 1
        log(f"resumed from {last} after epoch {start_epoch} (best val R@{cfg.val_k} {best:.4f})")
    end_epoch = cfg.epochs if stop_after is None else min(cfg.epochs, start_epoch + stop_after)
    for epoch in range(start_epoch, end_epoch):
        t0 = time.time()
        model.train()
        perm = train_rows[torch.randperm(len(train_rows), generator=gen).numpy()]
        sums = {"loss": 0.0, "nce": 0.0, "ground": 0.0}
        bar = tqdm(range(0, len(perm), cfg.batch_size), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch",
                   disable=not progress, leave=False)
        for s in bar:
            b = trainer.batch(perm[s:s + cfg.batch_size], gen)
            loss, parts = trainer.loss(model, b, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            sums["loss"] += float(loss.detach())
            sums["nce"] += parts["nce"]
            sums["ground"] += parts["ground"]
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        rec = {"epoch": epoch + 1, **{k: v / steps_per_epoch for k, v in sums.items()},
               "lr": sched.get_last_lr()[0], "train_seconds": time.time() - t0}
        if (epoch + 1) % cfg.val_every == 0 or epoch + 1 == cfg.epochs:
            model.eval()
            with torch.no_grad():
                rec[f"val_R@{cfg.val_k}"] = val = float(validate(model, prep))
            if val > best:
                best = val
                _save({"model": model.state_dict(), "config": cfg.to_dict(), "dims": prep.dims, "epoch": epoch + 1,
                       "val": val}, out / "best.pt")
                rec["best"] = True
        history.append(rec)
        val_s = f", val R@{cfg.val_k} {rec[f'val_R@{cfg.val_k}']:.4f}" if f"val_R@{cfg.val_k}" in rec else ""
        log(f"epoch {epoch + 1}/{cfg.epochs}: loss {rec['loss']:.4f} (nce {rec['nce']:.4f}, ground "
            f"{rec['ground']:.4f}){val_s} [{rec['train_seconds']:.1f}s]")
        _save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
               "generator": gen.get_state(), "rng": _rng_state(), "history": history, "best": best, "epoch": epoch,
               "training_hash": cfg.training_hash(), "config": cfg.to_dict(), "dims": prep.dims}, last)
        with atomic_path(out / "history.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(h) + "\n" for h in history)
    return {"best_val": best, "epochs_done": end_epoch, "epochs": cfg.epochs, "parameters": n_params,
            "out": str(out), "history": history}


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[LFTR, LFTRConfig, dict]:
    """Load ``best.pt`` (or any checkpoint written by `train`); a folder means its ``best.pt``."""
    path = Path(path)
    if path.is_dir():
        path = path / "best.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no checkpoint (train first with `python -m retrieval lftr train`)")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        cfg = LFTRConfig.from_dict(ck["config"], source=str(path))
    except Exception as e:  # not a torch file, a torn write, another program's checkpoint
        raise FormatError(path, f"not a checkpoint written by `python -m retrieval lftr train` "
                                f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    model = build_model(cfg, tuple(ck["dims"]))
    model.load_state_dict(ck["model"])
    return model.to(device).eval(), cfg, ck
