"""Loading a benchmark directory (see `eval.schema` for the layout and records).

The three JSONL files are loaded through the `datasets` library into Arrow tables that are cached beside the
benchmark (``<dir>/.cache/``) and memory-mapped, so the full PSR release (20,182 queries, 218,276 segments,
51,362 states) opens in seconds after the first load. Typed records (`Query`, `Segment`, `State`) are built on
access. Loading does not validate cross-references: run ``python -m eval validate DIR`` for that.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eval import features as feats
from eval.allocators import configure as _configure_allocators
from eval.errors import InputError, MissingInput, UnknownName
from eval.io import FormatError, read_json
from eval.schema import (
    GT_DEFINITION_FIELDS,
    GT_TIERS,
    QUERY_FEATURES,
    SEGMENT_FEATURES,
    SPLITS,
    STATE_FEATURES,
    Manifest,
    Query,
    Segment,
    State,
)

_configure_allocators()  # before this module's first large buffer (`eval.allocators`)

REQUIRED_FILES = ("manifest.json", "queries.jsonl", "corpus.jsonl", "states.jsonl")


def _cache_dir(root: Path) -> str | None:
    d = root / ".cache" / "datasets"
    try:
        d.mkdir(parents=True, exist_ok=True)
        return str(d) if os.access(d, os.W_OK) else None
    except OSError:
        return None  # read-only benchmark: fall back to the datasets default cache


def _file_stats(root: Path) -> list[list[Any]]:
    """``[name, size, mtime_ns, inode]`` of each required file of the benchmark at ``root``."""
    out = []
    for name in REQUIRED_FILES:
        st = (root / name).stat()
        out.append([name, st.st_size, st.st_mtime_ns, st.st_ino])
    return out


#: Where `Benchmark.load` notes that the files it read passed its checks (`_validated`); bump the version when a check
#: is added or changed, so that every benchmark is checked again.
VALIDATED_FILE, VALIDATION_VERSION = "validated.json", 1


def _validation_key(stats: list[list[Any]]) -> str:
    """The key of a passed validation: the checks' version, the schemas and the files' ``[name, size, mtime_ns,
    inode]`` (any write to a file changes its mtime)."""
    import hashlib
    import json

    schemas = [repr(f) for f in (QUERY_FEATURES, SEGMENT_FEATURES, STATE_FEATURES)]
    return hashlib.sha256(json.dumps([VALIDATION_VERSION, schemas, stats]).encode()).hexdigest()


def _validated(root: Path, key: str) -> bool:
    """Whether ``<root>/.cache/validated.json`` says these very files passed the checks of `_load_jsonl`."""
    try:
        return read_json(root / ".cache" / VALIDATED_FILE).get("key") == key
    except (OSError, ValueError, AttributeError, FormatError):
        return False


def _note_validated(root: Path, key: str) -> None:
    """Write the note `_validated` reads (nothing where the benchmark is read-only)."""
    from eval.atomic import write_json

    try:
        (root / ".cache").mkdir(parents=True, exist_ok=True)
        write_json(root / ".cache" / VALIDATED_FILE, {"key": key})
    except OSError:
        pass


def _load_jsonl(path: Path, features: datasets.Features, cache_dir: str | None, *,
                check: bool = True) -> datasets.Dataset:
    """``path`` as a memory-mapped `datasets.Dataset` (Arrow, cached under ``cache_dir``); ``check``: refuse
    invalid UTF-8, null required fields and repeated ids (`Benchmark.load` skips them for files that passed)."""
    if path.stat().st_size == 0:
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    try:
        with _quiet_json_reader():  # it logs its own error line; ours below names the line and field instead
            ds = datasets.Dataset.from_json(str(path), features=features, cache_dir=cache_dir)
    except Exception as e:  # datasets wraps Arrow parse errors in several types; name the file and the line
        from eval.validate import first_record_problem

        fix = f"`python -m eval validate {path.parent}` lists every problem"
        p = first_record_problem(path)
        if p is not None:
            raise FormatError(path, p.message, line=p.line, field=p.field, fix=fix) from None
        raise FormatError(path, f"could not be loaded as JSONL with the expected schema ({type(e).__name__}: "
                                f"{_cause(e)})", fix=fix) from None
    if check:
        _check_arrow(path, ds)
        _check_required(path, ds)
        _check_unique_ids(path, ds)
    return ds


def _check_unique_ids(path: Path, ds: datasets.Dataset) -> None:
    """Refuse a file whose ``id`` repeats (a lookup by id would silently keep one of the records), naming the lines
    of both occurrences (the distinct count is one Arrow kernel; lines are found only on failure)."""
    import pyarrow.compute as pc

    if "id" not in ds.column_names or not len(ds):
        return
    col = ds.data.table.column("id")
    n_distinct = pc.count_distinct(col).as_py()
    if n_distinct == len(col):
        return
    seen: dict[str, int] = {}
    for row, x in enumerate(col.to_pylist()):
        if x in seen:
            first, second = _record_lines(path, [seen[x], row])
            raise FormatError(path, f"duplicate id {x!r}, first on line {first} ({len(col) - n_distinct:,} repeated "
                                    "id(s) in the file)", line=second, field="id",
                              fix="give every record its own id; `python -m eval validate` lists every repeat")
        seen[x] = row


def _record_lines(path: Path, rows: list[int]) -> list[int]:
    """The 1-based file lines of records ``rows`` (record = non-blank line, in file order)."""
    want, out, r = set(rows), {}, -1
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            if raw.strip():
                r += 1
                if r in want:
                    out[r] = i
    return [out.get(x, x + 1) for x in rows]


def _check_required(path: Path, ds: datasets.Dataset) -> None:
    """A required field that is missing or null loads as an Arrow null (and breaks a job far from the file): refuse
    it here, naming the line (the column null counts cost nothing; the line scan runs only on failure)."""
    from eval.schema import REQUIRED_QUERY_FIELDS, REQUIRED_SEGMENT_FIELDS, REQUIRED_STATE_FIELDS

    required = {"queries.jsonl": REQUIRED_QUERY_FIELDS, "corpus.jsonl": REQUIRED_SEGMENT_FIELDS,
                "states.jsonl": REQUIRED_STATE_FIELDS}.get(path.name, {})
    table = ds.data.table
    nulls = [name for name in required if name in table.column_names and table.column(name).null_count]
    if not nulls:
        return
    from eval.validate import first_record_problem

    fix = f"`python -m eval validate {path.parent}` lists every problem"
    p = first_record_problem(path)
    if p is not None:
        raise FormatError(path, p.message, line=p.line, field=p.field, fix=fix)
    row = int(np.flatnonzero(np.asarray(table.column(nulls[0]).is_null()))[0])
    raise FormatError(path, f"required field missing or null in record {row + 1}", field=nulls[0], fix=fix)


@contextlib.contextmanager
def _quiet_json_reader():
    log = logging.getLogger("datasets.packaged_modules.json.json")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _cause(e: BaseException) -> str:
    """The innermost message of a wrapped error (datasets wraps the Arrow reader's in DatasetGenerationError)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return " ".join(str(e).split())[:300]


def _read_manifest(path: Path) -> Manifest:
    """``manifest.json`` as a `Manifest`; a wrong shape names the file and the field."""
    d = read_json(path)
    if not isinstance(d, dict):
        raise FormatError(path, f"expected a JSON object, got {type(d).__name__}")
    for name in ("name", "version"):
        if not isinstance(d.get(name), str):
            raise FormatError(path, "required string field missing or not a string", field=name)
    for name, typ in (("counts", dict), ("spaces", dict), ("domains", list), ("extra", dict)):
        if d.get(name) is not None and not isinstance(d[name], typ):
            raise FormatError(path, f"expected {typ.__name__}, got {type(d[name]).__name__}", field=name)
    return Manifest.from_dict(d)


def _check_links(root: Path) -> None:
    """Refuse a benchmark whose links are broken or whose source build changed (`eval.validate.link_problems`)."""
    from eval.validate import REBUILD_HINT, link_problems

    probs = link_problems(root)
    if probs:
        p = probs[0]
        more = f" (and {len(probs) - 1} more link problem(s))" if len(probs) > 1 else ""
        raise FormatError(root / p.file, p.message + more, field=p.field, fix=REBUILD_HINT.format(root=root))


def _check_arrow(path: Path, ds: datasets.Dataset) -> None:
    """Full Arrow validation of the loaded table: the JSON reader accepts invalid UTF-8 in strings, which would
    only fail later, far from the file. Cheap (C++, no Python per row: ~0.05 s for the PSR release)."""
    try:
        ds.data.table.validate(full=True)
    except pa.ArrowInvalid as e:
        m = re.match(r"Column (\d+)", str(e))
        col = ds.column_names[int(m.group(1))] if m and int(m.group(1)) < len(ds.column_names) else None
        line, detail = _first_bad_utf8(path)
        if line is None:
            raise FormatError(path, f"invalid data ({e})", field=col) from None
        raise FormatError(path, f"not valid UTF-8 ({detail})", line=line, field=col,
                          fix="re-encode the file as UTF-8") from None


def _first_bad_utf8(path: Path) -> tuple[int | None, str]:
    """The 1-based line of the first invalid UTF-8 byte sequence in ``path``, and what it is."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return i, f"byte 0x{raw[e.start]:02x} at column {e.start + 1}: {e.reason}"
    return None, ""


def _split(a: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``a`` cut into consecutive views of ``sizes`` (``np.split`` at the cumulative sizes, several times faster for
    tens of thousands of pieces)."""
    ends = np.cumsum(sizes)
    return [a[s:e] for s, e in zip((ends - sizes).tolist(), ends.tolist(), strict=True)]


class Benchmark:
    """A loaded benchmark directory.

    ``queries``, ``corpus`` and ``states`` are `datasets.Dataset` (Arrow, memory-mapped); rows convert to typed
    records with `query`, `segment` and `state`. Row order is file order.
    """

    def __init__(self, root: Path, manifest: Manifest, queries: datasets.Dataset, corpus: datasets.Dataset,
                 states: datasets.Dataset):
        self.root, self.manifest = root, manifest
        self.queries_ds, self.corpus_ds, self.states_ds = queries, corpus, states
        #: size, mtime and inode of the files `load` read the tables from (None: tables not read by `load`, whose
        #: fingerprint is never taken from the on-disk cache)
        self.source_stats: list[list[Any]] | None = None

    @classmethod
    def load(cls, root: str | os.PathLike, *, progress: bool = False) -> Benchmark:
        """Load a benchmark directory, or the Hub dataset ``owner/name[@revision]`` (`eval.hub.resolve_data`)."""
        from eval.hub import resolve_data

        root = resolve_data(root, "benchmark")
        if not root.is_dir():
            raise MissingInput(f"benchmark directory {root} does not exist")
        for name in REQUIRED_FILES:
            if not (root / name).exists():
                raise FormatError(root / name, "missing (a benchmark directory needs " + ", ".join(REQUIRED_FILES) + ")")
        manifest = _read_manifest(root / "manifest.json")
        _check_links(root)
        cache = _cache_dir(root)
        stats = _file_stats(root)
        key = _validation_key(stats)
        check = not _validated(root, key)
        was_enabled = datasets.is_progress_bar_enabled()
        if not progress:
            datasets.disable_progress_bars()
        try:
            q = _load_jsonl(root / "queries.jsonl", QUERY_FEATURES, cache, check=check)
            c = _load_jsonl(root / "corpus.jsonl", SEGMENT_FEATURES, cache, check=check)
            s = _load_jsonl(root / "states.jsonl", STATE_FEATURES, cache, check=check)
        finally:
            if was_enabled:
                datasets.enable_progress_bars()
        bench = cls(root, manifest, q, c, s)
        unchanged = _file_stats(root) == stats  # no file changed while it was read
        bench.source_stats = stats if unchanged else None
        if not check and not unchanged:  # the note was for the files as they were: check what was read
            for name, ds in (("queries.jsonl", q), ("corpus.jsonl", c), ("states.jsonl", s)):
                _check_arrow(root / name, ds)
                _check_required(root / name, ds)
                _check_unique_ids(root / name, ds)
        if check and unchanged:
            _note_validated(root, key)
        return bench

    # --- sizes and ids ---
    def __repr__(self) -> str:
        return (f"Benchmark({self.manifest.name!r} v{self.manifest.version}: {len(self.queries_ds)} queries, "
                f"{len(self.corpus_ds)} segments, {len(self.states_ds)} states, spaces={self.spaces})")

    @property
    def name(self) -> str:
        return self.manifest.name

    @cached_property
    def fingerprint(self) -> dict[str, str]:
        """``{name, version, sha256}``: what a run scored on this benchmark records (`eval.fingerprint`)."""
        from eval.fingerprint import cached_benchmark_fingerprint

        return cached_benchmark_fingerprint(self)

    @cached_property
    def query_ids(self) -> list[str]:
        return self.queries_ds["id"][:]

    @cached_property
    def corpus_ids(self) -> list[str]:
        return self.corpus_ds["id"][:]

    @cached_property
    def state_ids(self) -> list[str]:
        return self.states_ds["id"][:]

    @cached_property
    def query_index(self) -> dict[str, int]:
        return {x: i for i, x in enumerate(self.query_ids)}

    @cached_property
    def corpus_index(self) -> dict[str, int]:
        return {x: i for i, x in enumerate(self.corpus_ids)}

    @cached_property
    def state_index(self) -> dict[str, int]:
        return {x: i for i, x in enumerate(self.state_ids)}

    # --- typed access ---
    def _row(self, ds: datasets.Dataset, index: dict[str, int], key: int | str, what: str) -> dict:
        if isinstance(key, str):
            if key not in index:
                raise UnknownName(f"unknown {what} id {key!r} in benchmark {self.root}")
            key = index[key]
        return ds[int(key)]

    def query(self, key: int | str) -> Query:
        return Query.from_dict(self._row(self.queries_ds, self.query_index, key, "query"))

    def segment(self, key: int | str) -> Segment:
        return Segment.from_dict(self._row(self.corpus_ds, self.corpus_index, key, "segment"))

    def state(self, key: int | str) -> State:
        return State.from_dict(self._row(self.states_ds, self.state_index, key, "state"))

    def queries(self, split: str | None = None, *, fair_only: bool = False, qtypes: Iterable[str] | None = None) -> list[Query]:
        """Typed queries, optionally restricted to a split, the fair subset, and question types (file order)."""
        # Arrow's to_pylist: the same rows as datasets' row iteration, about 3x faster.
        rows = self.query_rows(split, fair_only=fair_only, qtypes=qtypes)
        ds = self.queries_ds if len(rows) == len(self.queries_ds) else self.queries_ds.select(rows)
        return [Query.from_dict(r) for r in ds.to_list()]

    def query_field(self, field: str, split: str | None = None) -> dict[str, Any]:
        """``{query id: its field}`` for the queries of ``split`` (all when None), read as columns: what a job that
        needs one field of many queries reads instead of building every typed `Query`."""
        if field not in self.queries_ds.column_names:
            raise InputError(f"queries have no field {field!r}; they have {sorted(self.queries_ds.column_names)}")
        rows = self.queries_ds.select_columns(sorted({"id", field})).to_dict()
        keep = range(len(rows["id"])) if split is None else self.query_rows(split)
        return {rows["id"][i]: rows[field][i] for i in keep}

    def query_rows(self, split: str | None = None, *, fair_only: bool = False, qtypes: Iterable[str] | None = None) -> np.ndarray:
        """Row indices of the queries in ``split`` (all when None), optionally fair-only / of some question types."""
        if split is not None and split not in SPLITS:
            raise InputError(f"unknown split {split!r}; expected one of {SPLITS}")
        mask = np.ones(len(self.queries_ds), dtype=bool)
        if split is not None:
            mask &= np.asarray(self.queries_ds["split"][:]) == split
        if fair_only:
            mask &= np.asarray(self.queries_ds["fair"][:], dtype=bool)
        if qtypes is not None:
            mask &= np.isin(np.asarray(self.queries_ds["qtype"][:]), list(qtypes))
        return np.flatnonzero(mask)

    def selection(self, split: str | None = None, *, fair_only: bool = False, qtypes: Iterable[str] | None = None,
                  allow_empty: bool = False) -> np.ndarray:
        """`query_rows` of a job's selection; an empty selection raises `EmptySelection` naming what was selected and
        what the benchmark holds, unless ``allow_empty`` (the command's ``--allow-empty``)."""
        rows = self.query_rows(split, fair_only=fair_only, qtypes=qtypes)
        if len(rows) or allow_empty:
            return rows
        from collections import Counter

        from eval.errors import EmptySelection

        what = ", ".join([f"split {split!r}" if split else "every split", *(["fair queries"] if fair_only else []),
                          *([f"question types {'/'.join(qtypes)}"] if qtypes else [])])
        held = Counter(self.queries_ds["split"][:])
        holds = ", ".join(f"{s} {n:,}" for s, n in sorted(held.items())) or "none"
        raise EmptySelection(f"the selection ({what}) holds no query of the benchmark {self.root} "
                             f"({self.root / 'queries.jsonl'} holds {len(self.queries_ds):,} queries: {holds})",
                             fix="select queries the benchmark has (--split), or pass --allow-empty to write an "
                                 "empty output")

    def segments(self) -> list[Segment]:
        return [Segment.from_dict(r) for r in self.corpus_ds.to_list()]

    def states(self) -> list[State]:
        return [State.from_dict(r) for r in self.states_ds.to_list()]

    # --- ground truth as corpus rows ---
    def gt_rows(self, queries: Sequence[Query], definition: str = "type2-all", tier: str | None = None) -> list[np.ndarray]:
        """Per query, the corpus row indices of its GT under ``definition`` (or of one ``tier`` of the type2 pools).

        Unknown ids raise `KeyError` naming the query and the id.
        """
        if definition not in GT_DEFINITION_FIELDS:
            raise UnknownName(f"unknown GT definition {definition!r}; expected one of {list(GT_DEFINITION_FIELDS)}")
        if tier is not None and tier not in GT_TIERS:
            raise UnknownName(f"unknown GT tier {tier!r}; expected one of {GT_TIERS}")
        lists = [q.gt_pools.tier(tier) if tier else q.gt(definition) for q in queries]
        sizes = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        flat = pa.array(list(itertools.chain.from_iterable(lists)), pa.string())
        # one hash lookup in C++ for every id (a Python dict lookup per id takes seconds at PSR scale)
        rows = pc.index_in(flat, value_set=self._corpus_id_array)
        if rows.null_count:
            bad = int(np.flatnonzero(np.asarray(rows.is_null()))[0])
            qi = int(np.searchsorted(np.cumsum(sizes), bad, side="right"))
            raise UnknownName(f"query {queries[qi].id}: GT id {flat[bad].as_py()!r} is not in the corpus")
        return np.split(np.asarray(rows, dtype=np.int64), np.cumsum(sizes)[:-1]) if len(lists) else []

    def query_table(self, rows: np.ndarray | Sequence[int]) -> pa.Table:
        """The queries at benchmark rows ``rows``, in that order, as one Arrow table (no Python object per row)."""
        return self.queries_ds.with_format("arrow")[[int(r) for r in rows]] if len(rows) else \
            self.queries_ds.data.table.slice(0, 0)

    def gt_rows_at(self, table: pa.Table, definition: str = "type2-all", tier: str | None = None) -> list[np.ndarray]:
        """`gt_rows` of the queries of ``table`` (`query_table`), read from its Arrow columns: the same rows in the
        same order, without a Python string per id."""
        if tier is not None:
            return self.gt_pools_at(table, tiers=[tier])[tier]
        return self.gt_pools_at(table, definitions=[definition])[definition]

    def gt_pools_at(self, table: pa.Table, definitions: Sequence[str] = (), tiers: Sequence[str] = ()
                    ) -> dict[str, list[np.ndarray]]:
        """`gt_rows_at` of several GT definitions and tiers at once (keyed by their names): every id of every field
        they read is looked up in the corpus in one hash pass."""
        for d in definitions:
            if d not in GT_DEFINITION_FIELDS:
                raise UnknownName(f"unknown GT definition {d!r}; expected one of {list(GT_DEFINITION_FIELDS)}")
        for t in tiers:
            if t not in GT_TIERS:
                raise UnknownName(f"unknown GT tier {t!r}; expected one of {GT_TIERS}")
        wanted = {d: GT_DEFINITION_FIELDS[d] for d in definitions} | {t: (f"gt_pools.{t}",) for t in tiers}
        n = table.num_rows
        if not n:
            return {name: [] for name in wanted}
        paths = list(dict.fromkeys(p for fields in wanted.values() for p in fields))
        sizes, flats = [], []
        for path in paths:
            top, *rest = path.split(".")
            col = table.column(top).combine_chunks() if top in table.column_names else pa.nulls(n, pa.list_(pa.string()))
            for part in rest:  # a null struct gives null fields
                col = pc.struct_field(col, part)
            sizes.append(np.asarray(pc.list_value_length(col).fill_null(0), dtype=np.int64))
            flats.append(pc.list_flatten(col).cast(pa.string()))
        flat = pa.concat_arrays(flats)
        found = pc.index_in(flat, value_set=self._corpus_id_array)
        ends = np.cumsum([len(f) for f in flats])
        if found.null_count:
            bad = int(np.flatnonzero(np.asarray(found.is_null()))[0])
            k = int(np.searchsorted(ends, bad, side="right"))
            qi = int(np.searchsorted(np.cumsum(sizes[k]), bad - (ends[k - 1] if k else 0), side="right"))
            raise UnknownName(f"query {table.column('id')[qi].as_py()}: GT id {flat[bad].as_py()!r} is not in the "
                              f"corpus ({paths[k]})")
        found = np.asarray(found, dtype=np.int64)
        by_path = dict(zip(paths, zip(np.split(found, ends[:-1]), sizes, strict=True), strict=True))
        out = {}
        for name, fields in wanted.items():
            if len(fields) == 1:
                rows, size = by_path[fields[0]]
                out[name] = _split(rows, size)
                continue
            # per query, the fields' lists one after the other (a stable sort by query keeps the fields' order)
            owner = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), by_path[f][1]) for f in fields])
            rows = np.concatenate([by_path[f][0] for f in fields])[np.argsort(owner, kind="stable")]
            out[name] = _split(rows, np.bincount(owner, minlength=n))
        return out

    @cached_property
    def _corpus_id_array(self) -> pa.Array:
        return self.corpus_ds.data.table.column("id").combine_chunks().cast(pa.string())

    @cached_property
    def segment_state_rows(self) -> np.ndarray:
        """(n_corpus,) int64: for each segment, the row of its canonical state in ``states`` (-1 if unknown)."""
        sidx = self.state_index
        return np.fromiter((sidx.get(s, -1) for s in self.corpus_ds["state_id"][:]), dtype=np.int64,
                           count=len(self.corpus_ds))

    # --- features and frames ---
    @property
    def spaces(self) -> list[str]:
        return feats.list_spaces(self.root)

    def features(self, space: str, table: str) -> feats.FeatureTable:
        return feats.load_table(self.root, space, table)

    def space_meta(self, space: str) -> dict:
        return feats.read_meta(self.root, space)

    def path(self, rel: str) -> Path:
        """Absolute path of a file referenced by a record (frames are stored relative to the directory)."""
        p = Path(rel)
        return p if p.is_absolute() else self.root / p
