"""Output directories of the canonicalization jobs: built beside their final place and swapped in at the end, so a
failed job leaves nothing half-written; a directory is only replaced when a previous job of ours made it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: File that marks a directory written by a canonicalization job (its content: the job kind).
MARKER = ".psr-canon"


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike, kind: str) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``final``.

    ``final`` may be missing, empty, or an earlier output of the same ``kind``; anything else raises
    `FileExistsError` before any work is done."""
    final = Path(final)
    if final.exists():
        if not final.is_dir():
            raise FileExistsError(f"{final} exists and is not a directory")
        marker = final / MARKER
        mine = marker.exists() and marker.read_text(encoding="utf-8").strip() == kind
        if any(final.iterdir()) and not mine:
            raise FileExistsError(f"{final} is not empty and was not written by `canon {kind}`; refusing to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.{kind}-", dir=final.parent))
    stage.chmod(0o755)
    try:
        yield stage
        (stage / MARKER).write_text(kind + "\n", encoding="utf-8")
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, old / "x")
        os.replace(stage, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
