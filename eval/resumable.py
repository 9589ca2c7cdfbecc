"""Resumable append-only JSONL: the one crash-safe layer under every job that appends its results as they come
(the forecaster runner's phrase files, `forecasters.phrasefile`; the narration job's outputs, `distill.narrate`).

Write order. A job appends whole lines only (`Appender`): the records of a chunk are encoded first, then written
with one ``os.write`` on an ``O_APPEND`` descriptor and ``fsync``-ed. A crash (even ``kill -9``) can therefore lose
only the chunk being written and tear at most the last line: the bytes after the file's last newline. Nothing is
rewritten in place; a compaction or a reset replaces the whole file atomically (`eval.io.write_jsonl`: temp file +
fsync + rename).

Resume. `scan` reads the complete lines (those before the last newline; a torn tail is measured, never read; any
other malformed line is a `FormatError` naming the line); `Lines.keys` is the set of keys already written (of one
config, when ``config_hash`` is given) and `Lines.config_hashes` counts the configs the file holds, so a job skips
what is done and refuses another config's lines. `cut_torn_tail` cuts the file back to its last newline, and an
`Appender` does so when it opens, so a new line never glues onto a torn one. `locked` keeps a second job off the
file. Readers of a finished file that want only its records use `read_records` (a torn last line is skipped).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.errors import OutputLocked
from eval.io import FormatError, iter_jsonl


@dataclass
class Lines:
    """The complete lines of a resumable JSONL file: ``rows`` holds ``(line number, object)`` in file order;
    ``torn_tail`` the bytes after the last newline (a write torn by a crash; not read)."""

    path: Path
    rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    torn_tail: int = 0

    def keys(self, key: str = "query_id", *, config_hash: str | None = None) -> set:
        """The ``key`` values of the lines (only those whose ``config_hash`` is ``config_hash``, when given)."""
        return {d[key] for _, d in self.rows if config_hash is None or d.get("config_hash") == config_hash}

    def config_hashes(self) -> Counter:
        """How many lines each ``config_hash`` has (None for lines without one)."""
        return Counter(d.get("config_hash") for _, d in self.rows)


def scan(path: str | os.PathLike) -> Lines:
    """The complete lines of ``path`` (a missing file has none). The bytes after the last newline are a torn tail,
    measured and not read; any other line that is not a JSON object raises `FormatError` naming the line."""
    path = Path(path)
    out = Lines(path)
    if not path.exists():
        return out
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    out.torn_tail = len(data) - keep
    for i, raw in enumerate(data[:keep].split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FormatError(path, f"not valid JSON ({e})", line=i) from None
        if not isinstance(d, dict):
            raise FormatError(path, f"expected a JSON object, got {type(d).__name__}", line=i)
        out.rows.append((i, d))
    return out


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a JSONL file (a torn last line is skipped; a missing file is empty)."""
    path = Path(path)
    if not path.exists():
        return []
    return [d for _, d in iter_jsonl(path, allow_torn_tail=True)]


def cut_torn_tail(path: str | os.PathLike) -> int:
    """Truncate ``path`` after its last newline (fsynced); returns the number of bytes removed (0 for a missing
    file)."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        removed = len(data) - keep
        if removed:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return removed


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (released on exit or process death); a second holder is refused
    with `eval.errors.OutputLocked` (a ``RuntimeError``). The lock file exists only while held: the holder removes
    it before releasing the lock. A job that opened the file just before that removal finds, once it holds the
    lock, that the path names another file than the one it locked, and starts over with that file (so two holders
    never coexist)."""
    lock_path = Path(str(path) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(lock_path, path)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
        os.close(fd)


def _acquire(lock_path: Path, path) -> int:
    """An open descriptor of ``lock_path`` holding its exclusive lock (see `locked`)."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputLocked(f"{path}: another job is writing this file (lock {lock_path} is held)") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file after we opened it: lock the new one


class Appender:
    """Append whole JSON lines to a file (created with its folder when missing; a torn tail is cut on opening).

    `write` queues one record; `flush` writes the queued lines with one ``os.write`` on an ``O_APPEND`` descriptor
    and fsyncs (call it after each chunk); `append` is both for a chunk; `append_bytes` appends ready-made lines.
    `close` (or leaving the ``with`` block) flushes.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut_torn_tail(self.path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._queued: list[str] = []

    def write(self, row: dict[str, Any]) -> None:
        self._queued.append(json.dumps(row, ensure_ascii=False) + "\n")

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.write(row)
        self.flush()

    def flush(self) -> None:
        if self._queued:
            data, self._queued = "".join(self._queued).encode("utf-8"), []
            self.append_bytes(data)

    def append_bytes(self, data: bytes) -> None:
        """Append ``data`` (whole lines, each ending in a newline) and fsync."""
        if not data:
            return
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
