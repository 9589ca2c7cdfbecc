"""TREC export: a run as a TREC run file and the benchmark's ground truth as a qrels file, for trec_eval / ranx.

``python -m eval export-trec RUN.parquet --data DIR --out run.trec [--qrels qrels.txt] [--k 100]``

Files (whitespace-separated, one line per item, queries in the run's order):

- run: ``qid Q0 docid rank score tag`` -- the first ``k`` items of the run's top-k list (rank 1..n, n <= k; the
  run's padding and the own video are never listed), ``score`` the method's score (``%.9g``: float32 exactly, so
  ties stay ties) or, with ``scores="rank"``, ``n + 1 - rank``; ``tag`` the run name (whitespace replaced by ``_``).
  A query the method gave no answer for (``missed``) has no line.
- qrels: ``qid 0 docid 1`` for every positive of the query under one GT definition (default ``type2-all``: the
  main pool, in-dataset + cross-dataset, own video excluded), for the same queries as the run file. A query
  without positives has no line.

Both files hold the same queries: the run's queries in the evaluated population (`eval.evaluate.Population`, the
default of ``eval score``: fair test queries of Q1-Q4), so a tool scores the population ``eval score`` scores.

How the numbers compare with ``eval score`` (``R@n`` = ranx ``hit_rate@n`` = trec_eval ``success_n``):

- Cut-off. Only ``k`` items per query are written (at most the run's own k). ``R@n`` for ``n <= k`` has the same
  definition; a tool's MRR is MRR@k (reciprocal rank 0 when the first positive lies beyond k), ours is uncut.
- Ties. A run's top-k list orders tied items by corpus row (``--tie row`` of ``eval score``); ``eval score``'s
  default (``--tie expected``) averages every metric over all orders of the tied items. trec_eval ignores the
  rank column and orders tied scores by docid, descending; ranx orders them as its sort happens to (unspecified).
  With ``scores="run"`` the tools therefore agree with ``eval score`` exactly on runs without ties, and on a tied
  query land between our ``--tie optimistic`` and ``--tie pessimistic`` values. With ``scores="rank"`` the
  written scores are strictly decreasing, so every tool reproduces the listed order: its ``R@n`` equals our
  ``--tie row`` R@n, its MRR our ``--tie row`` MRR cut at k.
- Misses. A missed query has no run line; trec_eval counts it only with ``-c``, ranx only with
  ``make_comparable=True`` (both then score it 0, as ``eval score`` does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError

#: ``scores`` modes: the method's scores, or ``n + 1 - rank`` (the listed order made explicit).
SCORE_MODES = ("run", "rank")
DEFAULT_K = 100
_TREC_RUN_LINE = re.compile(r"^\S+ Q0 \S+ \d+ \S+ \S+$")
_QRELS_LINE = re.compile(r"^\S+ 0 \S+ -?\d+$")


@dataclass
class TrecExport:
    """What `export_trec` wrote: paths, queries, lines, and the run's own k (the most a query can list)."""

    run_path: Path
    qrels_path: Path | None
    n_queries: int
    n_run_lines: int
    n_qrels_lines: int
    run_k: int
    k: int


def trec_tag(name: str) -> str:
    """A run name as a TREC tag: one token (whitespace runs become ``_``)."""
    return re.sub(r"\s+", "_", name.strip()) or "run"


def run_lines(run, rows: Sequence[int], *, k: int, tag: str, scores: str = "run") -> Iterator[str]:
    """TREC run lines (newline-terminated) of the run's queries at ``rows``: the first ``k`` listed items each."""
    if scores not in SCORE_MODES:
        raise InputError(f"unknown scores mode {scores!r}; expected one of {SCORE_MODES}")
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    if not tag or any(c.isspace() for c in tag):
        raise InputError(f"the TREC tag must be one token without whitespace, got {tag!r}")
    for i in rows:
        if run.missed[i]:
            continue
        qid = run.query_ids[i]
        listed = [(d, s) for d, s in zip(run.topk_ids[i][:k], run.topk_scores[i][:k], strict=True) if d != ""]
        n = len(listed)
        for rank, (doc, score) in enumerate(listed, 1):
            value = f"{float(score):.9g}" if scores == "run" else str(n + 1 - rank)
            yield f"{qid} Q0 {doc} {rank} {value} {tag}\n"


def qrels_lines(bench, query_ids: Sequence[str], definition: str = "type2-all") -> Iterator[str]:
    """Qrels lines (``qid 0 docid 1``) of the positives of ``query_ids`` under GT ``definition``."""
    from eval.schema import GT_DEFINITIONS, Query

    if definition not in GT_DEFINITIONS:
        raise InputError(f"unknown GT definition {definition!r}; expected one of {GT_DEFINITIONS}")
    index = bench.query_index
    rows = np.fromiter((index[q] for q in query_ids), dtype=np.int64, count=len(query_ids))
    for r in bench.queries_ds.select(rows):
        q = Query.from_dict(r)
        for doc in dict.fromkeys(q.gt(definition)):  # unique, in file order
            yield f"{q.id} 0 {doc} 1\n"


def is_trec_run(path: Path) -> bool:
    """Recogniser of TREC run files (first line ``qid Q0 docid rank score tag``)."""
    with open(path, encoding="utf-8") as f:
        return bool(_TREC_RUN_LINE.match(f.readline().rstrip("\n")))


def is_qrels(path: Path) -> bool:
    """Recogniser of qrels files (first line ``qid 0 docid rel``)."""
    with open(path, encoding="utf-8") as f:
        return bool(_QRELS_LINE.match(f.readline().rstrip("\n")))


def _write_lines(path: Path, lines: Iterator[str]) -> int:
    from eval.io import atomic_path

    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            n += 1
    return n


def export_trec(run_file: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike, *,
                qrels: str | os.PathLike | None = None, k: int = DEFAULT_K, tag: str | None = None,
                scores: str = "run", gt: str = "type2-all", population=None, overwrite: bool = False) -> TrecExport:
    """Write ``out`` (TREC run) and, with ``qrels``, the qrels file (module docstring). The run must have been
    scored on ``data`` (fingerprint check); ``population`` (`eval.evaluate.Population`, default the paper's main
    benchmark) selects the queries. Both outputs are checked before anything is written and written atomically."""
    from eval.benchmark import Benchmark
    from eval.evaluate import Population, QueryLabels, check_run_against
    from eval.outputs import check_output_file
    from eval.runs import read_run

    inputs = [run_file, data]
    check_output_file(out, "TREC run", recognise=is_trec_run, inputs=inputs, overwrite=overwrite)
    if qrels is not None:
        if Path(qrels).resolve() == Path(out).resolve():
            raise InputError(f"--qrels {qrels} is the same file as --out")
        check_output_file(qrels, "qrels", recognise=is_qrels, inputs=inputs, overwrite=overwrite, option="--qrels")
    run, bench = read_run(run_file), Benchmark.load(data)
    check_run_against(run, bench)
    pop = population or Population()
    rows = np.flatnonzero(pop.mask(QueryLabels.from_benchmark(bench, run.query_ids, run.name)))
    if len(rows) == 0:
        raise InputError(f"run {run.name!r} ({run_file}) has no query in the evaluated population "
                         f"({pop.describe()})", fix="choose the population with --split / --fair / --qtypes")
    ids = [run.query_ids[i] for i in rows]
    n_run = _write_lines(Path(out), run_lines(run, rows, k=k, tag=tag or trec_tag(run.name), scores=scores))
    n_qrels = _write_lines(Path(qrels), qrels_lines(bench, ids, gt)) if qrels is not None else 0
    return TrecExport(Path(out), Path(qrels) if qrels is not None else None, len(ids), n_run, n_qrels, run.k,
                      min(k, run.k))
