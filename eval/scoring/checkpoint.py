"""Resuming `eval.scoring.score_stream`: finished query blocks kept in a directory.

Layout::

    meta.json                   the job (`CheckpointMeta`): a checkpoint written for another job is refused
    block_<a:08d>_<b:08d>.npz   the `eval.scoring.block.BlockResult` of queries a..b-1, written atomically:
                                stats/<pool>/<field>, top/rows, top/scores, top/unlisted, ranked/<field>
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.runs import RankedPositives
from eval.scoring.block import PROBE_STAT_FIELDS, STAT_FIELDS, BlockResult, TopK

#: Names of the `RankedPositives` arrays in a block file, in field order.
_RANKED_KEYS = {"top_off": "top_offsets", "mask": "mask", "above": "above", "tie": "tie",
                "count_off": "count_offsets", "pos_mask": "pos_mask", "pos_count": "pos_count"}


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint was written for: the scoring job's ``fingerprint`` (e.g. a hash of the method's config),
    its shapes, pool and probe names, the unexcluded pools and `groups_hash` of its rows. The scores themselves
    cannot be checked: the fingerprint must change when the source does."""

    fingerprint: str
    n_queries: int
    n_items: int
    k: int
    q_block: int
    pools: list[str]
    probes: list[str]
    no_exclude_pools: list[str]
    groups: str


def groups_hash(pools: dict[str, Sequence[np.ndarray]], exclude: Sequence[np.ndarray] | None,
                probes: dict[str, Sequence[np.ndarray]]) -> str:
    """SHA-256 (16 hex digits) of every pool's, the exclusion's and every probe's rows, query by query."""
    h = hashlib.sha256()
    for group in (pools, {"exclude": exclude if exclude is not None else []}, probes):
        for name, lists in group.items():
            h.update(name.encode())
            for x in lists:
                a = np.asarray(x, np.int64)
                h.update(len(a).to_bytes(8, "little"))
                h.update(a.tobytes())
    return h.hexdigest()[:16]


class Checkpoint:
    """Finished query blocks of one `eval.scoring.score_stream` call under ``root`` (module docstring)."""

    def __init__(self, root: str | os.PathLike, meta: CheckpointMeta):
        from eval.io import read_json, write_json

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        meta_path = self.root / "meta.json"
        want = asdict(meta)
        if meta_path.exists():
            old = read_json(meta_path)
            if old != want:
                diff = sorted(k for k in set(old) | set(want) if old.get(k) != want.get(k))
                raise InputError(f"checkpoint {self.root} was written for another scoring job (differs in {diff}); "
                                 "delete it or use another directory")
        else:
            write_json(meta_path, want)

    def _path(self, a: int, b: int) -> Path:
        return self.root / f"block_{a:08d}_{b:08d}.npz"

    def save(self, a: int, b: int, block: BlockResult) -> None:
        from eval.io import atomic_path

        arrays = {f"stats/{n}/{f}": v for n, d in block.stats.items() for f, v in d.items()}
        arrays.update({"top/rows": block.top.rows, "top/scores": block.top.scores, "top/unlisted": block.top.unlisted})
        arrays.update({f"ranked/{key}": getattr(block.ranked, field) for key, field in _RANKED_KEYS.items()})
        with atomic_path(self._path(a, b)) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)

    def load(self, a: int, b: int, pools: list[str], probes: list[str]) -> BlockResult | None:
        """The block of queries ``a..b-1``, or None when it has not been finished."""
        p = self._path(a, b)
        if not p.exists():
            return None
        with np.load(p) as z:
            stats = {n: {f: z[f"stats/{n}/{f}"] for f in (STAT_FIELDS if n in pools else PROBE_STAT_FIELDS)}
                     for n in (*pools, *probes)}
            top = TopK(rows=z["top/rows"], scores=z["top/scores"], unlisted=z["top/unlisted"])
            ranked = RankedPositives(list(pools), *(z[f"ranked/{key}"] for key in _RANKED_KEYS))
        return BlockResult(stats, top, ranked)
