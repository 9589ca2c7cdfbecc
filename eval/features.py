"""Precomputed features of a retrieval space: ``features/<space>/`` of a benchmark directory.

Layout of one space directory::

    meta.json                 {"space": NAME, "kind": "visual" | "semantic" | "prefix", "model": ID_OR_PATH, "dim": D,
                               "normalized": true}
    <table>.npy               float32; (n, D) for `corpus` and `states`, (n, 8, D) for `prefixes` (one token per frame)
    <table>_ids.txt           one id per line, row i of the array belongs to line i

Tables: ``corpus`` (segment ids; a visual space's middle-frame features), ``states`` (state ids; a semantic
space's canonical state embeddings), ``prefixes`` (prefix ids; per-frame prefix tokens). A space holds any subset.
A ``prefix`` space is an input only: it holds a ``prefixes`` table and no items to retrieve (the synthetic
benchmark's ``sim`` space, `eval.synth.simspace`); its tokens need not be L2-normalised (``"normalized": false``).
Arrays are opened memory-mapped, so a 218,276 x 1,024 corpus costs nothing until read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.errors import InputError
from eval.io import FormatError, atomic_path, read_json, read_lines, write_json

TABLES = ("corpus", "states", "prefixes")


@dataclass(frozen=True)
class FeatureTable:
    """One feature table: ``ids[i]`` labels ``array[i]``. ``array`` is float32 (memory-mapped when loaded)."""

    ids: list[str]
    array: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.array.shape[-1])

    def index(self) -> dict[str, int]:
        return {x: i for i, x in enumerate(self.ids)}


def space_dir(root: str | os.PathLike, space: str) -> Path:
    return Path(root) / "features" / space


def list_spaces(root: str | os.PathLike) -> list[str]:
    d = Path(root) / "features"
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def read_meta(root: str | os.PathLike, space: str) -> dict[str, Any]:
    p = space_dir(root, space) / "meta.json"
    if not p.exists():
        raise FormatError(p, "missing (every space directory needs a meta.json)")
    return read_json(p)


def has_table(root: str | os.PathLike, space: str, table: str) -> bool:
    return (space_dir(root, space) / f"{table}.npy").exists()


def read_ids(path: Path) -> list[str]:
    """The ids of an ``<table>_ids.txt`` file, one a line (blank lines skipped); bytes that are not UTF-8 are a
    `FormatError` naming the line (`eval.io.read_text`)."""
    return [line for line in read_lines(path) if line.strip()]


def load_table(root: str | os.PathLike, space: str, table: str, *, mmap: bool = True) -> FeatureTable:
    """Load one table; raises `FormatError` when files are missing or the row count disagrees with the ids."""
    d = space_dir(root, space)
    arr_p, ids_p = d / f"{table}.npy", d / f"{table}_ids.txt"
    for p in (arr_p, ids_p):
        if not p.exists():
            raise FormatError(p, f"missing (space {space!r} has no {table!r} table)")
    try:
        arr = np.load(arr_p, mmap_mode="r" if mmap else None)
    except ValueError as e:
        raise FormatError(arr_p, f"not a readable .npy array ({e})") from None
    ids = read_ids(ids_p)
    if arr.shape[0] != len(ids):
        raise FormatError(arr_p, f"{arr.shape[0]} rows but {ids_p.name} lists {len(ids)} ids")
    return FeatureTable(ids, arr)


FINITE_CHUNK_ROWS = 65536


def check_finite(path: str | os.PathLike, array: np.ndarray, ids: list[str]) -> None:
    """Raise `FormatError` naming ``path``, the first row and its id when ``array`` holds NaN or inf (scored, such a
    row gives NaN or infinite scores far from the file). Checked in chunks of rows, so a memory-mapped table is never
    read at once."""
    flat = array.reshape(array.shape[0], -1) if array.ndim else array.reshape(1, -1)
    for start in range(0, flat.shape[0], FINITE_CHUNK_ROWS):
        ok = np.isfinite(np.asarray(flat[start:start + FINITE_CHUNK_ROWS])).all(axis=1)
        if not ok.all():
            row = start + int(np.flatnonzero(~ok)[0])
            rid = ids[row] if row < len(ids) else "?"
            raise FormatError(path, f"row {row} (id {rid!r}, line {row + 1} of the ids file) holds NaN or inf values",
                              fix="re-encode the space (python -m retrieval encode)")


#: Where `check_finite_cached` keeps its verdicts: ``<benchmark>/.cache/finite.json``.
FINITE_CACHE = Path(".cache") / "finite.json"


def check_finite_cached(root: str | os.PathLike, path: str | os.PathLike, array: np.ndarray, ids: list[str]) -> None:
    """`check_finite` of the table file ``path`` of the benchmark at ``root``, skipped when it already passed for the
    same file: the verdict is kept in ``<root>/.cache/finite.json`` under the file's path, size, mtime and inode (a
    rewritten table, which `write_table` replaces atomically, has another inode). A read-only benchmark keeps no
    verdict and is checked every time. At PSR scale the check reads every value of the table (seconds per stage)."""
    path = Path(path)
    cache = Path(root) / FINITE_CACHE
    try:
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        rel = os.path.relpath(path, root)
    except (OSError, ValueError):
        return check_finite(path, array, ids)
    try:
        done = json.loads(cache.read_text(encoding="utf-8"))
        if not isinstance(done, dict):
            done = {}
    except (OSError, ValueError):
        done = {}
    if done.get(rel) == key:
        return None
    check_finite(path, array, ids)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, {**done, rel: key})
    except OSError:
        pass  # a read-only benchmark: no cache
    return None


def write_table(root: str | os.PathLike, space: str, table: str, ids: list[str], array: np.ndarray) -> None:
    """Write one table atomically (array first, then ids: a reader never sees ids without their rows)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.shape[0] != len(ids):
        raise InputError(f"{table}: {array.shape[0]} rows but {len(ids)} ids")
    d = space_dir(root, space)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / f"{table}.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, array)
    with atomic_path(d / f"{table}_ids.txt") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.writelines(x + "\n" for x in ids)


#: Space kinds: retrieval spaces (``visual``: segment items, ``semantic``: state items) and input-only ``prefix``.
KINDS = ("visual", "semantic", "prefix")


def write_meta(root: str | os.PathLike, space: str, *, kind: str, dim: int, model: str, normalized: bool = True,
               **extra: Any) -> None:
    if kind not in KINDS:
        raise InputError(f"space kind must be one of {KINDS}, got {kind!r}")
    write_json(space_dir(root, space) / "meta.json",
               {"space": space, "kind": kind, "model": model, "dim": int(dim), "normalized": bool(normalized),
                **extra})


def l2_normalize(x: np.ndarray, axis: int = -1, eps: float = 1e-12) -> np.ndarray:
    """Return ``x / ||x||`` along ``axis`` as float32 (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=axis, keepdims=True)
    return (x / np.maximum(n, eps)).astype(np.float32)
