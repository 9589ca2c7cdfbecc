"""Answer accuracy of phrase files (DynaPix's selection accuracy, in PSR's open-vocabulary form), with paired tests
that respect the benchmark's clustering (queries share videos).

Reads of a method's answer to a query (1 = names the target canonical state):

- ``exact``: the parsed phrase, cleaned as the student parser cleans it (`forecasters.parsing.clean_phrase`), equals
  one of the phrasings of the target state (``states.jsonl`` text and members);
- ``snap``: the phrase snapped to its nearest canonical state, as ``python -m retrieval search ... --canonicalize 1``
  does (`retrieval.canon.snap`): the state of the run's top-ranked segment. A model that never saw the vocabulary
  (zero-shot) is scored fairly this way. The file contract is that run (distill never imports retrieval): pass
  ``--snap-runs NAME=RUN.parquet ...``. Runs list no segment of the query's own video, so a query whose target
  state occurs only in its own video cannot read as a hit; their number is reported (``snap_unreadable``).

A line counts as **parsed** only when the output followed the answer format (an ``Answer:`` line) or its direct
answer is a known phrasing of some state: a garbage line that the lenient student parser took as a direct answer is
not parsed, and is a miss in every read (its snap is ignored).

Comparisons (``pairs``, default every method against every earlier one in the order given: with
``[zero-shot, answer-only, cot]``, answer-only vs zero-shot, cot vs zero-shot and cot vs answer-only) run on the
queries every phrase file answers, for each read both methods have. Significance is cluster-aware: the bootstrap
resamples videos, not queries (`video_bootstrap`); McNemar's exact test (queries treated as independent) is shown
beside it for reference.

``python -m distill answers --data DIR --phrases zs.jsonl ao.jsonl cot.jsonl --names zero-shot answer-only cot
--snap-runs zero-shot=runs/zs+snap.parquet ... --out DIR`` writes ``answers.json`` and ``answers.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

READS = ("exact", "snap")


@dataclass
class AnswersConfig:
    """``python -m distill answers``: answer accuracy of phrase files, exact and snapped, with video-clustered tests."""

    data: str = field(metadata={"help": "benchmark directory"})
    phrases: list[str] = field(metadata={"help": "phrase files (JSONL) to compare"})
    out: str = field(metadata={"help": "output directory"})
    names: list[str] | None = field(default=None, metadata={"help": "method names (default: file stems)"})
    pairs: list[str] | None = field(default=None, metadata={
        "help": "comparisons 'A:B' (delta = A - B); default: every method against every earlier one"})
    reference: str | None = field(default=None, metadata={"help": "compare every other method against this one only"})
    snap_runs: list[str] | None = field(default=None, metadata={
        "help": "NAME=RUN.parquet: runs of `retrieval search --canonicalize 1` on NAME's phrase file (snap read)"})
    resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples (of videos)"})
    seed: int = field(default=0, metadata={"help": "bootstrap seed"})


# --- reads --------------------------------------------------------------------------------------------------

def phrasing_lookup(bench) -> dict[str, str]:
    """cleaned phrasing -> canonical state text, over every state's text and members (first state wins a tie)."""
    from forecasters.parsing import clean_phrase

    out: dict[str, str] = {}
    for text, members in zip(bench.states_ds["text"][:], bench.states_ds["members"][:], strict=True):
        for p in (text, *(members or [])):
            out.setdefault(clean_phrase(p), text)
    return out


def answer_phrase(rec, lookup: dict[str, str]) -> str | None:
    """The record's answer: the parsed phrase of an output that followed the answer format, or a direct answer
    (a single line without an ``Answer:`` line) that is a known phrasing -- also one longer than the student
    parser's direct-answer cap (`forecasters.parsing.MAX_DIRECT_WORDS`), as open-vocabulary states can be; None when
    the record holds no answer."""
    from forecasters.parsing import clean_phrase

    if rec.error is not None:
        return None
    if "no_answer_line" not in rec.flags:
        return rec.phrase if rec.ok and rec.phrase else None
    raw = rec.raw[0] if isinstance(rec.raw, list) and len(rec.raw) == 1 else rec.raw
    lines = [ln for ln in raw.splitlines() if ln.strip()] if isinstance(raw, str) else []
    direct = rec.phrase if rec.ok and rec.phrase else (lines[0] if len(lines) == 1 else None)
    return clean_phrase(direct) if direct and clean_phrase(direct) in lookup else None


def parsed(rec, lookup: dict[str, str]) -> bool:
    """The record holds an answer (`answer_phrase`): an ``Answer:`` line was followed, or the direct answer is a
    known phrasing."""
    return answer_phrase(rec, lookup) is not None


def exact_states(records: dict, query_ids: list[str], lookup: dict[str, str]) -> list[str | None]:
    """The canonical state each parsed phrase names exactly (None: unparsed or not a known phrasing)."""
    from forecasters.parsing import clean_phrase

    out = []
    for q in query_ids:
        phrase = answer_phrase(records[q], lookup)
        out.append(lookup.get(clean_phrase(phrase)) if phrase else None)
    return out


def snap_states(run_path: str, bench, query_ids: list[str]) -> list[str | None]:
    """The snap read of each query: the canonical state of the top-ranked segment of a ``--canonicalize 1`` run
    (None for a query the run missed or lacks)."""
    from eval.errors import InputError
    from eval.runs import read_run

    run = read_run(run_path)
    snapped = run.config.get("canonicalize_top_m")
    if snapped != 1:
        raise InputError(f"{run_path}: not a snap run (canonicalize_top_m={snapped!r})",
                         fix="write it with `python -m retrieval search ... --canonicalize 1`")
    row = {q: i for i, q in enumerate(run.query_ids)}
    missed = run.missed if run.missed is not None else np.zeros(run.n, bool)
    out = []
    for q in query_ids:
        i = row.get(q)
        out.append(None if i is None or missed[i] or not run.topk_ids[i] else bench.segment(run.topk_ids[i][0]).state)
    return out


# --- statistics ---------------------------------------------------------------------------------------------

def video_bootstrap(a, b, clusters, *, n_resamples: int = 10_000, seed: int = 0, alpha: float = 0.05):
    r"""Cluster bootstrap for ``delta = mean(a) - mean(b)`` over paired queries grouped by video.

    Resample the ``C`` videos with replacement ``B`` times; a resample's ``delta* = sum_c w_c D_c / sum_c w_c N_c``
    (``w_c``: times video ``c`` was drawn, ``D_c``: the sum of ``a - b`` over its queries, ``N_c``: their number).
    CI: the ``alpha/2``, ``1 - alpha/2`` percentiles of ``delta*``; two-sided p from the null-centred distribution,
    ``(1 + #{|delta* - delta| >= |delta|}) / (B + 1)``, as `eval.stats.paired_bootstrap` (which resamples queries,
    too narrow when queries of one video move together); None with fewer than `eval.stats.MIN_BOOTSTRAP_N` videos,
    the same floor, counted in the units resampled. Returns `eval.stats.BootstrapResult`."""
    from eval.stats import MIN_BOOTSTRAP_N, BootstrapResult

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    _, c = np.unique(np.asarray(clusters), return_inverse=True)
    d_c = np.bincount(c, weights=a - b)
    n_c = np.bincount(c).astype(np.float64)
    delta = float((a - b).mean())
    rng = np.random.default_rng(seed)
    boots = np.empty(n_resamples)
    chunk = max(1, 2_000_000 // len(d_c))
    for s in range(0, n_resamples, chunk):
        idx = rng.integers(0, len(d_c), size=(min(chunk, n_resamples - s), len(d_c)))
        boots[s:s + len(idx)] = d_c[idx].sum(axis=1) / n_c[idx].sum(axis=1)
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    p = (1 + int(np.sum(np.abs(boots - delta) >= abs(delta)))) / (n_resamples + 1)
    p = None if len(d_c) < MIN_BOOTSTRAP_N else float(min(1.0, p))
    return BootstrapResult(delta, float(lo), float(hi), p, len(a), float(a.mean()), float(b.mean()), n_resamples,
                           seed, alpha)


# --- the table ----------------------------------------------------------------------------------------------

def _pairs(cfg: AnswersConfig, names: list[str]) -> list[tuple[str, str]]:
    from eval.errors import InputError

    if cfg.pairs:
        out = []
        for p in cfg.pairs:
            a, sep, b = p.partition(":")
            if not sep or a not in names or b not in names or a == b:
                raise InputError(f"pair {p!r}: expected 'A:B' with two of {names}")
            out.append((a, b))
        return out
    if cfg.reference is not None:
        if cfg.reference not in names:
            raise InputError(f"reference {cfg.reference!r} is not one of {names}")
        return [(n, cfg.reference) for n in names if n != cfg.reference]
    return [(names[j], names[i]) for j in range(len(names)) for i in range(j)]


def _snap_runs(cfg: AnswersConfig, names: list[str]) -> dict[str, str]:
    from eval.errors import InputError

    out = {}
    for s in cfg.snap_runs or []:
        name, sep, path = s.partition("=")
        if not sep or name not in names:
            raise InputError(f"snap run {s!r}: expected NAME=RUN.parquet with NAME one of {names}")
        out[name] = path
    return out


def _summary(h: np.ndarray, qt: np.ndarray) -> dict[str, Any]:
    return {"accuracy": round(float(h.mean()), 4),
            "by_qtype": {t: round(float(h[qt == t].mean()), 4) for t in sorted(set(qt))}}


def compare_answers(cfg: AnswersConfig) -> dict[str, Any]:
    from eval.benchmark import Benchmark
    from eval.errors import InputError
    from eval.io import write_json
    from eval.phrases import read_phrases
    from eval.stats import mcnemar_exact

    names = cfg.names or [Path(p).name.removesuffix(".jsonl") for p in cfg.phrases]
    if len(names) != len(cfg.phrases) or len(set(names)) != len(names):
        raise InputError(f"need one distinct name per phrase file, got {names} for {len(cfg.phrases)} file(s)")
    pairs, snap_paths = _pairs(cfg, names), _snap_runs(cfg, names)
    bench = Benchmark.load(cfg.data)
    lookup = phrasing_lookup(bench)
    recs = {n: read_phrases(p) for n, p in zip(names, cfg.phrases, strict=True)}
    common = sorted(set.intersection(*(set(r) for r in recs.values())) & set(bench.query_index))
    if not common:
        raise InputError("the phrase files share no query of the benchmark")
    queries = [bench.query(q) for q in common]
    target = [q.target_state for q in queries]
    qt = np.asarray([q.qtype for q in queries])
    videos = np.asarray([q.video_id for q in queries])
    hits: dict[str, dict[str, np.ndarray]] = {}
    methods: dict[str, Any] = {}
    for n in names:
        reads = {"exact": exact_states(recs[n], common, lookup)}
        is_parsed = np.asarray([parsed(recs[n][q], lookup) for q in common])
        if n in snap_paths:
            snap = snap_states(snap_paths[n], bench, common)
            reads["snap"] = [s if p else None for s, p in zip(snap, is_parsed, strict=True)]
        hits[n] = {r: np.asarray([float(s == t) for s, t in zip(v, target, strict=True)]) for r, v in reads.items()}
        methods[n] = {"n": len(common), "parse_rate": round(float(is_parsed.mean()), 4),
                      "lenient_parse_rate": round(float(np.mean([recs[n][q].ok for q in common])), 4),
                      **{r: _summary(h, qt) for r, h in hits[n].items()}}
    comparisons = []
    for a, b in pairs:
        for r in READS:
            if r in hits[a] and r in hits[b]:
                bs = video_bootstrap(hits[a][r], hits[b][r], videos, n_resamples=cfg.resamples, seed=cfg.seed)
                mc = mcnemar_exact(hits[a][r], hits[b][r])
                comparisons.append({"a": a, "b": b, "read": r, "bootstrap_by_video": bs.to_dict(),
                                    "mcnemar": mc.to_dict()})
    own_only = _target_only_in_own_video(bench, queries)
    result = {"n_common": len(common), "n_videos": int(len(set(videos))), "snap_unreadable": own_only,
              "methods": methods, "comparisons": comparisons}
    out = Path(cfg.out)
    write_json(out / "answers.json", result)
    (out / "answers.md").write_text(to_markdown(result), encoding="utf-8")
    return result


def _target_only_in_own_video(bench, queries) -> int:
    """Queries whose target state has no segment outside their own video (a snap run cannot show them as hits)."""
    videos_of: dict[str, set[str]] = {}
    for state, video in zip(bench.corpus_ds["state"][:], bench.corpus_ds["video_id"][:], strict=True):
        videos_of.setdefault(state, set()).add(video)
    return sum(not (videos_of.get(q.target_state, set()) - {q.video_id}) for q in queries)


def to_markdown(result: dict[str, Any]) -> str:
    reads = [r for r in READS if any(r in m for m in result["methods"].values())]
    qtypes = sorted({t for m in result["methods"].values() for r in reads if r in m for t in m[r]["by_qtype"]})
    head = ["method", "n", "parsed %", *[f"{r} %" for r in reads], *[f"{t} {r} %" for r in reads for t in qtypes]]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, m in result["methods"].items():
        def cell(r, t=None, m=m):
            if r not in m:
                return "–"
            v = m[r]["accuracy"] if t is None else m[r]["by_qtype"].get(t, float("nan"))
            return f"{100 * v:.1f}"
        cells = [name, str(m["n"]), f"{100 * m['parse_rate']:.1f}", *[cell(r) for r in reads],
                 *[cell(r, t) for r in reads for t in qtypes]]
        lines.append("| " + " | ".join(cells) + " |")
    text = (f"Answer accuracy (the phrase names the target canonical state), {result['n_common']} common queries "
            f"from {result['n_videos']} videos\n\n" + "\n".join(lines) + "\n")
    if result["comparisons"]:
        rows = ["| comparison | read | Δ % (95% CI, bootstrap by video) | p (by video) | McNemar p |",
                "|---|---|---|---|---|"]
        for c in result["comparisons"]:
            b, mc = c["bootstrap_by_video"], c["mcnemar"]
            p = "n too small" if b["p_value"] is None else f"{b['p_value']:.3g}"
            rows.append(f"| {c['a']} vs {c['b']} | {c['read']} | {100 * b['delta']:+.1f} [{100 * b['ci_low']:+.1f}, "
                        f"{100 * b['ci_high']:+.1f}] | {p} | {mc['p_value']:.3g} |")
        text += "\n" + "\n".join(rows) + "\n"
    if "snap" in reads:
        text += (f"\nsnap: the phrase snapped to its nearest canonical state (retrieval search --canonicalize 1); "
                 f"{result['snap_unreadable']} queries have their target state only in their own video and cannot "
                 "read as snap hits.\n")
    return text
