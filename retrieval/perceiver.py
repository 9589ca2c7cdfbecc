"""A supervised perceiver: the queried object's present state read from its window, learned on a world of its own.

LFTR from frames forecasts from what its prefix tokens perceive. The self-supervised and LiT towers
(`retrieval.ssl`, `retrieval.lit`) read the object's place and little else (`retrieval.perception`). This module
learns perception directly, as a pretrained object-attribute recogniser would: a small CNN with one softmax head per
attribute of the simulator's state (`retrieval.perception.ATTRIBUTES`: motion, place, relation, the other object's
kind, pose), trained on a simulated world of **another seed** (the towers' pretraining world), never on the benchmark
it encodes (`retrieval.towers.check_disjoint` refuses it, as for the towers). It is an addition to the paper's
roles, not one of them: DINOv2 and CLIP were never trained on PSR's labels of any world.

Training windows (`labelled_windows`), each the object window the visual spaces see (`eval.images`):

- every corpus segment's middle frame, labelled with its segment's ``sim_state``;
- every prefix's last frame, labelled with the state of the object's segment active at the prefix's end.

Network (`PerceiverNet`): ``len(channels)`` blocks of 3x3 convolution, batch norm and ReLU, each but the last followed
by 2x2 max pooling, then global average pooling and a linear head per attribute. Loss: the sum of the heads'
cross-entropies. Augmentation: a random per-channel gain and offset (uniform within ``+-jitter/2``) and a horizontal
flip with probability ``flip``.

The token of a frame is the concatenation of the heads' softmax distributions, standardised with the mean and
standard deviation of the training windows' tokens (stored with the model). ``python -m retrieval encode`` with a
perceiver as ``--model`` (`retrieval.encode`) writes it for every prefix frame of a benchmark as a ``prefix`` space
(``features/<space>/prefixes.npy`` ``(n_prefixes, 8, d)``, ``meta.json`` ``kind: prefix``, ``normalized: false``),
the input of ``lftr-<space>[<semantic>]``.

Usage::

    python -m retrieval encoder perceiver --data WORLD --out models/perceiver
    python -m retrieval encode --data DIR --space perceiver --model models/perceiver
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.images import has_boxes, prefix_views, segment_views
from retrieval.perception import ATTRIBUTES, present_states
from retrieval.towers import (
    ALL,
    TRAIN_RECORD,
    OptimConfig,
    config_hash,
    data_record,
    finished_or_prepare,
    fit,
    frames_fingerprint,
    load_frames,
    normalize_pixels,
    peak_rss_mb,
    read_record,
    split_videos,
)

#: The perceiver's weights, vocabularies and token statistics in a perceiver directory (beside ``config.json``).
PERCEIVER_FILE = "psr_perceiver.pt"
#: ``model_type`` of a perceiver directory's ``config.json``.
MODEL_TYPE = "psr-perceiver"


@dataclass
class NetConfig:
    image_height: int = 32
    image_width: int = 48
    channels: tuple[int, ...] = (32, 64, 96, 128)


def _perceiver_optim() -> OptimConfig:
    return OptimConfig(epochs=6, batch_size=128, lr=2e-3, weight_decay=1e-4, warmup_epochs=0.5, grad_clip=0.0)


@dataclass
class PerceiverConfig:
    net: NetConfig = field(default_factory=NetConfig)
    optim: OptimConfig = field(default_factory=_perceiver_optim)
    jitter: float = 0.2  # per-channel gain and offset, each uniform in +-jitter/2
    flip: float = 0.5  # probability of a horizontal flip
    split: str = ALL  # the split of --data whose windows train it ("all": every video of a pretraining world)
    max_windows: int = 0  # 0 = every labelled window (a positive number: an evenly spaced subset)


@dataclass
class Windows:
    """Labelled training windows: ``views[i]`` (frame path, object box) shows an object in state ``labels[i]`` (one
    value per attribute of `ATTRIBUTES`)."""

    views: list
    labels: np.ndarray  # (n, len(ATTRIBUTES)) object (str)


def labelled_windows(bench: Benchmark, split: str = ALL, max_windows: int = 0) -> Windows:
    """The corpus middle frames and prefix last frames of ``split``'s videos with their simulator state (module
    docstring). `InputError` on a build without simulator truth or without a labelled window in ``split``."""
    pres = present_states(bench)  # raises on a build without sim_state
    vids = split_videos(bench, split)
    sim = bench.corpus_ds["sim_state"][:]
    rows = [(v, s.split("|")) for vid, v, s in zip(bench.corpus_ds["video_id"][:], segment_views(bench), sim,
                                                   strict=True) if vid in vids and s]
    pids, pviews = prefix_views(bench)
    last = dict(zip(pids, (fr[-1] for fr in pviews), strict=True))
    rows += [(last[p], list(lab)) for p, sp, lab in zip(pres.prefix_ids, pres.split, pres.labels, strict=True)
             if split == ALL or sp == split]
    bad = next((r for r in rows if len(r[1]) != len(ATTRIBUTES)), None)
    if bad is not None:
        raise InputError(f"{bench.root}: a sim_state of {len(bad[1])} parts at {bad[0][0]}; expected "
                         f"{len(ATTRIBUTES)} ({'|'.join(ATTRIBUTES)})")
    if not rows:
        raise InputError(f"{bench.root}: no labelled window in split {split!r}")
    if max_windows and len(rows) > max_windows:
        step = len(rows) / max_windows
        rows = [rows[int(i * step)] for i in range(max_windows)]
    return Windows([v for v, _ in rows], np.asarray([lab for _, lab in rows], dtype=object))


class PerceiverNet(nn.Module):
    """The CNN and its heads (module docstring); ``token`` gives the standardised concatenated distributions."""

    def __init__(self, net: NetConfig, sizes: list[int]):
        super().__init__()
        c = [3, *net.channels]
        layers: list[nn.Module] = []
        for i in range(len(net.channels)):
            layers += [nn.Conv2d(c[i], c[i + 1], 3, padding=1), nn.BatchNorm2d(c[i + 1]), nn.ReLU()]
            layers.append(nn.MaxPool2d(2) if i < len(net.channels) - 1 else nn.AdaptiveAvgPool2d(1))
        self.conv = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(c[-1], n) for n in sizes)
        d = sum(sizes)
        self.register_buffer("token_mean", torch.zeros(d))
        self.register_buffer("token_std", torch.ones(d))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.conv(x).flatten(1)
        return [head(h) for head in self.heads]

    def distributions(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.softmax(o, -1) for o in self(x)], -1)

    def token(self, x: torch.Tensor) -> torch.Tensor:
        return (self.distributions(x) - self.token_mean) / self.token_std


def _batches(frames: torch.Tensor, batch: int = 512):
    for s in range(0, len(frames), batch):
        yield normalize_pixels(frames[s:s + batch].float() / 255.0)


@torch.no_grad()
def _fit_token_stats(model: PerceiverNet, frames: torch.Tensor) -> torch.Tensor:
    """Set the token's standardisation from the training windows' distributions (one pass in eval mode); returns
    each window's predicted class per attribute, ``(n, len(ATTRIBUTES))``."""
    model.eval()
    logits = [model(x) for x in _batches(frames)]
    p = torch.cat([torch.cat([F.softmax(o, -1) for o in outs], -1) for outs in logits])
    model.token_mean.copy_(p.mean(0))
    model.token_std.copy_(p.std(0) + 1e-3)
    return torch.cat([torch.stack([o.argmax(-1) for o in outs], 1) for outs in logits])


def train_perceiver(bench: Benchmark, cfg: PerceiverConfig, out: str | Path, *, log=print, progress: bool = True,
                    stop_after: int | None = None) -> dict:
    """Train (or reuse, or resume) the perceiver into ``out``; returns its training record (``finished`` false
    when ``stop_after`` epochs ran and more remain)."""
    from eval.io import atomic_path, write_json
    from retrieval.lftr.train import torch_threads

    out = Path(out)
    win = labelled_windows(bench, cfg.split, cfg.max_windows)
    vocab = [sorted(set(win.labels[:, a].tolist())) for a in range(len(ATTRIBUTES))]
    fp = frames_fingerprint(win.views, bench.root)
    thash = config_hash(cfg, fp, json.dumps(win.labels.tolist()), "perceiver")
    rec = finished_or_prepare(out, thash, "the perceiver (same config, windows and labels)", log)
    if rec is not None:
        return rec
    with torch_threads(cfg.optim.threads):
        t0 = time.time()
        size = (cfg.net.image_height, cfg.net.image_width)
        frames = load_frames(bench.root, win.views, size, progress=progress)
        index = [{v: i for i, v in enumerate(values)} for values in vocab]
        y = torch.tensor([[index[a][v] for a, v in enumerate(lab)] for lab in win.labels])
        log(f"perceiver: {len(frames):,} windows in {time.time() - t0:.1f}s; classes per attribute "
            + ", ".join(f"{a} {len(v)}" for a, v in zip(ATTRIBUTES, vocab, strict=True)))
        torch.manual_seed(cfg.optim.seed)
        model = PerceiverNet(cfg.net, [len(v) for v in vocab])

        def step_loss(idx: torch.Tensor):
            x = frames[idx].float() / 255.0
            n = len(idx)
            gain = 1 + cfg.jitter * (torch.rand(n, 3, 1, 1) - 0.5)
            x = x * gain + cfg.jitter * (torch.rand(n, 3, 1, 1) - 0.5)
            flip = torch.rand(n) < cfg.flip
            x[flip] = x[flip].flip(-1)
            logits = model(normalize_pixels(x))
            parts = [F.cross_entropy(o, y[idx, a]) for a, o in enumerate(logits)]
            return sum(parts), {a: float(p.detach()) for a, p in zip(ATTRIBUTES, parts, strict=True)}

        history = fit(out, model, step_loss, len(frames), cfg.optim, thash, log=log, progress=progress,
                      stop_after=stop_after, drop_last=True)  # batch norm: no batch of one
        if len(history) < cfg.optim.epochs:
            return {"finished": False, "epochs_done": len(history), "history": history}
        pred = _fit_token_stats(model, frames)
        train_acc = {a: float((pred[:, i] == y[:, i]).float().mean()) for i, a in enumerate(ATTRIBUTES)}
        crop = "object" if has_boxes(bench) else "frame"  # what its windows were (`eval.images.segment_views`)
        rec = {"trainer": "perceiver", "config": asdict(cfg), "training_hash": thash, "windows": len(frames),
               "crop": crop, "frames_fingerprint": fp, "split": cfg.split, "benchmark": str(bench.root.resolve()),
               "data": data_record(bench, cfg.split), "init_data": [], "attributes": list(ATTRIBUTES),
               "vocab": vocab, "train_accuracy": train_acc,
               "parameters": sum(p.numel() for p in model.parameters()), "history": history,
               "seconds_per_epoch": sum(h["seconds"] for h in history) / len(history),
               "peak_rss_mb": peak_rss_mb(), "finished": True}
        with atomic_path(out / PERCEIVER_FILE) as tmp:
            torch.save({"state_dict": model.state_dict(), "net": asdict(cfg.net), "vocab": vocab,
                        "attributes": list(ATTRIBUTES), "crop": crop}, tmp)
        write_json(out / "config.json", {"model_type": MODEL_TYPE, "net": asdict(cfg.net),
                                         "token_dim": sum(len(v) for v in vocab)})
        write_json(out / TRAIN_RECORD, rec)  # last: its presence marks a finished perceiver
    log(f"perceiver written to {out} ({rec['parameters']:,} parameters, {rec['seconds_per_epoch']:.1f} s/epoch; "
        "training accuracy " + ", ".join(f"{a} {100 * v:.0f}%" for a, v in train_acc.items()) + ")")
    return rec


def is_perceiver(model: str | Path) -> bool:
    """``model`` is a perceiver directory (it holds `PERCEIVER_FILE`)."""
    return (Path(model) / PERCEIVER_FILE).is_file()


def load_perceiver(model_dir: str | Path) -> PerceiverNet:
    """The finished perceiver of ``model_dir`` in eval mode (`InputError` when there is none)."""
    d = Path(model_dir)
    if read_record(d) is None or not is_perceiver(d):
        raise InputError(f"{d}: no finished perceiver (no {PERCEIVER_FILE} and {TRAIN_RECORD})",
                         fix="train it: `python -m retrieval encoder perceiver --data WORLD --out DIR`")
    st = torch.load(d / PERCEIVER_FILE, map_location="cpu", weights_only=False)
    net = NetConfig(**{**st["net"], "channels": tuple(st["net"]["channels"])})
    model = PerceiverNet(net, [len(v) for v in st["vocab"]])
    model.load_state_dict(st["state_dict"])
    model.net_config, model.vocab, model.crop = net, st["vocab"], st.get("crop", "object")
    return model.eval()


@torch.no_grad()
def tokens_of(model: PerceiverNet, frames: torch.Tensor) -> torch.Tensor:
    """``(n, d)`` tokens of ``(n, 3, H, W)`` uint8 windows (at the perceiver's size, `load_frames`)."""
    return torch.cat([model.token(x) for x in _batches(frames)]) if len(frames) else torch.zeros(
        (0, model.token_mean.numel()))
