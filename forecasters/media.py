"""Loading prefix frames (and other images) once and sharing them across the queries of a prefix; which frames go in.

`FrameCache` maps an image path to one `ImagePart` (RGB, downscaled to at most ``max_pixels`` pixels when given,
aspect ratio kept, bicubic: the pixel policy of `forecasters.presets`), in an LRU of ``size`` images. The runner sorts queries by prefix, so the 8 frames of a prefix
are read and (for the ``openai`` backend) base64-encoded once, however many questions ask about that prefix.
Which frames go in: `eval.frames.FrameSelection` (``--frames``), shared with LFTR's prefix.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from eval.frames import FrameSelection, subsample  # noqa: F401  (re-exported: the runner's spelling)
from forecasters.backends.base import ImagePart


class FrameCache:
    """LRU cache of loaded images: ``get(path) -> ImagePart`` (the same object for the same path while cached)."""

    def __init__(self, root: str | os.PathLike, *, max_pixels: int | None = None, size: int = 256):
        self.root = Path(root)
        self.max_pixels = max_pixels
        self.size = size
        self._cache: OrderedDict[str, ImagePart] = OrderedDict()
        self.loads = 0  # images read from disk (for tests and the summary)
        self.largest: tuple[int, int] | None = None  # (width, height) of the largest frame handed out

    def path(self, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else self.root / p

    def _load(self, rel: str) -> ImagePart:
        from PIL import Image

        p = self.path(rel)
        with Image.open(p) as im:
            img = im.convert("RGB")
        if self.max_pixels and img.width * img.height > self.max_pixels:
            s = math.sqrt(self.max_pixels / (img.width * img.height))
            img = img.resize((max(1, int(img.width * s)), max(1, int(img.height * s))), Image.Resampling.BICUBIC)
        self.loads += 1
        if self.largest is None or img.width * img.height > self.largest[0] * self.largest[1]:
            self.largest = (img.width, img.height)
        return ImagePart(img, source=str(rel))

    def get(self, rel: str) -> ImagePart:
        part = self._cache.get(rel)
        if part is not None:
            self._cache.move_to_end(rel)
            return part
        part = self._load(rel)
        self._cache[rel] = part
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return part

    def get_many(self, rels: Sequence[str]) -> list[ImagePart]:
        return [self.get(r) for r in rels]
