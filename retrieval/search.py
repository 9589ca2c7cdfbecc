"""Phrase retrieval: a phrase file (`eval.phrases`) embedded and retrieved in a chosen space.

Each query's usable phrases (``PhraseRecord.samples``: several with multi-sample forecasters) are embedded with the
space's query-side text encoder (a semantic space's sentence-transformers model, or the text tower of a CLIP /
SigLIP image space: text -> image retrieval); an item's score is the max over the query's phrases. Identical phrases
are embedded once. Queries padded to the largest sample count repeat their first phrase (the max is unchanged).

A phrase file with a query id the benchmark does not know, or with no line for any selected query, is refused
(`eval.phrases.check_belongs`; the latter unless ``allow_empty``). A query whose line is missing, failed
(``error``), unparsed (``parse_ok`` false) or empty is a **miss**: its query
vectors are all zero and the run scores it as a miss, R@k = 0 (see `retrieval.queries`); it is counted in the
run config (``misses``) and flagged in the run file (``missed``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from eval.benchmark import Benchmark
from eval.phrases import check_belongs, read_phrases
from retrieval.queries import QueryVectors


@dataclass
class PhraseStats:
    queries: int
    missing_lines: int
    failed: int
    max_samples: int
    unique_phrases: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def phrase_query_vectors(bench: Benchmark, phrases: str | os.PathLike, rows: np.ndarray, space_name: str, encoder,
                         *, max_samples: int | None = None, progress: bool = False, allow_empty: bool = False
                         ) -> tuple[QueryVectors, PhraseStats]:
    """``(n, K, d)`` query vectors of the queries at ``rows`` from a phrase file (see the module docstring). A phrase
    file that does not belong is refused (`eval.phrases.check_belongs`: unknown query ids; with ``allow_empty``
    false, no line for any selected query)."""
    recs = read_phrases(phrases)
    ids = [bench.query_ids[int(r)] for r in rows]
    check_belongs(phrases, recs, bench.query_index, ids, benchmark=str(bench.root), allow_empty=allow_empty)
    samples: list[list[str]] = []
    missing = failed = 0
    for q in ids:
        rec = recs.get(q)
        if rec is None:
            missing += 1
            samples.append([])
        elif not rec.ok:
            failed += 1
            samples.append([])
        else:
            samples.append(rec.samples[:max_samples] if max_samples else rec.samples)
    uniq = sorted({p for s in samples for p in s})
    emb = encoder.encode_queries(uniq, progress=progress) if uniq else np.zeros((0, 1), np.float32)
    pos = {p: i for i, p in enumerate(uniq)}
    K = max([len(s) for s in samples] + [1])
    dim = emb.shape[1] if uniq else _encoder_dim(encoder)
    vec = np.zeros((len(ids), K, dim), np.float32)
    for i, s in enumerate(samples):  # per query: its few phrases
        if s:
            idx = [pos[p] for p in s] + [pos[s[0]]] * (K - len(s))
            vec[i] = emb[idx]
    stats = PhraseStats(queries=len(ids), missing_lines=missing, failed=failed, max_samples=K,
                        unique_phrases=len(uniq))
    return QueryVectors(ids, vec, space_name), stats


def _encoder_dim(encoder) -> int:
    dim = getattr(encoder, "dim", None)
    return int(dim) if dim else int(encoder.encode_queries(["x"]).shape[1])
