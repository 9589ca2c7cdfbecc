"""Loading a benchmark directory (see `eval.schema` for the layout and records).

The three JSONL files are loaded through the `datasets` library into Arrow tables that are cached beside the
benchmark (``<dir>/.cache/``) and memory-mapped, so the full PSR release (20,182 queries, 218,276 segments,
51,362 states) opens in seconds after the first load. Typed records (`Query`, `Segment`, `State`) are built on
access. Loading does not validate cross-references: run ``python -m eval validate DIR`` for that.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

import datasets
import numpy as np

from eval import features as feats
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

REQUIRED_FILES = ("manifest.json", "queries.jsonl", "corpus.jsonl", "states.jsonl")


def _cache_dir(root: Path) -> str | None:
    d = root / ".cache" / "datasets"
    try:
        d.mkdir(parents=True, exist_ok=True)
        return str(d) if os.access(d, os.W_OK) else None
    except OSError:
        return None  # read-only benchmark: fall back to the datasets default cache


def _load_jsonl(path: Path, features: datasets.Features, cache_dir: str | None) -> datasets.Dataset:
    if path.stat().st_size == 0:
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    try:
        return datasets.Dataset.from_json(str(path), features=features, cache_dir=cache_dir)
    except Exception as e:  # datasets wraps Arrow parse errors in several types; name the file
        raise FormatError(path, f"could not be loaded as JSONL with the expected schema ({type(e).__name__}: {e}); "
                                "run `python -m eval validate` on the directory for line-level errors") from None


class Benchmark:
    """A loaded benchmark directory.

    ``queries``, ``corpus`` and ``states`` are `datasets.Dataset` (Arrow, memory-mapped); rows convert to typed
    records with `query`, `segment` and `state`. Row order is file order.
    """

    def __init__(self, root: Path, manifest: Manifest, queries: datasets.Dataset, corpus: datasets.Dataset,
                 states: datasets.Dataset):
        self.root, self.manifest = root, manifest
        self.queries_ds, self.corpus_ds, self.states_ds = queries, corpus, states

    @classmethod
    def load(cls, root: str | os.PathLike, *, progress: bool = False) -> Benchmark:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"benchmark directory {root} does not exist")
        for name in REQUIRED_FILES:
            if not (root / name).exists():
                raise FormatError(root / name, "missing (a benchmark directory needs " + ", ".join(REQUIRED_FILES) + ")")
        manifest = Manifest.from_dict(read_json(root / "manifest.json"))
        cache = _cache_dir(root)
        was_enabled = datasets.is_progress_bar_enabled()
        if not progress:
            datasets.disable_progress_bars()
        try:
            q = _load_jsonl(root / "queries.jsonl", QUERY_FEATURES, cache)
            c = _load_jsonl(root / "corpus.jsonl", SEGMENT_FEATURES, cache)
            s = _load_jsonl(root / "states.jsonl", STATE_FEATURES, cache)
        finally:
            if was_enabled:
                datasets.enable_progress_bars()
        return cls(root, manifest, q, c, s)

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
        from eval.fingerprint import benchmark_fingerprint

        return benchmark_fingerprint(self)

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
                raise KeyError(f"unknown {what} id {key!r} in benchmark {self.root}")
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
        return [Query.from_dict(r) for r in self.queries_ds.select(self.query_rows(split, fair_only=fair_only, qtypes=qtypes))]

    def query_rows(self, split: str | None = None, *, fair_only: bool = False, qtypes: Iterable[str] | None = None) -> np.ndarray:
        """Row indices of the queries in ``split`` (all when None), optionally fair-only / of some question types."""
        if split is not None and split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        mask = np.ones(len(self.queries_ds), dtype=bool)
        if split is not None:
            mask &= np.asarray(self.queries_ds["split"][:]) == split
        if fair_only:
            mask &= np.asarray(self.queries_ds["fair"][:], dtype=bool)
        if qtypes is not None:
            mask &= np.isin(np.asarray(self.queries_ds["qtype"][:]), list(qtypes))
        return np.flatnonzero(mask)

    def segments(self) -> list[Segment]:
        return [Segment.from_dict(r) for r in self.corpus_ds]

    def states(self) -> list[State]:
        return [State.from_dict(r) for r in self.states_ds]

    # --- ground truth as corpus rows ---
    def gt_rows(self, queries: Sequence[Query], definition: str = "type2-all", tier: str | None = None) -> list[np.ndarray]:
        """Per query, the corpus row indices of its GT under ``definition`` (or of one ``tier`` of the type2 pools).

        Unknown ids raise `KeyError` naming the query and the id.
        """
        if definition not in GT_DEFINITION_FIELDS:
            raise KeyError(f"unknown GT definition {definition!r}; expected one of {list(GT_DEFINITION_FIELDS)}")
        if tier is not None and tier not in GT_TIERS:
            raise KeyError(f"unknown GT tier {tier!r}; expected one of {GT_TIERS}")
        idx = self.corpus_index
        out = []
        for q in queries:
            ids = q.gt_pools.tier(tier) if tier else q.gt(definition)
            try:
                out.append(np.fromiter((idx[x] for x in ids), dtype=np.int64, count=len(ids)))
            except KeyError as e:
                raise KeyError(f"query {q.id}: GT id {e.args[0]!r} is not in the corpus") from None
        return out

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
