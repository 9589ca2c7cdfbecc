"""How much do rationales reason, and how much do they restate or leak the answer? ``python -m distill
rationale-stats``.

Over accepted rationales (one or more narration outputs; each row's split comes from the benchmark), with the body
being the rationale without its ``Answer:`` line:

- ``restatements``: occurrences of the target state's phrasings in the body (`distill.lexicon`: lemmatized,
  longest match first over all state phrasings, so a longer phrasing of another state that contains a target
  phrasing does not count); mean, median, and the share of bodies with at least one;
- leakage probe, *string match*: the state named last in the body (any state's phrasing) is the target
  (``string_probe_acc``): what a reader skimming for the conclusion would take as the answer;
- leakage probe, *classifier*: TF-IDF (words and bigrams, sublinear tf) + logistic regression trained on the train
  bodies to predict the canonical answer, accuracy on the test bodies (``classifier_acc``); the same model trained on
  the question text alone (``question_only_acc``) and the most frequent train answer (``majority_acc``) are the
  floors it is read against. A body that states evidence from which the answer follows is recoverable by the
  classifier above those floors; one that restates the answer is recoverable by string match too;
- ``imminent``: bodies that say the change is imminent (one bucket for every query is no evidence);
- validator rejects per narration output (``rejects.jsonl``): rejected tries, by code, and a few examples;
- with ``--predicates`` on a synthetic benchmark, the validator's *false rejections of honest paraphrases*
  (`honest_paraphrase_probe`): each accepted body plus sentences that describe the object's true states up to the
  horizon in free words (the corpus describer, `eval.synth.lexicon.describe`, seeded per query): the observed one in
  the present tense, the intermediate ones in the future tense. Every such sentence is true, so a rejection for a
  contradiction or a leak is a false one (length and wording are not counted: the added sentences change both).
  Its control: a free description of the state after the target, true of none up to the horizon, added in the
  future tense (a real leak): the share the validator catches.

Writes ``<out>/rationale_stats.json`` and ``rationale_stats.md``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class RationaleStatsConfig:
    """``python -m distill rationale-stats``: restatements, leakage probes and validator rejects of narrations."""

    data: str = field(metadata={"help": "benchmark directory"})
    rationales: list[str] = field(metadata={"help": "narration output dirs (or rationales.jsonl files)"})
    out: str = field(metadata={"help": "output directory"})
    train_split: str = field(default="train", metadata={"help": "split the classifier probe trains on"})
    test_split: str = field(default="test", metadata={"help": "split the classifier probe is scored on"})
    examples: int = field(default=4, metadata={"help": "rejected tries shown per narration output"})
    predicates: str | None = field(default=None, metadata={
        "help": "predicates JSONL: adds the honest-paraphrase probe of the validator (synthetic benchmark)"})
    seed: int = field(default=0, metadata={"help": "classifier seed"})


def restatements(body: str, target: str, validator) -> int:
    """Occurrences of ``target``'s phrasings in ``body`` (longest match first over every state's phrasings; an
    occurrence worded exactly as another state's phrasing names that state, `RationaleValidator.mentions`)."""
    from distill.lexicon import longest_first

    return sum(target in m.states for m in longest_first(validator.mentions(body)))


def last_named_state(body: str, validator) -> str | None:
    """The canonical state whose phrasing occurs last in ``body`` (ties in one span: the alphabetically first)."""
    from distill.lexicon import longest_first

    ms = longest_first(validator.mentions(body))
    return min(ms[-1].states) if ms else None


def classifier_probe(train_x: list[str], train_y: list[str], test_x: list[str], test_y: list[str],
                     seed: int = 0) -> float | None:
    """Accuracy on the test texts of TF-IDF + logistic regression fitted on the train texts (None when either side
    is empty or the train side holds one class). The SAGA solver (fast on sparse rows); a probe, so a fit stopped by
    ``max_iter`` is used as is."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    if not train_x or not test_x or len(set(train_y)) < 2:
        return None
    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1),
                          LogisticRegression(solver="saga", max_iter=300, tol=1e-3, C=10.0, random_state=seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(train_x, train_y)
    return float(np.mean(model.predict(test_x) == np.asarray(test_y)))


HONEST_CODES = ("contradiction", "future_leak")
"""Rejections of an honest paraphrase that `honest_paraphrase_probe` counts as false."""
_NOW = ("Right now the {subject} is {state}.", "In the frames the {subject} is {state}.")
_LATER = ("On the way it will be {state}.", "At one point it will be {state}.", "Some time before that it will be "
          "{state}.")


def honest_paraphrase_probe(rows: list[dict], sets: dict, validator, seed: int = 0, examples: int = 4
                            ) -> dict[str, Any]:
    """False rejections of honest paraphrases (module docstring): ``{n, rejected, rejected_share, by_code,
    examples, leak_control}`` over the rows whose predicate set has ``true_states``. ``leak_control`` is the
    opposite case: the body plus one future-tense sentence describing, in free words, the object's state right after
    the target (``next_true_state``) where that description is true of none of its states up to the horizon -- a
    real leak; ``{n, caught, caught_share}`` counts those the validator rejects as ``future_leak`` (it knows the
    benchmark's phrasings, not every free description)."""
    import zlib

    from distill.validator import split_answer
    from eval.synth.lexicon import TrueState, describe, satisfies

    n, rejected, codes, shown = 0, 0, Counter(), []
    control = [0, 0]
    for r in rows:
        ps = sets.get(r["query_id"])
        if ps is None or not ps.true_states or not ps.true_states[0]:
            continue
        rng = np.random.default_rng(zlib.crc32(ps.query_id.encode()) + seed)
        extra = []
        for i, key in enumerate(ps.true_states[:-1]):  # the observed state and the intermediate ones, not the answer
            if key:
                phrase, _ = describe(TrueState.from_key(key), rng)
                forms = _NOW if i == 0 else _LATER
                extra.append(forms[int(rng.integers(len(forms)))].format(subject=ps.subject, state=phrase))
        body = split_answer(r["rationale"])[0]
        v = validator.check(f"{body} {' '.join(extra)}\nAnswer: {ps.answer}", ps)
        bad = [x for x in v.reasons if x.code in HONEST_CODES]
        n += 1
        rejected += bool(bad)
        codes.update(x.code for x in bad)
        if bad and len(shown) < examples:
            shown.append({"query_id": ps.query_id, "added": extra, "reasons": "; ".join(
                f"{x.code}: {x.detail}" for x in bad)})
        if TrueState.is_key(ps.next_true_state):
            phrase, den = describe(TrueState.from_key(ps.next_true_state), rng)
            truths = [TrueState.from_key(t) for t in ps.true_states if TrueState.is_key(t)]
            if not any(satisfies(t, den) for t in truths):
                leak = validator.check(f"{body} Later the {ps.subject} will be {phrase}.\nAnswer: {ps.answer}", ps)
                control[0] += 1
                control[1] += "future_leak" in leak.codes
    return {"n": n, "rejected": rejected, "rejected_share": round(rejected / n, 4) if n else None,
            "by_code": dict(codes), "examples": shown,
            "leak_control": {"n": control[0], "caught": control[1],
                             "caught_share": round(control[1] / control[0], 4) if control[0] else None}}


def _rows(paths: list[str]) -> tuple[list[dict], list[tuple[str, Path]]]:
    from eval.io import FormatError
    from eval.resumable import read_records

    rows, dirs = [], []
    for p in map(Path, paths):
        f = p / "rationales.jsonl" if p.is_dir() else p
        if not f.exists():
            raise FormatError(f, "rationale file does not exist (run `python -m distill narrate` first)")
        rows += [r for r in read_records(f) if isinstance(r.get("rationale"), str)]
        dirs.append((str(p), f.parent))
    return rows, dirs


def reject_summary(narration_dir: Path, examples: int) -> dict[str, Any]:
    """Rejected tries of one narration output (``rejects.jsonl``): count, by code, and examples of distinct codes."""
    from eval.resumable import read_records

    rej = read_records(narration_dir / "rejects.jsonl")
    codes: Counter = Counter()
    shown, seen = [], set()
    for r in rej:
        rc = [part.split(":")[0].strip() for part in str(r.get("reasons", "")).split("; ")]
        codes.update(rc)
        if len(shown) < examples and not set(rc) <= seen:
            seen |= set(rc)
            shown.append({"query_id": r.get("query_id"), "try": r.get("try"), "reasons": r.get("reasons")})
    return {"rejected_tries": len(rej), "by_code": dict(codes.most_common()), "examples": shown}


def _split_stats(rows: list[dict], validator) -> dict[str, Any]:
    from distill.validator import split_answer

    if not rows:
        return {"n": 0}
    bodies = [split_answer(r["rationale"])[0] for r in rows]
    rest = np.asarray([restatements(b, r["answer"], validator) for b, r in zip(bodies, rows, strict=True)])
    probe = [last_named_state(b, validator) == r["answer"] for b, r in zip(bodies, rows, strict=True)]
    return {"n": len(rows), "restatements_mean": round(float(rest.mean()), 3),
            "restatements_median": float(np.median(rest)), "restated_share": round(float((rest > 0).mean()), 4),
            "string_probe_acc": round(float(np.mean(probe)), 4),
            "imminent_share": round(float(np.mean([bool(re.search(r"\bimminent", b, re.I)) for b in bodies])), 4),
            "mean_words": round(float(np.mean([len(b.split()) for b in bodies])), 1)}


def rationale_stats(cfg: RationaleStatsConfig) -> dict[str, Any]:
    """Compute and write the statistics of the module docstring; returns them."""
    from distill.validator import split_answer, validator_for
    from eval.benchmark import Benchmark
    from eval.io import write_json

    bench = Benchmark.load(cfg.data)
    validator = validator_for(bench)
    rows, dirs = _rows(cfg.rationales)
    split = bench.query_field("split")
    question = bench.query_field("question")
    rows = [r for r in rows if r.get("query_id") in split]
    by_split = {s: [r for r in rows if split[r["query_id"]] == s] for s in sorted({split[r["query_id"]] for r in rows})}
    tr, te = by_split.get(cfg.train_split, []), by_split.get(cfg.test_split, [])
    ty, ey = [r["answer"] for r in tr], [r["answer"] for r in te]
    probes = {
        "train": len(tr), "test": len(te),
        "classifier_acc": classifier_probe([split_answer(r["rationale"])[0] for r in tr], ty,
                                           [split_answer(r["rationale"])[0] for r in te], ey, cfg.seed),
        "question_only_acc": classifier_probe([question[r["query_id"]] for r in tr], ty,
                                              [question[r["query_id"]] for r in te], ey, cfg.seed),
        "majority_acc": (float(np.mean(np.asarray(ey) == Counter(ty).most_common(1)[0][0])) if ty and ey else None)}
    stats = {"splits": {s: _split_stats(rs, validator) for s, rs in by_split.items()}, "all": _split_stats(rows, validator),
             "classifier_probe": probes,
             "narrators": dict(Counter(r.get("narrator", "?") for r in rows)),
             "rejects": {name: reject_summary(d, cfg.examples) for name, d in dirs}}
    if cfg.predicates:
        from distill.narrate import read_predicates

        sets = {ps.query_id: ps for ps in read_predicates(cfg.predicates)}
        stats["honest_paraphrases"] = honest_paraphrase_probe(rows, sets, validator, cfg.seed, cfg.examples)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "rationale_stats.json", stats)
    (out / "rationale_stats.md").write_text(to_markdown(stats), encoding="utf-8")
    return stats


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def to_markdown(stats: dict[str, Any]) -> str:
    cols = ("n", "restatements_mean", "restatements_median", "restated_share", "string_probe_acc", "imminent_share",
            "mean_words")
    lines = ["Rationale statistics (`python -m distill rationale-stats`; shares in %)", "",
             "| split | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, s in [*stats["splits"].items(), ("all", stats["all"])]:
        cells = [str(s.get(c, "-")) if c in ("n", "restatements_mean", "restatements_median", "mean_words")
                 else _pct(s.get(c)) for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    p = stats["classifier_probe"]
    lines += ["", f"Leakage probe (TF-IDF + logistic regression, trained on {p['train']} train bodies, scored on "
                  f"{p['test']} test bodies, `Answer:` line removed): accuracy {_pct(p['classifier_acc'])} %; "
                  f"question text only {_pct(p['question_only_acc'])} %; majority answer {_pct(p['majority_acc'])} %."]
    h = stats.get("honest_paraphrases")
    if h and h["n"]:
        lines += ["", f"Honest paraphrases (true states described in free words added to each body): {h['rejected']} "
                      f"of {h['n']} rejected ({_pct(h['rejected_share'])} %)"
                  + (" (" + ", ".join(f"{k} {v}" for k, v in h["by_code"].items()) + ")" if h["by_code"] else "")]
        lines += [f"- {e['query_id']}: {e['reasons'][:200]}" for e in h["examples"]]
        c = h.get("leak_control") or {}
        if c.get("n"):
            lines += ["", f"Leak control (a free description of the state after the target, true of none up to the "
                          f"horizon, added in the future tense): {c['caught']} of {c['n']} caught as future_leak "
                          f"({_pct(c['caught_share'])} %)."]
    for name, r in stats["rejects"].items():
        lines += ["", f"Validator rejects in {name}: {r['rejected_tries']} rejected tries"
                  + (" (" + ", ".join(f"{k} {v}" for k, v in r["by_code"].items()) + ")" if r["by_code"] else "")]
        lines += [f"- {e['query_id']} (try {e['try']}): {str(e['reasons'])[:160]}" for e in r["examples"]]
    return "\n".join(lines) + "\n"
