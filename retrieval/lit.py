"""A CLIP-style text -> image space: a locked text tower and an image tower trained to match it.

The name follows LiT (Zhai et al., 2022, "locked-image tuning"), with the roles swapped: LiT locks a pretrained
image tower and tunes the text tower, this locks the text tower, so that the space's text side is the semantic
space's own encoder (phrases, questions and oracle texts embed as they do there), and trains the image tower.

The text tower is the semantic space's sentence-transformers model (default the packaged all-MiniLM-L6-v2),
**locked**: it embeds each train-split corpus segment's raw description (``raw``) once, ``t = TextEncoder.
encode_queries(raw)`` ``(n_texts, 384)``, L2-normalised, and none of its parameters is ever handed to the optimiser.
The image tower (`retrieval.towers.build_vit` with ``out_dim`` = the text width; optionally initialised from the SSL
tower) embeds the segment's middle frame, ``v = normalise(f(frame))``. With a learnable temperature
``s = exp(logit_scale)`` and a batch of ``B`` (frame, description) pairs::

    L = ( CE_rows(s * V T^T) + CE_cols(s * V T^T) ) / 2      (image -> text and text -> image InfoNCE)

where pairs sharing a description or a frame are not negatives of each other (masked). Afterwards a phrase embedded
by the locked text model ranks frames directly: the tower directory carries ``psr_text_tower.json`` naming the text
model, `retrieval.encode` records it in the space's ``meta.json`` (``text_tower``, ``text_model``,
``text_encoder: sentence-transformers``), and `retrieval.encoders.query_text_encoder` then encodes phrases, questions
and oracle texts with that model (``retrieval search --space lit``, ``retrieval oracle semantic-text --space lit``).

Usage::

    python -m retrieval encoder lit --data DIR --out models/lit --init models/ssl
    python -m retrieval encode --data DIR --space lit --model models/lit
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eval.benchmark import Benchmark
from eval.errors import InputError, MissingInput
from eval.images import segment_views
from retrieval.encoders import PACKAGED_MINILM
from retrieval.lftr.train import torch_threads
from retrieval.ssl import AugmentConfig, augmenter
from retrieval.towers import (
    TEXT_TOWER_FILE,
    OptimConfig,
    TowerConfig,
    build_vit,
    config_hash,
    data_record,
    finished_or_prepare,
    fit,
    frames_fingerprint,
    load_frames,
    normalize_pixels,
    peak_rss_mb,
    read_record,
    save_tower,
    split_videos,
)


def _lit_augment() -> AugmentConfig:
    return AugmentConfig(crop_scale_min=0.6, jitter=0.0, grayscale=0.0)


def _lit_optim() -> OptimConfig:
    return OptimConfig(epochs=15, lr=5e-4)


@dataclass
class LiTConfig:
    tower: TowerConfig = field(default_factory=TowerConfig)  # out_dim is set to the text model's width
    augment: AugmentConfig = field(default_factory=_lit_augment)
    optim: OptimConfig = field(default_factory=_lit_optim)
    text_model: str = PACKAGED_MINILM
    init: str = ""  # an SSL tower directory to start the image tower from ("" = random)
    init_logit_scale: float = math.log(1 / 0.07)
    max_logit_scale: float = math.log(100.0)
    split: str = "train"  # the split of --data whose pairs train the tower; "all" for a pretraining world
    max_pairs: int = 0  # 0 = every (frame, description) pair of the split (a positive number: an evenly spaced subset)


@dataclass
class Pairs:
    """Train-split (view, description) pairs: ``frame[i]`` / ``text[i]`` index ``frames`` (views: frame path and
    object box, `eval.images`) / ``texts``."""

    frames: list
    texts: list[str]
    frame: np.ndarray
    text: np.ndarray


def caption_pairs(bench: Benchmark, split: str = "train", max_pairs: int = 0) -> Pairs:
    """Each corpus segment of a ``split`` video (``"all"``: every video) with a non-empty ``raw`` description: (its
    view, raw)."""
    vids = split_videos(bench, split)
    rows = [(f, r) for v, f, r in zip(bench.corpus_ds["video_id"][:], segment_views(bench),
                                      bench.corpus_ds["raw"][:], strict=True) if v in vids and r and r.strip()]
    if max_pairs and len(rows) > max_pairs:
        step = len(rows) / max_pairs
        rows = [rows[int(i * step)] for i in range(max_pairs)]
    frames = sorted({f for f, _ in rows}, key=lambda v: (v[0], v[1] or ()))
    texts = sorted({r for _, r in rows})
    fi, ti = {f: i for i, f in enumerate(frames)}, {t: i for i, t in enumerate(texts)}
    return Pairs(frames, texts, np.fromiter((fi[f] for f, _ in rows), np.int64, count=len(rows)),
                 np.fromiter((ti[r] for _, r in rows), np.int64, count=len(rows)))


def init_from(tower: nn.Module, path: str) -> int:
    """Copy every tensor of the tower saved at ``path`` whose name and shape match (the pooler usually differs);
    returns the number of tensors copied."""
    from transformers import AutoModel

    src = AutoModel.from_pretrained(path).state_dict()
    own = tower.state_dict()
    take = {k: v for k, v in src.items() if k in own and own[k].shape == v.shape}
    tower.load_state_dict(take, strict=False)
    return len(take)


class LiT(nn.Module):
    """The trainable part: the image tower and the temperature (the text tower is not a submodule)."""

    def __init__(self, cfg: LiTConfig):
        super().__init__()
        self.tower = build_vit(cfg.tower)
        self.logit_scale = nn.Parameter(torch.tensor(float(cfg.init_logit_scale)))
        self.max_logit_scale = cfg.max_logit_scale

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.tower(pixel_values=pixel_values).pooler_output, dim=-1)

    def scale(self) -> torch.Tensor:
        return self.logit_scale.clamp(max=self.max_logit_scale).exp()


def lit_loss(v: torch.Tensor, t: torch.Tensor, scale: torch.Tensor, frame_ids: torch.Tensor,
             text_ids: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of ``(B, d)`` image and text embeddings (module docstring); off-diagonal pairs that share a
    frame or a description are masked out of both softmaxes."""
    logits = scale * v @ t.T
    same = (frame_ids[:, None] == frame_ids[None, :]) | (text_ids[:, None] == text_ids[None, :])
    same.fill_diagonal_(False)
    logits = logits.masked_fill(same, -torch.inf)
    target = torch.arange(v.shape[0], device=v.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def text_model_dim(text_model: str) -> int:
    from retrieval.encoders import TextEncoder

    return TextEncoder(text_model).dim


def train_lit(bench: Benchmark, cfg: LiTConfig, out: str | Path, *, log=print, progress: bool = True,
              stop_after: int | None = None, text_encoder=None) -> dict:
    """Train (or reuse, or resume) the LiT image tower into ``out``; returns its training record.

    ``text_encoder``: an already loaded `retrieval.encoders.TextEncoder` of ``cfg.text_model`` (loaded when None).
    """
    from retrieval.encoders import TextEncoder

    out = Path(out)
    pairs = caption_pairs(bench, cfg.split, cfg.max_pairs)
    if len(pairs.frame) == 0:
        raise InputError(f"{bench.root}: no {cfg.split!r} corpus segment has a raw description")
    enc = text_encoder or TextEncoder(cfg.text_model)
    cfg.tower.out_dim = enc.dim
    init_rec = read_record(cfg.init) if cfg.init else None
    if cfg.init and init_rec is None:
        raise MissingInput(f"{cfg.init}: no finished tower to initialise from (train it first: "
                                "`python -m retrieval encoder ssl`)")
    fp = frames_fingerprint(pairs.frames, bench.root)
    thash = config_hash(cfg, fp, "\n".join(pairs.texts), (init_rec or {}).get("training_hash", ""), "lit")
    rec = finished_or_prepare(out, thash, "the LiT tower (same config, frames and descriptions)", log)
    if rec is not None:
        return rec
    with torch_threads(cfg.optim.threads):
        t0 = time.time()
        text = torch.from_numpy(enc.encode_queries(pairs.texts, progress=progress))  # locked: computed once
        tc = cfg.tower
        size = (round(tc.image_height * cfg.augment.cache_scale), round(tc.image_width * cfg.augment.cache_scale))
        frames = load_frames(bench.root, pairs.frames, size, progress=progress)
        log(f"LiT: {len(pairs.frame):,} pairs ({len(pairs.frames):,} frames, {len(pairs.texts):,} descriptions) "
            f"in {time.time() - t0:.1f}s; text tower {cfg.text_model} locked")
        torch.manual_seed(cfg.optim.seed)
        model = LiT(cfg)
        if cfg.init:
            log(f"image tower initialised from {cfg.init} ({init_from(model.tower, cfg.init)} tensors)")
        aug = augmenter(cfg.augment, (tc.image_height, tc.image_width))
        frame_of, text_of = torch.from_numpy(pairs.frame), torch.from_numpy(pairs.text)

        def step_loss(idx: torch.Tensor):
            fi, ti = frame_of[idx], text_of[idx]
            v = model(normalize_pixels(aug(frames[fi].float() / 255.0)))
            loss = lit_loss(v, text[ti], model.scale(), fi, ti)
            return loss, {"scale": float(model.scale().detach())}

        history = fit(out, model, step_loss, len(pairs.frame), cfg.optim, thash, log=log, progress=progress,
                      stop_after=stop_after)
        if len(history) < cfg.optim.epochs:
            return {"finished": False, "epochs_done": len(history), "history": history}
        rec = {"trainer": "lit", "config": asdict(cfg), "training_hash": thash, "pairs": int(len(pairs.frame)),
               "frames": len(pairs.frames), "texts": len(pairs.texts), "frames_fingerprint": fp,
               "split": cfg.split, "benchmark": str(bench.root.resolve()), "text_model": cfg.text_model,
               "data": data_record(bench, cfg.split),
               "init_data": [init_rec.get("data") or {"tower": cfg.init}, *init_rec.get("init_data", [])]
               if init_rec else [],  # what the SSL tower it started from read (checked by check_disjoint)
               "parameters": sum(p.numel() for p in model.tower.parameters()), "history": history,
               "seconds_per_epoch": sum(h["seconds"] for h in history) / len(history),
               "peak_rss_mb": peak_rss_mb(), "finished": True}
        save_tower(out, model.tower, cfg.tower, rec, {TEXT_TOWER_FILE: {
            "text_model": cfg.text_model, "text_encoder": "sentence-transformers", "dim": enc.dim}})
    log(f"LiT tower written to {out} ({rec['parameters']:,} parameters, {rec['seconds_per_epoch']:.1f} s/epoch)")
    return rec
