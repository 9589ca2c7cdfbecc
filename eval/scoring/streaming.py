"""`score_stream`: rank the whole corpus for every query in bounded memory, block by block (`eval.scoring.block`)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval.errors import InputError
from eval.runs import RankedPositives
from eval.scoring.block import (
    PROBE_STAT_FIELDS,
    STAT_FIELDS,
    BlockContext,
    BlockResult,
    Labels,
    PassAPlan,
    score_block,
)
from eval.scoring.checkpoint import Checkpoint, CheckpointMeta, groups_hash
from eval.scoring.sources import DEFAULT_C_CHUNK, DEFAULT_Q_BLOCK, as_score_source
from eval.scoring.states import StateIndex, score_block_states

#: Seconds of scoring after which `score_stream` starts saving finished blocks to its checkpoint (then at most this
#: long apart): a job shorter than this writes none, and a killed job loses at most this much work.
CHECKPOINT_EVERY_S = 30.0

#: Pools are bits of an int64 mask (`RankedPositives`).
MAX_POOLS = 62


@dataclass
class StreamResult:
    """What `score_stream` returns (also unpackable as ``topk_rows, topk_scores, stats``).

    ``topk_rows`` int64 (n_q, k) (-1 pads a ranking shorter than k), ``topk_scores`` float32 (n_q, k) (-inf pads),
    ``stats[pool][field]`` per query (fields in `STAT_FIELDS`; probes hold ``n_pos`` and ``best``),
    ``kth_tie_unlisted`` int64 (n_q,): items tied with the k-th score that are not in the list,
    ``ranked`` the tie-aware graded-metric information.
    """

    topk_rows: np.ndarray
    topk_scores: np.ndarray
    stats: dict[str, dict[str, np.ndarray]]
    kth_tie_unlisted: np.ndarray
    ranked: RankedPositives

    def __iter__(self):
        return iter((self.topk_rows, self.topk_scores, self.stats))

    @classmethod
    def of_blocks(cls, nq: int, k: int, pools: list[str], probes: list[str],
                  blocks: Sequence[tuple[slice, BlockResult]]) -> StreamResult:
        """The result of ``nq`` queries from their scored blocks (``(queries, block)``, covering ``0..nq-1``)."""
        stats = {n: {f: np.full(nq, np.nan, np.float32) if f == "best" else np.zeros(nq, np.int64)
                     for f in STAT_FIELDS} for n in pools}
        stats.update({n: {f: np.full(nq, np.nan, np.float32) if f == "best" else np.zeros(nq, np.int64)
                          for f in PROBE_STAT_FIELDS} for n in probes})
        out = cls(np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf, np.float32), stats,
                  np.zeros(nq, np.int64), concat_ranked(pools, [block.ranked for _, block in blocks]))
        for q, block in blocks:
            for n, d in block.stats.items():
                for f, v in d.items():
                    out.stats[n][f][q] = v
            out.topk_rows[q], out.topk_scores[q], out.kth_tie_unlisted[q] = (
                block.top.rows, block.top.scores, block.top.unlisted)
        return out


def concat_ranked(pool_names: list[str], parts: Sequence[RankedPositives]) -> RankedPositives:
    """The blocks' ranked positives as one `RankedPositives` (offsets shifted, arrays int64)."""
    def cat(offsets: str, fields: tuple[str, ...]) -> tuple[np.ndarray, ...]:
        offs, vals = [np.zeros(1, np.int64)], [[] for _ in fields]
        base = 0
        for part in parts:
            o = np.asarray(getattr(part, offsets), np.int64)
            offs.append(o[1:] + base)
            base += int(o[-1])
            for slot, f in enumerate(fields):
                vals[slot].append(np.asarray(getattr(part, f), np.int64))
        return (np.concatenate(offs), *[np.concatenate(v) if v else np.zeros(0, np.int64) for v in vals])

    return RankedPositives(list(pool_names), *cat("top_offsets", ("mask", "above", "tie")),
                           *cat("count_offsets", ("pos_mask", "pos_count")))


def _check_inputs(nq: int, pools: dict[str, Sequence[np.ndarray]], exclude: Sequence[np.ndarray] | None,
                  probes: dict[str, Sequence[np.ndarray]]) -> None:
    for name, lists in {**pools, **probes}.items():
        if len(lists) != nq:
            raise InputError(f"pool {name!r} has {len(lists)} queries, the source has {nq}")
    if exclude is not None and len(exclude) != nq:
        raise InputError(f"exclude has {len(exclude)} queries, the source has {nq}")
    if len(pools) > MAX_POOLS:
        raise InputError(f"at most {MAX_POOLS} pools (they are bits of an int64 mask)")


def score_stream(source: Any, pools: dict[str, Sequence[np.ndarray]], exclude: Sequence[np.ndarray] | None, *,
                 k: int = 50, q_block: int = DEFAULT_Q_BLOCK, c_chunk: int = DEFAULT_C_CHUNK, progress: bool = True,
                 no_exclude_pools: Sequence[str] = ("in_video",),
                 probes: dict[str, Sequence[np.ndarray]] | None = None, checkpoint: str | os.PathLike | None = None,
                 fingerprint: str = "", query_ids: Sequence[str] | None = None,
                 item_ids: Sequence[str] | None = None, source_label: str | None = None,
                 checkpoint_every_s: float = CHECKPOINT_EVERY_S) -> StreamResult:
    """Rank the whole corpus for every query in bounded memory; return the top-k and per-pool rank statistics.

    ``source``: an `eval.scoring.ScoreSource` (other objects with ``n_queries``, ``n_items``, ``scores`` are adapted,
    `eval.scoring.as_score_source`). ``pools[name][i]``: corpus rows of query i's positives in pool ``name``;
    ``exclude[i]``: corpus rows removed from query i's ranking (own video) for every pool not in
    ``no_exclude_pools`` and from the top-k list. ``probes[name][i]``: corpus rows whose best score is recorded
    (``best``, ``n_pos``) without rank counting (triplet diagnostics); probes ignore ``exclude``.

    Work: one ``source.scores`` call per tile (``q_block`` x ``c_chunk``) plus one per query block on the union of
    its positive rows. Memory: O(q_block x c_chunk) plus the pools. A query with an empty pool gets ``n_pos = 0``
    and zeros elsewhere (``best`` NaN).

    Resuming: with ``checkpoint`` (a directory), finished query blocks are saved there atomically and a rerun
    loads them instead of scoring them again (`eval.scoring.checkpoint`). Saving starts once the job has scored for
    ``checkpoint_every_s`` seconds and then repeats at most that far apart, each time with every block finished
    since: a short job writes no blocks (the semantic-text oracle's on the psr preset's test split: 80 MB, each
    fsynced), and a killed job loses at most that much work (0: every block as it finishes). ``fingerprint`` (e.g. a
    hash of the method's config) is stored with the shapes, pool names and a hash of the pools; a checkpoint
    written for anything else is an error, never silently reused. The scores themselves cannot be checked: change
    the fingerprint when the source changes.

    Scores must be finite: a NaN or +-inf score anywhere (counted in the tile kernel at no measurable cost, and in
    the positives' pass A) raises `eval.errors.InputError` naming the source (``source_label``, default its
    `eval.scoring.ScoreSource.label`), the query (``query_ids[i]`` when given) and the corpus item (``item_ids[j]``).
    """
    from tqdm.auto import tqdm

    source = as_score_source(source)
    nq, n_items = int(source.n_queries), int(source.n_items)
    probes = probes or {}
    _check_inputs(nq, pools, exclude, probes)
    names, probe_names = list(pools), list(probes)
    k = int(min(k, n_items))
    if k < 1:
        raise InputError("k must be >= 1 and the corpus non-empty")
    q_block, c_chunk = max(1, int(q_block)), max(1, int(c_chunk))
    blocks: list[tuple[slice, BlockResult]] = []
    n_chunks = math.ceil(n_items / c_chunk)
    bar = tqdm(total=math.ceil(nq / q_block) * n_chunks, desc="scoring", unit="tile", disable=not progress)
    ckpt = Checkpoint(checkpoint, CheckpointMeta(
        fingerprint=fingerprint, n_queries=nq, n_items=n_items, k=k, q_block=q_block, pools=names,
        probes=probe_names, no_exclude_pools=sorted(no_exclude_pools),
        groups=groups_hash(pools, exclude, probes))) if checkpoint else None
    labels = Labels(source_label or source.label, query_ids, item_ids)
    states: StateIndex | None = None
    plan = PassAPlan()
    unsaved: list[tuple[int, int, BlockResult]] = []
    last_save = time.monotonic()
    for a in range(0, nq, q_block):
        b = min(nq, a + q_block)
        block = ckpt.load(a, b, names, probe_names) if ckpt else None
        if block is None:
            ctx = BlockContext.build(slice(a, b), pools=pools, probes=probes, exclude=exclude,
                                     unexcluded=frozenset(no_exclude_pools), n_items=n_items, k=k, c_chunk=c_chunk,
                                     labels=labels)
            at_states = source.state_scores(slice(a, b))
            if at_states is not None:
                S, item_rows = at_states
                if states is None or states.item_rows is not item_rows:
                    states = StateIndex.of(item_rows, S.shape[1])
                block = score_block_states(source, S, states, ctx, bar)
            else:
                block = score_block(source, ctx, bar, plan)
            if ckpt:
                unsaved.append((a, b, block))
                if time.monotonic() - last_save >= checkpoint_every_s:
                    for u in unsaved:
                        ckpt.save(*u)
                    unsaved.clear()
                    last_save = time.monotonic()
        else:
            bar.update(n_chunks)
        blocks.append((slice(a, b), block))
    bar.close()
    return StreamResult.of_blocks(nq, k, names, probe_names, blocks)

