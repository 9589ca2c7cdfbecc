"""Training and prediction tensors of LFTR, built from a benchmark and its precomputed (frozen) features.

Per query (row of the benchmark's queries): the prefix row, question type, horizon, question-text embedding,
target state, positives, grounding targets and the items that may never be its negatives. Positives are the items
of the query's main GT pool (in-dataset + cross-dataset segments, mapped to target-space items: state rows in a
semantic space, segment rows in a visual one). **Excluded from negatives**: every item of the query's target state
and every item of any of its GT pools (in_video, in_dataset, cross_dataset, bge_similar, consensus, type1, and the
exact simulator-truth GT ``gt_sim_exact`` where the benchmark has one), as the paper's appendix says ("excluded from
every GT pool").

Hard negatives (paper §4.2, App. H): mined per **positive item** ``p`` as its nearest items in the target space
(cosine, exact), excluding items of ``p``'s own state; ``n_candidates`` of them are kept per positive
(`mine_hard_negatives`), and at batch time the query's excluded items are dropped and the first ``n_hard``
remaining ones are its hard negatives (`retrieval.lftr.batches.TrainBatches`). In a semantic space the only positive is
the target state, so this equals mining around the GT centroid. The neighbour table (int32, one row per distinct
positive item of the training queries) is cached as ``.npy`` under ``DIR/.cache/lftr/`` (or the checkpoint folder
when the benchmark is read-only).

Grounding targets: ``centroid`` (the L2-normalised mean of the query's positives) or the target state's
**prototype** (``state_proto``: the mean target-space feature of all the state's segments, normalised, as the
state-prototype oracle uses it). Intermediate-horizon supervision (Table 16) uses, per query, the states of its
object's segments that start after the prefix and before the target (``inter_ptr`` / ``inter_state``, in time
order: steps 1, 2, ...).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from eval.benchmark import Benchmark
from eval.features import FeatureTable, l2_normalize
from eval.io import FormatError, atomic_path
from eval.schema import MAIN_QTYPES, QUESTION_TYPES
from eval.segments import target_states
from retrieval.spaces import Space, space_meta


@dataclass
class LFTRData:
    """Arrays of all benchmark queries (row ``i`` = query row ``i``) and the target space.

    ``prefix`` ``(n_prefixes, 8, d_in)``; ``prefix_row``, ``qtype``, ``horizon``, ``target_state`` ``(n_q,)`` int64;
    ``question`` ``(n_q, d_text)`` or None; ``pos_ptr`` ``(n_q + 1,)`` / ``pos_items`` ``(nnz,)`` (CSR positives);
    ``centroid`` ``(n_q, d_out)`` L2-normalised mean of the positives (zero without positives);
    ``items`` ``(n_items, d_out)``; ``item_state`` ``(n_items,)``; ``split`` ``(n_q,)`` str;
    ``excl_ptr`` / ``excl_items`` (CSR, sorted per query): items of every GT pool of the query (never negatives);
    ``state_proto`` ``(n_states, d_out)`` L2-normalised state prototypes in the target space;
    ``inter_ptr`` / ``inter_state`` (CSR, time order): intermediate states between prefix and target.

    Built for prediction only (`build_data` with ``targets=False``), the fields derived from the GT (``target_state``,
    ``pos_ptr``, ``pos_items``, ``centroid``, ``excl_*``, ``state_proto``, ``inter_*``) are None and ``items`` is
    the target space's table itself, not a copy: predicting needs only the prefixes, question types, horizons and
    question texts.
    """

    prefix: np.ndarray
    prefix_row: np.ndarray
    qtype: np.ndarray
    horizon: np.ndarray
    question: np.ndarray | None
    target_state: np.ndarray | None
    pos_ptr: np.ndarray | None
    pos_items: np.ndarray | None
    centroid: np.ndarray | None
    items: np.ndarray
    item_state: np.ndarray
    split: np.ndarray
    excl_ptr: np.ndarray | None = None
    excl_items: np.ndarray | None = None
    state_proto: np.ndarray | None = None
    inter_ptr: np.ndarray | None = None
    inter_state: np.ndarray | None = None

    @property
    def n_pos(self) -> np.ndarray:
        if self.pos_ptr is None:
            raise RuntimeError("these LFTR data were built for prediction only (build_data(targets=False)): "
                               "they hold no GT")
        return np.diff(self.pos_ptr)

    def rows(self, split: str, *, with_positives: bool = True, main_only: bool = False) -> np.ndarray:
        """Query rows of ``split`` (with a non-empty main pool; ``main_only``: question types Q1-Q4)."""
        mask = self.split == split
        if main_only:
            mask &= self.qtype < len(MAIN_QTYPES)
        if with_positives:
            mask &= self.n_pos > 0
        return np.flatnonzero(mask)


@dataclass
class ConcatPrefixes:
    """The prefix tokens of several spaces concatenated per frame (Table 10's prefix fusion: ``prefix_space:
    a+b``): ``prefixes.array[i, f] = [x_a[i, f]; x_b[i, f]; ...]``, rows in the first space's order."""

    name: str
    prefixes: FeatureTable

    def prefix_rows(self, prefix_ids: list[str]) -> np.ndarray:
        idx = self.prefixes.index()
        missing = [p for p in prefix_ids if p not in idx]
        if missing:
            raise FormatError(self.name, f"{len(missing)} prefix id(s) of the queries are missing from a concatenated "
                                         f"prefix space, e.g. {missing[0]!r}")
        return np.fromiter((idx[p] for p in prefix_ids), np.int64, count=len(prefix_ids))


def load_prefix_space(bench: Benchmark, name: str) -> Space | ConcatPrefixes:
    """The space whose prefix tokens LFTR reads: one space, or ``a+b+...``: the spaces' tokens concatenated per
    frame (`ConcatPrefixes`; each space must hold a row for every prefix of the first)."""
    parts = [p for p in name.split("+") if p]
    if len(parts) <= 1:
        return Space.load(bench, name)
    spaces = [Space.load(bench, p) for p in parts]
    ids = list(spaces[0].prefixes.ids)
    arrays = [np.asarray(sp.prefixes.array, np.float32)[sp.prefix_rows(ids)] for sp in spaces]
    return ConcatPrefixes(name, FeatureTable(ids, np.concatenate(arrays, axis=-1)))


def cache_dir(bench: Benchmark, fallback: Path) -> Path:
    from eval.io import writable_dir

    return writable_dir(bench.root / ".cache" / "lftr", fallback)


def question_embeddings(bench: Benchmark, space_name: str, cache: Path, device: str | None = None) -> np.ndarray:
    """``(n_q, d)`` question-text embeddings from a semantic space's text encoder (cached per space and text)."""
    from retrieval.encoders import query_text_encoder

    texts = bench.queries_ds["question"][:]
    meta = space_meta(bench, space_name)
    h = hashlib.sha256((meta.get("model", "") + "\x00" + str(meta.get("query_prompt")) + "\x00" + "\n".join(texts))
                       .encode()).hexdigest()[:16]
    f = cache / f"question-{space_name}-{h}.npy"
    if f.exists():
        return np.load(f)
    enc = query_text_encoder(meta, device=device)
    arr = enc.encode_queries(texts, progress=True)
    with atomic_path(f) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)
    return arr


def build_data(bench: Benchmark, target: Space, prefix_space: Space | ConcatPrefixes,
               question: np.ndarray | None = None, *, targets: bool = True) -> LFTRData:
    """Assemble `LFTRData` for every query of ``bench`` (vectorised over queries; GT lists are per query).
    ``targets=False``: the inputs of prediction only (`LFTRData`), without reading a GT pool."""
    qd = bench.queries_ds
    prefix_ids = qd["prefix_id"][:]
    prefix_row = prefix_space.prefix_rows(prefix_ids)
    qt_index = {q: i for i, q in enumerate(QUESTION_TYPES)}
    qtype = np.fromiter((qt_index[q] for q in qd["qtype"][:]), np.int64, count=len(qd))
    horizon = np.asarray(qd["horizon"][:], np.int64)
    if not targets:
        return LFTRData(
            prefix=np.asarray(prefix_space.prefixes.array, np.float32), prefix_row=prefix_row, qtype=qtype,
            horizon=horizon, question=None if question is None else np.asarray(question, np.float32),
            target_state=None, pos_ptr=None, pos_items=None, centroid=None, items=target.items,
            item_state=target.item_state, split=np.asarray(qd["split"][:]))
    target_state = target_states(bench)
    groups, intermediate = _per_query(bench)
    pos_ptr, pos_items = _csr([np.unique(target.corpus_rows_to_items(rows)) if rows.size else rows
                               for rows in groups["type2-all"]])
    excl_ptr, excl_items = _csr([np.unique(target.corpus_rows_to_items(rows)) if rows.size else rows
                                 for rows in _excluded_rows(groups, len(qd))])
    inter_ptr, inter_state = _csr(intermediate)
    items = np.array(target.items, np.float32)  # a writable copy (the table may be memory-mapped read-only)
    # centroid of each query's positives: segment-sum via np.add.reduceat on the CSR layout
    counts = np.diff(pos_ptr)
    centroid = np.zeros((len(qd), items.shape[1]), np.float32)
    has = counts > 0
    if pos_items.size:
        sums = np.add.reduceat(items[pos_items], pos_ptr[:-1][has], axis=0)
        centroid[has] = l2_normalize(sums)
    return LFTRData(
        prefix=np.array(prefix_space.prefixes.array, np.float32), prefix_row=prefix_row, qtype=qtype,
        horizon=horizon, question=None if question is None else np.asarray(question, np.float32),
        target_state=target_state, pos_ptr=pos_ptr, pos_items=pos_items, centroid=centroid, items=items,
        item_state=target.item_state, split=np.asarray(qd["split"][:]), excl_ptr=excl_ptr, excl_items=excl_items,
        state_proto=target.state_prototypes(), inter_ptr=inter_ptr, inter_state=inter_state,
    )


def _csr(lists: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(lists) + 1, np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    flat = np.concatenate(lists).astype(np.int64) if lists and ptr[-1] else np.zeros(0, np.int64)
    return ptr, flat


#: GT pools whose items are never negatives of their query (`eval.schema` tiers), plus the type1 GT and the exact
#: simulator-truth GT (``gt_sim_exact``) where the benchmark has it.
EXCLUDED_POOLS = ("in_video", "in_dataset", "cross_dataset", "bge_similar", "consensus")


#: The last `_per_query` result of this process, under its key: a pool worker trains several heads on one benchmark.
_LAST_PER_QUERY: dict = {}


def _per_query(bench: Benchmark) -> tuple[dict[str, list[np.ndarray]], list[np.ndarray]]:
    """`_gt_groups` and `_intermediate_states` of ``bench``, kept for the next call on the same files (keyed by its
    folder and the size, mtime and inode of the files it was loaded from, `Benchmark.source_stats`; not kept when
    those changed while it loaded). Callers copy what they take from them."""
    stats = bench.source_stats
    key = None if stats is None else (str(Path(bench.root).resolve()), repr(stats))
    if key is not None and _LAST_PER_QUERY.get("key") == key:
        return _LAST_PER_QUERY["value"]
    value = (_gt_groups(bench), _intermediate_states(bench))
    _LAST_PER_QUERY.clear()
    if key is not None:
        _LAST_PER_QUERY.update(key=key, value=value)
    return value


def _gt_groups(bench: Benchmark) -> dict[str, list[np.ndarray]]:
    """Per query (every query of ``bench``, in order), the corpus rows of its main pool (``type2-all``), of each pool
    in `EXCLUDED_POOLS`, of its type1 GT and of its exact GT where the benchmark has it, read from the queries'
    Arrow columns in one corpus lookup (`eval.benchmark.Benchmark.gt_pools_at`)."""
    qd = bench.queries_ds
    definitions = ["type2-all", "type1-all"] + (["sim-exact"] if "gt_sim_exact" in qd.column_names else [])
    return bench.gt_pools_at(bench.query_table(np.arange(len(qd))), definitions=definitions, tiers=EXCLUDED_POOLS)


def _excluded_rows(groups: dict[str, list[np.ndarray]], n: int) -> list[np.ndarray]:
    """Per query: corpus rows of every GT pool (`EXCLUDED_POOLS`), of its type1 GT and of its exact GT."""
    names = [*EXCLUDED_POOLS, "type1-all", *(["sim-exact"] if "sim-exact" in groups else [])]
    return [np.concatenate([groups[name][i] for name in names]) for i in range(n)]


def _intermediate_states(bench: Benchmark) -> list[np.ndarray]:
    """Per query: benchmark state rows of its object's segments with ``prefix_end < start < target_time``, in
    time order (the states the rollout passes through before the target)."""
    cd, qd = bench.corpus_ds, bench.queries_ds
    seg_state = bench.segment_state_rows
    start = np.asarray(cd["start"][:], np.float64)
    keys = np.char.add(np.char.add(np.asarray(cd["video_id"][:], str), "/"), np.asarray(cd["object_id"][:], str))
    uniq, obj = np.unique(keys, return_inverse=True)
    order = np.lexsort((start, obj))  # rows grouped by (video, object), each group sorted by start
    bounds = np.searchsorted(obj[order], np.arange(len(uniq) + 1))
    group = {k: i for i, k in enumerate(uniq.tolist())}
    out = []
    for v, o, pe, tt in zip(qd["video_id"][:], qd["object_id"][:], qd["prefix_end"][:], qd["target_time"][:],
                            strict=True):
        g = group.get(f"{v}/{o}")
        rows = order[bounds[g]:bounds[g + 1]] if g is not None else order[:0]
        st = start[rows]
        out.append(seg_state[rows[(st > pe) & (st < tt)]])
    return out


@dataclass
class HardNegatives:
    """Nearest neighbours of positive items: ``neighbours[j]`` are the item rows nearest to item
    ``item_rows[j]`` (excluding items of its state), best first, -1 padded; ``slot`` maps an item row to ``j``
    (-1 when the item was not mined)."""

    item_rows: np.ndarray
    neighbours: np.ndarray
    slot: np.ndarray


def mine_hard_negatives(data: LFTRData, rows: np.ndarray, n_candidates: int, cache: Path | None, *, tag: str = "",
                        device: str = "cpu", chunk: int = 256, progress: bool = True) -> HardNegatives:
    """Mine `HardNegatives` for every distinct positive item of the queries ``rows`` (module docstring):
    ``(n_pos_items, n_candidates)`` int32, exact cosine top-k over all items in chunks of positives. Cached under
    ``cache`` when given (keyed by the items, the positives and ``n_candidates``)."""
    n_items = data.items.shape[0]
    n_candidates = min(n_candidates, n_items)
    counts = data.pos_ptr[rows + 1] - data.pos_ptr[rows]
    idx = np.repeat(data.pos_ptr[rows], counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts,
                                                                                         counts))
    pos = np.unique(data.pos_items[idx]) if idx.size else np.zeros(0, np.int64)
    slot = np.full(n_items, -1, np.int64)
    slot[pos] = np.arange(len(pos))
    if n_candidates == 0 or len(pos) == 0:
        return HardNegatives(pos, np.zeros((len(pos), 0), np.int32), slot)
    h = hashlib.sha256(tag.encode() + pos.tobytes() + data.items[pos].tobytes() + data.item_state.tobytes()
                       + repr(data.items.shape).encode() + str(n_candidates).encode()).hexdigest()[:16]
    f = cache / f"hardneg-item-{h}.npy" if cache is not None else None
    if f is not None and f.exists():
        return HardNegatives(pos, np.load(f), slot)
    items = torch.from_numpy(data.items).to(device)
    item_state = torch.from_numpy(data.item_state).to(device)
    out = np.empty((len(pos), n_candidates), np.int32)
    for s in tqdm(range(0, len(pos), chunk), desc="hard negatives", unit="chunk", disable=not progress):
        p = torch.from_numpy(pos[s:s + chunk]).to(device)
        sims = items[p] @ items.T
        sims.masked_fill_(item_state[None, :] == item_state[p][:, None], -torch.inf)
        top = sims.topk(n_candidates, dim=1)
        out[s:s + len(p)] = torch.where(torch.isfinite(top.values), top.indices, -1).cpu().numpy()
    if f is not None:
        with atomic_path(f) as tmp, open(tmp, "wb") as fh:
            np.save(fh, out)
    return HardNegatives(pos, out, slot)
