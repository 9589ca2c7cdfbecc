"""``--shard I/N``: one node's share of a chunked job (`retrieval.encode`), importable without the job's libraries."""

from __future__ import annotations

from eval.errors import InputError


def parse_shard(shard: str | tuple[int, int]) -> tuple[int, int]:
    """``"I/N"`` or ``(I, N)`` -> ``(I, N)``: this node computes the chunks ``j`` with ``j % N == I``; needs
    ``0 <= I < N``. The parser of ``--shard`` (an `InputError`, a ValueError, is the option's error)."""
    try:
        i, n = (int(x) for x in (shard.split("/") if isinstance(shard, str) else shard))
    except (TypeError, ValueError):
        raise InputError(f"--shard must be I/N (e.g. 0/4), got {shard!r}") from None
    if not 0 <= i < n:
        raise InputError(f"--shard must be I/N with 0 <= I < N, got {i}/{n}")
    return i, n
