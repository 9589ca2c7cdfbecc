"""CPU threads of the training loops (the towers, LFTR, distillation): as many as this process may run on, and
OpenMP workers that sleep while they wait instead of spinning (for every ``python -m retrieval`` / ``python -m
eval`` process and ``distill.train``).

Why: torch's CPU kernels run in OpenMP parallel regions (libgomp), each ending at a barrier. By default a worker
that reaches the barrier first spins (``GOMP_SPINCOUNT``, ~300,000 iterations) before it sleeps; on a shared machine
its peer is often descheduled, so the spinning burns a core that another process (or the peer itself) needed. With
many short regions per training step, CPU seconds per epoch tripled at a load of 7-8 on 2 cores (issue 23); encoding
2,946 questions with MiniLM at a load of 9-11 took 37 CPU s and 125-139 s wall spinning, 18 CPU s and 66 s passive.
``OMP_WAIT_POLICY=PASSIVE`` makes waiting workers sleep at once. libgomp reads it once, when it is loaded (with
torch or numba), so it must be in the environment before that: `prefer_passive_wait` sets it (unless the user chose
a policy, or a runtime is already loaded) and says whether it is in effect; the ``retrieval``, ``eval`` and
``distill`` entry points (``__main__``, so also ``psr retrieval|eval|distill``), ``forecasters tiny-model`` and the
forecasters' ``hf`` backend call it before anything imports torch, and `training_threads` calls it too (effective
in a fresh process); decoding, a long run of short parallel regions, is what spinning slows most beside a busy
core. The ``vllm`` backend does not: vLLM binds and manages its own OpenMP threads.

Thread count: ``os.sched_getaffinity`` (the CPUs this process may use: ``taskset``, cgroup cpusets, a batch
scheduler's allocation), not ``os.cpu_count`` (every CPU of the machine); ``OMP_NUM_THREADS`` set by the user or a
launcher (``accelerate``, ``torchrun``) wins.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
#: Shared objects of OpenMP runtimes: once one is mapped, it has read its environment.
_OPENMP_LIBS = ("libgomp", "libiomp", "libomp")


def affinity_cpus() -> int:
    """CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where that is not available)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """Threads for a training loop: ``OMP_NUM_THREADS`` when set to a positive integer, else `affinity_cpus`."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        n = 0
    return n if n > 0 else affinity_cpus()


def openmp_loaded() -> bool:
    """True when an OpenMP runtime is already mapped into this process (it has read ``OMP_WAIT_POLICY``). Read
    from ``/proc/self/maps``; elsewhere, whether torch or numba has been imported."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any(lib in line for line in f for lib in _OPENMP_LIBS)
    except OSError:
        return "torch" in sys.modules or "numba" in sys.modules


#: Whether the variable we set reached this process's OpenMP runtime (None: we have not set it).
_passive: bool | None = None


def prefer_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process (and so its children) when no policy is chosen yet and no
    OpenMP runtime has loaded; once one has, the variable could only reach the children, so it is left alone.
    Returns whether waiting OpenMP workers of this process sleep (a policy found in the environment is taken as
    set at start)."""
    global _passive
    if _passive is not None:
        return _passive
    policy = os.environ.get(WAIT_POLICY_ENV)
    if policy is not None:
        return policy.strip().upper() == "PASSIVE"
    _passive = not openmp_loaded()
    if _passive:
        os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return _passive


@contextlib.contextmanager
def training_threads(n: int = 0) -> Iterator[int]:
    """Run the block with ``n`` torch CPU threads (0: `default_threads`) and at most that many numba threads;
    restore both afterwards. Yields the thread count. Small heads on a shared CPU often train fastest on one: a
    config's ``threads`` sets it."""
    prefer_passive_wait()
    import torch

    n = int(n) if n and n > 0 else default_threads()
    old = torch.get_num_threads()
    nb_old = _numba_threads()
    torch.set_num_threads(n)
    if nb_old is not None:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield n
    finally:
        torch.set_num_threads(old)
        if nb_old is not None:
            import numba

            numba.set_num_threads(nb_old)


#: mallopt(3) parameters of glibc
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Whether `retain_freed_memory` took effect in this process (None: not asked yet).
_retained: bool | None = None


def retain_freed_memory(max_block_mb: int = 512) -> bool:
    """Let glibc's malloc serve blocks of up to ``max_block_mb`` MiB from its heap and keep freed memory for reuse,
    for this whole process (``mallopt`` ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``); returns whether it took
    effect (False off glibc).

    A training step allocates and frees tensors of the same sizes every step. By default glibc maps a block over
    its dynamic threshold (at most 32 MiB) with ``mmap`` and unmaps it when freed, and gives the heap's free top back
    to the system, so the next step's tensors land on fresh pages and pay a page fault for every 4 KiB they touch.
    Keeping the memory shortens an LFTR training step (`scripts/bench_lftr_step.py` measures by how much). The
    cost: memory freed after a peak stays with the process until it exits, so call it in processes that train (the
    LFTR jobs do), not in a long-lived host process. Once set, the thresholds stay for the process's life."""
    global _retained
    if _retained is not None:
        return _retained
    import ctypes
    import platform

    _retained = False
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        try:
            libc = ctypes.CDLL("libc.so.6")
            _retained = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(max_block_mb) << 20)
                             and libc.mallopt(_M_TRIM_THRESHOLD, 2 * int(max_block_mb) << 20))
        except (OSError, AttributeError):
            _retained = False
    return _retained


def _numba_threads() -> int | None:
    try:
        import numba

        return numba.get_num_threads()
    except Exception:  # numba missing or its threading layer unavailable: nothing to cap
        return None
