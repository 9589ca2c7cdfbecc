"""A benchmark's fingerprint: which benchmark a run was scored on.

``{"name", "version", "sha256"}``: the manifest's name and version, and a SHA-256 of everything
`eval.scoring.score_benchmark` reads from the benchmark to produce a run -- per query its id, video, object,
target state (type2 and type1), every GT tier and every GT definition field (`eval.schema.GT_DEFINITION_FIELDS`);
per corpus segment its id (in row order: the row tie-break depends on it), video, object and states. Two
benchmarks with the same fingerprint give a method the same run; changing any GT pool, adding or dropping a
segment, or renaming an id changes it. Frames, features, question texts and splits are not part of it (they do not
change a run's statistics; the evaluated population reads splits from the benchmark itself).

The hash is over logical content, column by column (Arrow kernels, no Python loop over rows): for a string column
the lengths and bytes of its values, for a list column each row's length (a null list counts as empty, as
`eval.schema.Query.from_dict` reads it) and then its values. It is computed once per loaded benchmark
(`eval.benchmark.Benchmark.fingerprint`) and kept in ``<benchmark>/.cache/fingerprint.json``
(`cached_benchmark_fingerprint`), keyed by the size, modification time and inode of each file the benchmark was
loaded from, the columns hashed and `FINGERPRINT_VERSION`: at PSR scale the hash takes seconds and every scoring
command needs it, the cache makes that a file read. A benchmark that is read-only keeps no cache.

Files (an adapter, a run file, a written dataset) are identified by `sha256_files` / `sha256_tree`: a SHA-256 over
each file's name (where names count) and bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eval.allocators import configure as _configure_allocators
from eval.schema import GT_DEFINITION_FIELDS, GT_TIERS

_configure_allocators()  # before this module's first large buffer (`eval.allocators`)

#: Query columns that determine a run (GT definition fields are added from `GT_DEFINITION_FIELDS`).
QUERY_COLUMNS = ("id", "video_id", "object_id", "target_state_id", "target_state_type1")
CORPUS_COLUMNS = ("id", "video_id", "object_id", "state_id", "state_type1")


def _strings(h: Any, arr: pa.Array) -> None:
    arr = pc.fill_null(arr.cast(pa.large_string()), "")
    off = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    h.update(np.diff(off).astype("<i8").tobytes())
    data = arr.buffers()[2]
    if data is not None and len(arr):
        h.update(memoryview(data)[int(off[0]):int(off[-1])])


def _lists(h: Any, arr: pa.Array) -> None:
    h.update(np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype="<i8").tobytes())
    _strings(h, pc.list_flatten(arr))


def _field(arr: pa.Array, rest: str) -> pa.Array | None:
    """The struct field at dotted ``rest`` of ``arr`` (``arr`` itself when empty); None when ``arr`` lacks it."""
    for part in filter(None, rest.split(".")):
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(part) < 0:
            return None
        arr = pc.struct_field(arr, [arr.type.get_field_index(part)])
    return arr


def _column(table: pa.Table, path: str) -> pa.Array | None:
    """A column by dotted path (``gt_pools.consensus``), as one array; None when the table lacks it."""
    top, _, rest = path.partition(".")
    if top not in table.column_names:
        return None
    return _field(table.column(top).combine_chunks(), rest)


def column_chunks(table: pa.Table, path: str) -> list[pa.Array] | None:
    """A column by dotted path, one array per chunk of the table (no copy: `_column` joins them, which copies every
    value); None when the table lacks it."""
    top, _, rest = path.partition(".")
    if top not in table.column_names:
        return None
    chunks = [_field(c, rest) for c in table.column(top).chunks]
    return None if any(c is None for c in chunks) else chunks


def _hash_columns(h: Any, table: pa.Table, paths: list[str], list_paths: frozenset[str] = frozenset()) -> None:
    """Hash the columns at ``paths``; a list column in ``list_paths`` that the table lacks hashes as all-empty (an
    optional GT list a benchmark does not have is the same as one no query fills)."""
    for path in paths:
        arr = _column(table, path)
        if arr is None and path in list_paths:
            arr = pa.array([[]] * table.num_rows, pa.list_(pa.string()))
        h.update(f"\x00{path}:{'absent' if arr is None else len(arr)}\x00".encode())
        if arr is None:
            continue
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            _lists(h, arr)
        else:
            _strings(h, arr)


def fingerprint_paths() -> tuple[list[str], list[str]]:
    """The query and corpus column paths the fingerprint covers, in hashing order."""
    gt = [f"gt_pools.{t}" for t in GT_TIERS]
    gt += [f for fields in GT_DEFINITION_FIELDS.values() for f in fields if f not in gt]
    return list(QUERY_COLUMNS) + gt, list(CORPUS_COLUMNS)


def benchmark_fingerprint(bench: Any) -> dict[str, str]:
    """``{"name", "version", "sha256"}`` of a loaded `eval.benchmark.Benchmark` (see the module docstring)."""
    h = hashlib.sha256()
    q_paths, c_paths = fingerprint_paths()
    h.update(b"queries")
    _hash_columns(h, bench.queries_ds.data.table, q_paths, frozenset(q_paths[len(QUERY_COLUMNS):]))
    h.update(b"corpus")
    _hash_columns(h, bench.corpus_ds.data.table, c_paths)
    return {"name": str(bench.manifest.name), "version": str(bench.manifest.version), "sha256": h.hexdigest()}


#: Changes whenever what `benchmark_fingerprint` hashes changes: a cached fingerprint of another version is recomputed.
FINGERPRINT_VERSION = 1
CACHE_FILE = "fingerprint.json"


def cached_benchmark_fingerprint(bench: Any) -> dict[str, str]:
    """`benchmark_fingerprint`, read from ``<root>/.cache/fingerprint.json`` when that was written for the same files
    (``bench.source_stats``, set by `eval.benchmark.Benchmark.load`), the same columns and `FINGERPRINT_VERSION`;
    computed (and written, where the benchmark is writable) otherwise."""
    stats = getattr(bench, "source_stats", None)
    if not stats:
        return benchmark_fingerprint(bench)
    key = hashlib.sha256(json.dumps([FINGERPRINT_VERSION, fingerprint_paths(), stats]).encode()).hexdigest()
    path = Path(bench.root) / ".cache" / CACHE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        fp = doc["fingerprint"]
        if doc.get("key") == key and set(fp) == {"name", "version", "sha256"}:
            return {k: str(v) for k, v in fp.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    fp = benchmark_fingerprint(bench)
    try:
        from eval.atomic import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"key": key, "fingerprint": fp})
    except OSError:
        pass  # a read-only benchmark: no cache
    return fp


def _hash_any(h: Any, arr: pa.Array) -> None:
    """Hash an Arrow array of any type by its logical content: validity, then strings (lengths + bytes), lists
    (lengths, then the values), structs (field by field, in name order) or fixed-width values (little-endian)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    h.update(f"\x00{arr.type}:{len(arr)}:{arr.null_count}\x00".encode())
    if arr.null_count:
        h.update(np.asarray(arr.is_valid(), dtype=np.uint8).tobytes())
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        _strings(h, arr)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        h.update(np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype="<i8").tobytes())
        _hash_any(h, pc.list_flatten(arr))
    elif pa.types.is_struct(t):
        for i in sorted(range(t.num_fields), key=lambda i: t.field(i).name):
            h.update(t.field(i).name.encode())
            _hash_any(h, pc.struct_field(arr, [i]))
    elif pa.types.is_null(t):
        pass
    else:  # numbers, booleans: their values (nulls as zero; the validity is hashed above)
        v = np.asarray(arr.fill_null(False if pa.types.is_boolean(t) else 0).to_numpy(zero_copy_only=False))
        h.update(v.astype(v.dtype.newbyteorder("<")).tobytes())


def _hash_table(h: Any, name: str, table: pa.Table) -> None:
    h.update(f"\x00table {name} {table.num_rows}\x00".encode())
    for col in sorted(table.column_names):
        h.update(col.encode())
        _hash_any(h, table.column(col))


#: The files of a benchmark directory whose every record the build fingerprint covers (`build_fingerprint`).
BUILD_FILES = ("queries.jsonl", "corpus.jsonl", "states.jsonl", "phrase_map.jsonl")


def build_fingerprint(bench: Any) -> str:
    """SHA-256 (hex) over everything a build decided: every field of every record of ``queries.jsonl``,
    ``corpus.jsonl`` and ``states.jsonl`` (states, their members, each segment's state, each query's target,
    transcript and GT pools) and, for a canonicalized benchmark, ``phrase_map.jsonl`` (each raw phrase's state and
    its similarity to the seed), in row order, columns by name. Two builds with the same fingerprint are the same
    benchmark; `eval.card` prints it, so builds on two machines are compared by one line. The manifest is left out
    (it records paths and timings of the machine that built it), and so are frames and features."""
    import pyarrow.json as pajson

    h = hashlib.sha256()
    for name, ds in (("queries.jsonl", bench.queries_ds), ("corpus.jsonl", bench.corpus_ds),
                     ("states.jsonl", bench.states_ds)):
        _hash_table(h, name, ds.data.table)
    pm = bench.root / "phrase_map.jsonl"
    if pm.is_file() and pm.stat().st_size:
        _hash_table(h, pm.name, pajson.read_json(pm))
    return h.hexdigest()


def fingerprint_line(card: dict) -> str:
    """The card's build fingerprint as one Markdown line ("" for a card without one), for the card and the results
    page (`eval.findings.card_beside_paper`); ``card``: `eval.card.Card.to_dict`."""
    fp = card.get("build_fingerprint")
    if not fp:
        return ""
    return (f"Build fingerprint: `{fp}` (SHA-256 of every record of the benchmark, `eval.fingerprint.build_fingerprint`;"
            " the same source, seed and settings build the same fingerprint whatever the thread count or BLAS kernel;"
            " CPUs of another instruction set (AVX2 against AVX-512) may build another).")


def describe(fp: dict[str, str] | None) -> str:
    """``'psr-synth' v1.0.0 (sha256 1a2b3c4d5e6f)`` for messages."""
    if not fp:
        return "no fingerprint"
    return f"{fp.get('name')!r} v{fp.get('version')} (sha256 {str(fp.get('sha256'))[:12]})"


def sha256_files(paths: Iterable[str | os.PathLike], *, name: Callable[[Path], str] | None = None) -> str:
    """SHA-256 (64 hex digits) over ``paths`` in the order given: for each file, ``name(path)`` encoded as UTF-8
    (skipped when ``name`` is None: the hash of the bytes alone), then the file's bytes."""
    h = hashlib.sha256()
    for p in map(Path, paths):
        if name is not None:
            h.update(name(p).encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def sha256_tree(path: str | os.PathLike) -> str | None:
    """`sha256_files` over a directory's regular files (recursive, sorted), each named by its path relative to the
    directory; for a single file, its name and bytes; None when ``path`` does not exist."""
    root = Path(path)
    if not root.exists():
        return None
    if not root.is_dir():
        return sha256_files([root], name=lambda f: f.name)
    files = sorted(f for f in root.rglob("*") if f.is_file())
    return sha256_files(files, name=lambda f: str(f.relative_to(root)))
