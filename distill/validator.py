"""The rationale validator: a chain of thought is kept only when it carries no numbers and nothing from after the
question's horizon, has a sensible length, and ends in the right answer line (DynaPix, paper 004, appendix
"Rationale construction": numbers stripped, 80-250 words).

A rationale is a body followed by a final line ``Answer: <state phrase>``. Checks, each a rejection ``code``:

==================  ===========================================================================================
code                rejects
==================  ===========================================================================================
``empty``           no text
``answer_line``     no final ``Answer:`` line, more than one, or an answer that is not the target state (the
                    phrase after ``Answer:``, cleaned as the student parser cleans it, must be one of the target
                    state's phrasings in ``states.jsonl``)
``number``          any digit (coordinates, timestamps, speeds, counts written in digits), a spelled number with a
                    unit (``two seconds``, ``half a second``, ``five frames``), a spelled decimal (``one point five``)
``coordinate``      a coordinate or time variable (``x =``, ``y:``, ``t =``) or a ``(x, y)`` tuple
``future_leak``     a phrasing of a state the object enters only after the target (see
                    `distill.predicates.PredicateSet.after_horizon_states`); phrasings of allowed states are masked
                    first, so ``falling over`` (tipping over, allowed) never counts as ``falling`` (forbidden)
``length``          a body (the text without the answer line) outside ``[min_words, max_words]`` words
==================  ===========================================================================================

Words are maximal runs of letters, digits and apostrophes. Spelled counts without a unit (``two dominoes``) are
scene description, not measurements, and pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from distill.predicates import PredicateSet
from forecasters.parsing import clean_phrase

MIN_WORDS = 80
MAX_WORDS = 250

_NUMBER_WORDS = (r"zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
                 r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|"
                 r"hundred|thousand|half|quarter|dozen|a\s+few|several")
_UNITS = (r"seconds?|secs?|milliseconds?|ms|minutes?|frames?|fps|units?|pixels?|px|meters?|metres?|centimeters?|"
          r"cm|mm|degrees?|radians?|percent|hz")
_SPELLED_MEASURE = re.compile(rf"\b(?:{_NUMBER_WORDS})(?:[\s-]+(?:and\s+)?(?:a|an|{_NUMBER_WORDS}))*[\s-]+(?:{_UNITS})\b",
                              re.I)
_SPELLED_DECIMAL = re.compile(rf"\b(?:{_NUMBER_WORDS})\s+point\s+(?:{_NUMBER_WORDS})\b", re.I)
_COORD = re.compile(r"(?<![\w'])[xyzt]\s*[=:]|\(\s*[xyzt]\s*,\s*[xyzt]\s*(?:,\s*[xyzt]\s*)?\)", re.I)
_ANSWER = re.compile(r"^\W*answer\s*[:：]\s*(.*)$", re.I)
_WORD = re.compile(r"[A-Za-z0-9']+")


@dataclass(frozen=True)
class Rejection:
    """Why a rationale was rejected: a ``code`` (see the module docstring) and a human-readable ``detail``."""

    code: str
    detail: str


@dataclass
class Verdict:
    """The validator's decision on one rationale: ``ok``, the ``reasons`` when not, the body's ``words`` and the
    parsed ``answer`` phrase (None when there is no answer line)."""

    ok: bool
    reasons: list[Rejection] = field(default_factory=list)
    words: int = 0
    answer: str | None = None

    def summary(self) -> str:
        return "ok" if self.ok else "; ".join(f"{r.code}: {r.detail}" for r in self.reasons)


def split_answer(text: str) -> tuple[str, list[str]]:
    """(body, answer phrases of every ``Answer:`` line) of a rationale; the body drops the answer lines."""
    body, answers = [], []
    for line in (text or "").splitlines():
        m = _ANSWER.match(line.strip())
        if m:
            answers.append(m.group(1).strip())
        else:
            body.append(line)
    return "\n".join(body).strip(), answers


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def _phrase_pattern(phrases: Sequence[str]) -> re.Pattern | None:
    ps = sorted({p.strip().lower() for p in phrases if p.strip()}, key=len, reverse=True)
    if not ps:
        return None
    return re.compile(r"(?<![\w'])(?:" + "|".join(r"\s+".join(map(re.escape, p.split())) for p in ps) + r")(?![\w'])",
                      re.I)


class RationaleValidator:
    """Checks rationales against a query's predicates; ``members`` maps a canonical state to its phrasings."""

    def __init__(self, members: Mapping[str, Sequence[str]], *, min_words: int = MIN_WORDS,
                 max_words: int = MAX_WORDS):
        if not 0 < min_words <= max_words:
            raise ValueError(f"need 0 < min_words <= max_words, got {min_words}, {max_words}")
        self.members = {k: tuple(v) for k, v in members.items()}
        self.min_words, self.max_words = min_words, max_words

    def phrasings(self, state: str) -> tuple[str, ...]:
        return self.members.get(state, (state,))

    def _answer_ok(self, answer: str, target: str) -> bool:
        cleaned = clean_phrase(answer)
        return cleaned in {clean_phrase(p) for p in self.phrasings(target)}

    def leaks(self, body: str, ps: PredicateSet) -> list[str]:
        """The forbidden (after-horizon) phrasings found in ``body`` once allowed phrasings are masked."""
        forbidden = [p for s in ps.after_horizon_states for p in self.phrasings(s)]
        pattern = _phrase_pattern(forbidden)
        if pattern is None:
            return []
        allowed = _phrase_pattern([p for s in ps.allowed_states for p in self.phrasings(s)] + [ps.subject])
        masked = allowed.sub(" ", body) if allowed is not None else body
        return sorted({m.group(0).lower() for m in pattern.finditer(masked)})

    def check(self, text: str, ps: PredicateSet) -> Verdict:
        """Validate one rationale for the query of ``ps`` (see the module docstring for the checks)."""
        if not text or not text.strip():
            return Verdict(False, [Rejection("empty", "no text")])
        body, answers = split_answer(text)
        reasons: list[Rejection] = []
        answer = answers[-1] if answers else None
        last = next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), "")
        if not answers:
            reasons.append(Rejection("answer_line", "no final 'Answer: <state>' line"))
        elif len(answers) > 1:
            reasons.append(Rejection("answer_line", f"{len(answers)} 'Answer:' lines; expected exactly one"))
        elif not _ANSWER.match(last.strip()):
            reasons.append(Rejection("answer_line", "the 'Answer:' line is not the last line"))
        elif not self._answer_ok(answer, ps.answer):
            reasons.append(Rejection("answer_line", f"answer {answer!r} is not the target state {ps.answer!r}"))
        nums = sorted({m.group(0) for rx in (_SPELLED_MEASURE, _SPELLED_DECIMAL) for m in rx.finditer(body)})
        digits = re.findall(r"\S*\d\S*", body)
        if digits or nums:
            reasons.append(Rejection("number", "numbers: " + ", ".join((digits + nums)[:5])))
        coords = sorted({m.group(0) for m in _COORD.finditer(body)})
        if coords:
            reasons.append(Rejection("coordinate", "coordinate/time variables: " + ", ".join(coords[:5])))
        leaks = self.leaks(body, ps)
        if leaks:
            reasons.append(Rejection("future_leak", "states after the question's horizon: " + ", ".join(leaks)))
        words = count_words(body)
        if not self.min_words <= words <= self.max_words:
            reasons.append(Rejection("length", f"{words} words, outside {self.min_words}-{self.max_words}"))
        return Verdict(not reasons, reasons, words, answer)


def validator_for(bench, **kw) -> RationaleValidator:
    """A validator with the benchmark's state phrasings (``states.jsonl`` members)."""
    from distill.predicates import OracleIndex

    return RationaleValidator(OracleIndex(bench).members, **kw)


@dataclass
class ValidateConfig:
    """``python -m distill validate``: check a rationale file against the predicates; exit code 1 on rejections."""

    data: str = field(metadata={"help": "benchmark directory"})
    predicates: str = field(metadata={"help": "predicates JSONL"})
    rationales: str = field(metadata={"help": "JSONL with query_id and rationale fields (or a narration dir)"})
    out: str | None = field(default=None, metadata={"help": "write the report (JSON) here"})
    min_words: int = field(default=MIN_WORDS, metadata={"help": "shortest body"})
    max_words: int = field(default=MAX_WORDS, metadata={"help": "longest body"})


def validate_file(cfg: ValidateConfig) -> dict:
    """Validate every rationale of a file; returns {checked, rejected, by_code, rejections: [{query_id, reasons}]}."""
    from collections import Counter
    from pathlib import Path

    from distill.predicates import PredicateSet
    from eval.benchmark import Benchmark
    from eval.io import FormatError, iter_jsonl, write_json

    bench = Benchmark.load(cfg.data)
    v = validator_for(bench, min_words=cfg.min_words, max_words=cfg.max_words)
    preds = {}
    for i, d in iter_jsonl(cfg.predicates):  # inputs: a missing file, a torn or bad line is named, never skipped
        if not isinstance(d.get("query_id"), str):
            raise FormatError(cfg.predicates, "missing or not a string", line=i, field="query_id")
        try:
            preds[d["query_id"]] = PredicateSet.from_dict(d)
        except TypeError as e:
            raise FormatError(cfg.predicates, f"not a predicate set ({e})", line=i) from None
    path = Path(cfg.rationales)
    path = path / "rationales.jsonl" if path.is_dir() else path
    rejections, codes = [], Counter()
    rows = list(iter_jsonl(path))
    for i, d in rows:
        qid = d.get("query_id")
        if qid not in preds:
            raise FormatError(path, f"no predicates for query {qid!r} in {cfg.predicates}", line=i, field="query_id")
        if not isinstance(d.get("rationale"), str):
            raise FormatError(path, "missing or not a string", line=i, field="rationale")
        verdict = v.check(d["rationale"], preds[qid])
        if not verdict.ok:
            codes.update(r.code for r in verdict.reasons)
            rejections.append({"query_id": qid, "line": i, "reasons": [r.__dict__ for r in verdict.reasons]})
    report = {"checked": len(rows), "rejected": len(rejections), "by_code": dict(codes), "rejections": rejections}
    if cfg.out:
        write_json(cfg.out, report)
    return report
