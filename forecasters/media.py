"""Loading prefix frames (and other images) once and sharing them across the queries of a prefix; which frames go in.

`FrameCache` maps an image path to one `ImagePart` (RGB, downscaled to at most ``max_pixels`` pixels when given,
aspect ratio kept, bicubic: the pixel policy of `forecasters.presets`), in an LRU of ``size`` images. The runner sorts queries by prefix, so the 8 frames of a prefix
are read and (for the ``openai`` backend) base64-encoded once, however many questions ask about that prefix.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from forecasters.backends.base import ImagePart


@dataclass(frozen=True)
class FrameSelection:
    """Which prefix frames a request carries (``--frames``; GenState-AI's last-frame-only ablation is ``last``).

    ==============  ====================================================================================
    ``all``         every prefix frame (the paper's 8), in order (the default)
    ``last``        the last prefix frame only (the frame nearest the future) = ``last:1``
    ``K``           the K last prefix frames, in order (``last:K``); all of them when K >= their number
    ``spaced:K``    K evenly spaced frames, the last always kept (`subsample`; how ``distill.sft`` trains a
                    student with ``frames: K``, so a student adapter is served that way)
    ==============  ====================================================================================

    ``key`` is what the run's config hash records: None for ``all`` (so default runs keep their hash),
    ``"last:K"`` or ``"spaced:K"`` otherwise; ``str`` is the canonical spelling written to the run config.
    """

    mode: str = "all"
    k: int | None = None

    def __post_init__(self):
        if self.mode not in ("all", "last", "spaced"):
            raise ValueError(f"frame selection mode must be all, last or spaced, got {self.mode!r}")
        if (self.mode == "all") != (self.k is None) or (self.k is not None and self.k < 1):
            raise ValueError(f"invalid frame selection {self.mode}:{self.k} (K must be >= 1; 'all' takes no K)")

    @classmethod
    def parse(cls, value: FrameSelection | str | int | None) -> FrameSelection:
        """``None``/``"all"`` -> all; ``"last"`` -> last 1; ``K`` / ``"K"`` / ``"last:K"`` -> last K;
        ``"spaced:K"`` -> K evenly spaced. Raises ``ValueError`` naming the accepted forms."""
        if isinstance(value, FrameSelection):
            return value
        if value is None:
            return cls()
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"--frames: expected all, last, K or spaced:K, got {value!r}")
        text = str(value).strip().lower()
        if text in ("all", "last"):
            return cls() if text == "all" else cls("last", 1)
        mode, _, num = text.rpartition(":")
        mode = mode or "last"  # a bare K: the K last frames
        if mode in ("last", "spaced") and num.isdigit() and int(num) >= 1:
            return cls(mode, int(num))
        raise ValueError(f"--frames: expected all, last, K (the K last frames, K >= 1) or spaced:K, got {value!r}")

    @property
    def key(self) -> str | None:
        return None if self.mode == "all" else f"{self.mode}:{self.k}"

    def __str__(self) -> str:
        return self.key or "all"

    def apply(self, paths: Sequence[str]) -> tuple[str, ...]:
        """The selected items of ``paths`` (the prefix frames in time order), in order."""
        paths = tuple(paths)
        if self.mode == "all" or self.k >= len(paths):
            return paths
        if self.mode == "last":
            return paths[len(paths) - self.k:]
        return subsample(paths, self.k)


def subsample(paths: Sequence[str], k: int | None) -> tuple[str, ...]:
    """``k`` evenly spaced items of ``paths`` in order, always including the last (the frame nearest the future);
    all of them when ``k`` is None or ``k >= len(paths)``. Indices: ``round(j * (n - 1) / (k - 1))``, j = 0..k-1."""
    paths = tuple(paths)
    n = len(paths)
    if k is None or k >= n:
        return paths
    if k < 1:
        raise ValueError(f"frames must be >= 1, got {k}")
    if k == 1:
        return (paths[-1],)
    return tuple(paths[round(j * (n - 1) / (k - 1))] for j in range(k))


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
