"""From a model's raw output to a state phrase.

`parse_phrase` (the paper's baselines, asked for "ONLY the object's predicted future state as a short phrase"):

1. drop ``<think>...</think>`` blocks; if an ``Answer:`` line is present, keep what follows the last one;
   otherwise keep the first non-empty line (flag ``multiline`` when more lines followed);
2. strip markdown emphasis, list bullets, labels (``Answer:``, ``Prediction:``) and quotes;
3. strip a preamble that names the object: ``"The ball will be ..."``, ``"It will ..."``, ``"The predicted future
   state is ..."``, ``"The red ball is going to ..."`` (flag ``preamble``);
4. drop punctuation except word-internal hyphens and apostrophes; lowercase; collapse whitespace.

An empty result is a parse failure (``parse_ok = False``, flag ``empty``), scored as a miss. A phrase outside
2-5 words is kept but flagged ``length``.

`parse_answer_line` (the distilled student, which reasons first): the phrase after the last ``Answer:`` line; a
short single-line output without it is taken as a direct answer (flag ``no_answer_line``); a longer output without
one (e.g. a chain of thought cut by ``max_tokens``) is a parse failure (flag ``no_answer_line``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIN_WORDS, MAX_WORDS = 2, 5
#: A direct answer (no ``Answer:`` line) longer than this many words is not taken as a phrase by the student parser.
MAX_DIRECT_WORDS = 8

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
_ANSWER_LINE = re.compile(r"^\W*(?:final\s+)?answer\W*?\s*[:：]\s*(.*)$", re.I)
_LABEL = re.compile(r"^\s*(?:final\s+answer|answer|prediction|predicted(?:\s+future)?\s+state|future\s+state|state)"
                    r"\s*[:：-]\s*", re.I)
_BULLET = re.compile(r"^\s*(?:[-*•>]+|\d+[.)])\s+")
_QUOTES = "\"'`“”‘’«»"
_SUBJECT = r"(?:(?:the|a|an|this|that|its|it's)\s+)?(?:[\w'’-]+\s+){0,4}?"
_PREAMBLES = [
    # "The (predicted) (future) state (of the ball) is/will be ..."
    re.compile(r"^(?:the\s+)?(?:object's\s+|object’s\s+)?(?:predicted\s+)?(?:future\s+|next\s+|final\s+|end\s+)?state"
               r"(?:\s+of\s+" + _SUBJECT + r"[\w'’-]+)?\s+(?:is|will\s+be|would\s+be)\s*[:：]?\s*", re.I),
    # "It will (likely) be ...", "The red ball will ...", "The ball is going to be ..."
    re.compile(r"^(?:it|they|" + _SUBJECT + r"[\w'’-]+)\s+(?:will|would|should|is\s+going\s+to|are\s+going\s+to|"
               r"is\s+likely\s+to|is\s+expected\s+to)\s+(?:(?:most\s+)?likely\s+|probably\s+|then\s+|soon\s+)?(?:be\s+)?",
               re.I),
    # "Will be ...", "Will roll ..."
    re.compile(r"^(?:will|would)\s+(?:be\s+)?", re.I),
    # "I predict (that) ...", "I think ..."
    re.compile(r"^i\s+(?:predict|think|expect|believe)\s+(?:that\s+)?", re.I),
]
_PUNCT = re.compile(r"(?<![\w])['’-]|['’-](?![\w])|[^\w\s'’-]", re.U)


@dataclass
class ParsedPhrase:
    """``phrase`` (None when nothing parseable), ``ok`` (a usable phrase), soft ``flags``."""

    phrase: str | None
    ok: bool
    flags: list[str] = field(default_factory=list)


def _strip_wrappers(s: str) -> str:
    prev = None
    while prev != s:
        prev = s
        s = _BULLET.sub("", s)
        s = _LABEL.sub("", s)
        s = s.strip().strip("*_").strip().strip(_QUOTES).strip()
    return s


def clean_phrase(text: str, flags: list[str] | None = None) -> str:
    """Steps 2-4 of `parse_phrase` on one line: wrappers, preamble, punctuation, case."""
    flags = flags if flags is not None else []
    s = _strip_wrappers(text)
    for pat in _PREAMBLES:
        m = pat.match(s)
        if m and m.end() < len(s):
            s = _strip_wrappers(s[m.end():])
            if "preamble" not in flags:
                flags.append("preamble")
            break
    s = s.replace("’", "'")
    s = _PUNCT.sub(" ", s)
    return " ".join(s.lower().split())


def _finish(phrase: str, flags: list[str]) -> ParsedPhrase:
    if not phrase:
        return ParsedPhrase(None, False, flags + ["empty"])
    n = len(phrase.split())
    if not MIN_WORDS <= n <= MAX_WORDS:
        flags.append("length")
    return ParsedPhrase(phrase, True, flags)


def _lines(raw: str) -> list[str]:
    return [ln.strip() for ln in _THINK.sub("", raw or "").splitlines() if ln.strip()]


def _last_answer(lines: list[str]) -> str | None:
    for ln in reversed(lines):
        m = _ANSWER_LINE.match(ln)
        if m and m.group(1).strip():
            return m.group(1)
    return None


def parse_phrase(raw: str | None) -> ParsedPhrase:
    """Parse a baseline's answer (see the module docstring)."""
    flags: list[str] = []
    lines = _lines(raw or "")
    ans = _last_answer(lines)
    if ans is not None:
        line = ans
    elif lines:
        line = lines[0]
        if len(lines) > 1:
            flags.append("multiline")
    else:
        return ParsedPhrase(None, False, ["empty"])
    return _finish(clean_phrase(line, flags), flags)


def parse_answer_line(raw: str | None) -> ParsedPhrase:
    """Parse a student's output: the phrase after the last ``Answer:`` line, or a short direct answer."""
    lines = _lines(raw or "")
    ans = _last_answer(lines)
    flags: list[str] = []
    if ans is None:
        flags.append("no_answer_line")
        if len(lines) != 1 or len(lines[0].split()) > MAX_DIRECT_WORDS:
            return ParsedPhrase(None, False, flags)
        ans = lines[0]
    return _finish(clean_phrase(ans, flags), flags)
