"""The rationale validator: a chain of thought is kept only when it carries no numbers and nothing from after the
question's horizon, agrees with its predicates, has a sensible length and wording, and ends in the right answer line
(DynaPix, paper 004, appendix "Rationale construction": numbers stripped, 80-250 words).

A rationale is a body followed by a final line ``Answer: <state phrase>``. Checks, each a rejection ``code``:

=====================  ======================================================================================
code                   rejects
=====================  ======================================================================================
``empty``              no text
``answer_line``        no final ``Answer:`` line, more than one, or an answer that is not the target state (the
                       phrase after ``Answer:``, cleaned as the student parser cleans it, must be one of the target
                       state's phrasings in ``states.jsonl``)
``answer_statement``   the body announces an answer ("the correct answer is ...", "the answer would be ...", an
                       inline ``Answer:``) or that one was given
``number``             any digit or numeric character (``½``, ``²``), a spelled number with a unit (``two
                       seconds``, ``a couple of seconds``, ``three quarters of a second``, ``five-tenths of a
                       second``, ``a second and a half``), a spelled fraction (``fifteen hundredths``, ``a
                       quarter``), a spelled decimal (``one point five``)
``frame_index``        a frame or second named by its index (``by the fourth frame``, ``at frame fifteen``,
                       ``frame number three``, ``the second second``)
``coordinate``         a coordinate or time variable (``x =``, ``y:``, ``t =``) or a ``(x, y)`` tuple
``future_leak``        a phrasing of a state the object enters only after the target (see
                       `distill.facts.PredicateSet.after_horizon_states`), found by `distill.lexicon` (lemmatized,
                       synonym-mapped, longest match first over *all* state phrasings: a forbidden phrasing that
                       contains an allowed one is caught, an allowed one that contains a forbidden one is not);
                       a predicate's own sentence quoted verbatim never counts (it is true by construction);
                       with a ``semantic`` check (`distill.semantic.SemanticLeaks`), also a future-tense sentence
                       about the object that a sentence-embedding space puts closer to an after-horizon state than
                       to anything allowed (a post-horizon state described in free words)
``contradiction``      the body says the object is in a state its predicates do not hold (a phrasing of a state
                       outside the allowed and after-horizon ones, in a sentence about the object, that is no
                       partial description of what is true: see *open vocabulary* below), or says it
                       moves (or stands still, or moves the opposite way) against the ``direction`` predicate,
                       or names another support than the ``support_now`` predicate, in a present-tense sentence
``answer_restated``    the body names the target state (a phrasing of it, in a sentence that quotes no predicate)
                       although no evidence names it: the target is neither the observed current state, nor an
                       intermediate state, nor the Q4 anchor, nor a Q5 object's end state (a rationale states the
                       answer once, on its ``Answer:`` line)
``no_evidence``        the body states fewer than `MIN_EVIDENCE_FACTS` of the predicate set's evidence facts
                       (``scene`` and ``motion`` sections; all of them when there are fewer): a fact is stated when
                       one sentence holds `EVIDENCE_COVERAGE` of its content keys (`distill.lexicon` keys, the
                       object's name and generic words dropped) -- a padded body with no evidence is rejected
``lexical_diversity``  fewer than `MIN_DISTINCT_RATIO` distinct words per word, one word above
                       `MAX_TOP_WORD_SHARE` of all words, or one sentence repeated more than `MAX_SENTENCE_REPEATS`
                       times (a body of 80 x "the" is rejected)
``length``             a body (the text without the answer line) outside ``[min_words, max_words]`` words
=====================  ======================================================================================

Words are maximal runs of letters, digits and apostrophes. Spelled counts without a unit (``two dominoes``) are
scene description, not measurements, and pass; so do ``first``/``last`` without ``frame``.

**Finding states** (`RationaleValidator.mentions`). Every phrasing of every canonical state is matched on lemmatized
keys (`distill.lexicon`), within one sentence, longest first. Two canonical states may share a key sequence (an open
vocabulary splits one meaning across clusters: "crashing into the red cube" / "slamming into the red cube"); an
occurrence whose exact wording (case and spacing aside) is a phrasing of some of them names those only.

**Open vocabulary.** On a benchmark of thousands of compositional states, a short or partial description of what is
true ("it is resting", "rolling slowly") is itself the phrasing of some other canonical state. A mention labelled
unsupported is therefore a contradiction only when it is *inconsistent* with the query's truth: its content words
are not a subset of the content words of any phrasing of an allowed state, and -- where the benchmark records what
each raw description says (``sim/phrases.jsonl``) and the predicates carry the simulator's ``true_states`` -- its
denotation is satisfied by none of the object's true states from the observed segment through the target
(`eval.synth.lexicon.satisfies`). A post-horizon state's phrasing is a leak, unless it stands in a sentence
without a future marker (`_FUTURE`) and is, by the same rule, a description of what is true up to the horizon.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from distill.facts import PredicateSet
from distill.lexicon import FUNCTION_WORDS, Match, PhraseIndex, contains, keys, longest_first, sentence_ids, tokens
from eval.errors import InputError
from forecasters.parsing import clean_phrase

MIN_WORDS = 80
MAX_WORDS = 250
MIN_DISTINCT_RATIO = 0.3
"""Distinct words / words of a body at least this (template bodies: about 0.5-0.7)."""
MAX_TOP_WORD_SHARE = 0.3
"""No single word may make up more than this share of a body's words ("the": about 0.06 of English prose, up to
0.21 of template bodies, which name objects with "the" throughout)."""
DIVERSITY_MIN_WORDS = 20
"""Bodies shorter than this are left to the length check (word shares of a few words mean nothing)."""
MAX_SENTENCE_REPEATS = 2
"""A sentence may occur at most this many times in a body."""
MIN_EVIDENCE_FACTS = 2
"""A body states at least this many of its predicate set's evidence facts (all of them when it has fewer)."""
EVIDENCE_COVERAGE = 2 / 3
"""A fact counts as stated when one sentence of the body holds this share of its content keys."""
_GENERIC_KEYS = frozenset(("end", "clip", "frame", "scene", "show", "by", "of", "to", "at", "in", "on", "and", "the"))
"""Keys that say nothing about a fact's content (`_content_keys` drops them)."""

_CARDINAL = (r"zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
             r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
             r"thousand|million|dozens?")
_COUNT = (rf"{_CARDINAL}|half|quarter|a\s+couple(?:\s+of)?|couple(?:\s+of)?|a\s+pair\s+of|a\s+few|few|several|"
          r"a\s+handful|handful")
_FRACTION = (r"halves|thirds?|quarters?|fifths?|sixths?|sevenths?|eighths?|ninths?|tenths?|twelfths?|twentieths?|"
             r"hundredths?|thousandths?")
_ORDINAL = (r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|hundredth|"
            r"(?:twenty|thirty|forty|fifty)[\s-](?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)")
_UNITS = (r"seconds?|secs?|milliseconds?|ms|minutes?|frames?|fps|units?|pixels?|px|meters?|metres?|centimeters?|"
          r"cm|mm|degrees?|radians?|percent|hz")
_TIME_UNIT = r"seconds?|secs?|milliseconds?|minutes?|frames?"
_SPELLED_MEASURE = re.compile(
    rf"\b(?:{_COUNT})(?:[\s-]+(?:and\s+)?(?:a\s+)?(?:{_COUNT}|{_FRACTION}))*(?:\s+of)?(?:\s+an?)?[\s-]+(?:{_UNITS})\b"
    rf"|\b(?:a|an|one)\s+(?:second|minute|frame)s?\s+and\s+a\s+(?:half|quarter)\b"
    # a fraction of a unit: "a tenth of a second", "an eighth of a second"
    rf"|\b(?:a|an)[\s-]+(?:{_FRACTION})\s+of\s+(?:a\s+|an\s+|one\s+|the\s+)?(?:{_UNITS})\b"
    # one unit as a duration: "within a second", "in a second or so", "a frame or two later"
    rf"|\b(?:within|in|under|inside|after|for|about|around|roughly|than|over|only|just|barely|almost|nearly)\s+"
    rf"(?:a|an|one)\s+(?:{_TIME_UNIT})(?=\s*[.,;:!?)]|\s*$|\s+(?:or|and|later|earlier|before|after|from|of|into|to|"
    rf"the|it|its|when|as|at|so|until|then)\b)"
    rf"|\b(?:a|an|one)\s+(?:{_TIME_UNIT})\s+or\s+(?:two|so|more|less)\b"
    rf"|\b(?:a|an|one)\s+(?:{_TIME_UNIT})\s+(?:later|earlier|afterwards|from\s+now)\b", re.I)
_SPELLED_FRACTION = re.compile(rf"\b(?:{_CARDINAL})[\s-]+(?:{_FRACTION})\b|\ba\s+quarter\b", re.I)
_SPELLED_DECIMAL = re.compile(rf"\b(?:{_CARDINAL})\s+point\s+(?:{_CARDINAL})\b", re.I)
_FROM_END = r"penultimate|antepenultimate|(?:next|second|third|fourth)[\s-]+(?:to|from)[\s-]+(?:the[\s-]+)?last"
_FRAME_INDEX = re.compile(
    rf"\b(?:frame|image|snapshot)s?\s+(?:number\s+|no\.?\s*|#\s*)?(?:{_CARDINAL}|{_ORDINAL})\b"
    rf"|\b(?:{_ORDINAL}|{_FROM_END})\s+(?:frame|image|snapshot|second)s?\b", re.I)
_COORD = re.compile(r"(?<![\w'])[xyzt]\s*[=:]|\(\s*[xyzt]\s*,\s*[xyzt]\s*(?:,\s*[xyzt]\s*)?\)", re.I)
_ANSWER = re.compile(r"^\W*answer\s*[:：]\s*(.*)$", re.I)
_ANSWER_STATEMENT = re.compile(
    r"\b(?:correct|right|final|true|expected|given|intended)\s+answer\b"
    r"|\banswer\s+(?:is|was|would\s+be|will\s+be|must\s+be|should\s+be|here\s+is)\b"
    r"|\banswer\s*[:：]"
    r"|\bI\s+(?:was|am|have\s+been)\s+(?:told|given)\b", re.I)
_WORD = re.compile(r"[A-Za-z0-9']+")
_SENTENCE = re.compile(r"[^.!?;\n]+")
_FUTURE = re.compile(r"\b(?:will|would|later|then|after|afterwards|soon|eventually|finally|until|once|"
                     r"next(?!\s+to\b)|going\s+to|ends?\s+up|ending\s+up|moment\s+the\s+question)\b", re.I)
"""Words that put a sentence in the future ("next to" is a relation, not a time)."""
_STILL = re.compile(r"\b(?:not\s+moving|stays?\s+(?:still|put)|stand(?:s|ing)?\s+still|sits?\s+still|sitting\s+still|"
                    r"motionless|stationary|does\s+not\s+move|doesn't\s+move|isn't\s+moving|(?:is|lies|sits|stays)"
                    r"\s+at\s+rest|at\s+a\s+standstill|not\s+in\s+motion)\b", re.I)
_DIRECTION = (r"to(?:ward)?s?\s+the\s+(?:left|right)|leftwards?|rightwards?|upwards?|downwards?|up|down|left|right|"
              r"to\s+the\s+(?:left|right)")
#: a verb of motion in the present (moving, heading, travelling, drifting, rolling, sliding ...) with a direction
_MOVING = re.compile(rf"\b(?:mov(?:ing|es)|head(?:ing|s)|travel(?:l?ing|s)|go(?:ing|es)|drift(?:ing|s)|roll(?:ing|s)|"
                     rf"slid(?:ing|es)|glid(?:ing|es)|coast(?:ing|s))\s+(?:(?:quickly|slowly|fast|steadily|away|off)"
                     rf"\s+)?(?P<dir>{_DIRECTION})(?:\s+and\s+(?P<dir2>{_DIRECTION}))?", re.I)
_SUPPORTED = re.compile(r"\b(?:supported|held\s+up|carried)\s+by\s+(?P<what>[a-z' ]+?)(?=$|[,.;]|\s+and\b|\s+at\b)",
                        re.I)


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

    @property
    def codes(self) -> set[str]:
        return {r.code for r in self.reasons}


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


def numbers_in(body: str) -> list[str]:
    """Digits, numeric characters (``½``), spelled measures, fractions and decimals found in ``body``."""
    found = re.findall(r"\S*\d\S*", body)
    if not body.isascii():  # ASCII's only numeric characters are its digits
        found += [ch for ch in body if not "0" <= ch <= "9" and unicodedata.numeric(ch, None) is not None]
    for rx in (_SPELLED_MEASURE, _SPELLED_FRACTION, _SPELLED_DECIMAL):
        found += [m.group(0) for m in rx.finditer(body)]
    return list(dict.fromkeys(found))


def lexical_problem(body: str) -> str | None:
    """Why ``body``'s wording is degenerate (see `MIN_DISTINCT_RATIO`, `MAX_TOP_WORD_SHARE`,
    `MAX_SENTENCE_REPEATS`), or None."""
    words = [w.lower() for w in _WORD.findall(body)]
    if len(words) < DIVERSITY_MIN_WORDS:
        return None
    distinct = len(set(words)) / len(words)
    if distinct < MIN_DISTINCT_RATIO:
        return f"{distinct:.2f} distinct words per word (< {MIN_DISTINCT_RATIO})"
    top, n = Counter(words).most_common(1)[0]
    if n / len(words) > MAX_TOP_WORD_SHARE:
        return f"{top!r} is {n / len(words):.0%} of the words (> {MAX_TOP_WORD_SHARE:.0%})"
    sentences = Counter(" ".join(s.lower().split()) for s in _SENTENCE.findall(body) if s.strip())
    rep, k = sentences.most_common(1)[0] if sentences else ("", 0)
    if k > MAX_SENTENCE_REPEATS:
        return f"a sentence occurs {k} times: {rep[:60]!r}"
    return None


def _dir_parts(words: str) -> set[str]:
    w = words.lower()
    return {d for d in ("left", "right", "up", "down") if re.search(rf"\b{d}(?:wards?)?\b", w)}


_OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}


def surface(text: str) -> str:
    """A wording with case, punctuation, spacing and leading/trailing function words removed (exact-wording
    comparisons of state phrasings)."""
    words = re.findall(r"[a-z0-9']+", text.lower().replace("’", "'"))
    while words and words[0] in FUNCTION_WORDS:
        words.pop(0)
    while words and words[-1] in FUNCTION_WORDS:
        words.pop()
    return " ".join(words)


class RationaleValidator:
    """Checks rationales against a query's predicates; ``members`` maps a canonical state to its phrasings;
    ``denotations`` (optional) maps a raw phrasing to what it says (``sim/phrases.jsonl``: attribute -> value)."""

    def __init__(self, members: Mapping[str, Sequence[str]], *, denotations: Mapping[str, Mapping[str, str]] | None
                 = None, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS, semantic=None):
        if not 0 < min_words <= max_words:
            raise InputError(f"need 0 < min_words <= max_words, got {min_words}, {max_words}")
        self.members = {k: tuple(v) for k, v in members.items()}
        self.min_words, self.max_words = min_words, max_words
        self.semantic = semantic  # a distill.semantic.SemanticLeaks, or None (pattern checks only)
        self.index = PhraseIndex(self.members)
        self._surface: dict[str, set[str]] = {}
        self._keysets: dict[str, list[frozenset[str]]] = {}
        for state, phrases in self.members.items():
            for p in phrases:
                self._surface.setdefault(surface(p), set()).add(state)
            self._keysets[state] = [frozenset(keys(p)) for p in (state, *phrases)]
        self.denotations: dict[tuple[str, ...], list[dict[str, str]]] = {}
        for phrase, den in (denotations or {}).items():
            self.denotations.setdefault(keys(phrase), []).append(dict(den))

    def phrasings(self, state: str) -> tuple[str, ...]:
        return self.members.get(state, (state,))

    def _answer_ok(self, answer: str, target: str) -> bool:
        cleaned = clean_phrase(answer)
        return cleaned in {clean_phrase(p) for p in self.phrasings(target)}

    def mentions(self, body: str, names: Sequence[str] = ()) -> list[Match]:
        """Every occurrence of a state phrasing in ``body`` (overlapping ones included, none across a sentence
        end), each naming the states whose exact wording it is when there are such (module docstring), else every
        state sharing its keys; ``names`` (object names) occur with the empty label ``""``."""
        toks = tokens(body)
        sent = sentence_ids(body, toks)
        found = self.index.find(toks, sent)
        if names:
            found += PhraseIndex({"": list(names)}).find(toks, sent)
        out = []
        for m in found:
            exact = self._surface.get(surface(body[m.start:m.end]), set()) & m.states
            out.append(Match(m.i, m.j, m.start, m.end, frozenset(exact)) if exact else m)
        return out

    def state_matches(self, body: str, ps: PredicateSet) -> list[tuple[Match, str]]:
        """Every state phrasing in ``body``, longest first, each labelled ``allowed``, ``forbidden`` (after the
        horizon) or ``unsupported`` (a state the predicates do not hold). Names of the object and of the other
        objects count as allowed spans, so they are never read as states."""
        allowed, after = set(ps.allowed_states), set(ps.after_horizon_states)

        def label(m: Match) -> str:
            if "" in m.states or m.states & allowed:
                return "allowed"
            return "forbidden" if m.states & after else "unsupported"

        order = {"allowed": 0, "forbidden": 1, "unsupported": 2}
        chosen = longest_first(self.mentions(body, [ps.subject, *ps.objects]), priority=lambda m: order[label(m)])
        # a predicate's own sentence, quoted verbatim, is true up to the horizon by construction: whatever state
        # phrasing its wording happens to contain is neither a leak nor a contradiction
        quoted = _quoted_spans(body, ps)
        out = []
        for m in chosen:
            lab = "allowed" if any(a <= m.start and m.end <= b for a, b in quoted) else label(m)
            if lab == "forbidden" and not _FUTURE.search(_sentence_at(body, m.start)) and \
                    self.consistent(body[m.start:m.end], ps):
                lab = "allowed"  # a present-tense description of what is true now names no future state
            out.append((m, lab))
        return out

    def future_sentences(self, body: str, ps: PredicateSet) -> list[str]:
        """Sentences of ``body`` in the future (`_FUTURE`) about the object (its name, or a leading "it"), naming no
        other object and quoting no predicate: what `semantic_leaks` reads."""
        quoted = _quoted_spans(body, ps)
        out = []
        for sm in sentences_about(body, ps):
            sent = sm.group(0)
            if not _FUTURE.search(sent) or any(a <= sm.start() and sm.end() <= b for a, b in quoted):
                continue
            out.append(sent)
        return out

    def semantic_leaks(self, body: str, ps: PredicateSet) -> list[str]:
        """Future sentences about the object that describe an after-horizon state in free words (`self.semantic`,
        `distill.semantic.SemanticLeaks`); empty without it."""
        if self.semantic is None:
            return []
        return self.semantic.leaks(body, ps, self.phrasings, candidates=self.future_sentences(body, ps))

    def restated(self, body: str, ps: PredicateSet, matches: list[tuple[Match, str]] | None = None) -> list[str]:
        """Mentions of the target state in ``body`` (outside quoted predicates) when no evidence names it (module
        docstring, ``answer_restated``)."""
        named = {ps.current, *ps.intermediate, *([ps.anchor] if ps.anchor else []),
                 *(f.value for f in ps.facts if f.kind == "other_end_state" and f.value)}
        if ps.answer in named:
            return []
        matches = self.state_matches(body, ps) if matches is None else matches
        quoted = _quoted_spans(body, ps)
        return sorted({body[m.start:m.end].lower() for m, _ in matches
                       if ps.answer in m.states and not (m.states & named)
                       and not any(a <= m.start and m.end <= b for a, b in quoted)})

    def evidence_stated(self, body: str, ps: PredicateSet) -> tuple[int, int]:
        """(evidence facts of ``ps`` that ``body`` states, the number it must state) (``no_evidence``)."""
        from distill.facts import EVIDENCE_SECTIONS

        facts = [f for f in ps.facts if f.section in EVIDENCE_SECTIONS]
        subject = set(keys(ps.subject))
        wanted = [k for k in (_content_keys(f.text, subject) for f in facts) if k]
        sentences = [set(keys(m.group(0))) for m in _SENTENCE.finditer(body)]
        stated = sum(any(len(k & s) >= EVIDENCE_COVERAGE * len(k) for s in sentences) for k in wanted)
        return stated, min(MIN_EVIDENCE_FACTS, len(wanted))

    def leaks(self, body: str, ps: PredicateSet) -> list[str]:
        """The forbidden (after-horizon) phrasings found in ``body`` (as written), longest match first."""
        return sorted({body[m.start:m.end].lower() for m, lab in self.state_matches(body, ps) if lab == "forbidden"})

    def consistent(self, phrase: str, ps: PredicateSet) -> bool:
        """``phrase`` (a mention) is a partial description of what is true of the object up to the horizon: its
        content words are a subset of those of a phrasing of an allowed state, or its denotation is satisfied by one
        of ``ps.true_states`` (module docstring, *open vocabulary*)."""
        k = keys(phrase)
        ks = frozenset(k)
        if any(ks <= other for st in ps.allowed_states for other in self._keysets.get(st, [frozenset(keys(st))])):
            return True
        dens = self.denotations.get(k)
        if not dens or not any(ps.true_states):
            return False
        from eval.synth.lexicon import TrueState, satisfies

        truths = [TrueState.from_key(t) for t in ps.true_states if TrueState.is_key(t)]
        return any(satisfies(t, d) for t in truths for d in dens)

    def contradictions(self, body: str, ps: PredicateSet, matches: list[tuple[Match, str]] | None = None
                       ) -> list[str]:
        """Statements of ``body`` that contradict the predicates (see the module docstring)."""
        matches = self.state_matches(body, ps) if matches is None else matches
        direction, support = ps.fact("direction"), ps.fact("support_now")
        quoted = _quoted_spans(body, ps)
        out = []
        for sm in sentences_about(body, ps):
            sent = sm.group(0)
            for m, lab in matches:
                if lab == "unsupported" and sm.start() <= m.start < sm.end() and \
                        not self.consistent(body[m.start:m.end], ps):
                    out.append(f"names {body[m.start:m.end]!r}, a state its predicates do not hold")
            if _FUTURE.search(sent) or any(a <= sm.start() and sm.end() <= b for a, b in quoted):
                continue  # a predicate quoted verbatim is true by construction
            if direction is not None and direction.value:
                out += _direction_conflicts(sent, direction.value)
            if support is not None and support.value and support.value not in ("nothing",):
                out += _support_conflicts(sent, support.value)
        return list(dict.fromkeys(out))

    def check(self, text: str, ps: PredicateSet) -> Verdict:
        """Validate one rationale for the query of ``ps`` (see the module docstring for the checks)."""
        if not text or not text.strip():
            return Verdict(False, [Rejection("empty", "no text")])
        body, answers = split_answer(text)
        reasons: list[Rejection] = []
        answer = answers[-1] if answers else None
        reasons += self._answer_line(text, answers, ps)
        if _ANSWER_STATEMENT.search(body):
            reasons.append(Rejection("answer_statement", f"announces an answer: "
                                                         f"{_ANSWER_STATEMENT.search(body).group(0)!r}"))
        nums = numbers_in(body)
        if nums:
            reasons.append(Rejection("number", "numbers: " + ", ".join(nums[:5])))
        frames = list(dict.fromkeys(m.group(0) for m in _FRAME_INDEX.finditer(body)))
        if frames:
            reasons.append(Rejection("frame_index", "frame indices: " + ", ".join(frames[:5])))
        coords = sorted({m.group(0) for m in _COORD.finditer(body)})
        if coords:
            reasons.append(Rejection("coordinate", "coordinate/time variables: " + ", ".join(coords[:5])))
        matches = self.state_matches(body, ps)
        leaks = sorted({body[m.start:m.end].lower() for m, lab in matches if lab == "forbidden"})
        if self.semantic is not None and not leaks:
            leaks = [f"free-worded: {x!r}" for x in self.semantic_leaks(body, ps)]
        if leaks:
            reasons.append(Rejection("future_leak", "states after the question's horizon: " + ", ".join(leaks)))
        contra = self.contradictions(body, ps, matches)
        if contra:
            reasons.append(Rejection("contradiction", "; ".join(contra[:3])))
        restated = self.restated(body, ps, matches)
        if restated:
            reasons.append(Rejection("answer_restated", "the body names the answer, which no evidence names: "
                                     + ", ".join(restated)))
        stated, needed = self.evidence_stated(body, ps)
        if stated < needed:
            reasons.append(Rejection("no_evidence", f"states {stated} of its evidence facts (at least {needed})"))
        lex = lexical_problem(body)
        if lex:
            reasons.append(Rejection("lexical_diversity", lex))
        words = count_words(body)
        if not self.min_words <= words <= self.max_words:
            reasons.append(Rejection("length", f"{words} words, outside {self.min_words}-{self.max_words}"))
        return Verdict(not reasons, reasons, words, answer)

    def _answer_line(self, text: str, answers: list[str], ps: PredicateSet) -> list[Rejection]:
        last = next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), "")
        if not answers:
            return [Rejection("answer_line", "no final 'Answer: <state>' line")]
        if len(answers) > 1:
            return [Rejection("answer_line", f"{len(answers)} 'Answer:' lines; expected exactly one")]
        if not _ANSWER.match(last.strip()):
            return [Rejection("answer_line", "the 'Answer:' line is not the last line")]
        if not self._answer_ok(answers[0], ps.answer):
            return [Rejection("answer_line", f"answer {answers[0]!r} is not the target state {ps.answer!r}")]
        return []


def sentences_about(body: str, ps: PredicateSet) -> list[re.Match]:
    """The sentences (`_SENTENCE` matches) of ``body`` about the query's object -- its name, or a leading "it" --
    that name no other object of the scene."""
    subj_keys = keys(ps.subject)
    others = [keys(o) for o in ps.objects if o != ps.subject]
    out = []
    for sm in _SENTENCE.finditer(body):
        k = keys(sm.group(0))
        about = contains(k, subj_keys) or bool(re.match(r"\s*it\b", sm.group(0), re.I))
        if about and not any(contains(k, o) for o in others if o):
            out.append(sm)
    return out


def _content_keys(text: str, subject: set[str]) -> frozenset[str]:
    """The keys of a fact's sentence that carry its content: its object's name and `_GENERIC_KEYS` dropped."""
    return frozenset(set(keys(text)) - subject - _GENERIC_KEYS)


def _quoted_spans(body: str, ps: PredicateSet) -> list[tuple[int, int]]:
    """Character spans of ``body`` that quote one of the predicates (not the answer) verbatim."""
    return [(i, i + len(f.text)) for f in ps.facts if f.section != "answer" and f.text for i in _find_all(body, f.text)]


def _sentence_at(text: str, pos: int) -> str:
    """The sentence (`_SENTENCE`) of ``text`` that holds character ``pos``."""
    return next((m.group(0) for m in _SENTENCE.finditer(text) if m.start() <= pos < m.end()), "")


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _direction_conflicts(sentence: str, truth: str) -> list[str]:
    """A present-tense sentence about the object against the ``direction`` value (``still`` or e.g. ``down-left``)."""
    moving = [m for m in _MOVING.finditer(sentence)]
    if truth == "still":
        return [f"says it is {m.group(0)!r}, but it is not moving" for m in moving]
    out = []
    if _STILL.search(sentence):
        out.append(f"says it is {_STILL.search(sentence).group(0)!r}, but it is moving")
    true_parts = set(truth.split("-"))
    for m in moving:
        said = _dir_parts(m.group(0))
        if any(_OPPOSITE[d] in true_parts for d in said):
            out.append(f"says it is {m.group(0)!r}, but it moves {truth.replace('-', ' and ')}")
    return out


def _support_conflicts(sentence: str, truth: str) -> list[str]:
    """A present-tense sentence naming what holds the object up, against the ``support_now`` value."""
    out = []
    truth_keys = set(keys(truth)) - {"bottom", "of"}
    for m in _SUPPORTED.finditer(sentence):
        said = set(keys(m.group("what"))) - {"bottom", "of"}
        if truth == "gripper" or "gripper" in said:
            if ("gripper" in said) != (truth == "gripper"):
                out.append(f"says it is {m.group(0)!r}, but it is supported by {truth}")
        elif said and truth_keys and not said & truth_keys:
            out.append(f"says it is {m.group(0)!r}, but it is supported by {truth}")
    return out


def read_denotations(root) -> dict[str, dict[str, str]] | None:
    """``sim/phrases.jsonl`` of a synthetic benchmark (phrase -> the attribute values it mentions), None without."""
    from pathlib import Path

    from eval.io import FormatError, iter_jsonl

    path = Path(root) / "sim" / "phrases.jsonl"
    if not path.is_file():
        return None
    out = {}
    for i, d in iter_jsonl(path):
        if not isinstance(d.get("phrase"), str) or not isinstance(d.get("denotes"), dict):
            raise FormatError(path, "expected a string 'phrase' and an object 'denotes'", line=i)
        out[d["phrase"]] = d["denotes"]
    return out


def validator_for(bench, *, semantic: bool | object = False, **kw) -> RationaleValidator:
    """A validator with the benchmark's state phrasings (``states.jsonl`` members) and, on a synthetic benchmark,
    what each raw phrasing says (``sim/phrases.jsonl``); ``semantic``: True adds the free-worded leak check with the
    packaged MiniLM (`distill.semantic.SemanticLeaks`), or pass a `SemanticLeaks` to use."""
    from distill.predicates import OracleIndex

    if semantic is True:
        from distill.semantic import SemanticLeaks

        semantic = SemanticLeaks()
    return RationaleValidator(OracleIndex(bench).members, denotations=read_denotations(bench.root),
                              semantic=semantic or None, **kw)


@dataclass
class ValidateConfig:
    """``python -m distill validate``: check a rationale file against the predicates; exit code 1 on rejections."""

    data: str = field(metadata={"help": "benchmark directory"})
    predicates: str = field(metadata={"help": "predicates JSONL"})
    rationales: str = field(metadata={"help": "JSONL with query_id and rationale fields (or a narration dir)"})
    out: str | None = field(default=None, metadata={"help": "write the report (JSON) here"})
    min_words: int = field(default=MIN_WORDS, metadata={"help": "shortest body"})
    max_words: int = field(default=MAX_WORDS, metadata={"help": "longest body"})
    semantic_leaks: bool = field(default=False, metadata={
        "help": "also reject post-horizon states described in free words (distill.semantic, MiniLM)"})


def validate_file(cfg: ValidateConfig) -> dict:
    """Validate every rationale of a file; returns {checked, rejected, by_code, rejections: [{query_id, reasons}]}."""
    from pathlib import Path

    from eval.benchmark import Benchmark
    from eval.io import FormatError, iter_jsonl, write_json

    bench = Benchmark.load(cfg.data)
    v = validator_for(bench, min_words=cfg.min_words, max_words=cfg.max_words, semantic=cfg.semantic_leaks)
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
