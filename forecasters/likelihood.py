"""The ``likelihood`` forecaster: candidate canonical states ranked by the model's log-likelihood of each as the
answer to the M3 prompt (closed-vocabulary forecasting, GenState-AI's VCF-Lik with BLiM's candidate-prior
normalization), so no free-form phrase has to be canonicalized.

``python -m forecasters run --forecaster likelihood --candidates states|topN:RUN ...``

**Candidates** (`CandidateSpec`): ``states`` = every canonical state of the benchmark's ``states.jsonl`` (its
``text``) for every query; ``topN:RUN`` = per query, the first N distinct canonical states in the top-k list of a
retrieval run (``RUN``, a run file scored on the same benchmark: its segments' states, in rank order), i.e. a
rerank of that run. The run's top-k list bounds the candidates: k segments may hold fewer than N states (a warning
says so, and the run config records the candidates per query); write the first-stage run with a larger ``--k``. The states after the first N in that list (the *tail*) keep their first-stage order below the
reranked candidates in the run file (as GenState-AI's rerankers keep the rest of the pool in first-stage order).

**Scores** (`Normalization`). With ``l(a | x) = sum_i log p(a_i | x, a_<i)`` the log-likelihood (nats) of answer
``a`` (``|a|`` tokens, `forecasters.backends.base`) given the query's M3 prompt ``x`` (prefix frames + question) and
``x_0`` the *content-free* prompt (the M3 template with no frames and the question replaced by
`CONTENT_FREE_QUESTION`, "N/A", as Calibrate-Before-Use's content-free input):

    ``s(a) = l(a | x) / |a|^lambda  -  alpha * l(a | x_0) / |a|_0^lambda``

``lambda = 1`` (``--length-norm mean``, the default: the mean token log-likelihood, VCF-Lik's ``s_lik``) or ``0``
(``sum``); ``alpha`` (``--cpn-alpha``, default 1) weighs the candidate prior, BLiM's candidate-prior normalization
(CPN: a candidate the model likes whatever the input, a frequent or short phrase, loses that head start);
``alpha = 0`` switches it off. ``|a|_0`` is the answer's token count under ``x_0`` (the same tokens in practice).
The prior does not depend on the query: it is computed once per run for every candidate text (``NAME.prior.json``
beside the phrase file, reused on resume).

**Output.** One phrase-file line per query (`eval.phrases`): ``phrase`` = the text of the best-scoring candidate
(ties: the first in candidate order), so the top candidate enters Table 3 and fusion like any forecast; and
``extra.likelihood`` = ``{"candidates": [state ids] (or "states": every state in ``states.jsonl`` order),
"states_sha256": (of the states' ids and texts), "logp": [l(a|x)], "n_tokens": [|a|], "scores": [s(a) as float32],
"tail": [state ids]}`` (about 35 bytes per candidate with ``states``). When every selected query is answered, the runner writes the run file
(`forecasters.likelihood_run`: the candidates' scores expanded from states to their segments, scored by
`eval.scoring.score_benchmark`, so ties are exact and the benchmark fingerprint is recorded); for shards,
``python -m forecasters likelihood-run`` builds it from the merged phrase file.

**Cost.** Per query: the shared prompt once (``hf`` with its KV cache, ``vllm`` through its prefix cache; over HTTP
once per candidate) plus one short forward of ``|a|`` tokens per candidate, in batches. ``states`` scores every
state for every query: with ~2,500 canonical states that is ~2,500 candidate passes per query (about 2,500 x 5
tokens), so on CPU ``topN:RUN`` (a rerank of a retrieval run's top states, N = 20-50) is the practical default;
``scripts/bench_likelihood.py`` measures the cost per query against free-form generation.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.errors import InputError
from eval.fingerprint import sha256_files
from eval.phrases import PhraseRecord

log = logging.getLogger(__name__)

#: The question of the content-free prompt x_0 (the M3 template, no frames): Calibrate-Before-Use's "N/A".
CONTENT_FREE_QUESTION = "N/A"
LENGTH_NORMS = ("mean", "sum")


@dataclass(frozen=True)
class Normalization:
    """``s(a) = l(a|x) / |a|^lambda - alpha * l(a|x_0) / |a|_0^lambda``, ``lambda = 1`` for ``length_norm="mean"``,
    0 for ``"sum"``; ``alpha = cpn_alpha`` (0: no candidate-prior normalization). See the module docstring."""

    length_norm: str = "mean"
    cpn_alpha: float = 1.0

    def __post_init__(self):
        if self.length_norm not in LENGTH_NORMS:
            raise InputError(f"--length-norm must be one of {LENGTH_NORMS}, got {self.length_norm!r}")
        if not math.isfinite(self.cpn_alpha):
            raise InputError(f"--cpn-alpha must be a finite number, got {self.cpn_alpha}")

    @property
    def uses_prior(self) -> bool:
        return self.cpn_alpha != 0

    def scores(self, logp: Sequence[float], n_tokens: Sequence[int], prior_logp: Sequence[float] | None = None,
               prior_n: Sequence[int] | None = None) -> np.ndarray:
        """float64 ``s`` per answer (shapes: one value per answer). ``prior_*`` are needed when ``cpn_alpha != 0``."""
        lp, n = np.asarray(logp, np.float64), np.asarray(n_tokens, np.float64)
        if np.any(n < 1):
            raise InputError("every answer needs at least one token")
        s = lp / n if self.length_norm == "mean" else lp.copy()
        if self.uses_prior:
            if prior_logp is None or prior_n is None:
                raise InputError("candidate-prior normalization needs the answers' content-free log-likelihoods")
            p, pn = np.asarray(prior_logp, np.float64), np.asarray(prior_n, np.float64)
            s -= self.cpn_alpha * (p / pn if self.length_norm == "mean" else p)
        return s

    def to_dict(self) -> dict[str, Any]:
        return {"length_norm": self.length_norm, "cpn_alpha": float(self.cpn_alpha),
                "content_free_question": CONTENT_FREE_QUESTION if self.uses_prior else None}


@dataclass(frozen=True)
class CandidateSpec:
    """``states`` (every canonical state) or ``topN:RUN`` (the first N distinct states of a retrieval run)."""

    kind: str
    n: int | None = None
    run: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> CandidateSpec:
        if not text:
            raise InputError("the likelihood forecaster needs --candidates", fix="--candidates states (every "
                             "canonical state) or --candidates top20:runs/m3-bge.parquet (rerank a retrieval run)")
        if text.strip() == "states":
            return cls("states")
        head, sep, run = text.partition(":")
        if sep and head.startswith("top") and head[3:].isdigit() and int(head[3:]) >= 1 and run:
            return cls("top", int(head[3:]), run)
        raise InputError(f"--candidates: expected 'states' or 'topN:RUN' (N >= 1, RUN a run file), got {text!r}")

    def __str__(self) -> str:
        return "states" if self.kind == "states" else f"top{self.n}:{self.run}"


@dataclass
class Candidates:
    """The candidate states of each selected query. ``state_ids`` / ``texts``: the benchmark's states in row order;
    ``rows[qid]`` the candidate state rows (None: every state), ``tail[qid]`` the first-stage order after them."""

    spec: CandidateSpec
    state_ids: list[str]
    texts: list[str]
    rows: dict[str, np.ndarray] | None
    tail: dict[str, np.ndarray]
    identity: dict[str, Any]

    def of(self, qid: str) -> np.ndarray:
        return np.arange(len(self.state_ids)) if self.rows is None else self.rows[qid]

    def counts(self) -> dict[str, Any]:
        """Candidates per query (min, mean, max), for the run config."""
        n = [len(self.of(q)) for q in self.rows] if self.rows is not None else [len(self.state_ids)]
        return {"min": int(min(n)), "mean": round(float(np.mean(n)), 2), "max": int(max(n))}

    def all_rows(self) -> np.ndarray:
        """Every state row some query has as a candidate (the prior's answers)."""
        if self.rows is None:
            return np.arange(len(self.state_ids))
        return np.unique(np.concatenate([*self.rows.values(), np.zeros(0, np.int64)])).astype(np.int64)


def state_texts(bench) -> tuple[list[str], list[str], str]:
    """The benchmark's state ids and texts (stripped) in row order, and a hash of both (16 hex digits)."""
    state_ids = list(bench.state_ids)
    texts = [str(t).strip() for t in bench.states_ds["text"][:]]
    empty = [state_ids[i] for i, t in enumerate(texts) if not t]
    if empty:
        raise InputError(f"{bench.root}/states.jsonl: {len(empty)} state(s) have an empty text, e.g. {empty[0]!r}",
                         fix="give every canonical state its phrase")
    h = hashlib.sha256("".join(f"{i}\t{t}\n" for i, t in zip(state_ids, texts, strict=True)).encode())
    return state_ids, texts, h.hexdigest()[:16]


def load_candidates(bench, spec: CandidateSpec, query_ids: Sequence[str]) -> Candidates:
    """The candidates of ``query_ids`` (see `CandidateSpec`); a run must hold every query and be scored on
    ``bench`` (`eval.evaluate.check_fingerprint`)."""
    state_ids, texts, states_sha = state_texts(bench)
    if spec.kind == "states":
        return Candidates(spec, state_ids, texts, None, {}, {"candidates": "states", "states_sha256": states_sha})
    rows, tail = _top_states(bench, spec, query_ids)
    # the run's content, not its path, identifies the candidates (a moved run file resumes the same job)
    ident = {"candidates": f"top{spec.n}", "run_sha256": sha256_files([spec.run])[:16], "states_sha256": states_sha}
    return Candidates(spec, state_ids, texts, rows, tail, ident)


def _top_states(bench, spec: CandidateSpec, query_ids: Sequence[str]) -> tuple[dict, dict]:
    """Per query the first ``spec.n`` distinct states of the run's top-k list, and the rest of them in order."""
    from eval.evaluate import check_fingerprint
    from eval.runs import read_run

    if not Path(spec.run).is_file():
        raise InputError(f"--candidates {spec}: run file {spec.run} does not exist",
                         fix="score a retrieval run first (python -m retrieval search ... --out RUN)")
    run = read_run(spec.run)
    check_fingerprint(run, bench)
    where = {q: i for i, q in enumerate(run.query_ids)}
    missing = [q for q in query_ids if q not in where]
    if missing:
        raise InputError(f"{spec.run} holds no ranking for {len(missing)} of the {len(query_ids)} selected queries, "
                         f"e.g. {missing[0]!r}", fix="score the retrieval run on the same split (or select the "
                                                     "queries it holds)")
    cidx, seg_state = bench.corpus_index, bench.segment_state_rows
    rows, tail = {}, {}
    for q in query_ids:
        i = where[q]
        if run.missed[i]:
            raise InputError(f"{spec.run}: query {q!r} is a miss in that run (no first-stage ranking to rerank)",
                             fix="rerank a run that answers every selected query")
        seen: dict[int, None] = {}
        for seg in run.topk_ids[i]:
            if seg and seg in cidx and seg_state[cidx[seg]] >= 0:
                seen.setdefault(int(seg_state[cidx[seg]]), None)
        order = np.fromiter(seen, np.int64, count=len(seen))
        if not len(order):
            raise InputError(f"{spec.run}: query {q!r} ranks no segment with a canonical state")
        rows[q], tail[q] = order[: spec.n], order[spec.n:]
    short = sum(len(r) < spec.n for r in rows.values())
    if short:
        log.warning("%s: %d of %d queries have fewer than %d distinct states in its top-%d list (the fewest: %d); "
                    "write the first-stage run with a larger --k to rerank %d", spec.run, short, len(rows), spec.n,
                    run.k, min(len(r) for r in rows.values()), spec.n)
    return rows, tail


def content_free_request(template, system: str | None):
    """The content-free prompt x_0: the template rendered with every text placeholder "N/A" and no media."""
    from forecasters.backends import Request

    values = {name: CONTENT_FREE_QUESTION for name in template.placeholders}
    media = [name for name in template.placeholders if name == "frames"]
    for name in media:
        values.pop(name)
    parts = tuple(p for p in template.render_parts(values, media=media) if isinstance(p, str))
    return Request(id="content-free", parts=parts, system=system)


def prior_path(out: str | Path) -> Path:
    """``runs/lik.jsonl`` -> ``runs/lik.prior.json``."""
    p = Path(out)
    return p.with_name(p.name.removesuffix(".jsonl") + ".prior.json")


def prior_scores(p, backend, texts: Sequence[str]) -> dict[str, tuple[float, int]] | str:
    """``text -> (l(a | x_0), |a|_0)`` for ``texts``, from ``NAME.prior.json`` when it holds them for this config,
    else scored now (one request) and saved. Returns the error message instead when scoring fails."""
    from eval.io import read_json, write_json
    from forecasters.backends import ScoreRequest

    path = prior_path(p.cfg.out)
    known: dict[str, tuple[float, int]] = {}
    if path.exists():
        d = read_json(path)
        if d.get("config_hash") == p.identity.config_hash:
            known = {t: (float(v[0]), int(v[1])) for t, v in d.get("answers", {}).items()}
    todo = sorted({t for t in texts if t not in known})
    if todo:
        req = content_free_request(p.template, p.spec.system)
        (res,) = backend.score([ScoreRequest("content-free", req, tuple(todo))])
        if not res.ok:
            return f"the content-free prior could not be scored: {res.error_kind}: {res.error}"
        known.update({t: (lp, n) for t, lp, n in zip(todo, res.logprobs, res.n_tokens, strict=True)})
        write_json(path, {"config_hash": p.identity.config_hash, "prompt": req.text, "answers": known})
    return known


def score_requests(p, frames) -> Iterator:
    """The todo queries as `ScoreRequest` objects (prompt = the M3 prompt with the run's frames, answers = the
    candidate texts); a query whose prompt cannot be built becomes an ``input`` failure."""
    from forecasters.backends import ScoreRequest, ScoreResult

    pool = p.task.candidates
    for q in p.todo:
        try:
            texts = tuple(pool.texts[r] for r in pool.of(q.id))
            yield ScoreRequest(q.id, p.request(q, frames), texts)
        except Exception as e:
            yield ScoreResult(request_id=q.id, error=f"input: {type(e).__name__}: {e}", error_kind="input")


def f32(x: float) -> float:
    """A float32 value as the shortest decimal that reads back to the same float32 (the lines' score format)."""
    return float(str(np.float32(x)))


def to_record(p, res, prior: dict[str, tuple[float, int]] | None, *, engine: str, batch_size: int) -> PhraseRecord:
    """The phrase-file line of one scored query (see the module docstring for ``extra.likelihood``)."""
    rec = PhraseRecord(query_id=res.request_id, model=p.model, backend=p.cfg.backend, forecaster=p.spec.name,
                       prompt_id=p.template.id, prompt_hash=p.template.hash, decoding={},
                       config_hash=p.identity.config_hash)
    rec.extra.update(engine=engine, batch_size=batch_size, seed=p.cfg.seed, attempts=res.attempts,
                     latency_s=round(res.latency_s, 4), prompt_tokens=res.prompt_tokens, completion_tokens=0)
    if not res.ok:
        rec.error, rec.parse_ok = res.error, False
        rec.extra["error_kind"] = res.error_kind
        return rec
    pool = p.task.candidates
    rows = pool.of(res.request_id)
    texts = [pool.texts[r] for r in rows]
    pl = pn = None
    if p.task.normalization.uses_prior:
        pl, pn = [prior[t][0] for t in texts], [prior[t][1] for t in texts]
    s = p.task.normalization.scores(res.logprobs, res.n_tokens, pl, pn).astype(np.float32)
    if not np.isfinite(s).all():
        j = int(np.flatnonzero(~np.isfinite(s))[0])
        rec.error, rec.parse_ok = f"candidate {texts[j]!r} got the non-finite score {float(s[j])}", False
        rec.extra["error_kind"] = "exception"
        return rec
    best = int(np.argmax(s))  # the first of the best (argmax returns the first maximum)
    rec.phrase, rec.phrases, rec.parse_ok = texts[best], [texts[best]], True
    ids = [pool.state_ids[r] for r in rows]
    listed = ids if pool.rows is not None else "states"  # every state, in states.jsonl order
    rec.extra["likelihood"] = {"candidates": listed, "states_sha256": pool.identity["states_sha256"],
                               "logp": [float(x) for x in res.logprobs],
                               "n_tokens": [int(x) for x in res.n_tokens], "scores": [f32(x) for x in s],
                               "tail": [pool.state_ids[r] for r in pool.tail.get(res.request_id, ())]}
    rec.extra["best_state_id"] = ids[best]
    return rec
