"""Training and prediction tensors of LFTR, built from a benchmark and its precomputed (frozen) features.

Per query (row of the benchmark's queries): the prefix row, question type, horizon, question-text embedding,
target state, positives and the grounding target. Positives are the items of the query's main GT pool
(in-dataset + cross-dataset segments, mapped to target-space items: state rows in a semantic space, segment rows in
a visual one). Negatives are never items of the query's target state (so neither GT nor the self tier, nor an
unlabelled segment of the same canonical state).

Hard negatives: for each training query, the ``n_hard`` items nearest to the centroid of its positives in the
target space (cosine), excluding items of the target state. Mined once per (space, queries, n_hard) in chunks of
queries, and cached as ``.npy`` under ``DIR/.cache/lftr/`` (or the checkpoint folder when the benchmark is read-only).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from eval.benchmark import Benchmark
from eval.features import l2_normalize
from eval.io import atomic_path
from eval.schema import QUESTION_TYPES
from retrieval.spaces import Space


@dataclass
class LFTRData:
    """Arrays of all benchmark queries (row ``i`` = query row ``i``) and the target space.

    ``prefix`` ``(n_prefixes, 8, d_in)``; ``prefix_row``, ``qtype``, ``horizon``, ``target_state`` ``(n_q,)`` int64;
    ``question`` ``(n_q, d_text)`` or None; ``pos_ptr`` ``(n_q + 1,)`` / ``pos_items`` ``(nnz,)`` (CSR positives);
    ``centroid`` ``(n_q, d_out)`` L2-normalised mean of the positives (zero without positives);
    ``items`` ``(n_items, d_out)``; ``item_state`` ``(n_items,)``; ``split`` ``(n_q,)`` str.
    """

    prefix: np.ndarray
    prefix_row: np.ndarray
    qtype: np.ndarray
    horizon: np.ndarray
    question: np.ndarray | None
    target_state: np.ndarray
    pos_ptr: np.ndarray
    pos_items: np.ndarray
    centroid: np.ndarray
    items: np.ndarray
    item_state: np.ndarray
    split: np.ndarray

    @property
    def n_pos(self) -> np.ndarray:
        return np.diff(self.pos_ptr)

    def rows(self, split: str, *, with_positives: bool = True) -> np.ndarray:
        mask = self.split == split
        if with_positives:
            mask &= self.n_pos > 0
        return np.flatnonzero(mask)


def pick_prefix_space(bench: Benchmark, requested: str = "") -> str:
    """``requested`` or the first space (sorted) that holds a ``prefixes`` table."""
    if requested:
        return requested
    for name in bench.spaces:
        if (bench.root / "features" / name / "prefixes.npy").exists():
            return name
    raise FileNotFoundError(f"{bench.root}: no space has a prefixes table; encode a visual space first "
                            "(`python -m retrieval encode --space NAME --model IMAGE_MODEL`)")


def cache_dir(bench: Benchmark, fallback: Path) -> Path:
    d = bench.root / ".cache" / "lftr"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def question_embeddings(bench: Benchmark, space_name: str, cache: Path, device: str | None = None) -> np.ndarray:
    """``(n_q, d)`` question-text embeddings from a semantic space's text encoder (cached per space and text)."""
    from retrieval.encoders import query_text_encoder

    texts = bench.queries_ds["question"][:]
    meta = bench.space_meta(space_name)
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


def build_data(bench: Benchmark, target: Space, prefix_space: Space, question: np.ndarray | None = None) -> LFTRData:
    """Assemble `LFTRData` for every query of ``bench`` (vectorised over queries; GT lists are per query)."""
    qd = bench.queries_ds
    prefix_ids = qd["prefix_id"][:]
    prefix_row = prefix_space.prefix_rows(prefix_ids)
    qt_index = {q: i for i, q in enumerate(QUESTION_TYPES)}
    qtype = np.fromiter((qt_index[q] for q in qd["qtype"][:]), np.int64, count=len(qd))
    horizon = np.asarray(qd["horizon"][:], np.int64)
    sidx = bench.state_index
    target_state = np.fromiter((sidx.get(s, -1) for s in qd["target_state_id"][:]), np.int64, count=len(qd))
    cidx = bench.corpus_index
    pools = qd["gt_pools"][:]
    ptr = [0]
    pos: list[np.ndarray] = []
    for p in pools:
        rows = np.fromiter((cidx[x] for t in ("in_dataset", "cross_dataset") for x in p[t] if x in cidx), np.int64)
        items = np.unique(target.corpus_rows_to_items(rows)) if rows.size else rows
        pos.append(items)
        ptr.append(ptr[-1] + items.size)
    pos_items = np.concatenate(pos) if pos else np.zeros(0, np.int64)
    pos_ptr = np.asarray(ptr, np.int64)
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
        item_state=target.item_state, split=np.asarray(qd["split"][:]),
    )


def mine_hard_negatives(data: LFTRData, rows: np.ndarray, n_hard: int, cache: Path | None, *, tag: str = "",
                        device: str = "cpu", chunk: int = 256, progress: bool = True) -> np.ndarray:
    """``(len(rows), n_hard)`` int64 item rows: nearest items to each query's positive centroid, excluding items
    of its target state (cosine, exact, chunked over queries); -1 pads when fewer items qualify. Cached under
    ``cache`` when given."""
    n_hard = min(n_hard, data.items.shape[0])
    if n_hard == 0 or len(rows) == 0:
        return np.zeros((len(rows), 0), np.int64)
    h = hashlib.sha256(tag.encode() + np.asarray(rows).tobytes() + data.centroid[rows].tobytes()
                       + data.items.shape.__repr__().encode() + str(n_hard).encode()).hexdigest()[:16]
    f = cache / f"hardneg-{h}.npy" if cache is not None else None
    if f is not None and f.exists():
        return np.load(f)
    items = torch.from_numpy(data.items).to(device)
    item_state = torch.from_numpy(data.item_state).to(device)
    out = np.empty((len(rows), n_hard), np.int64)
    for s in tqdm(range(0, len(rows), chunk), desc="hard negatives", unit="chunk", disable=not progress):
        r = rows[s:s + chunk]
        sims = torch.from_numpy(data.centroid[r]).to(device) @ items.T
        same = item_state[None, :] == torch.from_numpy(data.target_state[r]).to(device)[:, None]
        sims.masked_fill_(same, -torch.inf)
        top = sims.topk(n_hard, dim=1)
        out[s:s + len(r)] = torch.where(torch.isfinite(top.values), top.indices, -1).cpu().numpy()
    if f is not None:
        with atomic_path(f) as tmp, open(tmp, "wb") as fh:
            np.save(fh, out)
    return out
