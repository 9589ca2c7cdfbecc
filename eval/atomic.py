"""Atomic file writes: a file appears whole under its name or not at all, and an interrupt (SIGINT, SIGTERM) never
leaves a temporary file behind.

The lowest layer of eval's writing: `eval.io` (formats, `eval.io.atomic_dir`) and `eval.outputs` (output markers)
build on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block (delivered when it ends), so that a step and its bookkeeping are one: an
    interrupt never finds a temporary file or folder made but its cleanup not yet registered, or a finished output
    checked but not yet in place. A no-op outside the main thread.

    The handlers are swapped for one that only notes the signal, and the first signal noted is then handed to the
    handler that was there before (the command's `Interrupted`, Python's ``KeyboardInterrupt``, or the default
    action). Blocking the signal with ``pthread_sigmask`` would not do: the mask is the calling thread's, and in a
    process with other threads (torch's, a library's writer) the kernel hands the signal to one of them, whose
    Python handler then runs in the main thread at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    old = {s: signal.getsignal(s) for s in HELD}
    for s in HELD:
        signal.signal(s, lambda signum, _frame: noted.append(signum))
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if noted:
            _deliver(noted[0], old[noted[0]])


def _deliver(signum: int, handler) -> None:
    """Hand ``signum`` to ``handler`` as the signal itself would have (`signals_held`)."""
    if callable(handler):
        handler(signum, None)
    elif handler in (signal.SIG_DFL, None):
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over ``path``.

    On an exception the temporary file is removed, so a failed job never leaves a half-written output.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = None
    try:
        with signals_held():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or path.suffix or ".tmp",
                                       dir=path.parent)
            os.close(fd)
            tmp_path = Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp creates 0600; outputs should be readable like any other file
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if tmp_path is not None:
            with contextlib.suppress(FileNotFoundError):
                tmp_path.unlink()
        raise


def write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False, sort_keys=False)
        f.write("\n")
