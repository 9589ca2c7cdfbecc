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
resolved config), ``benchmark`` (name), ``benchmark_fingerprint`` (``{name, version, sha256}`` of the benchmark
it was scored on, `eval.fingerprint`), ``k``, ``pools`` (pool -> fields), ``ranked_pools`` (bit order of the
masks). Metrics need only the run, plus the benchmark for strata labels (horizon, question type, domain).

Reading validates (`read_run`, `check_run`): a rank pool holds every field of `RANK_FIELDS` (a run without its tie
columns is refused, never scored as tie-free), a probe exactly `PROBE_FIELDS`; counts are integer columns and
``best`` a float column, without nulls; per query ``n_pos >= 0``, ``n_above >= 0``, ``n_tie_neg >= 0``,
``0 <= n_tie_neg_first <= n_tie_neg``, ``0 <= n_tie_pos <= n_pos``, ``n_tie_pos >= 1`` when ``n_pos > 0``, every
count 0 and ``best`` NaN when ``n_pos = 0``, ``best`` finite when ``n_pos > 0``; top-k scores non-increasing, never
NaN or +inf, -inf exactly where the id is "" (padding); ``kth_tie_unlisted >= 0``; ranked positives with valid
masks, ``above >= 0``, ``tie >= 1``, ``pos_count >= 1``. A violation is a `eval.io.FormatError` naming the file,
the column and the query.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eval.allocators import configure as _configure_allocators
from eval.errors import InputError, UnknownName
from eval.io import FormatError, atomic_path

_configure_allocators()  # before this module's first large buffer (`eval.allocators`)

RUN_FORMAT_VERSION = "1.1"
META_KEY = b"psr_run"
INT_FIELDS = ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")
FLOAT_FIELDS = ("best",)
#: Fields of a pool with rank statistics, and of a probe (best score only; the triplet diagnostics).
RANK_FIELDS = INT_FIELDS + FLOAT_FIELDS
PROBE_FIELDS = ("n_pos", "best")
_RANKED_COLS = ("top_mask", "top_above", "top_tie", "pos_mask", "pos_count")


def is_run_file(path: Path) -> bool:
    """Recogniser of run files (`eval.outputs.check_output_file`): Parquet with the ``psr_run`` schema metadata
    (only the footer is read)."""
    return META_KEY in (pq.read_schema(path).metadata or {})


#: A run name's seed suffix: ``lftr-fusion-seed3``, ``lftr_fusion.seed=12`` (runs of one method over seeds).
SEED_SUFFIX = re.compile(r"^(?P<group>.+?)[-_.]seed[-_.=]?(?P<seed>\d+)$")


def seed_group(name: str) -> tuple[str, int | None]:
    """``("lftr-fusion", 3)`` for ``"lftr-fusion-seed3"``; ``(name, None)`` without a seed suffix."""
    m = SEED_SUFFIX.match(name)
    return (m.group("group"), int(m.group("seed"))) if m else (name, None)


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
    #: ``{name, version, sha256}`` of the benchmark the run was scored on (`eval.fingerprint`); None for a run file
    #: that records none (refused by `eval score` / `eval report`).
    fingerprint: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.topk_scores = np.asarray(self.topk_scores, dtype=np.float32)
        n = len(self.query_ids)
        if self.topk_scores.ndim != 2 or self.topk_scores.shape[0] != n or len(self.topk_ids) != n:
            raise InputError(f"run {self.method!r}: {n} query ids but topk_scores {self.topk_scores.shape} "
                             f"and {len(self.topk_ids)} top-k lists")
        for pool, d in self.stats.items():
            for f, v in d.items():
                if len(v) != n:
                    raise InputError(f"run {self.method!r}: stats[{pool!r}][{f!r}] has {len(v)} values, expected {n}")
        if self.kth_tie_unlisted is None:
            self.kth_tie_unlisted = np.zeros(n, np.int64)
        self.missed = np.zeros(n, bool) if self.missed is None else np.asarray(self.missed, bool)
        if self.missed.shape != (n,):
            raise InputError(f"run {self.method!r}: missed has shape {self.missed.shape}, expected ({n},)")
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
            raise UnknownName(f"run {self.name!r} has no query {missing[0]!r} ({len(missing)} missing)")
        rows = np.fromiter((index[q] for q in ids), dtype=np.int64, count=len(ids))
        return Run(self.method, dict(self.config), list(ids), [self.topk_ids[i] for i in rows], self.topk_scores[rows],
                   {p: {f: v[rows] for f, v in d.items()} for p, d in self.stats.items()}, self.benchmark,
                   self.kth_tie_unlisted[rows], self.ranked.select(rows) if self.ranked is not None else None,
                   self.name, self.missed[rows], dict(self.fingerprint) if self.fingerprint else None)

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
            raise InputError(f"missed has shape {missed.shape}, expected ({self.n},)")
        if not missed.any():
            return
        for pool, d in self.stats.items():
            if "n_above" not in d:
                continue
            if pool not in n_ranked:
                raise UnknownName(f"mark_missed: no ranked-item counts for pool {pool!r}")
            rows = missed & (d["n_pos"] > 0)  # an empty pool keeps its zero counts (it has no value either way)
            n_pos = d["n_pos"][rows]
            d["n_above"][rows] = np.maximum(np.asarray(n_ranked[pool])[rows] - n_pos, 0)
            d["n_tie_neg"][rows] = 0
            d["n_tie_neg_first"][rows] = 0
            d["n_tie_pos"][rows] = n_pos
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
    """Write ``run`` to a Parquet file atomically (see the module docstring for the layout); returns the path.
    A run that `check_run` refuses is not written (`eval.errors.InputError`)."""
    path = Path(path)
    problem = check_run(run)
    if problem is not None:
        raise InputError(f"run {run.name!r} not written to {path}: {problem[0]}: {problem[1]}")
    n, k = run.n, run.k
    flat_ids = [x for row in run.topk_ids for x in row]
    if len(flat_ids) != n * k:
        raise InputError(f"run {run.name!r}: every top-k list must hold k={k} ids")
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
            "benchmark": run.benchmark, "benchmark_fingerprint": run.fingerprint, "k": k,
            "pools": {p: list(d) for p, d in run.stats.items()},
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


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _dtype_problem(v: np.ndarray, kind: str) -> tuple[int, str] | None:
    """(row, message) when ``v`` is not an integer (``kind="int"``) / float (``"float"``) column."""
    ok = np.issubdtype(v.dtype, np.integer) if kind == "int" else np.issubdtype(v.dtype, np.floating)
    if ok:
        return None
    row = 0
    if kind == "int" and np.issubdtype(v.dtype, np.floating):  # point at the value that could not be a count
        row = _first(~np.isfinite(v) | (v != np.round(v))) or 0
    what = "integer counts" if kind == "int" else "float scores"
    value = v[row].item() if isinstance(v[row], np.generic) else v[row]
    return row, f"expected {what}, got a {v.dtype} column (value {value!r}); nothing is cast silently"


def _stat_checks(d: dict[str, np.ndarray], rank: bool) -> list[tuple[str, np.ndarray, Any]]:
    """(field, bad-row mask, message(row)) for one pool's values (see the module docstring)."""
    n_pos, best = d["n_pos"], np.asarray(d["best"], np.float64)
    has = n_pos > 0
    checks: list[tuple[str, np.ndarray, Any]] = [
        ("n_pos", n_pos < 0, lambda i: f"n_pos = {n_pos[i]} < 0"),
        ("best", has & ~np.isfinite(best), lambda i: f"best = {best[i]} with n_pos = {n_pos[i]}: a non-empty pool's "
                                                     "best score must be finite"),
        ("best", ~has & ~np.isnan(best), lambda i: f"best = {best[i]} but the pool is empty (n_pos = 0): expected NaN"),
    ]
    if not rank:
        return checks
    above, tn, tp, tf = d["n_above"], d["n_tie_neg"], d["n_tie_pos"], d["n_tie_neg_first"]
    return checks + [
        ("n_above", above < 0, lambda i: f"n_above = {above[i]} < 0"),
        ("n_tie_neg", tn < 0, lambda i: f"n_tie_neg = {tn[i]} < 0"),
        ("n_tie_neg_first", (tf < 0) | (tf > tn), lambda i: f"n_tie_neg_first = {tf[i]} outside [0, n_tie_neg = "
                                                             f"{tn[i]}]"),
        ("n_tie_pos", (tp < 0) | (tp > n_pos), lambda i: f"n_tie_pos = {tp[i]} outside [0, n_pos = {n_pos[i]}]"),
        ("n_tie_pos", has & (tp < 1), lambda i: f"n_tie_pos = {tp[i]} with n_pos = {n_pos[i]}: the best positive "
                                                "ties with itself, so n_tie_pos >= 1"),
        ("n_above", ~has & ((above != 0) | (tn != 0) | (tp != 0) | (tf != 0)),
         lambda i: f"an empty pool (n_pos = 0) has counts n_above = {above[i]}, n_tie_neg = {tn[i]}, n_tie_pos = "
                   f"{tp[i]}, n_tie_neg_first = {tf[i]}: expected 0"),
    ]


def _check_pools(run: Run) -> tuple[str, str] | None:
    at = lambda i, msg: f"row {i} (query {run.query_ids[i]!r}): {msg}"  # noqa: E731
    for pool, d in run.stats.items():
        fields = set(d)
        want = PROBE_FIELDS if fields <= set(PROBE_FIELDS) else RANK_FIELDS
        missing = [f for f in want if f not in fields]
        if missing:
            kind = ("a pool with rank statistics needs " + ", ".join(RANK_FIELDS) + " (without its tie columns it "
                    "cannot be scored tie-aware)") if want is RANK_FIELDS else "a probe needs n_pos and best"
            return f"{pool}/{missing[0]}", f"column missing: {kind}"
        extra = sorted(fields - set(want))
        if extra:
            return f"{pool}/{extra[0]}", f"unknown field of a {'rank pool' if want is RANK_FIELDS else 'probe'}"
        for f in want:
            bad = _dtype_problem(np.asarray(d[f]), "float" if f in FLOAT_FIELDS else "int")
            if bad is not None:
                return f"{pool}/{f}", at(*bad)
        for f, mask, msg in _stat_checks(d, want is RANK_FIELDS):
            i = _first(mask)
            if i is not None:
                return f"{pool}/{f}", at(i, msg(i))
    return None


def _excerpt(row: np.ndarray, j: int, width: int = 2) -> str:
    """Scores ``j - width .. j + width + 1`` of a row for a message (a top-50 list is too long to print)."""
    a, b = max(0, j - width), min(len(row), j + width + 2)
    return f"scores {a}..{b - 1} of {len(row)}: {row[a:b].tolist()}"


def _check_topk(run: Run) -> tuple[str, str] | None:
    at = lambda i, msg: f"row {i} (query {run.query_ids[i]!r}): {msg}"  # noqa: E731
    sc = run.topk_scores
    i = _first(np.isnan(sc).any(1) | (sc == np.inf).any(1))
    if i is not None:
        j = int(np.flatnonzero(np.isnan(sc[i]) | (sc[i] == np.inf))[0])
        return "topk_scores", at(i, f"score {j} is {sc[i, j]} ({_excerpt(sc[i], j)}): NaN or +inf")
    pad = np.fromiter((x == "" for row in run.topk_ids for x in row), bool, count=sc.size).reshape(sc.shape)
    i = _first(((sc == -np.inf) != pad).any(1))
    if i is not None:
        return "topk_scores", at(i, "a -inf score must pad an empty id ('') and an empty id carry -inf")
    i = _first((sc[:, 1:] > sc[:, :-1]).any(1))
    if i is not None:
        j = int(np.flatnonzero(sc[i, 1:] > sc[i, :-1])[0])
        return "topk_scores", at(i, f"score {j + 1} ({sc[i, j + 1]}) exceeds score {j} ({sc[i, j]}): not in "
                                    f"non-increasing order ({_excerpt(sc[i], j)})")
    unlisted = np.asarray(run.kth_tie_unlisted)
    bad = _dtype_problem(unlisted, "int")
    if bad is not None:
        return "kth_tie_unlisted", at(*bad)
    i = _first(unlisted < 0)
    return None if i is None else ("kth_tie_unlisted", at(i, f"kth_tie_unlisted = {unlisted[i]} < 0"))


def _check_ranked(run: Run) -> tuple[str, str] | None:
    r = run.ranked
    if r is None:
        return None
    unknown = [p for p in r.pool_names if p not in run.stats]
    if unknown:
        return "ranked/top_mask", f"ranked_pools name {unknown[0]!r}, which has no statistics in the run"
    for col, off in (("ranked/top_mask", r.top_offsets), ("ranked/pos_mask", r.count_offsets)):
        if len(off) != run.n + 1:
            return col, f"{len(off) - 1} lists for {run.n} queries"
    limit = 1 << len(r.pool_names)
    for col, off, v, bad in (("ranked/top_mask", r.top_offsets, r.mask, (r.mask <= 0) | (r.mask >= limit)),
                             ("ranked/top_above", r.top_offsets, r.above, r.above < 0),
                             ("ranked/top_tie", r.top_offsets, r.tie, r.tie < 1),
                             ("ranked/pos_mask", r.count_offsets, r.pos_mask, (r.pos_mask <= 0) | (r.pos_mask >= limit)),
                             ("ranked/pos_count", r.count_offsets, r.pos_count, r.pos_count < 1)):
        j = _first(bad)
        if j is not None:
            i = int(np.searchsorted(off, j, side="right")) - 1
            return col, f"row {i} (query {run.query_ids[i]!r}): invalid value {int(v[j])}"
    return None


def check_run(run: Run) -> tuple[str, str] | None:
    """The first problem of ``run`` as ``(column, message naming the row and query id)``, None when it is sound
    (the rules are in the module docstring)."""
    return _check_pools(run) or _check_topk(run) or _check_ranked(run)


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


def _read_meta(path: Path, table: pa.Table) -> dict:
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
    if not isinstance(meta["k"], int) or meta["k"] < 1 or not isinstance(meta["pools"], dict):
        raise FormatError(path, f"k = {meta['k']!r} and pools must be a positive integer and an object", field="k")
    fp = meta.get("benchmark_fingerprint")
    if fp is not None and not (isinstance(fp, dict) and {"name", "version", "sha256"} <= set(fp)):
        raise FormatError(path, f"expected {{name, version, sha256}}, got {fp!r}", field="benchmark_fingerprint")
    return meta


def _column(path: Path, table: pa.Table, col: str) -> np.ndarray:
    c = table.column(col)
    if c.null_count:
        raise FormatError(path, f"null value in row {_first(c.is_null().to_numpy(zero_copy_only=False))}", field=col)
    return c.to_numpy(zero_copy_only=False)


def _ranked(path: Path, table: pa.Table, meta: dict) -> RankedPositives | None:
    if meta.get("ranked_pools") is None:
        return None
    got = {}
    for c in _RANKED_COLS:
        if f"ranked/{c}" not in table.column_names:
            raise FormatError(path, "column missing", field=f"ranked/{c}")
        got[c] = _offsets(path, table, f"ranked/{c}")
        bad = _dtype_problem(np.asarray(got[c][1]), "int")
        if bad is not None:
            raise FormatError(path, bad[1], field=f"ranked/{c}")
    return RankedPositives(list(meta["ranked_pools"]), got["top_mask"][0], got["top_mask"][1].astype(np.int64),
                           got["top_above"][1].astype(np.int64), got["top_tie"][1].astype(np.int64),
                           got["pos_mask"][0], got["pos_mask"][1].astype(np.int64), got["pos_count"][1].astype(np.int64))


def read_run(path: str | os.PathLike) -> Run:
    """Read a run written by `write_run` and validate it (`check_run`); a malformed or inconsistent file raises
    `FormatError` naming the file, the column and (for a bad value) the row and query id."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"run file {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise FormatError(path, f"not a readable Parquet run file ({e})") from None
    meta = _read_meta(path, table)
    names = set(table.column_names)
    need = ["query_id", "topk_ids", "topk_scores"] + [f"{p}/{f}" for p, fs in meta["pools"].items() for f in fs]
    for col in need:
        if col not in names:
            raise FormatError(path, "column missing", field=col)
    n, k = table.num_rows, int(meta["k"])
    qids = table.column("query_id").to_pylist()
    if any(not isinstance(q, str) or not q for q in qids):
        raise FormatError(path, f"row {next(i for i, q in enumerate(qids) if not isinstance(q, str) or not q)}: "
                                "query ids must be non-empty strings", field="query_id")
    if len(set(qids)) != n:
        raise FormatError(path, "duplicate query ids", field="query_id")
    off, ids = _offsets(path, table, "topk_ids")
    off_s, scores = _offsets(path, table, "topk_scores")
    for col, o in (("topk_ids", off), ("topk_scores", off_s)):
        bad = np.flatnonzero(np.diff(o) != k)
        if bad.size:
            raise FormatError(path, f"row {int(bad[0])} (query {qids[int(bad[0])]}) holds {int(np.diff(o)[bad[0]])} "
                                    f"entries, expected k={k}", field=col)
    if _dtype_problem(np.asarray(scores), "float") is not None or any(not isinstance(x, str) for x in ids):
        raise FormatError(path, "expected list<float> scores and list<string> ids", field="topk_scores")
    topk_ids = [list(ids[i * k:(i + 1) * k]) for i in range(n)]
    stats = {p: {f: _column(path, table, f"{p}/{f}") for f in fs} for p, fs in meta["pools"].items()}
    unlisted = _column(path, table, "kth_tie_unlisted") if "kth_tie_unlisted" in names else np.zeros(n, np.int64)
    missed = _column(path, table, "missed") if "missed" in names else np.zeros(n, bool)
    if missed.dtype != bool:
        raise FormatError(path, f"expected a bool column, got {missed.dtype}", field="missed")
    run = Run(method=str(meta["method"]), config=dict(meta.get("config") or {}), query_ids=qids, topk_ids=topk_ids,
              topk_scores=np.asarray(scores, np.float32).reshape(n, k), stats=stats, benchmark=str(meta["benchmark"]),
              kth_tie_unlisted=unlisted, ranked=_ranked(path, table, meta), name=str(meta.get("name") or meta["method"]),
              missed=missed, fingerprint=meta.get("benchmark_fingerprint"))
    problem = check_run(run)
    if problem is not None:
        raise FormatError(path, problem[1], field=problem[0])
    run.kth_tie_unlisted = np.asarray(run.kth_tie_unlisted).astype(np.int64)
    for d in run.stats.values():  # lossless: the dtypes were checked above; copies, so the run can be edited
        for f in d:
            d[f] = np.asarray(d[f]).astype(np.float32 if f in FLOAT_FIELDS else np.int64)
    return run
