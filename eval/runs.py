"""The run file: one scored method on one benchmark (DESIGN.md "Run").

A run is one Parquet file (``*.parquet``), one row per query, written atomically. Columns::

    query_id            string
    topk_ids            list<string>    the top-k corpus ids, best first (own video removed; ties by corpus row)
    topk_scores         list<float32>   their scores
    kth_tie_unlisted    int64           items tied with the k-th score that did not fit in the list
    missed              bool            the method gave no answer for this query (scored as a miss, `Run.mark_missed`)
    <pool>/<field>      int64 | float32 rank statistics per GT pool (see `eval.scoring`): n_pos, n_above,
                                        n_tie_neg, n_tie_pos, n_tie_neg_first, best; probes hold n_pos, best
    ranked/top_mask     list<int64>     positives at or above the k-th score: pool bitmask ...
    ranked/top_above    list<int64>     ... ranked items strictly above it ...
    ranked/top_tie      list<int64>     ... size of its tie group
    ranked/pos_mask     list<int64>     distinct pool bitmasks of the query's positives ...
    ranked/pos_count    list<int64>     ... and how many positives carry each

The Arrow schema metadata key ``psr_run`` holds JSON: ``format_version``, ``method``, ``config`` (the method's
resolved config), ``benchmark`` (name), ``k``, ``pools`` (pool -> fields), ``ranked_pools`` (bit order of the
masks). Metrics need only the run, plus the benchmark for strata labels (horizon, question type, domain).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eval.io import FormatError, atomic_path

RUN_FORMAT_VERSION = "1.0"
META_KEY = b"psr_run"
INT_FIELDS = ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")
FLOAT_FIELDS = ("best",)
_RANKED_COLS = ("top_mask", "top_above", "top_tie", "pos_mask", "pos_count")


@dataclass
class RankedPositives:
    """Per-query information for tie-aware graded metrics (nDCG), CSR layout (offsets of length n_q + 1).

    Bit ``b`` of a mask means "in pool ``pool_names[b]``"; only positives of the main ranking (own video
    excluded) appear.

    - ``mask``, ``above``, ``tie`` (rows ``top_offsets[i]:top_offsets[i+1]`` for query i): every positive scoring at
      least the k-th score, its mask, the number of ranked items strictly above it, and its tie-group size
      (itself included; counted over the whole ranking).
    - ``pos_mask``, ``pos_count`` (``count_offsets``): the distinct masks of the query's positives and how many
      positives carry each.
    """

    pool_names: list[str]
    top_offsets: np.ndarray
    mask: np.ndarray
    above: np.ndarray
    tie: np.ndarray
    count_offsets: np.ndarray
    pos_mask: np.ndarray
    pos_count: np.ndarray

    def select(self, rows: np.ndarray) -> RankedPositives:
        """The same information restricted to queries ``rows`` (in that order)."""
        rows = np.asarray(rows, dtype=np.int64)

        def take(off: np.ndarray, *arrs: np.ndarray):
            lens = off[rows + 1] - off[rows]
            new_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            flat = np.repeat(off[rows] - new_off[:-1], lens) + np.arange(new_off[-1])
            return (new_off, *(a[flat] for a in arrs))

        to, m, a, t = take(self.top_offsets, self.mask, self.above, self.tie)
        co, pm, pc = take(self.count_offsets, self.pos_mask, self.pos_count)
        return RankedPositives(list(self.pool_names), to, m, a, t, co, pm, pc)

    def without_top(self, queries: np.ndarray) -> RankedPositives:
        """A copy in which the queries flagged in ``queries`` (bool, n_q) have no positives above the k-th score."""
        lens = np.diff(self.top_offsets)
        keep = np.repeat(~np.asarray(queries, bool), lens)
        new_off = np.concatenate([[0], np.cumsum(np.where(queries, 0, lens))]).astype(np.int64)
        return RankedPositives(list(self.pool_names), new_off, self.mask[keep], self.above[keep], self.tie[keep],
                               self.count_offsets.copy(), self.pos_mask.copy(), self.pos_count.copy())


@dataclass
class Run:
    """One method scored on one benchmark.

    ``topk_scores`` float32 (n, k) (-inf pads a ranking shorter than k; ``topk_ids`` then holds ""),
    ``stats[pool][field]`` arrays of length n (see `eval.scoring`), ``kth_tie_unlisted`` int64 (n,),
    ``ranked`` the graded-metric information (None for runs that do not carry it: nDCG is then unavailable).
    """

    method: str
    config: dict[str, Any]
    query_ids: list[str]
    topk_ids: list[list[str]]
    topk_scores: np.ndarray
    stats: dict[str, dict[str, np.ndarray]]
    benchmark: str
    kth_tie_unlisted: np.ndarray | None = None
    ranked: RankedPositives | None = None
    name: str = field(default="")
    #: bool (n,): queries the method gave no answer for (a failed or unparseable forecast); see `mark_missed`.
    missed: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.topk_scores = np.asarray(self.topk_scores, dtype=np.float32)
        n = len(self.query_ids)
        if self.topk_scores.ndim != 2 or self.topk_scores.shape[0] != n or len(self.topk_ids) != n:
            raise ValueError(f"run {self.method!r}: {n} query ids but topk_scores {self.topk_scores.shape} "
                             f"and {len(self.topk_ids)} top-k lists")
        for pool, d in self.stats.items():
            for f, v in d.items():
                if len(v) != n:
                    raise ValueError(f"run {self.method!r}: stats[{pool!r}][{f!r}] has {len(v)} values, expected {n}")
        if self.kth_tie_unlisted is None:
            self.kth_tie_unlisted = np.zeros(n, np.int64)
        self.missed = np.zeros(n, bool) if self.missed is None else np.asarray(self.missed, bool)
        if self.missed.shape != (n,):
            raise ValueError(f"run {self.method!r}: missed has shape {self.missed.shape}, expected ({n},)")
        if not self.name:
            self.name = self.method

    @property
    def n(self) -> int:
        return len(self.query_ids)

    @property
    def k(self) -> int:
        return int(self.topk_scores.shape[1])

    @property
    def pools(self) -> list[str]:
        """Pools with rank statistics (probes, which only hold ``best``, excluded)."""
        return [p for p, d in self.stats.items() if "n_above" in d]

    def select(self, ids: list[str]) -> Run:
        """The run restricted to query ``ids`` (in that order); unknown ids raise KeyError."""
        index = {q: i for i, q in enumerate(self.query_ids)}
        missing = [q for q in ids if q not in index]
        if missing:
            raise KeyError(f"run {self.name!r} has no query {missing[0]!r} ({len(missing)} missing)")
        rows = np.fromiter((index[q] for q in ids), dtype=np.int64, count=len(ids))
        return Run(self.method, dict(self.config), list(ids), [self.topk_ids[i] for i in rows], self.topk_scores[rows],
                   {p: {f: v[rows] for f, v in d.items()} for p, d in self.stats.items()}, self.benchmark,
                   self.kth_tie_unlisted[rows], self.ranked.select(rows) if self.ranked is not None else None,
                   self.name, self.missed[rows])

    def mark_missed(self, missed: np.ndarray, n_ranked: dict[str, np.ndarray]) -> None:
        """Score the queries flagged in ``missed`` as misses, in place.

        A miss is a query the method gave no answer for (the forecaster failed or its output did not parse). Whatever
        the source scored for it, its positives are placed after every ranked negative: for each pool
        ``n_above = n_ranked - n_pos``, ``n_tie_neg = 0``, ``n_tie_pos = n_pos``, so the first GT rank is
        ``n_ranked - n_pos + 1`` (R@k = 0 for every k below it, MRR ~ 0), its top-k list is emptied and it has
        no positives above the k-th score (nDCG = 0). ``n_ranked[pool]`` (n,) is the number of items ranked for
        each query in that pool (the corpus minus the query's excluded rows).
        """
        missed = np.asarray(missed, bool)
        if missed.shape != (self.n,):
            raise ValueError(f"missed has shape {missed.shape}, expected ({self.n},)")
        if not missed.any():
            return
        for pool, d in self.stats.items():
            if "n_above" not in d:
                continue
            if pool not in n_ranked:
                raise KeyError(f"mark_missed: no ranked-item counts for pool {pool!r}")
            n_pos = d["n_pos"][missed]
            d["n_above"][missed] = np.maximum(np.asarray(n_ranked[pool])[missed] - n_pos, 0)
            d["n_tie_neg"][missed] = 0
            d["n_tie_neg_first"][missed] = 0
            d["n_tie_pos"][missed] = n_pos
        self.topk_scores[missed] = -np.inf
        for i in np.flatnonzero(missed):
            self.topk_ids[i] = [""] * self.k
        self.kth_tie_unlisted[missed] = 0
        if self.ranked is not None:
            self.ranked = self.ranked.without_top(missed)
        self.missed = self.missed | missed


def _list_array(offsets: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, np.int32)), pa.array(values, type=typ))


def write_run(path: str | os.PathLike, run: Run) -> Path:
    """Write ``run`` to a Parquet file atomically (see the module docstring for the layout); returns the path."""
    path = Path(path)
    n, k = run.n, run.k
    flat_ids = [x for row in run.topk_ids for x in row]
    if len(flat_ids) != n * k:
        raise ValueError(f"run {run.name!r}: every top-k list must hold k={k} ids")
    offsets = np.arange(0, n * k + 1, k, dtype=np.int64)
    cols: dict[str, pa.Array] = {
        "query_id": pa.array(run.query_ids, type=pa.string()),
        "topk_ids": _list_array(offsets, np.asarray(flat_ids, dtype=object), pa.string()),
        "topk_scores": _list_array(offsets, run.topk_scores.ravel(), pa.float32()),
        "kth_tie_unlisted": pa.array(np.asarray(run.kth_tie_unlisted, np.int64)),
        "missed": pa.array(np.asarray(run.missed, bool)),
    }
    for pool, d in run.stats.items():
        for f, v in d.items():
            typ = pa.float32() if f in FLOAT_FIELDS else pa.int64()
            cols[f"{pool}/{f}"] = pa.array(np.asarray(v, np.float32 if f in FLOAT_FIELDS else np.int64), type=typ)
    meta = {"format_version": RUN_FORMAT_VERSION, "method": run.method, "name": run.name, "config": run.config,
            "benchmark": run.benchmark, "k": k, "pools": {p: list(d) for p, d in run.stats.items()},
            "ranked_pools": run.ranked.pool_names if run.ranked is not None else None}
    if run.ranked is not None:
        r = run.ranked
        for name, off, vals in (("top_mask", r.top_offsets, r.mask), ("top_above", r.top_offsets, r.above),
                                ("top_tie", r.top_offsets, r.tie), ("pos_mask", r.count_offsets, r.pos_mask),
                                ("pos_count", r.count_offsets, r.pos_count)):
            cols[f"ranked/{name}"] = _list_array(off, np.asarray(vals, np.int64), pa.int64())
    table = pa.table(cols).replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def _offsets(path: Path, table: pa.Table, col: str) -> tuple[np.ndarray, np.ndarray]:
    arr = table.column(col).combine_chunks()
    if not pa.types.is_list(arr.type):
        raise FormatError(path, f"expected a list column, got {arr.type}", field=col)
    if arr.null_count:
        raise FormatError(path, f"null list in row {int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])}",
                          field=col)
    off = arr.offsets.to_numpy().astype(np.int64)
    off = off - off[0]
    return off, arr.flatten().to_numpy(zero_copy_only=False)


def read_run(path: str | os.PathLike) -> Run:
    """Read a run written by `write_run`; a malformed file raises `FormatError` naming the file and the field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run file {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise FormatError(path, f"not a readable Parquet run file ({e})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise FormatError(path, "no 'psr_run' schema metadata: not a run written by eval.runs.write_run")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as e:
        raise FormatError(path, f"run metadata is not valid JSON ({e.msg})") from None
    for key in ("method", "k", "pools", "benchmark"):
        if key not in meta:
            raise FormatError(path, "missing from the run metadata", field=key)
    if str(meta.get("format_version", "")).split(".")[0] != RUN_FORMAT_VERSION.split(".")[0]:
        raise FormatError(path, f"run format {meta.get('format_version')!r}, this reader knows {RUN_FORMAT_VERSION}")
    names = set(table.column_names)
    need = ["query_id", "topk_ids", "topk_scores"] + [f"{p}/{f}" for p, fs in meta["pools"].items() for f in fs]
    for col in need:
        if col not in names:
            raise FormatError(path, "column missing", field=col)
    n, k = table.num_rows, int(meta["k"])
    qids = table.column("query_id").to_pylist()
    if any(q is None for q in qids):
        raise FormatError(path, "null query id", field="query_id")
    if len(set(qids)) != n:
        raise FormatError(path, "duplicate query ids", field="query_id")
    off, ids = _offsets(path, table, "topk_ids")
    off_s, scores = _offsets(path, table, "topk_scores")
    for col, o in (("topk_ids", off), ("topk_scores", off_s)):
        bad = np.flatnonzero(np.diff(o) != k)
        if bad.size:
            raise FormatError(path, f"row {int(bad[0])} (query {qids[int(bad[0])]}) holds {int(np.diff(o)[bad[0]])} "
                                    f"entries, expected k={k}", field=col)
    topk_ids = [list(ids[i * k:(i + 1) * k]) for i in range(n)]
    stats: dict[str, dict[str, np.ndarray]] = {}
    for p, fs in meta["pools"].items():
        stats[p] = {}
        for f in fs:
            col = table.column(f"{p}/{f}")
            if col.null_count:
                raise FormatError(path, "null values", field=f"{p}/{f}")
            stats[p][f] = col.to_numpy().astype(np.float32 if f in FLOAT_FIELDS else np.int64)
    unlisted = (table.column("kth_tie_unlisted").to_numpy().astype(np.int64) if "kth_tie_unlisted" in names
                else np.zeros(n, np.int64))
    missed = (table.column("missed").to_numpy(zero_copy_only=False).astype(bool) if "missed" in names
              else np.zeros(n, bool))
    ranked = None
    if meta.get("ranked_pools") is not None:
        got = {}
        for c in _RANKED_COLS:
            if f"ranked/{c}" not in names:
                raise FormatError(path, "column missing", field=f"ranked/{c}")
            got[c] = _offsets(path, table, f"ranked/{c}")
        ranked = RankedPositives(list(meta["ranked_pools"]), got["top_mask"][0], got["top_mask"][1].astype(np.int64),
                                 got["top_above"][1].astype(np.int64), got["top_tie"][1].astype(np.int64),
                                 got["pos_mask"][0], got["pos_mask"][1].astype(np.int64),
                                 got["pos_count"][1].astype(np.int64))
    return Run(method=str(meta["method"]), config=dict(meta.get("config") or {}), query_ids=qids, topk_ids=topk_ids,
               topk_scores=np.asarray(scores, np.float32).reshape(n, k), stats=stats, benchmark=str(meta["benchmark"]),
               kth_tie_unlisted=unlisted, ranked=ranked, name=str(meta.get("name") or meta["method"]), missed=missed)
