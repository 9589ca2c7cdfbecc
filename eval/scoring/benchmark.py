"""`score_benchmark`: a score source on a benchmark's queries, every GT pool and tier under the PSR protocol -> a run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eval.allocators import configure as _configure_allocators
from eval.errors import InputError
from eval.schema import GT_DEFINITION_FIELDS, GT_DEFINITIONS
from eval.scoring.block import sorted_unique
from eval.scoring.sources import DEFAULT_C_CHUNK, DEFAULT_Q_BLOCK, as_score_source
from eval.scoring.streaming import score_stream

_configure_allocators()  # before this module's first large buffer (`eval.allocators`)

#: Tiers `score_benchmark` scores besides the GT definitions (`eval.schema.GT_DEFINITIONS`).
BENCHMARK_TIERS = ("in_dataset", "cross_dataset", "bge_similar", "in_video")
#: Pool names `score_benchmark` scores, in report order (a GT definition no query has is left out).
BENCHMARK_POOLS = GT_DEFINITIONS + BENCHMARK_TIERS
#: Probe groups scored by `score_benchmark` for the triplet diagnostics (best score only, no rank counting).
TRIPLET_PROBES = ("triplet_temporal", "triplet_semantic")


class BenchmarkGroups(NamedTuple):
    """Per query (lists aligned with the queries), as corpus rows: the positives of every pool, the own-video rows
    (``exclude``) and the triplet probes' rows (`benchmark_groups`)."""

    pools: dict[str, list[np.ndarray]]
    exclude: list[np.ndarray]
    probes: dict[str, list[np.ndarray]]


def _list_entries(table: Any, path: str) -> int | None:
    """The number of entries of the list column at dotted ``path`` (``gt_pools.consensus``) over every row, counted
    chunk by chunk (joining the chunks would copy every id: a second at PSR scale); None when the table lacks it."""
    from eval.fingerprint import column_chunks

    chunks = column_chunks(table, path)
    if chunks is None:
        return None
    return sum(int(pc.sum(pc.fill_null(pc.list_value_length(c), 0)).as_py() or 0) for c in chunks)


def gt_definitions_present(bench: Any) -> list[str]:
    """The GT definitions (`eval.schema.GT_DEFINITION_FIELDS`) that some query of ``bench`` has: the main pool
    always, every other definition when its fields exist and at least one query's list is non-empty."""
    table = bench.queries_ds.data.table
    names = list(GT_DEFINITION_FIELDS)  # read at call time: a definition added to the mapping is picked up
    out = names[:1]
    for name in names[1:]:
        counts = [_list_entries(table, f) for f in GT_DEFINITION_FIELDS[name]]
        if all(c is not None for c in counts) and any(c > 0 for c in counts):
            out.append(name)
    return out


def benchmark_groups(bench: Any, queries: Sequence[Any] | pa.Table) -> BenchmarkGroups:
    """The pools, own-video exclusions and triplet probes of ``queries`` in ``bench`` (all as corpus rows).

    ``queries``: the benchmark's own queries, as `eval.schema.Query` objects or as the Arrow table of their rows
    (`eval.benchmark.Benchmark.query_table`, which `score_benchmark` passes: no Python object per GT id).

    Pools: the GT definitions the benchmark has (`gt_definitions_present`: ``type2-all`` = the main pool =
    in_dataset + cross_dataset, ``type2-consensus``, ``type1-all``, ...), and the tiers ``in_dataset``,
    ``cross_dataset``, ``bge_similar``, ``in_video``. Exclusion: every segment of the query's own video. Probes
    (see `eval.triplets`): ``triplet_temporal`` = segments of the queried object (same ``video_id`` and
    ``object_id``) in a state other than the target; ``triplet_semantic`` = segments of other videos in the target
    (type2) state whose subject+predicate (type1) state differs from the target's.
    """
    table = queries if isinstance(queries, pa.Table) else bench.query_table(
        [bench.query_index[q.id] for q in queries])
    pools = bench.gt_pools_at(table, definitions=gt_definitions_present(bench), tiers=BENCHMARK_TIERS)
    corpus = bench.corpus_ds.data.table

    def text(name: str) -> pa.Array:  # a column as strings, a null as "None" (as str() writes it)
        return pc.fill_null(corpus.column(name).combine_chunks().cast(pa.string()), "None")

    def index(col: pa.Array) -> dict[str, np.ndarray]:
        """value -> its rows, ascending (Arrow hashes the values: no Python string per row)."""
        enc = pc.dictionary_encode(col)
        inv = np.asarray(enc.indices, dtype=np.int64)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(enc.dictionary) + 1))
        return {x: order[bounds[i]:bounds[i + 1]] for i, x in enumerate(enc.dictionary.to_pylist())}

    def codes(corpus_column: str, query_column: str) -> tuple[np.ndarray, np.ndarray]:
        """One int64 code per corpus row and per query for a column's values, equal where the values are (a null
        equals a null, as Python's ``None == None``; a query value absent from the corpus equals no row)."""
        enc = pc.dictionary_encode(corpus.column(corpus_column).combine_chunks())
        null = len(enc.dictionary)
        rows = np.asarray(enc.indices.fill_null(null), dtype=np.int64)
        q = table.column(query_column).combine_chunks()
        found = pc.index_in(q.cast(enc.dictionary.type), value_set=enc.dictionary)
        queries = np.asarray(found.fill_null(-1), dtype=np.int64)
        queries[np.asarray(q.is_null(), dtype=bool)] = null
        return rows, queries

    vid = text("video_id")
    by_video, by_state = index(vid), index(text("state_id"))
    by_obj = index(pc.binary_join_element_wise(vid, text("object_id"), "\x00"))  # object ids may be per-video
    (video, q_video), (state, q_state), (type1, q_type1) = (
        codes(c, qc) for c, qc in (("video_id", "video_id"), ("state_id", "target_state_id"),
                                   ("state_type1", "target_state_type1")))
    empty = np.zeros(0, np.int64)
    exclude, temporal, semantic = [], [], []
    cols = [table.column(c).to_pylist() for c in ("video_id", "object_id", "target_state_id")]
    for i, (v, obj, st) in enumerate(zip(*cols, strict=True)):
        exclude.append(by_video.get(v, empty))
        o = by_obj.get(f"{v}\x00{obj}", empty)
        temporal.append(o[state[o] != q_state[i]])
        s = by_state.get(st, empty)
        semantic.append(s[(video[s] != q_video[i]) & (type1[s] != q_type1[i])])
    return BenchmarkGroups(pools, exclude, {"triplet_temporal": temporal, "triplet_semantic": semantic})


#: Folder (under a benchmark's ``.cache``) of `cached_benchmark_groups`, how many files it keeps, and the version of
#: their layout and of `benchmark_groups` (bump it when either changes, so that no older file is read).
GROUPS_CACHE, GROUPS_CACHE_FILES, GROUPS_CACHE_VERSION = "groups", 4, 1
_GROUPS_FILE = re.compile(r"[0-9a-f]{32}\.npz")  # `_groups_key`'s names


def _groups_key(bench: Any, query_rows: np.ndarray) -> str:
    """What `benchmark_groups` of ``query_rows`` depends on: the benchmark's files (size, mtime and inode, as
    `Benchmark.load` read them), the GT mapping, the tiers, the rows, and the cache's version."""
    h = hashlib.sha256(json.dumps([GROUPS_CACHE_VERSION, bench.source_stats, GT_DEFINITION_FIELDS,
                                   list(BENCHMARK_TIERS), list(TRIPLET_PROBES)], sort_keys=True).encode())
    h.update(np.ascontiguousarray(query_rows, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def _groups_to_arrays(g: BenchmarkGroups) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for kind, named in (("pool", g.pools), ("exclude", {"exclude": g.exclude}), ("probe", g.probes)):
        for name, lists in named.items():
            sizes = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
            values = np.concatenate([np.asarray(x, np.int64) for x in lists]) if len(lists) else np.zeros(0, np.int64)
            arrays[f"{kind}/{name}/sizes"] = sizes
            arrays[f"{kind}/{name}/rows"] = values.astype(np.int32 if values.size and values.max() < 2**31 else
                                                         np.int64)
    return arrays


def _groups_from_arrays(z: Any) -> BenchmarkGroups:
    out: dict[str, dict[str, list[np.ndarray]]] = {"pool": {}, "exclude": {}, "probe": {}}
    for key in z.files:
        kind, name, part = key.split("/")
        if part != "sizes":
            continue
        sizes = z[key]
        rows = z[f"{kind}/{name}/rows"].astype(np.int64)
        ends = np.cumsum(sizes)
        out[kind][name] = [rows[a:b] for a, b in zip((ends - sizes).tolist(), ends.tolist(), strict=True)]
    return BenchmarkGroups(out["pool"], out["exclude"]["exclude"], out["probe"])


def cached_benchmark_groups(bench: Any, table: pa.Table, query_rows: np.ndarray) -> BenchmarkGroups:
    """`benchmark_groups` of the benchmark's queries at ``query_rows`` (``table``: their rows), read from
    ``<benchmark>/.cache/groups/`` when a command computed them for the same files, GT mapping and rows
    (`_groups_key`); computed and written there otherwise (nothing is written for a benchmark that cannot be, or
    whose files changed while it loaded). At PSR scale they are millions of corpus rows, a fixed cost of every
    scoring stage (`scripts/psr_scale.py` times the stages); the folder keeps the `GROUPS_CACHE_FILES` newest."""
    if not getattr(bench, "source_stats", None):
        return benchmark_groups(bench, table)
    folder = bench.root / ".cache" / GROUPS_CACHE
    path = folder / f"{_groups_key(bench, query_rows)}.npz"
    try:
        with np.load(path) as z:
            g = _groups_from_arrays(z)
        if len(g.exclude) == len(query_rows):
            return g
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # none yet, or not one we can read
        pass
    g = benchmark_groups(bench, table)
    try:
        from eval.io import atomic_path

        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **_groups_to_arrays(g))
        ours = [p for p in folder.glob("*.npz") if _GROUPS_FILE.fullmatch(p.name)]  # only files this cache wrote
        for old in sorted(ours, key=lambda p: p.stat().st_mtime, reverse=True)[GROUPS_CACHE_FILES:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
    return g


def score_benchmark(bench: Any, source: Any, query_rows: np.ndarray | Sequence[int], *, method: str,
                    config: dict[str, Any] | None = None, k: int = 50, q_block: int = DEFAULT_Q_BLOCK,
                    c_chunk: int = DEFAULT_C_CHUNK, progress: bool = True,
                    checkpoint: str | os.PathLike | None = None, missed: np.ndarray | None = None) -> Any:
    """Score ``source`` on the benchmark queries at ``query_rows`` (source query i = benchmark row query_rows[i])
    over the whole corpus, for every GT definition and tier (`BENCHMARK_POOLS`) plus the triplet probes, under
    the PSR protocol (own video excluded except for ``in_video``). Returns an `eval.runs.Run` stamped with the
    benchmark's fingerprint (`eval.fingerprint`). With ``checkpoint``
    (a directory) finished query blocks are kept there and a rerun of the same method + config resumes.
    ``missed`` (bool, one per query) flags queries the method gave no answer for: they are scored as misses
    (`eval.runs.Run.mark_missed`: every positive after every ranked negative), whatever the source scored."""
    from eval.runs import Run

    source = as_score_source(source)
    query_rows = np.asarray(query_rows, dtype=np.int64)
    if source.n_queries != len(query_rows):
        raise InputError(f"the source has {source.n_queries} queries but {len(query_rows)} query rows were given")
    if source.n_items != len(bench.corpus_ds):
        raise InputError(f"the source scores {source.n_items} items but the corpus has {len(bench.corpus_ds)}")
    table = bench.query_table(query_rows)
    query_ids = table.column("id").to_pylist()
    pools, exclude, probes = cached_benchmark_groups(bench, table, query_rows)
    fingerprint = hashlib.sha256(json.dumps({"method": method, "config": config or {}, "benchmark": bench.name},
                                            sort_keys=True, default=str).encode()).hexdigest()[:16]
    ids = np.asarray(bench.corpus_ids, dtype=object)
    res = score_stream(source, pools, exclude, k=k, q_block=q_block, c_chunk=c_chunk, progress=progress,
                       no_exclude_pools=("in_video",), probes=probes, checkpoint=checkpoint, fingerprint=fingerprint,
                       query_ids=query_ids, item_ids=ids,
                       source_label=f"{method!r} ({source.label})")
    topk_ids = [[ids[r] if r >= 0 else "" for r in row] for row in res.topk_rows]
    run = Run(method=method, config=dict(config or {}), query_ids=query_ids, topk_ids=topk_ids,
              topk_scores=res.topk_scores, stats=res.stats, benchmark=bench.name,
              kth_tie_unlisted=res.kth_tie_unlisted, ranked=res.ranked, fingerprint=getattr(bench, "fingerprint", None))
    if missed is not None:
        n_items = source.n_items
        n_excl = np.fromiter((len(e) for e in exclude), dtype=np.int64, count=len(exclude))
        n_ranked = {p: np.full(len(query_ids), n_items, np.int64) if p == "in_video" else n_items - n_excl
                    for p in run.pools}
        run.mark_missed(np.asarray(missed, bool), n_ranked)
    return run


def expected_pool_sizes(bench: Any, query_ids: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per pool and probe of `benchmark_groups`, the ``n_pos`` that `score_benchmark` gives each of ``query_ids``
    (distinct positives, minus the own-video rows for cross-instance pools), and the number of own-video rows each
    query's cross-instance rankings leave out (int64 arrays aligned with ``query_ids``). Kept on ``bench`` per list
    of query ids: a report checks every run against it, and runs on one split share their queries."""
    # the pools follow the GT mapping read at call time (`gt_definitions_present`), so it is part of the key
    key = hashlib.sha1(json.dumps(GT_DEFINITION_FIELDS, sort_keys=True).encode() + b"\x00"
                       + "\n".join(query_ids).encode()).hexdigest()
    memo = bench.__dict__.setdefault("_expected_pool_sizes", {}) if hasattr(bench, "__dict__") else {}
    if key not in memo:
        while len(memo) >= 4:  # a report's runs share a few lists (Q1-Q4, Q5): keep the newest
            memo.pop(next(iter(memo)))
        memo[key] = _expected_pool_sizes(bench, query_ids)
    sizes, n_excl = memo[key]
    return {k: v.copy() for k, v in sizes.items()}, n_excl.copy()


def _distinct_counts(lists: Sequence[np.ndarray], n_items: int, minus: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """Per list, the number of its distinct rows, not counting those in the same query's ``minus`` list."""
    n = len(lists)

    def keys(ls: Sequence[np.ndarray]) -> np.ndarray:
        sizes = np.fromiter((len(x) for x in ls), np.int64, count=n)
        rows = np.concatenate([np.asarray(x, np.int64).ravel() for x in ls]) if n else np.zeros(0, np.int64)
        return sorted_unique(np.repeat(np.arange(n, dtype=np.int64), sizes) * n_items + rows)

    k = keys(lists)
    if minus is not None and len(k):
        m = keys(minus)
        if len(m):
            pos = np.minimum(np.searchsorted(m, k), len(m) - 1)
            k = k[m[pos] != k]
    return np.bincount(k // n_items, minlength=n).astype(np.int64) if n_items else np.zeros(n, np.int64)


def _expected_pool_sizes(bench: Any, query_ids: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    index = bench.query_index
    pools, exclude, probes = benchmark_groups(bench, bench.query_table([index[q] for q in query_ids]))
    n_items = len(bench.corpus_ds)
    out = {name: _distinct_counts(lists, n_items, None if name == "in_video" else exclude)
           for name, lists in pools.items()}
    for name, lists in probes.items():
        out[name] = _distinct_counts(lists, n_items)
    return out, _distinct_counts(exclude, n_items)
