"""Append-only JSONL outputs of the resumable distillation jobs (narration, predicates).

Crash-safe write order: a job appends whole lines and fsyncs after each chunk, so after a crash the file holds every
finished chunk plus at most one torn last line. `read_records` skips that torn line and `repair` cuts it off before
appending again; nothing else is ever rewritten in place (a rewrite goes through `eval.io.atomic_path`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eval.io import iter_jsonl, write_jsonl


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file (a torn last line is skipped; a missing file is empty)."""
    path = Path(path)
    if not path.exists():
        return []
    return [d for _, d in iter_jsonl(path, allow_torn_tail=True)]


def repair(path: str | os.PathLike) -> int:
    """Cut a torn last line (no trailing newline) off ``path``; returns the bytes removed."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return 0
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
        f.truncate(keep)
        os.fsync(f.fileno())
    return len(data) - keep


def rewrite(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``rows`` atomically."""
    write_jsonl(path, rows)


class Appender:
    """Append JSON lines to a file; `flush` fsyncs (call it after each chunk)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair(self.path)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close() / __exit__

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self.flush()
            self._f.close()

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
