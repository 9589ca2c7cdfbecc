"""Output directories of the canonicalization jobs: built beside their final place and swapped in at the end, so a
failed job leaves nothing half-written; a directory is only replaced when a previous job of ours made it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from eval.io import atomic_dir

#: File that marks a directory written by a canonicalization job (its content: the job kind).
MARKER = ".psr-canon"


def check_out_dir(final: str | os.PathLike, kind: str) -> Path:
    """``final`` when it may be replaced by a ``canon <kind>`` output: missing, empty, or an earlier output of the same
    ``kind``; anything else raises `FileExistsError` (call it before the work, to refuse early)."""
    final = Path(final)
    if final.exists():
        if not final.is_dir():
            raise FileExistsError(f"{final} exists and is not a directory")
        marker = final / MARKER
        mine = marker.exists() and marker.read_text(encoding="utf-8").strip() == kind
        if any(final.iterdir()) and not mine:
            raise FileExistsError(f"{final} is not empty and was not written by `canon {kind}`; refusing to replace it")
    return final


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike, kind: str) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``final`` (which `check_out_dir` must accept)."""
    final = check_out_dir(final, kind)
    with atomic_dir(final, tag=kind) as stage:
        yield stage
        (stage / MARKER).write_text(kind + "\n", encoding="utf-8")
