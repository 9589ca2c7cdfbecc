"""Process pools that stop with their command: `process_pool`, used by every job that runs work in child processes
(the synthetic build's videos, the LFTR heads of `retrieval demo`, the students of `distill study`).

A plain ``with ProcessPoolExecutor(...)`` does not stop when its command is interrupted:

- leaving the block waits for every job already submitted, so a SIGTERM to the command (what `distill recipe` sends
  a stage it stops, what ``timeout`` sends) lets the queued jobs run to the end first;
- a forked worker inherits the command's SIGINT/SIGTERM handler (`eval.cli_support.signals_as_exceptions`); the
  exception it raises leaves the worker blocked on its result pipe while the command waits for it, so a Ctrl-C or a
  ``pkill`` hung the build for good.

`process_pool` yields an ordinary executor whose workers leave SIGINT to the command (a Ctrl-C reaches the whole
process group) and end at once on SIGTERM. When the block exits on an exception (an interrupt, a failed job), the
workers are terminated before the exception goes on: the jobs in flight are dropped, the queued ones never start.
A job must therefore write its outputs atomically (`eval.io`), as every job of the toolkit does: what an interrupted
job leaves is whole or absent, and a rerun redoes it. A worker that dies on its own (killed, out of memory) makes
the pending futures raise ``BrokenProcessPool`` instead of hanging.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any


class StoppingPool(ProcessPoolExecutor):
    """The executor `process_pool` yields: ``map`` is the executor's, save that leaving its iteration early cancels
    nothing (the pool's exit ends the workers; on Python 3.11 a future cancelled before its worker ended makes the
    pool's manager thread fail with a traceback). ``timeout`` applies to each chunk's result."""

    def map(self, fn, *iterables, timeout=None, chunksize=1):
        items = list(zip(*iterables, strict=False))
        futures = [self.submit(_call_chunk, fn, items[i:i + chunksize]) for i in range(0, len(items), chunksize)]

        def results():
            for f in futures:
                yield from f.result(timeout)

        return results()


def _call_chunk(fn: Callable[..., Any], chunk: list[tuple]) -> list[Any]:
    return [fn(*args) for args in chunk]


def _worker_init(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """In each worker: SIGINT ignored (the command handles it), SIGTERM the default (end), then ``initializer``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if initializer is not None:
        initializer(*initargs)


def terminate_workers(pool: ProcessPoolExecutor) -> None:
    """End ``pool``'s worker processes now (SIGTERM) and wait for them; its pending futures become broken."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # Python >= 3.14: pool.terminate_workers()
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join()


@contextlib.contextmanager
def process_pool(workers: int, *, start: str = "spawn", initializer: Callable[..., None] | None = None,
                 initargs: tuple = ()) -> Iterator[StoppingPool]:
    """A ``ProcessPoolExecutor`` of ``workers`` processes (``start``: ``spawn``, or ``fork`` where the platform has
    it) that is shut down when the block ends and terminated at once when it ends on an exception (module
    docstring). ``initializer(*initargs)`` runs in each worker."""
    if start == "fork" and "fork" not in multiprocessing.get_all_start_methods():
        start = "spawn"
    pool = StoppingPool(workers, mp_context=multiprocessing.get_context(start), initializer=_worker_init,
                        initargs=(initializer, initargs))
    try:
        yield pool
    except BaseException:
        terminate_workers(pool)  # first: shutting down forgets the workers
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
