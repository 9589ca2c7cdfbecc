"""Retrieval spaces: item embeddings of a benchmark's corpus plus the map from corpus segments to items.

A space is one ``features/<space>/`` directory (see `eval.features`):

- a **semantic** space embeds the canonical state strings (table ``states``, ``(n_states, d)``); a segment is
  represented by its state, so ``item_rows[c]`` is the states-table row of corpus segment ``c`` and every segment
  of a state shares its score (the paper's "expand each retrieved state to its member segments");
- a **visual** space holds one middle-frame feature per segment (table ``corpus``, ``(n_corpus, d)``), and
  optionally per-frame prefix tokens (table ``prefixes``, ``(n_prefixes, 8, d)``);
- a **prefix** space holds only prefix tokens (an LFTR input, e.g. the synthetic benchmark's ``sim`` space: the
  simulator's state, perfect perception); it has no items and is never a target.

Item vectors are float32 and L2-normalised, so a dot product is the cosine similarity (prefix tokens of a prefix
space are standardized features instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from eval.benchmark import Benchmark
from eval.errors import InputError, MissingInput
from eval.features import FeatureTable, check_finite_cached, has_table, l2_normalize, space_dir
from eval.io import FormatError


def space_meta(bench: Benchmark, name: str) -> dict:
    """The ``meta.json`` of space ``name``; a space the benchmark lacks is an `InputError` that lists the spaces it
    has and the command that makes one."""
    d = space_dir(bench.root, name)
    if not (d / "meta.json").exists():
        have = [s for s in bench.spaces if (space_dir(bench.root, s) / "meta.json").exists()]
        what = f"{d} holds no finished space (no meta.json)" if d.is_dir() else f"no space {name!r} in {bench.root}"
        raise InputError(f"{what}; its spaces: {', '.join(have) or 'none'}",
                         fix=f"make it with `python -m retrieval encode --data {bench.root} --space {name} --model "
                             "MODEL` (a sentence-transformers text model, or CLIP / SigLIP / DINOv2 for a visual "
                             "space)")
    return bench.space_meta(name)


@dataclass
class Space:
    """One retrieval space of a loaded benchmark.

    Attributes:
        name: the space directory name.
        meta: its ``meta.json`` (``kind``, ``model``, ``dim``, ...).
        items: ``(n_items, d)`` float32, L2-normalised: state embeddings (semantic) or segment features (visual).
        item_ids: ids labelling the rows of ``items`` (state ids or segment ids).
        item_rows: ``(n_corpus,)`` int64, benchmark corpus row -> row of ``items``; None when it is the identity.
        item_state: ``(n_items,)`` int64, the benchmark state row of each item (for "same state" masks).
    """

    name: str
    meta: dict
    items: np.ndarray
    item_ids: list[str]
    item_rows: np.ndarray | None
    item_state: np.ndarray
    bench: Benchmark

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def dim(self) -> int:
        return int(self.items.shape[1])

    @property
    def n_items(self) -> int:
        return int(self.items.shape[0])

    @classmethod
    def load(cls, bench: Benchmark, name: str) -> Space:
        """Load a space and check that it covers the benchmark's corpus (a `FormatError` names what is missing)."""
        meta = space_meta(bench, name)
        kind = meta.get("kind")
        d = space_dir(bench.root, name)
        if kind == "semantic":
            table = _require(bench, name, "states")
            rows = _map_ids(bench.state_ids, table.ids, d / "states_ids.txt", "state")
            item_rows = rows[bench.segment_state_rows]
            bad = np.flatnonzero(bench.segment_state_rows < 0)
            if bad.size:
                raise FormatError(bench.root / "corpus.jsonl", f"segment {bench.corpus_ids[bad[0]]!r} has a state_id "
                                  "that is not in states.jsonl", line=int(bad[0]) + 1, field="state_id")
            state_of_item = np.full(len(table.ids), -1, np.int64)
            state_of_item[rows] = np.arange(len(rows))
            return cls(name, meta, np.asarray(table.array, np.float32), table.ids, item_rows, state_of_item, bench)
        if kind == "visual":
            table = _require(bench, name, "corpus")
            rows = _map_ids(bench.corpus_ids, table.ids, d / "corpus_ids.txt", "segment")
            identity = len(rows) == len(table.ids) and np.array_equal(rows, np.arange(len(rows)))
            item_state = np.full(len(table.ids), -1, np.int64)
            item_state[rows] = bench.segment_state_rows
            return cls(name, meta, np.asarray(table.array, np.float32), table.ids, None if identity else rows,
                       item_state, bench)
        if kind == "prefix":  # an input space: prefix tokens only, nothing to retrieve
            table = _require(bench, name, "prefixes")
            return cls(name, meta, np.zeros((0, table.dim), np.float32), [], None, np.zeros(0, np.int64), bench)
        raise FormatError(d / "meta.json", f"unknown space kind {kind!r} (expected 'semantic', 'visual' or 'prefix')",
                          field="kind")

    # --- corpus-level views ---
    def corpus_rows_to_items(self, corpus_rows: np.ndarray) -> np.ndarray:
        """Item rows of the given benchmark corpus rows."""
        corpus_rows = np.asarray(corpus_rows, np.int64)
        return corpus_rows if self.item_rows is None else self.item_rows[corpus_rows]

    def segment_features(self, corpus_rows: np.ndarray | None = None) -> np.ndarray:
        """``(n, d)`` features of corpus segments (a semantic space returns each segment's state embedding). All of
        them (``corpus_rows`` None) in a visual space whose rows are the corpus's: the (memory-mapped, read-only)
        table itself, not a copy of it."""
        if corpus_rows is None and self.item_rows is None and self.n_items == len(self.bench.corpus_ids):
            return self.items
        rows = np.arange(len(self.bench.corpus_ids)) if corpus_rows is None else corpus_rows
        return self.items[self.corpus_rows_to_items(rows)]

    @cached_property
    def state_items(self) -> np.ndarray:
        """``(n_states,)`` int64: the item row of each benchmark state in a semantic space (-1 when absent)."""
        out = np.full(len(self.bench.state_ids), -1, np.int64)
        ok = self.item_state >= 0
        out[self.item_state[ok]] = np.flatnonzero(ok)
        return out

    def state_prototypes(self) -> np.ndarray:
        """``(n_states, d)`` float32, L2-normalised: per benchmark state, the mean of its segments' features
        (``P[s] = normalise(mean_{c: state(c)=s} x_c)``). In a semantic space this is the state embedding itself.
        States without segments get a zero row."""
        if self.kind == "semantic":
            out = np.zeros((len(self.bench.state_ids), self.dim), np.float32)
            ok = self.state_items >= 0
            out[ok] = self.items[self.state_items[ok]]
            return out
        seg_state = self.bench.segment_state_rows
        n_c, n_s = len(seg_state), len(self.bench.state_ids)
        ok = seg_state >= 0
        member = sp.csr_matrix((np.ones(int(ok.sum()), np.float32), (seg_state[ok], np.flatnonzero(ok))),
                               shape=(n_s, n_c))
        sums = member @ self.segment_features()
        return l2_normalize(np.asarray(sums, np.float32))

    # --- prefixes ---
    @property
    def has_prefixes(self) -> bool:
        return has_table(self.bench.root, self.name, "prefixes")

    @cached_property
    def prefixes(self) -> FeatureTable:
        """Per-frame prefix tokens ``(n_prefixes, 8, d)`` of this space (visual spaces that encoded prefixes)."""
        return _require(self.bench, self.name, "prefixes")

    def prefix_rows(self, prefix_ids: list[str]) -> np.ndarray:
        """Row in `prefixes` of each prefix id; a `FormatError` names the first missing one."""
        idx = self.prefixes.index()
        missing = [p for p in prefix_ids if p not in idx]
        if missing:
            raise FormatError(space_dir(self.bench.root, self.name) / "prefixes_ids.txt",
                              f"{len(missing)} prefix id(s) of the queries are missing, e.g. {missing[0]!r}")
        return np.fromiter((idx[p] for p in prefix_ids), np.int64, count=len(prefix_ids))


def _require(bench: Benchmark, name: str, table: str) -> FeatureTable:
    """A feature table of the space; missing files and NaN/inf rows raise `FormatError` naming the file (the NaN check
    is kept per file version in the benchmark's cache, `eval.features.check_finite_cached`)."""
    path = space_dir(bench.root, name) / f"{table}.npy"
    if not has_table(bench.root, name, table):
        raise FormatError(path, f"missing: space {name!r} has no {table!r} table (run `python -m retrieval encode`)")
    t = bench.features(name, table)
    check_finite_cached(bench.root, path, t.array, t.ids)
    return t


def _map_ids(bench_ids: list[str], table_ids: list[str], path, what: str) -> np.ndarray:
    """For each benchmark id, its row in a feature table (every benchmark id must be present)."""
    idx = {x: i for i, x in enumerate(table_ids)}
    missing = [x for x in bench_ids if x not in idx]
    if missing:
        raise FormatError(path, f"{len(missing)} {what} id(s) of the benchmark have no row, e.g. {missing[0]!r} "
                                "(re-encode the space)")
    return np.fromiter((idx[x] for x in bench_ids), np.int64, count=len(bench_ids))


def pick_prefix_space(bench: Benchmark, requested: str = "") -> str:
    """``requested`` or the first space (sorted) that holds a ``prefixes`` table."""
    if requested:
        return requested
    for name in bench.spaces:
        if (bench.root / "features" / name / "prefixes.npy").exists():
            return name
    raise MissingInput(f"{bench.root}: no space has a prefixes table; encode a visual space first "
                       "(`python -m retrieval encode --space NAME --model IMAGE_MODEL`)")
