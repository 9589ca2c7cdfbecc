"""How a toolkit process allocates memory: pyarrow's pool and numpy's huge-page advice, chosen once per process.

Two defaults cost most of a scoring stage's system time on the 2-core Linux machines this toolkit is tested on, whose
kernels give transparent huge pages to memory that asks for them and make such a request wait for the kernel to
compact memory (``/sys/kernel/mm/transparent_hugepage/enabled`` = ``madvise``, ``defrag`` = ``madvise``):

- numpy asks for huge pages for every large array (``madvise(MADV_HUGEPAGE)``), so each fresh large array of a
  scoring stage (its GT lists, ranked positives, run columns) can stall in that compaction. `configure` turns the
  request off wherever ``defrag`` makes it wait (``always``, ``madvise``, ``defer+madvise``); with ``defer`` or
  ``never`` it is left on.
- pyarrow's default pool on Linux is mimalloc, whose fresh segments spend most of their time in the kernel on such
  a machine; jemalloc (the system allocator where pyarrow has no jemalloc) does not.

`scripts/bench_allocators.py` times a scoring stage under each setting, as fresh processes (its record is on
`docs/performance.md`). `configure` is called by the modules that read a benchmark's Arrow tables and rank it
(`eval.benchmark`, `eval.runs`, `eval.fingerprint`, `eval.scoring.benchmark`), before their first large buffer. A
user's own choice wins: with ``NUMPY_MADVISE_HUGEPAGE`` or ``ARROW_DEFAULT_MEMORY_POOL`` set, that setting is left
as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

THP_DEFRAG = Path("/sys/kernel/mm/transparent_hugepage/defrag")
#: ``defrag`` modes in which a huge-page request waits for compaction.
STALLING_DEFRAG = ("always", "madvise", "defer+madvise")

_done = False


def thp_setting(path: Path = THP_DEFRAG) -> str | None:
    """The bracketed choice of a transparent-huge-page setting file (default ``defrag``), None where there is none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else None


def configure(*, force: bool = False, defrag: Path = THP_DEFRAG) -> dict[str, object]:
    """Choose the allocators of this process (module docstring), once (again with ``force``; ``defrag``: the kernel's
    setting file); returns what is in use: ``arrow_pool`` (pyarrow's backend) and ``numpy_hugepage_advice`` (bool,
    None where this numpy has no such switch)."""
    global _done
    import pyarrow as pa

    madvise = _numpy_madvise_switch()
    if force or not _done:
        if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
            try:
                pool = pa.jemalloc_memory_pool()
            except NotImplementedError:  # a pyarrow built without jemalloc
                pool = pa.system_memory_pool()
            pa.set_memory_pool(pool)
        stalls = thp_setting(defrag) in STALLING_DEFRAG
        if madvise is not None and "NUMPY_MADVISE_HUGEPAGE" not in os.environ and stalls:
            madvise(False)
        _done = True
    advice = None
    if madvise is not None:  # the switch returns the previous setting: read it by setting it back
        advice = bool(madvise(True))
        madvise(advice)
    return {"arrow_pool": pa.default_memory_pool().backend_name, "numpy_hugepage_advice": advice}


def _numpy_madvise_switch():
    """numpy's switch of its huge-page advice (returns the previous setting), None where this numpy has none."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    return getattr(multiarray, "_set_madvise_hugepage", None)
