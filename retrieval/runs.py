"""From query vectors to run files, through eval's streaming scorer (never a dense queries x corpus matrix).

``score_query_vectors`` builds the score source of a method (``DenseSource`` over the space's items, with the
state -> segment expansion of semantic spaces; ``RandomSource`` for the random baseline), scores it with
`eval.scoring.score_benchmark`, writes the query vectors beside the run (``RUN.qvec.npz``) and then the run
(``RUN.parquet``; the run file is written last, so its existence means the method finished). An interrupted
scoring job resumes from the finished query blocks kept in ``.ckpt-RUN/`` beside the run (eval's scoring
checkpoint, keyed by the method, its config and a SHA-1 of the query vectors), which is removed once the run is
written. ``fuse_runs`` z-score-fuses runs that share a corpus from their saved query vectors (eval's
``FusionSource``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from eval.benchmark import Benchmark
from eval.errors import InputError, UnknownName
from eval.outputs import check_output_file
from eval.runs import Run, is_run_file, write_run
from eval.scoring import DenseSource, FusionSource, RandomSource, score_benchmark
from retrieval.queries import QueryVectors, load_query_vectors, run_stem, save_query_vectors, sidecar_path
from retrieval.spaces import Space


def make_source(bench: Benchmark, qv: QueryVectors, space: Space | None):
    """The eval score source of ``qv`` (``space`` is unused for the random baseline)."""
    if qv.kind == "random":
        return RandomSource(len(qv.query_ids), len(bench.corpus_ids), qv.seed)
    if space is None or space.name != qv.space:
        raise InputError(f"query vectors of space {qv.space!r} need that space loaded")
    if qv.vectors.shape[2] != space.dim:
        raise InputError(f"query vectors are {qv.vectors.shape[2]}-d but space {space.name!r} is {space.dim}-d")
    return DenseSource(qv.vectors, space.items, space.item_rows, reduce="max")


def query_rows_of(bench: Benchmark, query_ids: list[str]) -> np.ndarray:
    idx = bench.query_index
    missing = [q for q in query_ids if q not in idx]
    if missing:
        raise UnknownName(f"{len(missing)} query id(s) are not in the benchmark {bench.root}, e.g. {missing[0]!r}")
    return np.fromiter((idx[q] for q in query_ids), np.int64, count=len(query_ids))


def _is_query_vectors(path: Path) -> bool:
    with np.load(path, allow_pickle=False) as z:
        return "query_ids" in z.files and "space" in z.files


def check_run_output(out: str | os.PathLike, *, inputs=(), overwrite: bool = False, sidecar: bool = True) -> None:
    """Refuse ``out`` before any work unless it may receive a run (`eval.outputs`): missing, or a run file (and,
    with ``sidecar``, its query-vector sidecar missing or a sidecar), or ``overwrite``; never inside or one of the
    job's ``inputs``."""
    check_output_file(out, "run", recognise=is_run_file, inputs=inputs, overwrite=overwrite)
    if sidecar:
        check_output_file(sidecar_path(out), "query-vector", recognise=_is_query_vectors, inputs=inputs,
                          overwrite=overwrite, option="--out's sidecar")


def score_query_vectors(bench: Benchmark, qv: QueryVectors, space: Space | None, out: str | os.PathLike, *,
                        method: str, config: dict[str, Any] | None = None, k: int = 50,
                        progress: bool = True, inputs=(), overwrite: bool = False) -> Run:
    """Score ``qv`` over the whole corpus and write ``out`` (Parquet run) plus its query-vector sidecar.
    ``out`` is checked first (`check_run_output`)."""
    check_run_output(out, inputs=[*inputs, bench.root], overwrite=overwrite)
    cfg = {"space": qv.space, "n_samples": int(qv.vectors.shape[1]) if qv.kind == "dense" else 0,
           "misses": qv.n_misses, "query_vectors_sha1": _digest(qv), **(config or {})}
    ckpt = _checkpoint_dir(out)
    run = score_benchmark(bench, make_source(bench, qv, space), query_rows_of(bench, qv.query_ids), method=method,
                          config=cfg, k=k, progress=progress, checkpoint=ckpt, missed=qv.miss)
    save_query_vectors(sidecar_path(out), qv, method=method)
    write_run(out, run)
    shutil.rmtree(ckpt, ignore_errors=True)
    return run


def _digest(qv: QueryVectors) -> str:
    """SHA-1 of the query vectors (or the random seed): part of the run config, so a scoring checkpoint is only ever
    resumed for the very same vectors."""
    h = hashlib.sha1(qv.kind.encode() + str(qv.seed).encode() + "\n".join(qv.query_ids).encode())
    if qv.kind == "dense":
        h.update(np.ascontiguousarray(qv.vectors).tobytes())
    return h.hexdigest()


def _checkpoint_dir(out: str | os.PathLike) -> Path:
    """``runs/m3.parquet`` -> ``runs/.ckpt-m3/``: finished query blocks of an interrupted scoring job."""
    out = Path(out)
    return out.with_name(f".ckpt-{run_stem(out)}")


def load_fusable(bench: Benchmark, run_paths: list[str | os.PathLike]) -> list[QueryVectors]:
    """Query vectors of each run, restricted to the query ids common to all runs (in the first run's order)."""
    qvs = [load_query_vectors(sidecar_path(p)) for p in run_paths]
    common = set(qvs[0].query_ids)
    for q in qvs[1:]:
        common &= set(q.query_ids)
    if not common:
        raise InputError("the runs share no query ids")
    ids = [q for q in qvs[0].query_ids if q in common]
    out = []
    for qv in qvs:
        if qv.query_ids == ids:
            out.append(qv)
            continue
        pos = {q: i for i, q in enumerate(qv.query_ids)}
        sel = np.fromiter((pos[q] for q in ids), np.int64, count=len(ids))
        vec = qv.vectors[sel] if qv.kind == "dense" else qv.vectors
        out.append(QueryVectors(ids, vec, qv.space, kind=qv.kind, seed=qv.seed, miss=qv.miss[sel]))
    return out


def fuse_query_vectors(bench: Benchmark, qvs: list[QueryVectors], out: str | os.PathLike, *, method: str,
                       weights: list[float] | None = None, config: dict[str, Any] | None = None, k: int = 50,
                       progress: bool = True, inputs: list[str] | None = None, overwrite: bool = False) -> Run:
    """Z-score fusion ``s = sum_k w_k (s_k - mu_k) / sigma_k`` (per query, over the corpus) of query-vector sets
    that cover the same queries; writes the fused run to ``out`` (checked first, `check_run_output`)."""
    check_run_output(out, inputs=[*(inputs or []), bench.root], overwrite=overwrite, sidecar=False)
    if len(qvs) < 2:
        raise InputError("fusion needs at least two inputs")
    ids = qvs[0].query_ids
    if any(q.query_ids != ids for q in qvs[1:]):
        raise InputError("fusion inputs must cover the same queries in the same order (use load_fusable)")
    spaces: dict[str, Space] = {}
    for qv in qvs:
        if qv.kind == "dense" and qv.space not in spaces:
            spaces[qv.space] = Space.load(bench, qv.space)
    sources = [make_source(bench, qv, spaces.get(qv.space)) for qv in qvs]
    fused = FusionSource(sources, weights, names=inputs or [q.space for q in qvs])
    cfg = {"fusion": "z-score", "spaces": [q.space for q in qvs], "weights": list(weights or [1.0] * len(qvs)),
           "inputs": inputs or [], **(config or {})}
    cfg["query_vectors_sha1"] = [_digest(q) for q in qvs]
    ckpt = _checkpoint_dir(out)
    # a fused query is a miss only when every input missed it (the others still carry an answer)
    missed = np.logical_and.reduce([q.miss for q in qvs])
    cfg["misses"] = int(missed.sum())
    run = score_benchmark(bench, fused, query_rows_of(bench, ids), method=method, config=cfg, k=k,
                          progress=progress, checkpoint=ckpt, missed=missed)
    write_run(out, run)
    shutil.rmtree(ckpt, ignore_errors=True)
    return run


def fuse_runs(bench: Benchmark, run_paths: list[str | os.PathLike], out: str | os.PathLike, *, method: str = "",
              weights: list[float] | None = None, k: int = 50, progress: bool = True,
              overwrite: bool = False) -> Run:
    """Fuse runs written by ``python -m retrieval`` (they carry query-vector sidecars) into ``out``."""
    inputs = [*run_paths, *(sidecar_path(p) for p in run_paths)]
    check_run_output(out, inputs=[*inputs, bench.root], overwrite=overwrite, sidecar=False)
    qvs = load_fusable(bench, run_paths)
    name = method or "fusion(" + "+".join(run_stem(p) for p in run_paths) + ")"
    return fuse_query_vectors(bench, qvs, out, method=name, weights=weights, k=k, progress=progress,
                              inputs=[str(p) for p in run_paths], overwrite=overwrite)
