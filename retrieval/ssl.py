"""A self-supervised visual encoder trained on a build's frames (the DINOv2 role).

Each frame ``x`` of a batch of ``B`` gives two global views (kornia, `AugmentConfig`: random resized crop to the
tower's size, horizontal flip, colour jitter, random grayscale, optionally a channel permutation and Gaussian blur)
and, with multi-crop, ``local_crops`` small views; the tower (`retrieval.towers.build_vit`) embeds each view,
``e = f(view)``, and a projection head ``g`` maps it to ``z = g(e)``. The objective (``objective``):

- ``vicreg`` (default; Bardes et al. 2022), head Linear-BN-ReLU-Linear-BN-ReLU-Linear, over each global view and
  every other view::

      L = sim_weight * mean MSE(z_i, z_j) + var_weight * mean_views v(z) + cov_weight * mean_views c(z)
      v(z) = mean_j relu(1 - sqrt(Var(z_j) + eps))         c(z) = sum_{i != j} C(z)_ij^2 / d

  (``C`` the batch covariance): invariance, a variance hinge that keeps every dimension spread over the batch, and
  decorrelated dimensions -- no negatives, and a collapsed space is penalised;
- ``barlow`` (Barlow Twins), same head: ``sum_i (1 - C_ii)^2 + barlow_lambda * sum_{i != j} C_ij^2`` with ``C`` the
  cross-correlation of the batch-standardised views;
- ``simclr`` (Chen et al. 2020), head Linear-GELU-Linear onto the unit sphere, with the ``2B`` global views'
  similarities ``s_ij = <z_i, z_j> / tau``::

      L = mean_i  -log( exp(s_{i, p(i)}) / sum_{j != i} exp(s_ij) )        p(i) = the other view of i's frame

- ``recon``: masked prediction alone (one view).

Masked prediction (``recon_weight`` > 0, or ``recon``): ``mask_ratio`` of the input's patches are blanked and a small
decoder reconstructs from ``e`` a low-resolution target of the view before its colour augmentation (``recon_target``:
``gray``, ``edges`` or ``rgb`` on `RECON_GRID`), added with weight ``recon_weight``.

The saved space (``center``, ``whiten``; `standardize_pooler`): after training, the training frames' mean
``pooler_output`` and, with ``whiten`` > 0, a ZCA whitening of their covariance (eigenvalue floor ``whiten`` x the
largest) are folded into the linear pooler, so the saved tower's space is centred and whitened. A small tower trained
for a few hundred steps (and a randomly initialised one too) puts almost all of its frames' variance in a handful
of directions around a large common offset (demo world: effective dimension about 3 of 96, anisotropy 0.95), and
cosine similarity in such a space sees little else, although the other directions still tell states apart;
whitening gives every direction the frames differ in its share. The default floor (1e-10 of the largest eigenvalue)
is nearly full whitening: the directions that tell states apart sit far below the largest ones, and a higher floor
damps them. It was chosen on the validation split of the demo benchmark (the tower trained on its own disjoint world)
by the state-prototype oracle, over floors 1e-3 to 1e-12; 1e-12 scored a little higher there, but its amplification
of the float32 pooler's rounding no longer leaves the training frames centred.
The map is a fixed linear layer of the tower, so the encoder, the LiT initialisation and the file format are those
of any tower.

Nothing but pixels enters the objective: the trainer's only data input is the list of frame views
(`retrieval.towers.train_frames` of ``split``; ``"all"`` for a pretraining world); no state, description, question or
split label reaches it. The head and decoder are discarded; the saved tower's ``pooler_output`` (a linear map of the
CLS token) is the representation.

Usage::

    python -m retrieval encoder ssl --data WORLD --out models/ssl --set split=all   # trains once; a rerun reuses it
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
from eval.errors import InputError
from retrieval.lftr.train import torch_threads
from retrieval.towers import (
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
    save_tower,
    train_frames,
)

OBJECTIVES = ("vicreg", "barlow", "simclr", "recon")


@dataclass
class AugmentConfig:
    """Batched view augmentations (kornia), applied to frames cached at ``cache_scale`` x the tower size.

    Geometry: a random resized crop (``crop_scale_*`` of the area, ``crop_ratio_*`` width / height) and a horizontal
    flip. Colour: jitter (probability ``jitter``), grayscale, a random permutation of the RGB channels
    (``channel_shuffle``), Gaussian blur. Multi-crop: ``local_crops`` extra small views per frame (``local_scale_*``
    of the area, resized to the tower's resolution: each costs as much as a global view)."""

    cache_scale: float = 1.5
    crop_scale_min: float = 0.3
    crop_scale_max: float = 1.0
    crop_ratio_min: float = 1.0  # width / height of the crop (frames are 4:3)
    crop_ratio_max: float = 1.8
    flip: float = 0.5
    jitter: float = 0.8  # probability of colour jitter
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    grayscale: float = 0.2
    channel_shuffle: float = 0.0
    blur: float = 0.0
    local_crops: int = 0
    local_scale_min: float = 0.1
    local_scale_max: float = 0.35


def _ssl_augment() -> AugmentConfig:
    return AugmentConfig()


@dataclass
class SSLConfig:
    tower: TowerConfig = field(default_factory=TowerConfig)
    augment: AugmentConfig = field(default_factory=_ssl_augment)
    optim: OptimConfig = field(default_factory=OptimConfig)
    objective: str = "vicreg"  # vicreg | barlow | simclr (module docstring)
    tau: float = 0.2  # simclr temperature
    head_hidden: int = 256  # 0: no projection head (vicreg / barlow regularise the representation itself)
    head_dim: int = 256
    center: bool = True  # fold the training frames' mean embedding into the pooler (a centred space)
    whiten: float = 1e-10  # with center: fold a ZCA whitening into the pooler too; eigenvalue floor, share of the largest (0 = off)
    sim_weight: float = 25.0  # vicreg: invariance (lambda)
    var_weight: float = 25.0  # vicreg: variance hinge (mu)
    cov_weight: float = 1.0  # vicreg: covariance (nu)
    barlow_lambda: float = 0.01  # barlow: weight of the off-diagonal cross-correlation
    recon_weight: float = 0.0  # masked prediction: weight of the low-resolution reconstruction term (0 = off)
    recon_target: str = "gray"  # what is reconstructed from the embedding: gray | edges | rgb (module docstring)
    mask_ratio: float = 0.0  # share of the input's patches blanked before the tower sees a view
    split: str = "train"  # the split of --data whose frames train the tower; "all" for a pretraining world
    max_frames: int = 0  # 0 = every frame of the split (a positive number keeps an evenly spaced subset: tests)


def geometric(cfg: AugmentConfig, size: tuple[int, int], *, local: bool = False) -> nn.Module:
    """The geometry part of a view: random resized crop to ``size`` (``local``: the multi-crop's small views,
    ``local_scale_*`` of the area) and horizontal flip; ``(B, 3, h, w)`` -> ``(B, 3, *size)`` float in [0, 1]."""
    import kornia.augmentation as K

    scale = (cfg.local_scale_min, cfg.local_scale_max) if local else (cfg.crop_scale_min, cfg.crop_scale_max)
    return nn.Sequential(K.RandomResizedCrop(size, scale=scale, ratio=(cfg.crop_ratio_min, cfg.crop_ratio_max)),
                         K.RandomHorizontalFlip(p=cfg.flip))


def photometric(cfg: AugmentConfig) -> nn.Module:
    """The colour part of a view: jitter, grayscale, channel permutation, blur (float in [0, 1], same shape)."""
    import kornia.augmentation as K

    ops = [K.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue, p=cfg.jitter),
           K.RandomGrayscale(p=cfg.grayscale)]
    if cfg.channel_shuffle:
        ops.append(K.RandomChannelShuffle(p=cfg.channel_shuffle))
    if cfg.blur:
        ops.append(K.RandomGaussianBlur((5, 5), (0.1, 1.5), p=cfg.blur))
    return nn.Sequential(*ops)


def augmenter(cfg: AugmentConfig, size: tuple[int, int], *, local: bool = False) -> nn.Module:
    """Batched random views: ``(B, 3, h, w)`` float in [0, 1] -> ``(B, 3, *size)`` float in [0, 1]."""
    return nn.Sequential(geometric(cfg, size, local=local), photometric(cfg))


#: Grid of the masked-prediction target (height, width): the synthetic ``pixels`` space's 16x12.
RECON_GRID = (12, 16)


def recon_target(view: torch.Tensor, kind: str) -> torch.Tensor:
    """``(B, 3, H, W)`` geometric view (before colour augmentation) in [0, 1] -> ``(B, 12 * 16 [* 3])`` target,
    standardised per item (zero mean, unit variance): ``gray`` luminance, ``edges`` Sobel gradient magnitude of the
    luminance, ``rgb`` the colour image, each box-downsampled to `RECON_GRID`."""
    gray = (0.299 * view[:, 0] + 0.587 * view[:, 1] + 0.114 * view[:, 2]).unsqueeze(1)
    if kind == "gray":
        t = gray
    elif kind == "rgb":
        t = view
    elif kind == "edges":
        kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=view.device)
        k = torch.stack([kx, kx.T]).unsqueeze(1)
        g = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), k)
        t = g.pow(2).sum(1, keepdim=True).sqrt()
    else:
        raise InputError(f"unknown reconstruction target {kind!r}; expected gray, edges or rgb")
    t = F.adaptive_avg_pool2d(t, RECON_GRID).flatten(1)
    return (t - t.mean(1, keepdim=True)) / (t.std(1, keepdim=True) + 1e-6)


def mask_patches(x: torch.Tensor, patch: int, ratio: float) -> torch.Tensor:
    """Blank (set to 0, the normalised mid-grey) a random ``ratio`` of each image's ``patch`` x ``patch`` patches."""
    if not ratio:
        return x
    b, _, h, w = x.shape
    keep = torch.rand(b, 1, h // patch, w // patch, device=x.device) >= ratio
    return x * keep.repeat_interleave(patch, 2).repeat_interleave(patch, 3).to(x.dtype)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    """SimCLR's NT-Xent loss of two ``(B, d)`` L2-normalised view batches (module docstring)."""
    z = torch.cat([z1, z2])
    b = z1.shape[0]
    logits = (z @ z.T) / tau
    logits.fill_diagonal_(-torch.inf)
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)
    return F.cross_entropy(logits, target)


def variance_covariance(z: torch.Tensor, eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """VICReg's regularisers of a ``(B, d)`` batch: ``v = mean_j relu(1 - sqrt(Var(z_j) + eps))`` and
    ``c = sum_{i != j} C_ij^2 / d`` with ``C`` the batch covariance (module docstring)."""
    z = z - z.mean(0)
    v = F.relu(1.0 - torch.sqrt(z.var(0) + eps)).mean()
    cov = (z.T @ z) / (z.shape[0] - 1)
    off = cov - torch.diag_embed(torch.diagonal(cov))
    return v, off.pow(2).sum() / z.shape[1]


def vicreg_loss(views: list[torch.Tensor], cfg: SSLConfig) -> tuple[torch.Tensor, dict]:
    """VICReg over ``views[0]``, ``views[1]`` (global) and any local views: invariance (MSE) between each global view
    and every other view, variance and covariance terms on every view (module docstring)."""
    pairs = [(i, j) for i in range(min(2, len(views))) for j in range(i + 1, len(views))]
    inv = sum(F.mse_loss(views[i], views[j]) for i, j in pairs) / len(pairs)
    vc = [variance_covariance(z) for z in views]
    var = sum(v for v, _ in vc) / len(vc)
    cov = sum(c for _, c in vc) / len(vc)
    loss = cfg.sim_weight * inv + cfg.var_weight * var + cfg.cov_weight * cov
    return loss, {"inv": float(inv.detach()), "var": float(var.detach()), "cov": float(cov.detach())}


def barlow_loss(views: list[torch.Tensor], cfg: SSLConfig, eps: float = 1e-5) -> tuple[torch.Tensor, dict]:
    """Barlow Twins over pairs of views (global x every other): ``sum_i (1 - C_ii)^2 + lambda sum_{i != j} C_ij^2``
    with ``C`` the cross-correlation of the batch-standardised views (module docstring)."""
    std = [(z - z.mean(0)) / (z.std(0) + eps) for z in views]
    pairs = [(i, j) for i in range(min(2, len(views))) for j in range(i + 1, len(views))]
    on = off = 0.0
    for i, j in pairs:
        c = std[i].T @ std[j] / std[i].shape[0]
        d = torch.diagonal(c)
        on = on + (d - 1).pow(2).sum()
        off = off + (c - torch.diag_embed(d)).pow(2).sum()
    on, off = on / len(pairs), off / len(pairs)
    return on + cfg.barlow_lambda * off, {"on_diag": float(on.detach()), "off_diag": float(off.detach())}


class SSLModel(nn.Module):
    """The tower plus its projection head (discarded after training): SimCLR's Linear-GELU-Linear onto the unit
    sphere, or VICReg / Barlow Twins' expander Linear-BN-ReLU-Linear-BN-ReLU-Linear."""

    def __init__(self, cfg: SSLConfig):
        super().__init__()
        if cfg.objective not in OBJECTIVES:
            raise InputError(f"unknown SSL objective {cfg.objective!r}; expected one of {OBJECTIVES}")
        self.tower = build_vit(cfg.tower)
        self.normalize = cfg.objective == "simclr"
        d, h, o = cfg.tower.out_dim, cfg.head_hidden, cfg.head_dim
        if not h:
            self.head = nn.Identity()
        elif self.normalize:
            self.head = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, o))
        else:
            self.head = nn.Sequential(nn.Linear(d, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, h),
                                      nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, o))

        self.decoder = None
        if cfg.recon_weight or cfg.objective == "recon":
            n_out = RECON_GRID[0] * RECON_GRID[1] * (3 if cfg.recon_target == "rgb" else 1)
            self.decoder = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, n_out))

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The tower's ``pooler_output`` (the representation a space stores, before L2 normalisation)."""
        return self.tower(pixel_values=pixel_values).pooler_output

    def project(self, e: torch.Tensor) -> torch.Tensor:
        z = self.head(e)
        return F.normalize(z, dim=-1) if self.normalize else z

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.project(self.embed(pixel_values))


def ssl_objective(model: SSLModel, frames: torch.Tensor, cfg: SSLConfig) -> Callable:
    """``step_loss(idx)`` for `retrieval.towers.fit`: two global views of ``frames[idx]`` (plus ``local_crops``
    small ones) -> the objective's loss (+ ``recon_weight`` x the masked-prediction term on the global views).
    ``frames`` is the only data the objective sees (``(n, 3, h, w)`` uint8)."""
    size = (cfg.tower.image_height, cfg.tower.image_width)
    geo, col = geometric(cfg.augment, size), photometric(cfg.augment)
    local = augmenter(cfg.augment, size, local=True) if cfg.augment.local_crops else None
    recon = cfg.recon_weight if cfg.objective != "recon" else 1.0

    def step_loss(idx: torch.Tensor):
        x = frames[idx].float() / 255.0
        g = [geo(x)] if cfg.objective == "recon" else [geo(x), geo(x)]  # masked prediction needs one view
        views = [mask_patches(normalize_pixels(col(v)), cfg.tower.patch_size, cfg.mask_ratio) for v in g]
        views += [normalize_pixels(local(x)) for _ in range(cfg.augment.local_crops)] if local is not None else []
        e = [model.embed(v) for v in views]
        parts: dict[str, float] = {}
        loss = torch.zeros(())
        if cfg.objective == "simclr":
            loss = nt_xent(model.project(e[0]), model.project(e[1]), cfg.tau)
        elif cfg.objective in ("vicreg", "barlow"):
            z = [model.project(x) for x in e]
            loss, parts = vicreg_loss(z, cfg) if cfg.objective == "vicreg" else barlow_loss(z, cfg)
        if recon:
            r = sum(F.mse_loss(model.decoder(x), recon_target(gv, cfg.recon_target))
                    for x, gv in zip(e[:len(g)], g, strict=True)) / len(g)
            loss = loss + recon * r
            parts["recon"] = float(r.detach())
        return loss, parts

    return step_loss


def pooler_outputs(tower: nn.Module, frames: torch.Tensor, cfg: SSLConfig, max_frames: int = 4096) -> torch.Tensor:
    """``(m, out_dim)`` float64 ``pooler_output`` of an evenly spaced subset of at most ``max_frames`` training frames,
    resized to the tower's size without augmentation (as the image processor feeds the saved tower)."""
    size = (cfg.tower.image_height, cfg.tower.image_width)
    idx = torch.linspace(0, len(frames) - 1, min(len(frames), max_frames)).long()
    tower.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(idx), 512):
            x = F.interpolate(frames[idx[s:s + 512]].float() / 255.0, size=size, mode="bilinear", antialias=True,
                              align_corners=False)
            out.append(tower(pixel_values=normalize_pixels(x)).pooler_output.double())
    return torch.cat(out)


def whitening_map(e: torch.Tensor, floor: float) -> torch.Tensor:
    """ZCA map ``M = V diag((l + floor * max(l))^-1/2) V^T`` of the covariance ``V diag(l) V^T`` of the rows of ``e``
    (float64): ``(e - mean) @ M`` has unit variance along every direction whose variance is well above the floor,
    and directions below it are damped rather than amplified."""
    if len(e) < 2:
        raise InputError(f"whitening a tower's space needs at least 2 training frames, got {len(e)}",
                         fix="train on more frames or set whiten=0")
    c = torch.cov(e.T)
    lam, vec = torch.linalg.eigh(c)
    lam = lam.clamp(min=0.0)
    return vec @ torch.diag((lam + floor * lam.max()).rsqrt()) @ vec.T


def standardize_pooler(tower: nn.Module, frames: torch.Tensor, cfg: SSLConfig) -> dict:
    """Fold the training frames' statistics into the tower's linear pooler, so the saved space is centred (``center``)
    and, with ``whiten`` > 0, whitened: ``pooler(x) = W cls + b`` becomes ``M (W cls + b - mean)`` with ``M`` the
    `whitening_map` (the identity without whitening). Cosine similarity then compares every direction the frames
    differ in, not a shared offset and the few directions of largest variance. Returns what was folded in (for the
    record): the norm of the removed mean, the floor, and the effective dimension of the training frames' pooler
    output before and after (`retrieval.complementarity.geometry`, of the L2-normalised outputs as a space stores
    them)."""
    from retrieval.complementarity import geometry

    e = pooler_outputs(tower, frames, cfg)
    mean = e.mean(0)
    m = whitening_map(e, cfg.whiten) if cfg.whiten > 0 else torch.eye(e.shape[1], dtype=torch.float64)
    dense = tower.pooler.dense
    with torch.no_grad():
        w, b = dense.weight.double(), dense.bias.double()
        dense.weight.copy_((m.T @ w).to(dense.weight.dtype))
        dense.bias.copy_(((b - mean) @ m).to(dense.bias.dtype))
    after = pooler_outputs(tower, frames, cfg)

    def eff(x: torch.Tensor) -> float:
        return round(geometry(F.normalize(x, dim=1).numpy())["effective_dim"], 2)

    return {"mean_norm": float(mean.norm()), "whiten_floor": cfg.whiten, "effective_dim_before": eff(e),
            "effective_dim_after": eff(after)}


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
        raise InputError(f"{bench.root}: no {cfg.split!r} frames to train on")
    fp = frames_fingerprint(paths, bench.root)
    thash = config_hash(cfg, fp, "ssl")
    rec = finished_or_prepare(out, thash, "the SSL tower (same config and frames)", log)
    if rec is not None:
        return rec
    with torch_threads(cfg.optim.threads):
        t0 = time.time()
        tc = cfg.tower
        size = (round(tc.image_height * cfg.augment.cache_scale), round(tc.image_width * cfg.augment.cache_scale))
        frames = load_frames(bench.root, paths, size, progress=progress)
        log(f"SSL: {len(paths):,} {cfg.split} frames cached at {size[1]}x{size[0]} in {time.time() - t0:.1f}s")
        torch.manual_seed(cfg.optim.seed)
        model = SSLModel(cfg)
        history = fit(out, model, ssl_objective(model, frames, cfg), len(paths), cfg.optim, thash, log=log,
                      progress=progress, stop_after=stop_after, drop_last=cfg.objective != "simclr")
        if len(history) < cfg.optim.epochs:
            return {"finished": False, "epochs_done": len(history), "history": history}
        std = standardize_pooler(model.tower, frames, cfg) if cfg.center else None
        rec = {"trainer": cfg.objective, "config": asdict(cfg), "training_hash": thash, "frames": len(paths),
               "frames_fingerprint": fp, "split": cfg.split, "benchmark": str(bench.root.resolve()),
               "data": data_record(bench, cfg.split),
               "centred_by": std["mean_norm"] if std else None, "standardized": std,
               "parameters": sum(p.numel() for p in model.tower.parameters()), "history": history,
               "seconds_per_epoch": sum(h["seconds"] for h in history) / len(history),
               "peak_rss_mb": peak_rss_mb(), "finished": True}
        save_tower(out, model.tower, cfg.tower, rec)
    log(f"SSL tower written to {out} ({rec['parameters']:,} parameters, "
        f"{rec['seconds_per_epoch']:.1f} s/epoch)")
    return rec
