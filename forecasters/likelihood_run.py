"""A ``likelihood`` forecast through the runner (`ScoreTask`), and its run file: the candidates' scores, expanded
from states to segments and scored by `eval.scoring.score_benchmark` like any method (so `eval score` / `eval
report` read it, ties are exact and the benchmark fingerprint is recorded).

`ScoreTask` is the runner's task for a scoring forecaster (`forecasters.runner.Task`): it loads the candidates and
the normalization (`forecasters.likelihood`), refuses sampling options and a backend that cannot score, scores the
content-free prior once, streams `ScoreRequest` objects (``Backend.stream_scores``), writes one line per query
(`forecasters.likelihood.to_record`) and, when every selected query is answered, the run file (``--run-out``,
default ``NAME.run.parquet``).

Per query (one phrase-file line, `forecasters.likelihood`), with ``m`` the lowest candidate score and
``d = max(1, |m| * 1e-6)`` (a step float32 keeps distinct at that magnitude):

=====================================================  ========================================================
state                                                  score of each of its segments (float32)
=====================================================  ========================================================
a candidate                                            its score ``s(a)``
the r-th state of the tail (first-stage order)         ``m - r * d``
any other state, and segments without a known state    ``m - (T + 1) * d`` (``T`` the tail's length): all tied
=====================================================  ========================================================

A query whose line failed (or is missing, for `build_run` on a partial file) is scored as a miss
(`eval.runs.Run.mark_missed`). Scores live in a dense ``(query block, states + 1)`` float32 table built per query
block (`CandidateScoreSource`), gathered per segment: segments of one state get bitwise identical scores.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.errors import InputError, OutputRefused
from eval.io import FormatError
from eval.phrases import PhraseRecord
from forecasters import likelihood
from forecasters.likelihood import Candidates, CandidateSpec, Normalization, load_candidates, state_texts

log = logging.getLogger(__name__)


class CandidateScoreSource:
    """An `eval.scoring.ScoreSource` over the corpus from per-query state scores (see the module docstring).

    ``rows[i]`` (int64) state rows of query i's candidates, ``scores[i]`` (float32) their scores, ``tail[i]`` the
    first-stage order of further states; ``item_rows`` (n_corpus,) the state row of each segment (-1: unknown)."""

    cached_blocks = True

    def __init__(self, n_states: int, item_rows: np.ndarray, rows: Sequence[np.ndarray],
                 scores: Sequence[np.ndarray], tail: Sequence[np.ndarray], name: str = "likelihood"):
        self.n_states, self.name = int(n_states), name
        self.item_rows = np.where(np.asarray(item_rows) < 0, n_states, item_rows).astype(np.int64)
        self._rows, self._scores, self._tail = list(rows), list(scores), list(tail)
        self.n_queries, self.n_items = len(self._rows), len(self.item_rows)
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None

    def state_row(self, i: int) -> np.ndarray:
        """float32 (n_states + 1,): query i's score of every state (the last column: segments of no known state)."""
        s = np.asarray(self._scores[i], np.float32)
        lo = float(s.min()) if s.size else 0.0
        step = max(1.0, abs(lo) * 1e-6)
        tail = np.asarray(self._tail[i], np.int64)
        out = np.full(self.n_states + 1, np.float32(lo - (len(tail) + 1) * step), np.float32)
        out[tail] = (lo - step * np.arange(1, len(tail) + 1)).astype(np.float32)
        out[np.asarray(self._rows[i], np.int64)] = s
        return out

    def _block(self, q: slice) -> np.ndarray:
        key = (q.start, q.stop)
        if self._cache is None or self._cache[0] != key:
            self._cache = None
            self._cache = (key, np.stack([self.state_row(i) for i in range(q.start, q.stop)]) if q.stop > q.start
                           else np.zeros((0, self.n_states + 1), np.float32))
        return self._cache[1]

    def scores(self, q: slice, items: slice | np.ndarray) -> np.ndarray:
        q = slice(*q.indices(self.n_queries)[:2])
        return np.take(self._block(q), self.item_rows[items], axis=1)


def _parse_line(path: Path, rec, state_index: dict[str, int], states_sha: str) -> tuple[np.ndarray, ...]:
    """(candidate rows, float32 scores, tail rows) of a successful line; `FormatError` naming the line's query."""
    lik = rec.extra.get("likelihood")
    where = f"query {rec.query_id!r}"
    if not isinstance(lik, dict):
        raise FormatError(path, f"{where}: no 'likelihood' record (not a likelihood forecast?)", field="likelihood")
    cands, scores, tail = lik.get("candidates"), lik.get("scores"), lik.get("tail", [])
    if lik.get("states_sha256") != states_sha:
        raise FormatError(path, f"{where}: scored against other canonical states (states_sha256 "
                                f"{lik.get('states_sha256')!r}, the benchmark's {states_sha!r})",
                          field="likelihood.states_sha256", fix="pass the benchmark the forecast ran on")
    if cands == "states":
        cands = list(state_index)
    if not isinstance(cands, list) or not isinstance(scores, list) or len(cands) != len(scores) or not cands:
        raise FormatError(path, f"{where}: 'candidates' and 'scores' must be non-empty lists of one length",
                          field="likelihood")
    unknown = [x for x in [*cands, *tail] if x not in state_index]
    if unknown:
        raise FormatError(path, f"{where}: state id {unknown[0]!r} is not in the benchmark's states.jsonl",
                          field="likelihood.candidates")
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise FormatError(path, f"{where}: scores must be numbers", field="likelihood.scores") from None
    if not np.isfinite(s).all():
        raise FormatError(path, f"{where}: non-finite score {float(s[~np.isfinite(s)][0])}", field="likelihood.scores")
    rows = np.fromiter((state_index[x] for x in cands), np.int64, count=len(cands))
    if len(np.unique(rows)) != len(rows):
        raise FormatError(path, f"{where}: a candidate state is listed twice", field="likelihood.candidates")
    return rows, s.astype(np.float32), np.fromiter((state_index[x] for x in tail), np.int64, count=len(tail))


def build_run(bench, phrases: str | os.PathLike, query_ids: Sequence[str] | None = None, *, method: str | None = None,
              k: int = 50, progress: bool = False):
    """The `eval.runs.Run` of a likelihood phrase file over ``query_ids`` (default: every query of the file, in
    benchmark order). Lines must share one config; failed or missing queries are misses."""
    from eval.phrases import read_phrases
    from eval.scoring import score_benchmark

    path = Path(phrases)
    recs = read_phrases(path)
    hashes = {r.config_hash for r in recs.values()}
    if len(hashes) > 1:
        raise InputError(f"{path}: lines of {len(hashes)} configs ({sorted(hashes)}): a run scores one config",
                         fix="merge shards of one run (python -m forecasters merge), or --drop-foreign")
    if query_ids is None:
        query_ids = sorted(recs, key=lambda q: bench.query_index.get(q, -1))
    unknown = [q for q in query_ids if q not in bench.query_index]
    if unknown:
        raise InputError(f"{path}: query id {unknown[0]!r} is not in {bench.root} ({len(unknown)} unknown)")
    sidx, states_sha = bench.state_index, state_texts(bench)[2]
    rows, scores, tails, missed = [], [], [], np.zeros(len(query_ids), bool)
    for i, q in enumerate(query_ids):
        rec = recs.get(q)
        if rec is None or not rec.ok:
            missed[i] = True
            rows.append(np.zeros(0, np.int64))
            scores.append(np.zeros(0, np.float32))
            tails.append(np.zeros(0, np.int64))
            continue
        r, s, t = _parse_line(path, rec, sidx, states_sha)
        rows.append(r)
        scores.append(s)
        tails.append(t)
    if missed.any():
        log.warning("%s: %d of %d queries have no successful line: scored as misses", path, int(missed.sum()),
                    len(query_ids))
    first = next((r for r in recs.values() if r.ok), None)
    name = method or f"likelihood[{Path(first.model).name if first else 'model'}]"
    config = {"phrases": str(path), "config_hash": next(iter(hashes), None), "misses": int(missed.sum()),
              "forecaster": first.forecaster if first else None, "model": first.model if first else None}
    source = CandidateScoreSource(len(bench.state_ids), bench.segment_state_rows, rows, scores, tails, name=name)
    query_rows = np.fromiter((bench.query_index[q] for q in query_ids), np.int64, count=len(query_ids))
    return score_benchmark(bench, source, query_rows, method=name, config=config, k=k, progress=progress,
                           missed=missed)


def _check_replaceable(path: Path) -> None:
    """Refuse to replace a file that is not a run file (`eval.errors.OutputRefused`)."""
    if not path.exists():
        return
    from eval.runs import read_run

    try:
        read_run(path)
    except Exception:
        raise OutputRefused(f"{path} exists and is not a run file: not replaced",
                            fix="pass another --run-out, or move that file away") from None


def write_likelihood_run(bench, phrases: str | os.PathLike, out: str | os.PathLike,
                         query_ids: Sequence[str] | None = None, **kw: Any) -> Path:
    """`build_run` and write it to ``out`` (atomically; an existing run file there is replaced, anything else is
    refused)."""
    from eval.runs import write_run

    out = Path(out)
    _check_replaceable(out)
    run = build_run(bench, phrases, query_ids, **kw)
    write_run(out, run)
    return out


def run_file_path(cfg) -> Path:
    """Where a scoring run writes its run file: ``--run-out``, else ``runs/NAME.jsonl`` -> ``runs/NAME.run.parquet``."""
    if cfg.run_out:
        return Path(cfg.run_out)
    p = Path(cfg.out)
    return p.with_name(p.name.removesuffix(".jsonl") + ".run.parquet")


@dataclass
class ScoreTask:
    """The runner's task for the ``likelihood`` forecaster (`forecasters.runner.Task`; see the module docstring).
    ``prior``: ``text -> (l(a | x_0), |a|_0)`` once `start` has scored it (None without candidate-prior
    normalization)."""

    candidates: Candidates
    normalization: Normalization
    prior: dict[str, tuple[float, int]] | None = None

    @classmethod
    def setup(cls, cfg, bench, query_ids: list[str]) -> ScoreTask:
        """The candidates of ``query_ids`` and the normalization of a run config; refuses sampling options."""
        if cfg.samples != 1 or cfg.temperature != 0:
            raise InputError("the likelihood forecaster scores candidates, it does not sample: drop --samples and "
                             "--temperature")
        if cfg.candidate_batch_size < 1:
            raise InputError(f"--candidate-batch-size must be >= 1, got {cfg.candidate_batch_size}")
        norm = Normalization(cfg.length_norm, cfg.cpn_alpha)
        return cls(load_candidates(bench, CandidateSpec.parse(cfg.candidates), query_ids), norm)

    @property
    def decoding(self) -> dict:
        """Empty: scoring samples nothing, so the config hash records no decoding."""
        return {}

    @property
    def identity(self) -> dict[str, Any]:
        """The candidates (their source and a hash of it) and the normalization: the config hash's ``scoring``."""
        return {**self.candidates.identity, **self.normalization.to_dict()}

    def check(self, backend) -> None:
        backend.check_scoring()

    def start(self, p, backend) -> str | None:
        """Score the content-free prior (`forecasters.likelihood.prior_scores`); the error message if it fails."""
        if not self.normalization.uses_prior:
            return None
        prior = likelihood.prior_scores(p, backend, [self.candidates.texts[r] for r in self.candidates.all_rows()])
        if isinstance(prior, str):
            return prior
        self.prior = prior
        return None

    def stream(self, p, backend, frames) -> Iterator[list]:
        return backend.stream_scores(likelihood.score_requests(p, frames))

    def record(self, p, result, *, engine: str, batch_size: int) -> PhraseRecord:
        return likelihood.to_record(p, result, self.prior, engine=engine, batch_size=batch_size)

    def finish(self, p) -> Path:
        """Write the run file of the selected queries (`write_likelihood_run`)."""
        return write_likelihood_run(p.bench, p.cfg.out_path, run_file_path(p.cfg), [qid for qid, _ in p.selected])

    def config(self) -> dict[str, Any]:
        return {"candidates_per_query": self.candidates.counts()}
