"""Which prefix frames a job reads: ``all``, ``last``, ``K`` (the K last) or ``spaced:K`` (K evenly spaced, the last
kept). Shared by the image forecasters (``forecasters run --frames``, `forecasters.media`) and LFTR's prefix
(``retrieval lftr ... --set frames=...``), so both spell and pick frames the same way; items are any sequence in
time order (frame paths, or ``range(8)`` for the rows of a prefix-token table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eval.errors import InputError


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
            raise InputError(f"frame selection mode must be all, last or spaced, got {self.mode!r}")
        if (self.mode == "all") != (self.k is None) or (self.k is not None and self.k < 1):
            raise InputError(f"invalid frame selection {self.mode}:{self.k} (K must be >= 1; 'all' takes no K)")

    @classmethod
    def parse(cls, value: FrameSelection | str | int | None) -> FrameSelection:
        """``None``/``"all"`` -> all; ``"last"`` -> last 1; ``K`` / ``"K"`` / ``"last:K"`` -> last K;
        ``"spaced:K"`` -> K evenly spaced. Raises ``ValueError`` naming the accepted forms."""
        if isinstance(value, FrameSelection):
            return value
        if value is None:
            return cls()
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise InputError(f"--frames: expected all, last, K or spaced:K, got {value!r}")
        text = str(value).strip().lower()
        if text in ("all", "last"):
            return cls() if text == "all" else cls("last", 1)
        mode, _, num = text.rpartition(":")
        mode = mode or "last"  # a bare K: the K last frames
        if mode in ("last", "spaced") and num.isdigit() and int(num) >= 1:
            return cls(mode, int(num))
        raise InputError(f"--frames: expected all, last, K (the K last frames, K >= 1) or spaced:K, got {value!r}")

    @property
    def key(self) -> str | None:
        return None if self.mode == "all" else f"{self.mode}:{self.k}"

    def __str__(self) -> str:
        return self.key or "all"

    def same_frames(self, other: FrameSelection, n: int) -> bool:
        """Whether both select the same frames of an ``n``-frame prefix (``last:8``, ``spaced:8`` and ``all`` do
        for the paper's 8)."""
        return self.apply(range(n)) == other.apply(range(n))

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
        raise InputError(f"frames must be >= 1, got {k}")
    if k == 1:
        return (paths[-1],)
    return tuple(paths[round(j * (n - 1) / (k - 1))] for j in range(k))
