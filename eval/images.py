"""Frames as the visual spaces see them: a whole frame, or the window around one object.

A segment (a prefix frame) is about one object; on a frame that shows several, an encoder that sees the whole frame
gives every object's segment the same vector. Where the benchmark records the object's box (``Segment.box``,
``Query.prefix_boxes``: ``[x0, y0, x1, y1]`` in pixels of the frame), a visual space encodes the **object window**:
the box's centre, widened to at least `CONTEXT` times the box and at least `MIN_FRACTION` of the frame in each
direction (keeping the frame's aspect ratio), shifted to lie inside the frame. At 160x120 that is the 64x48 window of
the synthetic benchmark's ``pixels`` space.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

CONTEXT = 2.0
"""The window is at least this many times the object's box (context around the object)."""
MIN_FRACTION = 0.4
"""The window is at least this fraction of the frame's width and height."""

Box = Sequence[float]


def object_window(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """Integer ``(left, top, right, bottom)`` of the object window of ``box`` in a ``width`` x ``height`` frame."""
    x0, y0, x1, y1 = (float(v) for v in box)
    cx, cy = 0.5 * (x0 + x1), 0.5 * (y0 + y1)
    aspect = width / height
    w = max(CONTEXT * (x1 - x0), CONTEXT * (y1 - y0) * aspect, MIN_FRACTION * width)
    w = min(w, float(width))
    h = min(w / aspect, float(height))
    left = min(max(cx - w / 2, 0.0), width - w)
    top = min(max(cy - h / 2, 0.0), height - h)
    return int(round(left)), int(round(top)), int(round(left + w)), int(round(top + h))


def load_view(path: str | os.PathLike, box: Box | None = None):
    """The RGB image of a frame, cropped to the object window of ``box`` when one is given (PIL image)."""
    from PIL import Image

    with Image.open(Path(path)) as im:
        im = im.convert("RGB")
    if box is None:
        return im
    return im.crop(object_window(box, im.width, im.height))


View = tuple[str, tuple[float, ...] | None]
"""What a visual space sees of one segment or prefix frame: ``(frame path relative to the benchmark, box or None)``."""


def _box(b) -> tuple[float, ...] | None:
    return None if b is None else tuple(float(v) for v in b)


def segment_views(bench, crop: bool = True) -> list[View]:
    """One `View` per corpus segment (corpus order); boxes only when ``crop`` and the benchmark records them."""
    frames = bench.corpus_ds["frame"][:]
    boxes = bench.corpus_ds["box"][:] if crop and "box" in bench.corpus_ds.column_names else [None] * len(frames)
    return [(f, _box(b)) for f, b in zip(frames, boxes, strict=True)]


def prefix_views(bench, crop: bool = True) -> tuple[list[str], list[list[View]]]:
    """Unique prefix ids (first-seen order) and the views of their frames (from the first query of each prefix)."""
    q = bench.queries_ds
    pids, frames = q["prefix_id"][:], q["prefix_frames"][:]
    boxes = q["prefix_boxes"][:] if crop and "prefix_boxes" in q.column_names else [None] * len(pids)
    seen: dict[str, list[View]] = {}
    for p, fr, bx in zip(pids, frames, boxes, strict=True):
        if p not in seen:
            seen[p] = [(f, _box(bx[i]) if bx is not None else None) for i, f in enumerate(fr)]
    return list(seen), list(seen.values())


def has_boxes(bench) -> bool:
    """True when the benchmark records object boxes for its segments (every one)."""
    if "box" not in bench.corpus_ds.column_names:
        return False
    return all(b is not None for b in bench.corpus_ds["box"][:])
