"""Training LFTR: multi-query max-similarity InfoNCE with random + hard negatives, plus grounding.

For a query b with samples ``y_{b,1..K}`` (`LFTR.sample`) and candidate item x, ``s(b, x) = max_k <y_{b,k}, x>``.
With its positive ``p_b`` (one GT item drawn uniformly per step), ``R`` random items shared by the batch and ``M``
hard negatives ``n_{b,1..M}`` (the nearest items to ``p_b`` that are in none of the query's GT pools; see
`retrieval.lftr.data`)::

    L_nce(b)    = -log softmax_j( s(b, c_j) / tau )[p_b]        c = [p_b, random_1..R, hard_{b,1..M}]
    L_ground(b) = mean_d (normalise(P(mu_h)) - g_b)_d^2       g_b = GT centroid (default) or target-state prototype
    L_inter(b)  = mean_{t < h} mean_d (normalise(P(mu_t)) - proto(s_{b,t}))_d^2   (states passed through; Table 16)
    L           = mean_b L_nce(b) + grounding_weight * mean_b L_ground(b) + intermediate_weight * mean L_inter

Candidates that are items of the query's target state or of any of its GT pools (other than ``p_b``) are masked out
of the softmax. When the whole item set is no larger than ``1 + R + M`` (a small semantic space) every item is a
candidate (a full softmax, same masks). AdamW with a per-step cosine schedule; after each epoch (every
``val_every``) the validation R@k is computed (`retrieval.lftr.predict.validation_recall`: torch on the training
device by default); ``best.pt`` keeps the best-val-R@k weights, ``last.pt`` everything needed to resume (weights,
optimiser, schedule, RNG states, history) and is rewritten atomically every epoch.

Checkpoint folder::

    config.yaml      resolved config         history.jsonl    one line per epoch: loss terms, val R@k, seconds
    last.pt          resume state            best.pt          best-val weights + config + dims
    train_info.json  parameter count, dims, spaces, query counts, device
    runs/            with report_to tensorboard: the history as TensorBoard scalars (`eval.tracking`)
    wandb/, wandb-run-id   with report_to wandb: W&B's local files and the id a resume continues
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from eval.benchmark import Benchmark
from eval.errors import InputError, MissingInput
from eval.io import FormatError, atomic_path, write_json
from eval.threads import training_threads as torch_threads  # noqa: F401  (threads + wait policy; re-exported)
from eval.tracking import EpochReporter, parse_report_to
from retrieval.encoders import pick_device
from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.data import (
    ConcatPrefixes,
    HardNegatives,
    LFTRData,
    build_data,
    cache_dir,
    load_prefix_space,
    mine_hard_negatives,
    pick_prefix_space,
    question_embeddings,
)
from retrieval.lftr.model import LFTR, count_parameters
from retrieval.spaces import Space


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Batch:
    rows: torch.Tensor
    prefix: torch.Tensor
    qtype: torch.Tensor
    horizon: torch.Tensor
    question: torch.Tensor | None
    target_state: torch.Tensor
    positive: torch.Tensor
    ground: torch.Tensor
    hard: torch.Tensor | None


class Trainer:
    """Holds the data on the training device and computes the loss of a batch of query rows."""

    def __init__(self, cfg: LFTRConfig, data: LFTRData, hard: HardNegatives | None, train_rows: np.ndarray,
                 device: str, adapter: PrefixAdapter | None = None):
        self.cfg, self.data, self.device, self.adapter = cfg, data, device, adapter
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        self.prefix, self.prefix_row = t(data.prefix), t(data.prefix_row)
        self.qtype, self.horizon, self.target_state = t(data.qtype), t(data.horizon), t(data.target_state)
        self.question = t(data.question) if data.question is not None else None
        self.pos_ptr, self.pos_items = t(data.pos_ptr), t(data.pos_items)
        self.items, self.item_state = t(data.items), t(data.item_state)
        self.n_items = self.items.shape[0]
        if cfg.grounding_target == "prototype":
            proto = t(data.state_proto)
            self.ground = proto[self.target_state.clamp(min=0)] * (self.target_state >= 0)[:, None]
        else:
            self.ground = t(data.centroid)
        empty = np.zeros(1, np.int64)
        self.excl_ptr = t(data.excl_ptr if data.excl_ptr is not None else np.zeros(len(data.qtype) + 1, np.int64))
        self.excl_items = t(data.excl_items if data.excl_items is not None and data.excl_items.size else empty[:0])
        self.proto = t(data.state_proto) if data.state_proto is not None else None
        self.inter_ptr = t(data.inter_ptr) if data.inter_ptr is not None else None
        self.inter_state = t(data.inter_state) if data.inter_state is not None else None
        self.train_rows = train_rows
        self.full_softmax = self.n_items <= 1 + cfg.n_random_negatives + cfg.n_hard_negatives
        self.hard_slot = self.hard_nb = None
        if hard is not None and hard.neighbours.shape[1] > 0 and cfg.n_hard_negatives and not self.full_softmax:
            self.hard_slot, self.hard_nb = t(hard.slot), t(hard.neighbours.astype(np.int64))

    # --- masks ---
    def excluded(self, rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """``(B, M)`` bool: candidate item ``cand[b, j]`` is an item of a GT pool of query ``rows[b]``
        (membership by binary search in the batch's sorted (row, item) keys)."""
        start, count = self.excl_ptr[rows], self.excl_ptr[rows + 1] - self.excl_ptr[rows]
        total = int(count.sum())
        if total == 0:
            return torch.zeros(cand.shape, dtype=torch.bool, device=cand.device)
        b = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), count)
        within = torch.arange(total, device=rows.device) - torch.repeat_interleave(count.cumsum(0) - count, count)
        keys = b * self.n_items + self.excl_items[torch.repeat_interleave(start, count) + within]
        q = torch.arange(len(rows), device=rows.device)[:, None] * self.n_items + cand.clamp(min=0)
        pos = torch.searchsorted(keys, q).clamp(max=total - 1)
        return keys[pos] == q

    def never_negative(self, rows: torch.Tensor, target_state: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """``(B, M)`` bool: ``cand`` items that may not be negatives of the batch's queries (target state or GT)."""
        return (self.item_state[cand.clamp(min=0)] == target_state[:, None]) | self.excluded(rows, cand)

    def hard_negatives(self, rows: torch.Tensor, target_state: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        """``(B, n_hard)`` item rows (-1 = none): the nearest neighbours of each query's positive that are not
        excluded for the query, best first."""
        nb = self.hard_nb[self.hard_slot[positive].clamp(min=0)]  # (B, n_candidates)
        ok = (nb >= 0) & (self.hard_slot[positive] >= 0)[:, None] & ~self.never_negative(rows, target_state, nb)
        order = torch.argsort((~ok).to(torch.int8), dim=1, stable=True)[:, :self.cfg.n_hard_negatives]
        picked = nb.gather(1, order)
        return torch.where(ok.gather(1, order), picked, torch.full_like(picked, -1))

    def batch(self, rows: np.ndarray, generator: torch.Generator) -> Batch:
        r = torch.from_numpy(rows).to(self.device)
        start, count = self.pos_ptr[r], self.pos_ptr[r + 1] - self.pos_ptr[r]
        u = torch.rand(len(rows), generator=generator).to(self.device)
        pick = start + (u * count).long().clamp(max=count - 1)
        positive = self.pos_items[pick]
        target_state = self.target_state[r]
        hard = self.hard_negatives(r, target_state, positive) if self.hard_nb is not None else None
        return Batch(
            rows=r, prefix=self.prefix_tokens(self.prefix_row[r]), qtype=self.qtype[r], horizon=self.horizon[r],
            question=self.question[r] if self.question is not None else None, target_state=target_state,
            positive=positive, ground=self.ground[r], hard=hard)

    def prefix_tokens(self, prefix_rows: torch.Tensor) -> torch.Tensor:
        """``(B, 8, d_in)`` prefix tokens: the precomputed table (frozen encoder) or the adapter's encoder output."""
        if self.adapter is not None:
            return self.adapter.tokens(prefix_rows)
        return self.prefix[prefix_rows]

    def loss(self, model: LFTR, b: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        mu = model.rollout(model.context(b.prefix, b.qtype, b.horizon, b.question))  # (B, H, D)
        B = mu.shape[0]
        ar = torch.arange(B, device=self.device)
        mu_r = mu[ar, model.read_step(b.horizon, "matched")]
        samples = model.sample(mu_r, b.horizon)  # (B, K, d)
        if self.full_softmax:
            logits = torch.einsum("bkd,nd->bkn", samples, self.items).amax(1)  # (B, n_items)
            every = torch.arange(self.n_items, device=self.device).expand(B, -1)
            masked = self.never_negative(b.rows, b.target_state, every)
            masked[ar, b.positive] = False
            logits = logits.masked_fill(masked, -torch.inf)
            labels = b.positive
        else:
            pos = torch.einsum("bkd,bd->bk", samples, self.items[b.positive]).amax(1, keepdim=True)
            parts, masks = [pos], [torch.zeros_like(pos, dtype=torch.bool)]
            if cfg.n_random_negatives:
                rnd = torch.randint(0, self.n_items, (cfg.n_random_negatives,), generator=generator)
                rnd = rnd.to(self.device)
                parts.append(torch.einsum("bkd,rd->bkr", samples, self.items[rnd]).amax(1))
                masks.append(self.never_negative(b.rows, b.target_state, rnd.expand(B, -1)))
            if b.hard is not None:
                hard = b.hard.clamp(min=0)
                parts.append(torch.einsum("bkd,bmd->bkm", samples, self.items[hard]).amax(1))
                masks.append(b.hard < 0)
            logits = torch.cat(parts, 1).masked_fill(torch.cat(masks, 1), -torch.inf)
            labels = torch.zeros(B, dtype=torch.int64, device=self.device)
        nce = F.cross_entropy(logits / cfg.tau, labels)
        ground = F.mse_loss(model.project_mean(mu_r), b.ground)  # the paper's grounding MSE: mean over dims
        loss = nce + cfg.grounding_weight * ground if cfg.grounding_weight else nce
        parts = {"nce": float(nce.detach()), "ground": float(ground.detach())}
        if cfg.intermediate_weight:
            inter = self.intermediate_loss(model, mu, b.rows)
            loss = loss + cfg.intermediate_weight * inter
            parts["inter"] = float(inter.detach())
        return loss, parts

    def intermediate_loss(self, model: LFTR, mu: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Mean over (query, step t) of ``|| normalise(P(mu_t)) - proto(s_t) ||^2`` for the states ``s_1, s_2, ...``
        the query's object passes through before its target (steps beyond H are dropped); 0 when there are none."""
        start, count = self.inter_ptr[rows], self.inter_ptr[rows + 1] - self.inter_ptr[rows]
        total = int(count.sum())
        if total == 0:
            return mu.sum() * 0.0
        b = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), count)
        step = torch.arange(total, device=rows.device) - torch.repeat_interleave(count.cumsum(0) - count, count)
        state = self.inter_state[torch.repeat_interleave(start, count) + step]
        keep = (step < mu.shape[1]) & (state >= 0)
        if not bool(keep.any()):
            return mu.sum() * 0.0
        b, step, state = b[keep], step[keep], state[keep]
        return F.mse_loss(model.project_mean(mu[b, step]), self.proto[state])


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
    prefix_space: Space | ConcatPrefixes
    data: LFTRData
    cache: Path

    @property
    def dims(self) -> tuple[int, int, int]:
        d_text = 0 if self.data.question is None else self.data.question.shape[1]
        return self.data.prefix.shape[-1], self.data.items.shape[1], d_text


def prepare(bench: Benchmark, cfg: LFTRConfig, out: Path, device: str) -> Prepared:
    if not cfg.target_space:
        raise InputError("LFTR config needs target_space (--space NAME)")
    target = Space.load(bench, cfg.target_space)
    prefix_space = load_prefix_space(bench, pick_prefix_space(bench, cfg.prefix_space))
    cache = cache_dir(bench, out / "cache")
    question = None
    if cfg.question_space and cfg.condition_question:
        question = question_embeddings(bench, cfg.question_space, cache, device=device)
    return Prepared(bench, target, prefix_space, build_data(bench, target, prefix_space, question), cache)


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
    """
    with torch_threads(cfg.threads), contextlib.ExitStack() as closing:
        return _train(bench, cfg, out, validate=validate, progress=progress, log=log, stop_after=stop_after,
                      adapter_factory=adapter_factory, closing=closing)


def _train(bench: Benchmark, cfg: LFTRConfig, out: str | Path, *, validate, progress: bool, log, stop_after,
           adapter_factory=None, closing: contextlib.ExitStack) -> dict:
    trackers = parse_report_to(cfg.report_to)  # a tracker that is not installed stops the job before any work
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
    if len(train_rows) == 0:
        raise InputError(f"no {cfg.train_split!r} queries with a non-empty main GT pool in {bench.root}")
    hard = None
    if cfg.n_hard_negatives:
        hard = mine_hard_negatives(prep.data, train_rows, cfg.n_hard_candidates, prep.cache,
                                   tag=f"{cfg.target_space}|{bench.root.resolve()}", device=device, progress=progress)
    trainer = Trainer(cfg, prep.data, hard, train_rows, device, adapter)
    model = build_model(cfg, prep.dims).to(device)
    n_params = count_parameters(model)
    params = list(model.parameters())
    if adapter is not None:
        params += [p for p in adapter.module.parameters() if p.requires_grad]
        log(f"prefix encoder trained with the head: {count_parameters(adapter.module):,} trainable parameters")
    log(f"LFTR: {n_params:,} trainable parameters ({n_params / 1e6:.2f}M); prefix {prep.prefix_space.name} "
        f"d_in={prep.dims[0]}, target {cfg.target_space} d_out={prep.dims[1]}, question d={prep.dims[2]}; "
        f"{len(train_rows):,} training queries; device {device}")
    write_json(out / "train_info.json", {
        "parameters": n_params, "d_in": prep.dims[0], "d_out": prep.dims[1], "d_text": prep.dims[2],
        "prefix_space": prep.prefix_space.name, "target_space": cfg.target_space, "n_items": int(prep.data.items.shape[0]),
        "train_queries": int(len(train_rows)), "val_queries": int(len(prep.data.rows(cfg.val_split, main_only=True))),
        "device": device, "full_softmax": trainer.full_softmax, "torch": torch.__version__,
        "adapter_parameters": count_parameters(adapter.module) if adapter is not None else 0})
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train_rows) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.epochs * steps_per_epoch))
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    best, start_epoch = -1.0, 0
    if state is not None:
        model.load_state_dict(state["model"])
        if adapter is not None:
            adapter.module.load_state_dict(state["adapter"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        gen.set_state(state["generator"])
        _set_rng_state(state["rng"])
        history, best, start_epoch = state["history"], state["best"], state["epoch"] + 1
        log(f"resumed from {last} after epoch {start_epoch} (best val R@{cfg.val_k} {best:.4f})")
    end_epoch = cfg.epochs if stop_after is None else min(cfg.epochs, start_epoch + stop_after)
    report = closing.enter_context(EpochReporter(trackers, out, run_name=out.name, config=cfg.to_dict(),
                                                 resume_step=history[-1]["epoch"] if history else None))
    if history:  # the last finished epoch again: the call that wrote it may have stopped before reporting it
        report.log(history[-1], step=history[-1]["epoch"])
    for epoch in range(start_epoch, end_epoch):
        t0, c0 = time.time(), time.process_time()
        model.train()
        if adapter is not None:
            adapter.module.train()
        perm = train_rows[torch.randperm(len(train_rows), generator=gen).numpy()]
        sums = {"loss": 0.0, "nce": 0.0, "ground": 0.0} | ({"inter": 0.0} if cfg.intermediate_weight else {})
        bar = tqdm(range(0, len(perm), cfg.batch_size), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch",
                   disable=not progress, leave=False)
        for s in bar:
            b = trainer.batch(perm[s:s + cfg.batch_size], gen)
            loss, parts = trainer.loss(model, b, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            sums["loss"] += float(loss.detach())
            for k, v in parts.items():
                sums[k] += v
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        rec = {"epoch": epoch + 1, **{k: v / steps_per_epoch for k, v in sums.items()},
               "lr": sched.get_last_lr()[0], "train_seconds": time.time() - t0,
               "train_cpu_seconds": time.process_time() - c0, "load_avg": os.getloadavg()[0]}
        if (epoch + 1) % cfg.val_every == 0 or epoch + 1 == cfg.epochs:
            t1 = time.time()
            model.eval()
            with torch.no_grad():
                if adapter is not None:
                    adapter.module.eval()
                    adapter.refresh(prep, prep.data.rows(cfg.val_split, main_only=True))
                rec[f"val_R@{cfg.val_k}"] = val = float(validate(model, prep))
            rec["val_seconds"] = time.time() - t1
            if val > best:
                best = val
                _save({"model": model.state_dict(), "config": cfg.to_dict(), "dims": prep.dims, "epoch": epoch + 1,
                       "val": val, **_adapter_state(adapter)}, out / "best.pt")
                rec["best"] = True
        history.append(rec)
        val_s = f", val R@{cfg.val_k} {rec[f'val_R@{cfg.val_k}']:.4f}" if f"val_R@{cfg.val_k}" in rec else ""
        log(f"epoch {epoch + 1}/{cfg.epochs}: loss {rec['loss']:.4f} (nce {rec['nce']:.4f}, ground "
            f"{rec['ground']:.4f}){val_s} [{rec['train_seconds']:.1f}s]")
        _save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
               "generator": gen.get_state(), "rng": _rng_state(), "history": history, "best": best, "epoch": epoch,
               "training_hash": thash, "config": cfg.to_dict(), "dims": prep.dims, **_adapter_state(adapter)}, last)
        with atomic_path(out / "history.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(h) + "\n" for h in history)
        report.log(rec, step=rec["epoch"])  # after the checkpoint: a tracker never shows an epoch a resume redoes
    return {"best_val": best, "epochs_done": end_epoch, "epochs": cfg.epochs, "parameters": n_params,
            "out": str(out), "history": history}


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
