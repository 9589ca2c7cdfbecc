"""Finding state phrasings in free text, robust to inflection and light paraphrase, longest match first.

Text and phrasings are reduced to *keys*: each word is lowercased, a possessive ``'s`` dropped, lemmatized
(`simplemma`, English, offline; "dropped" -> drop, "fell" -> fall) and mapped to the first word of its synonym
group (`SYNONYM_GROUPS`: "settles" -> rest, "bin" -> container); function words (`FUNCTION_WORDS`: articles,
forms of "be", "will", "it") are dropped. A phrasing occurs in a text when its key sequence occurs contiguously in
the text's key sequence, so "has dropped into the bin" matches "dropping into the container", and "is being pushed"
matches "pushed".

`PhraseIndex` holds the key sequences of every phrasing of every canonical state (``states.jsonl`` members) in a
trie; `PhraseIndex.find` returns every occurrence, and `longest_first` keeps a non-overlapping subset, longest first
(ties: a lower ``priority`` value, then the earlier position). So a phrasing that contains another one ("dropping
into the container" vs "dropping") wins over it, and the shorter one is never counted inside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

FUNCTION_WORDS = frozenset((
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "am", "has", "have", "had", "will", "would",
    "shall", "it", "its", "it's", "this", "that", "these", "those", "just"))
"""Words dropped from key sequences (they never decide which state a phrase names)."""

SYNONYM_GROUPS: tuple[tuple[str, ...], ...] = (
    ("rest", "settle", "sit", "lie"),
    ("fall", "drop", "plummet", "plunge"),
    ("slide", "skid", "glide", "slip"),
    ("bounce", "rebound"),
    ("topple", "tip", "keel"),
    ("push", "shove"),
    ("spin", "twirl", "whirl"),
    ("wobble", "teeter"),
    ("crash", "smash", "collide", "slam"),
    ("container", "bin"),
    ("floor", "ground"),
    ("table", "tabletop"),
    ("ramp", "slope", "incline"),
)
"""Lemmas that name the same motion, support or place; each maps to the first of its group. Kept small on purpose:
only words no state vocabulary uses to tell two states apart."""

_SYNONYM = {w: g[0] for g in SYNONYM_GROUPS for w in g}
_TOKEN = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")
_LEMMA_FIXES = {"lying": "lie", "lies": "lie", "lay": "lie", "fell": "fall", "fallen": "fall", "slid": "slide",
                "spun": "spin", "hit": "hit", "being": "be"}


@lru_cache(maxsize=65536)
def word_key(word: str) -> str:
    """The key of one word: lowercased, possessive dropped, lemmatized, synonym-mapped."""
    import simplemma

    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    lemma = _LEMMA_FIXES.get(w) or simplemma.lemmatize(w, lang="en").lower()
    return _SYNONYM.get(lemma, lemma)


@dataclass(frozen=True)
class Token:
    """One content word of a text: its ``key`` and character span ``[start, end)``."""

    key: str
    start: int
    end: int


@lru_cache(maxsize=4096)
def tokens(text: str) -> tuple[Token, ...]:
    """The content words of ``text`` (function words dropped) with their keys and spans (cached: the validator's
    checks of one body each read its words)."""
    return tuple(Token(word_key(w), m.start(), m.end()) for m in _TOKEN.finditer(text)
                 if (w := m.group(0).lower()) not in FUNCTION_WORDS)


@lru_cache(maxsize=262144)
def keys(text: str) -> tuple[str, ...]:
    """The keys of ``text``'s content words (cached: the validator keys the same state phrasings for every body)."""
    return tuple(t.key for t in tokens(text))


def contains(seq: Sequence[str], sub: Sequence[str]) -> bool:
    """``sub`` occurs contiguously in ``seq`` (an empty ``sub`` never does)."""
    n = len(sub)
    return n > 0 and any(tuple(seq[i:i + n]) == tuple(sub) for i in range(len(seq) - n + 1))


@dataclass(frozen=True)
class Match:
    """An occurrence of a phrasing: token span ``[i, j)`` of the text's content words, the character span, and the
    canonical states the phrasing belongs to."""

    i: int
    j: int
    start: int
    end: int
    states: frozenset[str]

    @property
    def length(self) -> int:
        return self.j - self.i


class PhraseIndex:
    """A trie over the key sequences of phrasings; ``phrasings`` maps a label (a canonical state) to its phrasings."""

    def __init__(self, phrasings: Mapping[str, Iterable[str]]):
        self._root: dict = {}
        for label, phrases in phrasings.items():
            for p in phrases:
                self.add(p, label)

    def add(self, phrase: str, label: str) -> None:
        k = keys(phrase)
        if not k:
            return
        node = self._root
        for key in k:
            node = node.setdefault(key, {})
        node.setdefault(None, set()).add(label)

    def find(self, toks: Sequence[Token], sentence: Sequence[int] | None = None) -> list[Match]:
        """Every occurrence of a phrasing in ``toks`` (overlapping ones included); with ``sentence`` (each token's
        sentence number, see `sentence_ids`) no occurrence runs across a sentence end."""
        out = []
        for i in range(len(toks)):
            node = self._root
            for j in range(i, len(toks)):
                if sentence is not None and sentence[j] != sentence[i]:
                    break
                node = node.get(toks[j].key)
                if node is None:
                    break
                if None in node:
                    out.append(Match(i, j + 1, toks[i].start, toks[j].end, frozenset(node[None])))
        return out


SENTENCE_END = re.compile(r"[.!?;\n]")
"""Characters that end a sentence: no phrasing occurrence runs across one."""


def sentence_ids(text: str, toks: Sequence[Token]) -> list[int]:
    """The sentence number of each token of ``text`` (sentences end at `SENTENCE_END` characters)."""
    ends = [m.start() for m in SENTENCE_END.finditer(text)]
    out, k = [], 0
    for t in toks:
        while k < len(ends) and ends[k] < t.start:
            k += 1
        out.append(k)
    return out


def longest_first(matches: Iterable[Match], priority: Callable[[Match], int] = lambda m: 0) -> list[Match]:
    """A non-overlapping subset of ``matches``, chosen longest first (ties: lower ``priority``, then earlier);
    returned in text order."""
    taken: list[Match] = []
    used: set[int] = set()
    for m in sorted(matches, key=lambda m: (-m.length, priority(m), m.i)):
        span = set(range(m.i, m.j))
        if span & used:
            continue
        used |= span
        taken.append(m)
    return sorted(taken, key=lambda m: m.i)
