"""Image towers learned on a benchmark's own frames (the synthetic world's DINOv2 / CLIP roles), and what they share.

A tower is a small transformers ``ViTModel`` (``model_type`` ``vit``: patch embedding, pre-norm attention blocks with
``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj``, a final LayerNorm) whose ``pooler_output`` is a *linear* map of the
CLS token (``pooler_act="linear"``) of width ``out_dim``, plus a ``ViTImageProcessor`` that resizes a frame to
``(image_height, image_width)`` and normalises it to ``[-1, 1]``. Saved with ``save_pretrained``, a tower directory
loads like any hub encoder (`retrieval.encoders.ImageEncoder`: ``AutoModel`` + ``AutoImageProcessor``,
``pooler_output`` L2-normalised), so ``python -m retrieval encode --space NAME --model DIR`` embeds corpus frames
and prefix frames with it.

Training data are the frames of one split of a build (`train_frames`): every corpus middle frame and prefix frame
of a video whose queries are in ``split``, or of every video with ``split="all"``. The toolkit's towers play the
roles of DINOv2 and CLIP, which never saw PSR's corpus, so they are **pretrained on a world of their own**: a
simulator-truth build of another seed (``python -m eval synth --out WORLD --seed S'``, `pretraining_world_seed`),
its frames (``split: all`` or one of its splits; the demo's configs read its train split), never on the
benchmark they encode. The tower's record names that data (`data_record`: build, seed, split and the video ids it
read) and `check_disjoint` refuses a tower that read any video of the benchmark it is about to encode. Frames are decoded once into a ``uint8`` tensor at ``cache_scale`` times the
model resolution (`load_frames`), so random crops keep some detail.

Config helpers (`load_dataclass`) give every trainer the toolkit's argument convention: dataclass defaults <
YAML files in order < ``key=value`` overrides (values parsed as YAML scalars; unknown keys raise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import yaml

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.images import View, load_view, prefix_views, segment_views
from eval.io import read_yaml
from retrieval.encoders import PRECISIONS, autocast, resolve_precision
from retrieval.seeding import seed_everything

#: File in a tower directory that records what trained it (trainer, config, data fingerprint, train info).
TRAIN_RECORD = "psr_tower.json"
#: File in a LiT tower directory naming the locked text model whose space the image tower maps into.
TEXT_TOWER_FILE = "psr_text_tower.json"

T = TypeVar("T")


@dataclass
class TowerConfig:
    """Architecture of an image tower (a small ViT) and its input resolution."""

    image_height: int = 48
    image_width: int = 64
    patch_size: int = 8
    hidden_size: int = 96
    layers: int = 3
    heads: int = 3
    mlp_ratio: int = 2
    out_dim: int = 96  # width of pooler_output (the embedding a space stores)


def build_vit(cfg: TowerConfig):
    """A randomly initialised ``ViTModel`` (see the module docstring)."""
    from transformers import ViTConfig, ViTModel

    if cfg.image_height % cfg.patch_size or cfg.image_width % cfg.patch_size:
        raise InputError(f"image size {cfg.image_height}x{cfg.image_width} is not a multiple of patch {cfg.patch_size}")
    vc = ViTConfig(image_size=(cfg.image_height, cfg.image_width), patch_size=cfg.patch_size,
                   hidden_size=cfg.hidden_size, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                   intermediate_size=cfg.mlp_ratio * cfg.hidden_size, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0, pooler_output_size=cfg.out_dim, pooler_act="linear")
    return ViTModel(vc, add_pooling_layer=True)


def image_processor(cfg: TowerConfig):
    """The processor saved with a tower: resize to the tower's size (bilinear), scale to [0, 1], normalise to
    [-1, 1] (mean 0.5, std 0.5 per channel)."""
    try:
        from transformers import ViTImageProcessorPil as Proc  # the PIL backend (no torchvision here)
    except ImportError:  # pragma: no cover - a transformers without the PIL-backend class
        from transformers import ViTImageProcessor as Proc
    return Proc(do_resize=True, size={"height": cfg.image_height, "width": cfg.image_width}, do_rescale=True,
                do_normalize=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def normalize_pixels(x: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` float in [0, 1] -> the processor's normalisation ([-1, 1])."""
    return (x - 0.5) / 0.5


# ---------------------------------------------------------------------------------------------------------------
# training frames and what they came from
# ---------------------------------------------------------------------------------------------------------------
#: ``split`` value that selects every video of a build (a tower's own pretraining world), not one query split.
ALL = "all"
#: A tower's pretraining world is simulated with the benchmark's seed plus this offset (`pretraining_world_seed`);
#: distinct from the canonicalization encoder's world (`retrieval.synth.ENCODER_SEED_OFFSET`).
WORLD_SEED_OFFSET = 200_003


def pretraining_world_seed(benchmark_seed: int) -> int:
    """Seed of the simulated world a benchmark's towers pretrain on: ``benchmark_seed + WORLD_SEED_OFFSET`` (video
    ids hash the seed, so the world's videos are other videos than the benchmark's)."""
    return int(benchmark_seed) + WORLD_SEED_OFFSET


def split_videos(bench: Benchmark, split: str) -> set[str]:
    """Video ids whose queries are in ``split`` (splits are video-disjoint); ``split="all"``: every video of the
    build (corpus and queries)."""
    if split == ALL:
        return set(bench.corpus_ds["video_id"][:]) | set(bench.queries_ds["video_id"][:])
    vids = np.asarray(bench.queries_ds["video_id"][:])
    splits = np.asarray(bench.queries_ds["split"][:])
    return set(vids[splits == split].tolist())


def train_frames(bench: Benchmark, split: str = "train") -> list[View]:
    """Sorted unique views (frame path relative to the benchmark, object box or None; `eval.images`) of the videos
    of ``split`` (``"all"``: every video): corpus segments and prefix frames, each as the visual spaces see it (the
    object window where the benchmark records boxes). Paths and boxes only: no state, text or label leaves this
    function."""
    vids = split_videos(bench, split)
    seg_vid = bench.corpus_ds["video_id"][:]
    out = {v for vid, v in zip(seg_vid, segment_views(bench), strict=True) if vid in vids}
    q_vid = dict(zip(bench.queries_ds["prefix_id"][:], bench.queries_ds["video_id"][:], strict=True))
    pids, views = prefix_views(bench)
    out.update(v for p, fr in zip(pids, views, strict=True) if q_vid[p] in vids for v in fr)
    return sorted(out, key=lambda v: (v[0], v[1] or ()))


def load_frames(root: Path, views: Sequence, size: tuple[int, int], *, progress: bool = True) -> torch.Tensor:
    """``(n, 3, H, W)`` uint8: each view decoded as RGB (cropped to its object window when it has a box) and resized
    to ``size = (H, W)`` (bilinear). A view is a `eval.images.View` or a bare frame path."""
    from PIL import Image
    from tqdm.auto import tqdm

    h, w = size
    out = torch.empty((len(views), 3, h, w), dtype=torch.uint8)
    for i, v in enumerate(tqdm(views, desc="frames", unit="frame", disable=not progress)):
        path, box = (v, None) if isinstance(v, str) else v
        arr = np.asarray(load_view(root / path, box).resize((w, h), Image.Resampling.BILINEAR))
        out[i] = torch.from_numpy(arr.copy()).permute(2, 0, 1)
    return out


def data_record(bench: Benchmark, split: str) -> dict:
    """What a tower trains on, for its record: the build (path, name, seed, preset), the split, and the sorted ids of
    the split's videos (a superset of those a frame subset reads), which `check_disjoint` tests."""
    extra = bench.manifest.extra or {}
    vids = sorted(split_videos(bench, split))
    return {"root": str(bench.root.resolve()), "name": bench.manifest.name, "seed": extra.get("seed"),
            "preset": extra.get("preset"), "split": split, "n_videos": len(vids), "video_ids": vids}


def tower_videos(model_dir: str | os.PathLike) -> set[str]:
    """Every video whose frames shaped the tower in ``model_dir``: its own training data and, recursively, the
    data of the tower it was initialised from (``init_data`` in the record). `InputError` when the directory holds
    no finished tower or its record does not list its videos (retrain such a tower)."""
    from eval.errors import InputError

    rec = read_record(model_dir)
    if rec is None:
        raise InputError(f"{model_dir}: no finished tower (no {TRAIN_RECORD} beside config.json)")
    sources = [rec.get("data"), *rec.get("init_data", [])]
    if any(not isinstance(d, dict) or "video_ids" not in d for d in sources):
        raise InputError(f"{Path(model_dir) / TRAIN_RECORD}: the record does not list the videos the tower read, so "
                         "its disjointness from a benchmark cannot be checked",
                         fix="retrain the tower with this toolkit (`python -m retrieval encoder ssl|lit`)")
    return {v for d in sources for v in d["video_ids"]}


def check_disjoint(model_dir: str | os.PathLike, bench: Benchmark) -> dict:
    """Refuse (`InputError`) a tower that read any video of ``bench`` (the towers stand in for encoders that never
    saw the benchmark's corpus); returns ``{"tower_videos", "benchmark_videos", "shared": 0}`` when disjoint."""
    from eval.errors import InputError

    seen, have = tower_videos(model_dir), split_videos(bench, ALL)
    shared = sorted(seen & have)
    if shared:
        raise InputError(f"{model_dir}: the tower was trained on {len(shared)} of the {len(have)} videos of the "
                         f"benchmark {bench.root} (e.g. {shared[0]}); a frozen encoder must never have seen the "
                         "corpus it encodes", fix="pretrain it on a world of another seed (`python -m eval synth "
                         "--seed S' --out WORLD`, then `encoder ssl|lit --data WORLD --set split=all`)")
    return {"tower_videos": len(seen), "benchmark_videos": len(have), "shared": 0}


def frames_fingerprint(views: Sequence, root: Path) -> str:
    """SHA-1 over the views (frame path, box) and their files' sizes (a changed or rebuilt benchmark changes it)."""
    h = hashlib.sha1()
    for v in views:
        path, box = (v, None) if isinstance(v, str) else v
        h.update(path.encode() + b"\0" + repr(box).encode() + b"\0" + str(os.path.getsize(root / path)).encode()
                 + b"\n")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# config convention
# ---------------------------------------------------------------------------------------------------------------
def load_dataclass(cls: type[T], paths: Sequence[str | os.PathLike] = (), overrides: Sequence[str] = (),
                   **fixed: Any) -> T:
    """``cls()`` <- each YAML file in order <- ``fixed`` (non-None) <- ``key=value`` overrides; unknown keys raise
    `ValueError` naming the source. Nested dataclass fields take a mapping (YAML) or ``field.key=value``."""
    d = asdict(cls())
    for p in paths:
        y = read_yaml(p)
        if not isinstance(y, dict):
            raise InputError(f"{p}: expected a mapping of config keys, got {type(y).__name__}")
        _merge(cls, d, y, str(p))
    _merge(cls, d, {k: v for k, v in fixed.items() if v is not None}, "<options>")
    for o in overrides:
        if "=" not in o:
            raise InputError(f"override {o!r} is not of the form key=value")
        k, v = (s.strip() for s in o.split("=", 1))
        node: Any = v
        for part in reversed(k.split(".")[1:]):
            node = {part: node}
        _merge(cls, d, {k.split(".")[0]: node}, f"--set {o}")
    return from_dict(cls, d)


def _merge(cls, d: dict, new: dict, source: str) -> None:
    known = {f.name: f for f in fields(cls)}
    for k, v in new.items():
        if k not in known:
            raise InputError(f"{source}: unknown {cls.__name__} key {k!r}; known keys: {sorted(known)}")
        sub = _dataclass_type(cls, known[k])
        if sub is not None:
            if not isinstance(v, dict):
                raise InputError(f"{source}: {k} takes a mapping of {sub.__name__} keys")
            _merge(sub, d[k], v, source)
        else:
            d[k] = _coerce(v, known[k].type, f"{source}: {k}")


def _coerce(v: Any, typ: str, where: str) -> Any:
    """A value of a config field of type ``typ`` (a string annotation): YAML scalars for strings given to non-string
    fields, and numbers as the field's number type ("3e-3" is a string to YAML 1.1)."""
    if isinstance(v, str) and typ not in ("str", "str | None"):
        v = yaml.safe_load(v)
    try:
        if typ == "float" and not isinstance(v, bool):
            return float(v)
        if typ == "int" and not isinstance(v, bool):
            if float(v) != int(float(v)):
                raise ValueError
            return int(float(v))
    except (TypeError, ValueError):
        raise InputError(f"{where}: expected a {typ}, got {v!r}") from None
    if typ.startswith("tuple") and isinstance(v, list):
        return tuple(v)
    return v


def _dataclass_type(cls, f) -> type | None:
    default = cls.__dataclass_fields__[f.name].default_factory
    if default is not dataclasses.MISSING:
        obj = default()
        if dataclasses.is_dataclass(obj):
            return type(obj)
    return None


def from_dict(cls: type[T], d: dict[str, Any]) -> T:
    kw = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        sub = _dataclass_type(cls, f)
        kw[f.name] = from_dict(sub, d[f.name]) if sub is not None and isinstance(d[f.name], dict) else d[f.name]
    return cls(**kw)


def config_hash(cfg: Any, *extra: str) -> str:
    return hashlib.sha256(json.dumps([asdict(cfg), *extra], sort_keys=True).encode()).hexdigest()[:16]


def read_record(model_dir: str | os.PathLike) -> dict | None:
    """The training record of a tower directory, or None when the directory holds no finished tower."""
    p = Path(model_dir) / TRAIN_RECORD
    if not p.exists() or not (Path(model_dir) / "config.json").exists():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------------------------
# the shared training loop (resumable) and the tower directory
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class OptimConfig:
    """Optimisation of a tower trainer: AdamW with a linear warm-up then cosine decay per step."""

    epochs: int = 10
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 0  # torch CPU threads during the job (0 = the CPUs this process may use, eval.threads)
    #: fp32 | bf16 | auto: the training step's precision (`retrieval.encoders.PRECISIONS`; bf16 is autocast, the
    #: weights stay float32); encoding always runs in float32
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InputError(f"optim.precision must be one of {PRECISIONS}, got {self.precision!r}")


def check_output_dir(out: Path) -> None:
    """Refuse to write a tower into a non-empty folder that is not one of ours (never overwrite a user's files)."""
    from eval.errors import OutputRefused

    if out.exists() and any(out.iterdir()) and not (out / "train").is_dir() and not (out / TRAIN_RECORD).exists():
        raise OutputRefused(f"{out} is a non-empty folder that holds no tower written by this toolkit",
                            fix="give an empty or new --out")


def finished_or_prepare(out: Path, training_hash: str, what: str, log=print) -> dict | None:
    """The record of a finished training of ``training_hash`` in ``out`` (logged: reusing ``what``), or None once
    ``out`` is ready for a new one: a foreign non-empty folder is refused (`check_output_dir`), the folder is created
    and the record of a training of another config is removed (the tower in it is being replaced)."""
    rec = read_record(out)
    if rec is not None and rec.get("training_hash") == training_hash:
        log(f"reusing {what} in {out}")
        return rec
    check_output_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / TRAIN_RECORD).unlink(missing_ok=True)
    return None


def _lr_lambda(total: int, warmup: int):
    import math

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        t = min(step - warmup, total - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * t))

    return f


def fit(out: Path, module: torch.nn.Module, step_loss, n_items: int, opt_cfg: OptimConfig, training_hash: str, *,
        log=print, progress: bool = True, stop_after: int | None = None, drop_last: bool = False) -> list[dict]:
    """Minimise ``step_loss(idx) -> (loss, parts)`` over shuffled batches of ``range(n_items)`` for
    ``opt_cfg.epochs`` epochs, training every parameter of ``module`` that requires grad (``drop_last``: skip each
    epoch's last, partial batch, for objectives with batch statistics).

    Resumable: ``out/train/last.pt`` (module, optimiser, schedule, RNG states, history) is rewritten atomically each
    epoch and ``out/train/history.jsonl`` logs loss terms, wall and CPU seconds (all threads), peak RSS and the load
    average per epoch; a run with another
    ``training_hash`` refuses to resume there. Randomness (shuffling, augmentations) comes from torch's global RNG,
    seeded by ``opt_cfg.seed``. Returns the history (one dict per epoch).
    """
    import time

    from tqdm.auto import tqdm

    from eval.io import atomic_path

    tdir = out / "train"
    tdir.mkdir(parents=True, exist_ok=True)
    last = tdir / "last.pt"
    params = [p for p in module.parameters() if p.requires_grad]
    device = params[0].device.type if params else "cpu"
    precision = resolve_precision(opt_cfg.precision, device)
    opt = torch.optim.AdamW(params, lr=opt_cfg.lr, weight_decay=opt_cfg.weight_decay)
    steps = n_items // opt_cfg.batch_size if drop_last and n_items >= opt_cfg.batch_size else \
        -(-n_items // opt_cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(opt_cfg.epochs * steps,
                                                              int(opt_cfg.warmup_epochs * steps)))
    seed_everything(opt_cfg.seed)
    history: list[dict] = []
    start = 0
    if last.exists():
        st = torch.load(last, map_location="cpu", weights_only=False)
        if st["training_hash"] != training_hash:
            raise InputError(f"{tdir} holds a run with a different training config; use another --out")
        module.load_state_dict(st["module"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        torch.set_rng_state(st["rng"])
        history, start = st["history"], st["epoch"] + 1
        log(f"resumed from {last} after epoch {start}")
    end = opt_cfg.epochs if stop_after is None else min(opt_cfg.epochs, start + stop_after)
    for epoch in range(start, end):
        t0, c0 = time.time(), time.process_time()
        module.train()
        perm = torch.randperm(n_items)
        sums: dict[str, float] = {}
        bar = tqdm(range(0, steps * opt_cfg.batch_size, opt_cfg.batch_size), desc=f"epoch {epoch + 1}/{opt_cfg.epochs}",
                   unit="batch", disable=not progress, leave=False)
        for s in bar:
            with autocast(precision, device):
                loss, parts = step_loss(perm[s:s + opt_cfg.batch_size])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if opt_cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, opt_cfg.grad_clip)
            opt.step()
            sched.step()
            for k, v in {"loss": float(loss.detach()), **parts}.items():
                sums[k] = sums.get(k, 0.0) + v
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        rec = {"epoch": epoch + 1, **{k: v / steps for k, v in sums.items()}, "lr": sched.get_last_lr()[0],
               "seconds": time.time() - t0, "cpu_seconds": time.process_time() - c0, "peak_rss_mb": peak_rss_mb(),
               "load_avg": os.getloadavg()[0], "precision": precision}
        history.append(rec)
        log(f"epoch {epoch + 1}/{opt_cfg.epochs}: " + ", ".join(f"{k} {v:.4f}" for k, v in rec.items()
                                                               if k not in ("epoch", "lr", "precision")))
        with atomic_path(last) as tmp:
            torch.save({"module": module.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                        "rng": torch.get_rng_state(), "history": history, "epoch": epoch,
                        "training_hash": training_hash}, tmp)
        with atomic_path(tdir / "history.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(h) + "\n" for h in history)
    return history


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB; Linux ``ru_maxrss`` is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def save_tower(out: Path, model, cfg: TowerConfig, record: dict, extra_files: dict[str, dict] | None = None) -> None:
    """Write the tower (``save_pretrained`` of model and processor) into ``out``, then ``extra_files`` (JSON), then
    the training record last: its presence marks a finished tower."""
    import shutil
    import tempfile

    from eval.io import write_json

    stage = Path(tempfile.mkdtemp(prefix=".tower-", dir=out))
    try:
        model.save_pretrained(stage)
        image_processor(cfg).save_pretrained(stage)
        for name, obj in (extra_files or {}).items():
            write_json(stage / name, obj)
        for p in stage.iterdir():
            os.replace(p, out / p.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    write_json(out / TRAIN_RECORD, record)

