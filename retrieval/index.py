"""Exact top-k search with FAISS ``IndexFlatIP`` on L2-normalised vectors (inner product = cosine).

Top-k lists come from here; full tie-aware ranks (what the metrics need) come from eval's streaming scorer, which
counts instead of sorting (faiss GPU top-k is capped at 2048, so ranks are never computed by top-k).
A GPU index is used when faiss was built with GPUs and sees one (``faiss-gpu-cu12``, the ``gpu`` extra).
"""

from __future__ import annotations

import numpy as np

from eval.errors import InputError
from eval.features import l2_normalize


def faiss_gpus() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


class FlatIPIndex:
    """Exact inner-product index over ``items`` ``(n_items, d)`` (re-normalised to unit length on add).

    ``search(queries, k)`` takes ``(n, d)`` or ``(n, K, d)`` queries; with K samples per query the score of an item
    is the max over the samples (``s(q, i) = max_k <q_k, x_i>``). Returns ``(scores, item_rows)``, both ``(n, k)``,
    sorted by decreasing score (ties by increasing item row); rows past the item count are -1 with score -inf.
    """

    def __init__(self, items: np.ndarray, *, use_gpu: bool | None = None):
        import faiss

        items = l2_normalize(np.asarray(items, np.float32))
        self.n_items, self.dim = items.shape
        index = faiss.IndexFlatIP(self.dim)
        self.on_gpu = bool(use_gpu if use_gpu is not None else faiss_gpus() > 0)
        if self.on_gpu:
            index = faiss.index_cpu_to_all_gpus(index)
        index.add(items)
        self.index = index

    def search(self, queries: np.ndarray, k: int, *, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(queries, np.float32)
        if q.ndim == 2:
            q = q[:, None, :]
        if q.ndim != 3 or q.shape[2] != self.dim:
            raise InputError(f"queries must be (n, d) or (n, K, d) with d={self.dim}, got {queries.shape}")
        n, n_samples, _ = q.shape
        k_eff = min(k, self.n_items)
        out_s = np.full((n, k), -np.inf, np.float32)
        out_i = np.full((n, k), -1, np.int64)
        step = max(1, chunk // n_samples)
        for s in range(0, n, step):
            block = q[s:s + step]
            b = block.shape[0]
            scores, rows = self.index.search(np.ascontiguousarray(block.reshape(b * n_samples, self.dim)), k_eff)
            sc, ro = _merge_max(scores.reshape(b, n_samples * k_eff), rows.reshape(b, n_samples * k_eff), k_eff)
            out_s[s:s + b, :k_eff], out_i[s:s + b, :k_eff] = sc, ro
        return out_s, out_i


def _merge_max(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the top-k items of the union of per-sample top-k lists, an item scored by its max.

    Exact: an item of the true top-k under the max reduction is in the top-k of the sample that attains its max.
    """
    n = scores.shape[0]
    # sort by (row asc, score desc) so the first occurrence of a row carries its max score
    order = np.lexsort((-scores, rows), axis=1)
    r = np.take_along_axis(rows, order, 1)
    s = np.take_along_axis(scores, order, 1)
    first = np.ones_like(r, dtype=bool)
    first[:, 1:] = r[:, 1:] != r[:, :-1]
    first &= r >= 0
    s = np.where(first, s, -np.inf)
    # final order: score desc, then row asc
    order = np.lexsort((np.where(first, r, np.iinfo(np.int64).max), -s), axis=1)[:, :k]
    out_s = np.take_along_axis(s, order, 1).astype(np.float32)
    out_r = np.take_along_axis(r, order, 1)
    out_r = np.where(np.isfinite(out_s), out_r, -1)
    assert out_s.shape == (n, k)
    return out_s, out_r


def expand_states_topk(state_scores: np.ndarray, state_rows: np.ndarray, item_rows: np.ndarray, k: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Top-k corpus segments from top-k states of a semantic space (each state expands to its member segments,
    which share its score; within a state, segments by increasing corpus row).

    ``state_scores``/``state_rows``: ``(n, k_s)`` from `FlatIPIndex.search` over states; ``item_rows``:
    ``(n_corpus,)`` corpus row -> state row. Returns ``(scores, corpus_rows)`` ``(n, k)``.
    """
    order = np.argsort(item_rows, kind="stable")
    sorted_states = item_rows[order]
    starts = np.searchsorted(sorted_states, np.arange(int(item_rows.max()) + 2), side="left")
    n = state_scores.shape[0]
    out_s = np.full((n, k), -np.inf, np.float32)
    out_r = np.full((n, k), -1, np.int64)
    for qi in range(n):  # loops over queries x k states only, never over the corpus
        members = [order[starts[st]:starts[st + 1]] for st in state_rows[qi] if st >= 0]
        counts = [len(m) for m in members]
        if not members:
            continue
        rows = np.concatenate(members)[:k]
        scores = np.repeat(state_scores[qi, :len(members)], counts)[:k]
        out_s[qi, :len(rows)], out_r[qi, :len(rows)] = scores, rows
    return out_s, out_r
