"""``python -m retrieval encode``: compute a space's feature tables for a benchmark directory.

- semantic (a sentence-transformers model): table ``states`` = the canonical state strings, ``(n_states, d)``;
- visual (an image encoder): table ``corpus`` = each segment's middle frame, ``(n_corpus, d)``, and table
  ``prefixes`` = the 8 prefix frames of each prefix, ``(n_prefixes, 8, d)``. With ``crop="object"`` (the default
  ``"auto"`` picks it when the benchmark records object boxes) each image is the object window of the segment's
  (the prefix's) object (`eval.images`), so objects sharing a frame get their own vectors; ``"frame"`` encodes
  whole frames.

Work is done in chunks of ``chunk_size`` rows (items, or prefixes). Each finished chunk is saved under
``features/<space>/.partial/<table>/`` next to a fingerprint of the job (model, table ids), so a crashed or killed
job resumes from the last finished chunk; a job with a different fingerprint starts over. When every chunk of a
table is done the table is assembled atomically (`eval.features.write_table`), the partial folder removed, and
``meta.json`` plus ``encode_config.json`` (the resolved config) written last.

Sharding over nodes (``--shard i/n``): shard ``i`` computes the chunks whose index ``j`` has ``j % n == i`` and stops
without assembling; once every shard is done, one plain run (no ``--shard``) finds every chunk on disk, computes
nothing and assembles the tables. Shards share the partial folder, so the benchmark directory must be on a shared
filesystem.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from eval.benchmark import Benchmark
from eval.errors import InputError, OutputRefused
from eval.features import space_dir, write_meta, write_table
from eval.images import load_view, prefix_views, segment_views
from eval.io import FormatError, atomic_path, write_json
from eval.outputs import check_output_dir, write_marker
from eval.schema import PREFIX_FRAMES
from retrieval.encoders import (
    TEXT_TOWER_MODEL_TYPES,
    ImageEncoder,
    TextEncoder,
    is_vision_model,
    pick_device,
    resolve_model,
    show_progress,
)
from retrieval.shard import parse_shard
from retrieval.towers import TEXT_TOWER_FILE

#: Output kind of a space directory written by encode (`eval.outputs`).
OUTPUT_KIND = "retrieval encode"


@dataclass
class EncodeConfig:
    """Resolved config of one encode job (written to ``features/<space>/encode_config.json``)."""

    data: str
    space: str
    model: str
    kind: str = "auto"  # "semantic" | "visual" | "auto" (from the model's config)
    tables: tuple[str, ...] = ()  # empty: all tables of the kind
    batch_size: int = 64
    chunk_size: int = 4096
    device: str | None = None
    query_prompt: str | None = None
    shard: tuple[int, int] | None = None  # (i, n): compute chunk j only when j % n == i; assemble nothing
    overwrite: bool = False  # replace a space directory that encode did not write (eval.outputs)
    crop: str = "auto"  # "object" | "frame" | "auto" (object when the benchmark records boxes); visual spaces only

    def resolved(self, bench: Benchmark | None = None) -> EncodeConfig:
        from eval.images import has_boxes

        crop = self.crop
        if crop not in ("auto", "object", "frame"):
            raise InputError(f"--crop must be object, frame or auto, got {crop!r}")
        if crop == "auto":
            crop = "object" if bench is not None and has_boxes(bench) else "frame"
        kind = self.kind
        if kind == "auto":
            kind = "visual" if is_vision_model(self.model) else "semantic"
        if kind not in ("semantic", "visual"):
            raise InputError(f"--kind must be semantic, visual or auto, got {kind!r}")
        default = ("states",) if kind == "semantic" else ("corpus", "prefixes")
        tables = tuple(self.tables) or default
        bad = [t for t in tables if t not in default]
        if bad:
            raise InputError(f"a {kind} space has tables {default}; cannot encode {bad}")
        return EncodeConfig(**{**asdict(self), "kind": kind, "tables": tables, "device": pick_device(self.device),
                               "crop": crop})


def _fingerprint(cfg: EncodeConfig, table: str, ids: list[str]) -> str:
    h = hashlib.sha256(json.dumps([cfg.model, cfg.kind, table, cfg.query_prompt, cfg.chunk_size, cfg.crop]).encode())
    for x in ids:
        h.update(x.encode() + b"\n")
    return h.hexdigest()[:16]


def _encode_chunked(root: Path, space: str, table: str, ids: list[str], fingerprint: str, chunk_size: int,
                    encode: Callable[[int, int], np.ndarray], progress: bool,
                    shard: tuple[int, int] | None = None) -> np.ndarray | None:
    """Run ``encode(start, stop)`` over ``ids`` chunk by chunk, keeping finished chunks on disk; return all rows.

    With ``shard=(i, n)`` only chunks ``j % n == i`` are computed and nothing is returned (see the module docstring).
    """
    part = space_dir(root, space) / ".partial" / table
    fp_file = part / "fingerprint.txt"
    if part.exists() and (not fp_file.exists() or fp_file.read_bytes().strip() != fingerprint.encode()):
        shutil.rmtree(part)  # a different job (model, ids, chunking) left these: start over
    part.mkdir(parents=True, exist_ok=True)
    fp_file.write_text(fingerprint + "\n")
    starts = list(range(0, len(ids), chunk_size))
    if shard is not None:
        starts = [s for j, s in enumerate(starts) if j % shard[1] == shard[0]]
    done = [s for s in starts if (part / f"{s:09d}.npy").exists()]
    chunks: list[np.ndarray] = []
    total = sum(min(chunk_size, len(ids) - s) for s in starts)
    desc = f"{space}/{table}" + (f" shard {shard[0]}/{shard[1]}" if shard else "")
    with tqdm(total=total, desc=desc, unit="row", disable=not progress) as bar:
        bar.update(sum(min(chunk_size, len(ids) - s) for s in done))
        for s in starts:
            f = part / f"{s:09d}.npy"
            if f.exists():
                if shard is None:
                    chunks.append(np.load(f))
                continue
            arr = np.ascontiguousarray(encode(s, min(s + chunk_size, len(ids))), dtype=np.float32)
            with atomic_path(f) as tmp, open(tmp, "wb") as fh:
                np.save(fh, arr)
            if shard is None:
                chunks.append(arr)
            bar.update(arr.shape[0])
    if shard is not None:
        return None
    return np.concatenate(chunks) if chunks else np.zeros((0,), np.float32)


def _prefix_frames(bench: Benchmark, crop: bool = False) -> tuple[list[str], list[list[tuple]]]:
    """Unique prefix ids (first-seen order) and the views (frame path, box) of their frames, from the queries."""
    pids, views = prefix_views(bench, crop)
    for p, fr in zip(pids, views, strict=True):
        if len(fr) != PREFIX_FRAMES:
            line = bench.queries_ds["prefix_id"][:].index(p) + 1
            raise FormatError(bench.root / "queries.jsonl", f"expected {PREFIX_FRAMES} prefix frames, got {len(fr)}",
                              line=line, field="prefix_frames")
    return pids, views


def _written_by_encode(d: Path) -> bool:
    """A space folder without the output marker that encode wrote all the same: it holds encode's config, or an
    interrupted job's chunks."""
    return (d / "encode_config.json").exists() or (d / ".partial").is_dir()


def _check_space_target(root: Path, cfg: EncodeConfig) -> Path:
    """``features/<space>/`` may be written: a new space, one encode wrote (its marker is written when the tables
    are assembled), or ``cfg.overwrite``; never a link to another benchmark's space (encode would write through
    it)."""
    d = space_dir(root, cfg.space)
    if d.exists() and not d.resolve().is_relative_to(root.resolve()):
        raise OutputRefused(f"{d} links to {d.resolve()}, outside the benchmark; encode never writes through a link",
                            fix="encode into a new --space name")
    return check_output_dir(d, OUTPUT_KIND, overwrite=cfg.overwrite, recognise=_written_by_encode, option="--space")


def encode_space(cfg: EncodeConfig, *, progress: bool | None = None) -> Path:
    """Encode the tables of one space (see the module docstring); returns the space directory. A sharded job
    (``cfg.shard``) only leaves its chunks in the partial folder. ``progress``: a bar per chunk of rows and one per
    batch (None: when stderr is a terminal, `retrieval.encoders.show_progress`)."""
    progress = show_progress(progress)
    from retrieval.perceiver import is_perceiver

    if is_perceiver(resolve_model(cfg.model)):  # a supervised perceiver writes a prefix space
        return _encode_perceiver(cfg, progress)
    bench = Benchmark.load(cfg.data)
    cfg = cfg.resolved(bench)
    root = bench.root
    _check_space_target(root, cfg)  # refuse before loading a model
    extra: dict = {}
    shard = parse_shard(cfg.shard) if cfg.shard is not None else None

    def write(table: str, ids: list[str], arr: np.ndarray | None, shape: tuple[int, ...]) -> None:
        if arr is not None:
            write_table(root, cfg.space, table, ids, arr.reshape(shape))
    if cfg.kind == "semantic":
        enc = TextEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size, query_prompt=cfg.query_prompt)
        texts = bench.states_ds["text"][:]
        ids = bench.state_ids
        arr = _encode_chunked(root, cfg.space, "states", ids, _fingerprint(cfg, "states", ids), cfg.chunk_size,
                              lambda s, e: enc.encode_items(texts[s:e], progress=progress), progress, shard)
        write("states", ids, arr, (len(ids), enc.dim))
        dim, extra = enc.dim, {"encoder": "sentence-transformers", "query_prompt": cfg.query_prompt}
    else:
        enc = ImageEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size)
        dim = enc.dim
        crop = cfg.crop == "object"

        def images(views):
            return [load_view(bench.path(f), b) for f, b in views]

        if "corpus" in cfg.tables:
            views = segment_views(bench, crop)
            ids = bench.corpus_ids
            arr = _encode_chunked(root, cfg.space, "corpus", ids, _fingerprint(cfg, "corpus", ids), cfg.chunk_size,
                                  lambda s, e: enc.encode_images(images(views[s:e]), progress=progress), progress,
                                  shard)
            write("corpus", ids, arr, (len(ids), dim))
        if "prefixes" in cfg.tables:
            _prefix_table(bench, cfg, crop, lambda views: enc.encode_images(images(views), progress=progress), dim,
                          progress, shard)
        has_text = enc.model_type in TEXT_TOWER_MODEL_TYPES
        extra = {"encoder": enc.model_type, "text_tower": has_text, "crop": cfg.crop}
        lit = Path(resolve_model(cfg.model)) / TEXT_TOWER_FILE
        if lit.exists():  # a LiT image tower (retrieval.lit): phrases go through its locked sentence model
            t = json.loads(lit.read_text(encoding="utf-8"))
            extra.update(text_tower=True, text_model=t["text_model"], text_encoder=t["text_encoder"])
    if shard is not None:
        return space_dir(root, cfg.space)  # the plain run after all shards assembles
    return _finish(root, cfg, dim, **extra)


def _prefix_table(bench: Benchmark, cfg: EncodeConfig, crop: bool, embed: Callable[[list], np.ndarray], dim: int,
                  progress: bool, shard: tuple[int, int] | None) -> None:
    """The ``prefixes`` table: ``embed(views) -> (n, dim)`` over the 8 frames of each prefix, chunk by chunk
    (`_encode_chunked`); assembled unless ``shard``."""
    pids, pviews = _prefix_frames(bench, crop)
    flat = [v for fr in pviews for v in fr]
    step = max(1, cfg.chunk_size // PREFIX_FRAMES)

    def chunk(s: int, e: int) -> np.ndarray:
        return embed(flat[s * PREFIX_FRAMES:e * PREFIX_FRAMES]).reshape(e - s, PREFIX_FRAMES, dim)

    arr = _encode_chunked(bench.root, cfg.space, "prefixes", pids, _fingerprint(cfg, "prefixes", pids), step, chunk,
                          progress, shard)
    if arr is not None:
        write_table(bench.root, cfg.space, "prefixes", pids, arr.reshape(len(pids), PREFIX_FRAMES, dim))


def _finish(root: Path, cfg: EncodeConfig, dim: int, **meta) -> Path:
    """Drop the job's finished chunks, then write its config, ``meta.json`` and the output marker (last)."""
    d = space_dir(root, cfg.space)
    shutil.rmtree(d / ".partial", ignore_errors=True)  # encode's own chunks (`_encode_chunked`)
    write_json(d / "encode_config.json", asdict(cfg))
    write_meta(root, cfg.space, kind=cfg.kind, dim=dim, model=cfg.model, **meta)
    write_marker(d, OUTPUT_KIND)
    return d


def _encode_perceiver(cfg: EncodeConfig, progress: bool) -> Path:
    """``cfg.model`` is a supervised perceiver (`retrieval.perceiver`): the token of every prefix frame (the object
    window where the benchmark records boxes) into the ``prefix`` space ``cfg.space`` (``normalized: false``),
    chunk by chunk like every encode job. Refuses a perceiver that read a video of the benchmark
    (`retrieval.towers.check_disjoint`): it learned from labels, so on its own videos it would be told the answers."""
    from dataclasses import replace

    from eval.images import has_boxes
    from retrieval.perceiver import MODEL_TYPE, load_perceiver, tokens_of
    from retrieval.perception import ATTRIBUTES
    from retrieval.towers import check_disjoint, load_frames

    bench = Benchmark.load(cfg.data)
    if cfg.tables and tuple(cfg.tables) != ("prefixes",):
        raise InputError(f"a perceiver writes a prefix space (table prefixes); cannot encode {list(cfg.tables)}")
    root = bench.root
    _check_space_target(root, replace(cfg, kind="prefix"))
    check_disjoint(cfg.model, bench)
    model = load_perceiver(cfg.model)
    crop = model.crop if cfg.crop == "auto" else cfg.crop  # the windows it was trained on
    if crop != model.crop:
        raise InputError(f"{cfg.model}: the perceiver was trained on {model.crop} windows; --crop {crop} would show it "
                         "other images", fix="leave --crop at auto")
    if crop == "object" and not has_boxes(bench):
        raise InputError(f"{root}: the corpus records no object box for some segments, and the perceiver reads object "
                         "windows", fix="encode a build with boxes (`python -m retrieval synth` records them)")
    cfg = replace(cfg, kind="prefix", tables=("prefixes",), crop=crop)
    size = (model.net_config.image_height, model.net_config.image_width)
    dim = int(model.token_mean.numel())
    shard = parse_shard(cfg.shard) if cfg.shard is not None else None
    _prefix_table(bench, cfg, crop == "object",
                  lambda views: tokens_of(model, load_frames(root, views, size, progress=False)).numpy(), dim,
                  progress, shard)
    if shard is not None:
        return space_dir(root, cfg.space)
    return _finish(root, cfg, dim, normalized=False, encoder=MODEL_TYPE, crop=crop, attributes=list(ATTRIBUTES),
                   vocab=model.vocab)

