"""The records of the predicate stage: one qualitative `Fact` and the `PredicateSet` of a query.

They live in their own module so that `distill.predicates` (trajectory facts) and `distill.motion` (simulator facts)
both build them without importing each other.

Sections, in the order a rationale states them (observed evidence first, the answer once, at the end):

==============  =======================================================================================
section         holds
==============  =======================================================================================
``scene``       what the frames show: the current state, what supports the object, the other objects
``motion``      how things move at the end of the clip, contacts, collision courses, timing of the next change
``trajectory``  the intermediate states before the asked moment (never the answer), the question's anchor,
                the other objects' end states (Q5)
``answer``      the answer (one fact; a narrator states it only on the final ``Answer:`` line)
==============  =======================================================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SECTIONS = ("scene", "motion", "trajectory", "answer")
EVIDENCE_SECTIONS = ("scene", "motion")
"""Sections that hold evidence (observed or physical), as opposed to state labels of the trajectory."""


@dataclass(frozen=True)
class Fact:
    """One qualitative statement: ``kind`` (see `distill.predicates`), ``text`` (one sentence, no numbers),
    ``section`` (see the module docstring) and an optional machine-readable ``value`` (a direction, a support
    name, a state) that the validator's contradiction check compares a rationale against."""

    kind: str
    text: str
    section: str
    value: str | None = None


@dataclass
class PredicateSet:
    """The predicates of one query, plus what the validator needs to catch leaks and contradictions.

    ``upcoming`` lists the states from the one after the current state up to the target (the answer, last);
    ``allowed_states`` every canonical state that may be named (current, upcoming, the Q4 anchor, Q5 group end states);
    ``after_horizon_states`` the object's states after the target that are not allowed (naming one is a leak);
    ``objects`` the other objects of the scene (their subjects); ``video_id`` the query's video;
    ``counterfactual_of`` set on a counterfactual set (`distill.faithfulness`): the query id its evidence came from;
    ``true_states`` the simulator's keys of the observed segment and of each upcoming one, aligned with
    ``[current, *upcoming]`` (empty without a simulator; see `distill.predicates`); ``family`` the scene family of
    the video's simulator record (``""`` without one); ``next_state`` / ``next_true_state`` the canonical state and
    the simulator key of the object's segment right after the target (None / ``""`` when there is none or it is
    unknown): never narrated, they let `distill.faithfulness` find a donor whose answer comes just before a Q4
    anchor.
    """

    query_id: str
    qtype: str
    horizon: int
    domain: str
    subject: str
    question: str
    answer: str
    current: str
    upcoming: list[str]
    facts: list[Fact]
    allowed_states: list[str]
    after_horizon_states: list[str]
    sources: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    anchor: str | None = None
    video_id: str = ""
    counterfactual_of: str | None = None
    true_states: list[str] = field(default_factory=list)
    family: str = ""
    next_state: str | None = None
    next_true_state: str = ""

    @property
    def intermediate(self) -> list[str]:
        """The upcoming states before the target (the trajectory labels a rationale may name)."""
        return self.upcoming[:-1]

    def facts_in(self, section: str) -> list[Fact]:
        return [f for f in self.facts if f.section == section]

    def fact(self, kind: str) -> Fact | None:
        return next((f for f in self.facts if f.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PredicateSet:
        d = dict(d)
        d["facts"] = [Fact(**f) for f in d.get("facts") or []]
        return cls(**d)
