"""A self-supervised visual encoder trained on a benchmark's train-split frames (the DINOv2 role).

Objective: SimCLR (Chen et al. 2020). Each frame ``x`` of a batch of ``B`` gives two augmented views (kornia:
random resized crop to the tower's size, horizontal flip, colour jitter, random grayscale); the tower
(`retrieval.towers.build_vit`) embeds each view, a projection head ``g`` (Linear-GELU-Linear) maps it to
``z = normalise(g(f(view)))``, and with the ``2B`` views' similarities ``s_ij = <z_i, z_j> / tau``::

    L = mean_i  -log( exp(s_{i, p(i)}) / sum_{j != i} exp(s_ij) )        p(i) = the other view of i's frame

(NT-Xent). Nothing but pixels enters the objective: the trainer's only data input is the list of frame paths
(`retrieval.towers.train_frames`); no state, description, question or split label reaches it. The head is
discarded; the saved tower's ``pooler_output`` (a linear map of the CLS token) is the representation.

Usage::

    python -m retrieval encoder ssl --data DIR --out models/ssl      # trains once; a rerun reuses the tower
    python -m retrieval encode --data DIR --space ssl --model models/ssl
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eval.benchmark import Benchmark
from retrieval.lftr.train import torch_threads
from retrieval.towers import (
    TRAIN_RECORD,
    OptimConfig,
    TowerConfig,
    build_vit,
    check_output_dir,
    config_hash,
    fit,
    frames_fingerprint,
    load_frames,
    normalize_pixels,
    peak_rss_mb,
    read_record,
    save_tower,
    train_frames,
)


@dataclass
class AugmentConfig:
    """SimCLR-style view augmentations (kornia), applied to frames cached at ``cache_scale`` x the tower size."""

    cache_scale: float = 1.5
    crop_scale_min: float = 0.3
    crop_ratio_min: float = 1.0  # width / height of the crop (frames are 4:3)
    crop_ratio_max: float = 1.8
    flip: float = 0.5
    jitter: float = 0.8  # probability of colour jitter
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    grayscale: float = 0.2


@dataclass
class SSLConfig:
    tower: TowerConfig = field(default_factory=TowerConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    tau: float = 0.2
    head_hidden: int = 256
    head_dim: int = 64
    split: str = "train"
    max_frames: int = 0  # 0 = every frame of the split (a positive number keeps an evenly spaced subset: tests)


def augmenter(cfg: AugmentConfig, size: tuple[int, int]) -> nn.Module:
    """Batched random views: ``(B, 3, h, w)`` float in [0, 1] -> ``(B, 3, *size)`` float in [0, 1]."""
    import kornia.augmentation as K

    return nn.Sequential(
        K.RandomResizedCrop(size, scale=(cfg.crop_scale_min, 1.0), ratio=(cfg.crop_ratio_min, cfg.crop_ratio_max)),
        K.RandomHorizontalFlip(p=cfg.flip),
        K.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue, p=cfg.jitter),
        K.RandomGrayscale(p=cfg.grayscale),
    )


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    """SimCLR's NT-Xent loss of two ``(B, d)`` L2-normalised view batches (module docstring)."""
    z = torch.cat([z1, z2])
    b = z1.shape[0]
    logits = (z @ z.T) / tau
    logits.fill_diagonal_(-torch.inf)
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)
    return F.cross_entropy(logits, target)


class SimCLR(nn.Module):
    """The tower plus its projection head (the head is discarded after training)."""

    def __init__(self, cfg: SSLConfig):
        super().__init__()
        self.tower = build_vit(cfg.tower)
        d = cfg.tower.out_dim
        self.head = nn.Sequential(nn.Linear(d, cfg.head_hidden), nn.GELU(), nn.Linear(cfg.head_hidden, cfg.head_dim))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.tower(pixel_values=pixel_values).pooler_output), dim=-1)


def ssl_objective(model: SimCLR, frames: torch.Tensor, cfg: SSLConfig) -> Callable:
    """``step_loss(idx)`` for `retrieval.towers.fit`: two views of ``frames[idx]`` -> NT-Xent. ``frames`` is the
    only data the objective sees (``(n, 3, h, w)`` uint8 pixels)."""
    aug = augmenter(cfg.augment, (cfg.tower.image_height, cfg.tower.image_width))

    def step_loss(idx: torch.Tensor):
        x = frames[idx].float() / 255.0
        v1, v2 = normalize_pixels(aug(x)), normalize_pixels(aug(x))
        loss = nt_xent(model(v1), model(v2), cfg.tau)
        return loss, {}

    return step_loss


def select_frames(paths: list[str], max_frames: int) -> list[str]:
    if max_frames and len(paths) > max_frames:
        step = len(paths) / max_frames
        return [paths[int(i * step)] for i in range(max_frames)]
    return paths


def train_ssl(bench: Benchmark, cfg: SSLConfig, out: str | Path, *, log=print, progress: bool = True,
              stop_after: int | None = None) -> dict:
    """Train (or reuse, or resume) the SSL tower into ``out``; returns its training record.

    A finished tower in ``out`` whose record has the same config and frame fingerprint is reused as is.
    """
    out = Path(out)
    paths = select_frames(train_frames(bench, cfg.split), cfg.max_frames)
    if not paths:
        raise ValueError(f"{bench.root}: no {cfg.split!r} frames to train on")
    fp = frames_fingerprint(paths, bench.root)
    thash = config_hash(cfg, fp, "simclr")
    rec = read_record(out)
    if rec is not None and rec.get("training_hash") == thash:
        log(f"reusing the SSL tower in {out} (same config and frames)")
        return rec
    check_output_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / TRAIN_RECORD).unlink(missing_ok=True)  # a tower of another config is being replaced
    with torch_threads(cfg.optim.threads):
        t0 = time.time()
        tc = cfg.tower
        size = (round(tc.image_height * cfg.augment.cache_scale), round(tc.image_width * cfg.augment.cache_scale))
        frames = load_frames(bench.root, paths, size, progress=progress)
        log(f"SSL: {len(paths):,} {cfg.split} frames cached at {size[1]}x{size[0]} in {time.time() - t0:.1f}s")
        torch.manual_seed(cfg.optim.seed)
        model = SimCLR(cfg)
        history = fit(out, model, ssl_objective(model, frames, cfg), len(paths), cfg.optim, thash, log=log,
                      progress=progress, stop_after=stop_after)
        if len(history) < cfg.optim.epochs:
            return {"finished": False, "epochs_done": len(history), "history": history}
        rec = {"trainer": "simclr", "config": asdict(cfg), "training_hash": thash, "frames": len(paths),
               "frames_fingerprint": fp, "split": cfg.split, "benchmark": str(bench.root.resolve()),
               "parameters": sum(p.numel() for p in model.tower.parameters()), "history": history,
               "seconds_per_epoch": sum(h["seconds"] for h in history) / len(history),
               "peak_rss_mb": peak_rss_mb(), "finished": True}
        save_tower(out, model.tower, cfg.tower, rec)
    log(f"SSL tower written to {out} ({rec['parameters']:,} parameters, "
        f"{rec['seconds_per_epoch']:.1f} s/epoch)")
    return rec
