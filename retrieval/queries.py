"""Query vectors: what every retrieval method produces before scoring, and the sidecar file that keeps them.

A method (baseline, oracle, phrase search, LFTR) turns each query into K >= 1 vectors in one space; an item's score
is the max over the K (``s(q, i) = max_k <v_{q,k}, x_i>``). A query the method cannot answer (a failed or
unparsed phrase, no observed future frame) is a **miss**: all its vectors are zero and ``miss`` flags it; the run
scores it as a miss (`eval.runs.Run.mark_missed`: every positive after every ranked negative, so R@k = 0), never
as the random ranking a full tie would give in expectation.

Beside each run ``RUN.parquet`` the method writes ``RUN.qvec.npz`` (`save_query_vectors`) holding the vectors, the
space and the query ids, so that runs sharing a corpus can be z-score fused later without recomputing them
(``python -m retrieval fuse``). The random baseline stores only its seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import FormatError, atomic_path


@dataclass
class QueryVectors:
    """Query vectors of one method in one space.

    ``vectors``: ``(n, K, d)`` float32, L2-normalised rows (zero rows for misses); ``query_ids``: the ``n`` query
    ids in scoring order; ``space``: the space name; ``kind``: ``"dense"`` or ``"random"`` (``vectors`` empty,
    ``seed`` set); ``miss``: ``(n,)`` bool; ``info``: what a learned method records of its fitting (its run's
    config keeps it).
    """

    query_ids: list[str]
    vectors: np.ndarray
    space: str
    kind: str = "dense"
    seed: int = 0
    miss: np.ndarray | None = None
    info: dict | None = None

    def __post_init__(self) -> None:
        if self.kind == "dense":
            if self.vectors.ndim == 2:
                self.vectors = self.vectors[:, None, :]
            if self.vectors.ndim != 3 or self.vectors.shape[0] != len(self.query_ids):
                raise InputError(f"vectors must be (n={len(self.query_ids)}, K, d), got {self.vectors.shape}")
            self.vectors = np.ascontiguousarray(self.vectors, dtype=np.float32)
        if self.miss is None:
            self.miss = (np.zeros(len(self.query_ids), bool) if self.kind != "dense"
                         else ~np.any(self.vectors != 0, axis=(1, 2)))

    @property
    def n_misses(self) -> int:
        return int(self.miss.sum())


def run_stem(run_path: str | os.PathLike) -> str:
    """A run file's name without its last suffix (``runs/lftr-f0.25.parquet`` -> ``lftr-f0.25``): what names the
    run's sidecar, scoring checkpoint and default labels, so runs whose names differ only after a dot stay apart."""
    p = Path(run_path)
    return p.name[: -len(p.suffix)] if p.suffix else p.name


def sidecar_path(run_path: str | os.PathLike) -> Path:
    """``runs/m3.parquet`` -> ``runs/m3.qvec.npz`` (`run_stem`)."""
    return Path(run_path).with_name(run_stem(run_path) + ".qvec.npz")


def save_query_vectors(path: str | os.PathLike, qv: QueryVectors, *, method: str = "") -> Path:
    path = Path(path)
    with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, query_ids=np.asarray(qv.query_ids, dtype=str), vectors=qv.vectors if qv.kind == "dense"
                 else np.zeros((0, 1, 1), np.float32), space=np.asarray(qv.space), kind=np.asarray(qv.kind),
                 seed=np.asarray(qv.seed), miss=qv.miss, method=np.asarray(method))
    return path


def load_query_vectors(path: str | os.PathLike) -> QueryVectors:
    path = Path(path)
    if not path.exists():
        raise FormatError(path, "missing: runs written by `python -m retrieval` keep their query vectors here; "
                                "runs from elsewhere cannot be fused")
    try:
        z = np.load(path, allow_pickle=False)
        return QueryVectors([str(x) for x in z["query_ids"]], z["vectors"], str(z["space"]), kind=str(z["kind"]),
                            seed=int(z["seed"]), miss=z["miss"].astype(bool))
    except (KeyError, ValueError, OSError) as e:
        raise FormatError(path, f"not a query-vector file ({e})") from None
