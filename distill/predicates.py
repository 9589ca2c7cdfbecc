"""Oracle -> qualitative predicates: what a model could truthfully say about a query at test time, from the truth.

DynaPix (paper 004, §5.1, appendix "Rationale construction") grounds every rationale in the simulator's true record,
converted into qualitative statements without numbers. Here the truth is the query's timed state trajectory (every
benchmark has it) and, on the synthetic benchmark, the simulator record (`distill.motion`).

Trajectory of a query (all times in seconds from the video start):

- *current*: the last transcript entry with ``t <= prefix_end`` (the state the prefix shows);
- *upcoming*: transcript entries with ``prefix_end < t < target_time``, then the target (``target_state`` at
  ``target_time``); for horizon ``h`` that is ``h`` states, the last being the answer;
- *after the horizon*: the object's corpus segments (same video and object) starting after ``target_time``; they
  are never stated, and `distill.validator` rejects a rationale that names one of them (unless the same state also
  occurs up to the horizon, or is named by the question, as the Q4 anchor is).

Predicates (kinds), all phrased qualitatively:

=====================  =======================================================================================
kind                   statement
=====================  =======================================================================================
``current_state``      the state the prefix shows
``upcoming_order``     the order of upcoming states up to the target: next, then ..., eventually (target)
``time_to_change``     time from ``prefix_end`` to the next state change, bucketed: imminent (<= `IMMINENT_S`),
                       soon (<= `SOON_S`), later (DynaPix: 15 and 40 frames at 25 fps)
``time_to_target``     the same bucket for the time from ``prefix_end`` to ``target_time`` (horizon >= 2)
``heading_toward``     Q4: it is heading toward the named state; the state just before it is the target
``end_state``          Q2: the state it finally settles into (the target)
``state_at_time``      Q3: the state active at the asked elapsed time (the target)
``other_end_state``    Q5: the end states of the other objects of the question's group
``answer``             the target state (what the rationale concludes)
motion kinds           synthetic benchmark only: see `distill.motion`
=====================  =======================================================================================

`build_predicates` yields one `PredicateSet` per query; ``python -m distill predicates`` writes them as JSONL.
"""

from __future__ import annotations

import os
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

IMMINENT_S = 0.6
"""A change within this many seconds of the prefix end is "imminent" (DynaPix: 15 frames at 25 fps)."""
SOON_S = 1.6
"""A change within this many seconds (and not imminent) comes "soon"; later ones come "later" (DynaPix: 40 frames)."""
TIME_EPS = 1e-6
SIM_CACHE = 16
"""Simulator records kept in memory (queries come grouped by video, so a handful suffices)."""

SECTIONS = ("scene", "motion", "prediction")


@dataclass(frozen=True)
class Fact:
    """One qualitative statement: ``kind`` (see the module docstring), ``text`` (one sentence, no numbers) and
    ``section`` of the chain of thought it belongs to (``scene`` parsing, ``motion`` analysis, ``prediction``)."""

    kind: str
    text: str
    section: str


@dataclass
class PredicateSet:
    """The predicates of one query, plus what the validator needs to catch leaks.

    ``upcoming`` lists the states from the one after the current state up to the target (the answer, last);
    ``allowed_states`` every canonical state that may be named (current, upcoming, the Q4 anchor, Q5 group end states);
    ``after_horizon_states`` the object's states after the target that are not allowed (naming one is a leak).
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


def time_bucket(seconds: float) -> str:
    """``imminent`` (<= `IMMINENT_S`), ``soon`` (<= `SOON_S`) or ``later``."""
    if seconds <= IMMINENT_S:
        return "imminent"
    if seconds <= SOON_S:
        return "soon"
    return "later"


_BUCKET_TEXT = {"imminent": "is about to change: the change is imminent",
                "soon": "will change soon, though not immediately",
                "later": "will stay as it is for a while; the change comes later"}
_TARGET_BUCKET_TEXT = {"imminent": "The state asked about is reached almost immediately.",
                       "soon": "The state asked about is reached soon.",
                       "later": "The state asked about is reached only later, after the intermediate states."}


@dataclass
class OracleIndex:
    """Per-benchmark lookups: each object's corpus segments in time order, Q5 groups, the members (raw phrasings)
    of each canonical state, and (synthetic benchmark) the simulator records."""

    bench: Any
    use_sim: bool = True
    _sims: OrderedDict = field(default_factory=OrderedDict, repr=False)

    @cached_property
    def segments(self) -> dict[tuple[str, str], list[tuple[float, float, str]]]:
        """(video_id, object_id) -> [(start, end, canonical state)] sorted by start."""
        c = self.bench.corpus_ds
        cols = c.select_columns(["video_id", "object_id", "start", "end", "state"]).to_dict()
        out: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
        for v, o, s, e, st in zip(cols["video_id"], cols["object_id"], cols["start"], cols["end"], cols["state"],
                                  strict=True):
            out[(v, o)].append((float(s), float(e), st))
        for segs in out.values():
            segs.sort()
        return dict(out)

    @cached_property
    def groups(self) -> dict[str, list[tuple[str, str, str]]]:
        """group_id -> [(query id, subject, target state)] of the Q5 queries of that group."""
        q = self.bench.queries_ds.select_columns(["id", "group_id", "subject", "target_state"]).to_dict()
        out: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
        for i, g, s, t in zip(q["id"], q["group_id"], q["subject"], q["target_state"], strict=True):
            if g:
                out[g].append((i, s, t))
        return dict(out)

    @cached_property
    def members(self) -> dict[str, tuple[str, ...]]:
        """canonical state text -> its phrasings (the text itself first)."""
        out = {}
        for s in self.bench.states():
            out[s.text] = (s.text, *[m for m in s.members if m != s.text])
        return out

    @cached_property
    def sim_dir(self) -> str | None:
        d = self.bench.root / "sim"
        return str(d) if self.use_sim and d.is_dir() else None

    def sim(self, video_id: str):
        """The simulator record of a video (None when the benchmark has none); the last `SIM_CACHE` are kept."""
        if self.sim_dir is None:
            return None
        if video_id in self._sims:
            self._sims.move_to_end(video_id)
            return self._sims[video_id]
        from eval.synth.record import load_npz

        path = os.path.join(self.sim_dir, f"{video_id}.npz")
        rec = load_npz(path) if os.path.exists(path) else None
        self._sims[video_id] = rec
        if len(self._sims) > SIM_CACHE:
            self._sims.popitem(last=False)
        return rec

    def target_segment(self, query) -> tuple[float, float] | None:
        """(start, end) of the query's target segment, from the corpus (None when the corpus lacks it)."""
        for s, e, st in self.segments.get((query.video_id, query.object_id), []):
            if abs(s - query.target_time) < TIME_EPS and st == query.target_state:
                return s, e
        return None


def trajectory_states(query) -> tuple[str, list[tuple[float, str]]]:
    """(current state, upcoming [(t, state)] up to and including the target) from the transcript and the target."""
    entries = sorted((float(e.t), e.state) for e in query.transcript if float(e.t) < query.target_time - TIME_EPS)
    seen = [e for e in entries if e[0] <= query.prefix_end + TIME_EPS]
    current = seen[-1][1] if seen else (entries[0][1] if entries else query.target_state)
    upcoming = [e for e in entries if e[0] > query.prefix_end + TIME_EPS]
    upcoming.append((float(query.target_time), query.target_state))
    return current, upcoming


def _order_text(subject: str, upcoming: list[str]) -> str:
    if len(upcoming) == 1:
        return f"Next, the {subject} will be {upcoming[0]}."
    parts = [f"Next, the {subject} will be {upcoming[0]}"]
    parts += [f"then {s}" for s in upcoming[1:-1]]
    parts.append(f"and eventually, at the point the question asks about, {upcoming[-1]}")
    return ", ".join(parts) + "."


def trajectory_facts(query, current: str, upcoming: list[tuple[float, str]], index: OracleIndex) -> list[Fact]:
    """The trajectory predicates of one query (see the module docstring)."""
    subj = query.subject
    states = [s for _, s in upcoming]
    facts = [Fact("current_state", f"In the frames, the {subj} is {current}.", "scene")]
    dt_next = upcoming[0][0] - query.prefix_end
    facts.append(Fact("time_to_change", f"Its current state {_BUCKET_TEXT[time_bucket(dt_next)]}.", "motion"))
    if query.qtype == "Q4" and query.anchor_state:
        facts.append(Fact("heading_toward", f"The {subj} is on its way to a point where it is {query.anchor_state}; "
                                            f"just before that, it will be {query.target_state}.", "prediction"))
    facts.append(Fact("upcoming_order", _order_text(subj, states), "prediction"))
    if len(states) >= 2:
        facts.append(Fact("time_to_target", _TARGET_BUCKET_TEXT[time_bucket(upcoming[-1][0] - query.prefix_end)],
                          "prediction"))
    if query.qtype == "Q2":
        facts.append(Fact("end_state", f"In the end, the {subj} is {query.target_state}, and it stays that way.",
                          "prediction"))
    if query.qtype == "Q3":
        facts.append(Fact("state_at_time", f"At the elapsed time the question asks about, the {subj} is "
                                           f"{query.target_state}.", "prediction"))
    if query.qtype == "Q5" and query.group_id:
        for qid, other, end in index.groups.get(query.group_id, []):
            if qid != query.id and other != subj:
                facts.append(Fact("other_end_state", f"The {other} ends up {end}.", "prediction"))
    facts.append(Fact("answer", f"So the {subj} will be {query.target_state}.", "prediction"))
    return facts


def _allowed_and_after(query, current: str, states: list[str], index: OracleIndex) -> tuple[list[str], list[str]]:
    allowed = [current, *states]
    if query.anchor_state:
        allowed.append(query.anchor_state)
    if query.qtype == "Q5" and query.group_id:
        allowed += [end for qid, _, end in index.groups.get(query.group_id, []) if qid != query.id]
    allowed = list(dict.fromkeys(allowed))
    later = [st for s, _, st in index.segments.get((query.video_id, query.object_id), [])
             if s > query.target_time + TIME_EPS]
    after = [s for s in dict.fromkeys(later) if s not in allowed]
    return allowed, after


def query_predicates(query, index: OracleIndex) -> PredicateSet:
    """The `PredicateSet` of one query (trajectory predicates, plus motion predicates when a simulator record exists)."""
    from distill import motion

    current, upcoming = trajectory_states(query)
    states = [s for _, s in upcoming]
    facts = trajectory_facts(query, current, upcoming, index)
    sources = ["trajectory"]
    rec = index.sim(query.video_id)
    if rec is not None:
        moment = motion.target_moment(query, index.target_segment(query))
        mfacts = motion.motion_facts(rec, query, moment)
        if mfacts:
            sources.append("simulator")
            # scene facts first, then the motion analysis, then the prediction (the answer fact stays last)
            facts = [f for f in facts if f.section == "scene"] + [f for f in mfacts if f.section == "scene"] + \
                    [f for f in facts if f.section == "motion"] + [f for f in mfacts if f.section == "motion"] + \
                    [f for f in mfacts if f.section == "prediction"] + [f for f in facts if f.section == "prediction"]
    allowed, after = _allowed_and_after(query, current, states, index)
    return PredicateSet(query_id=query.id, qtype=query.qtype, horizon=int(query.horizon), domain=query.domain,
                        subject=query.subject, question=query.question, answer=query.target_state, current=current,
                        upcoming=states, facts=facts, allowed_states=allowed, after_horizon_states=after,
                        sources=sources)


def build_predicates(bench, queries: Iterable, *, use_sim: bool = True) -> Iterator[PredicateSet]:
    """`PredicateSet` for each query, in order."""
    index = OracleIndex(bench, use_sim=use_sim)
    for q in queries:
        yield query_predicates(q, index)


@dataclass
class PredicatesConfig:
    """``python -m distill predicates``: every query's predicates as JSONL."""

    data: str = field(metadata={"help": "benchmark directory"})
    out: str = field(metadata={"help": "predicates file to write (JSONL)"})
    split: str | None = field(default=None, metadata={"help": "train | val | test | null (all queries)"})
    limit: int | None = field(default=None, metadata={"help": "only the first N queries"})
    use_sim: bool = field(default=True, metadata={"help": "add motion predicates from sim/ when present"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


def write_predicates(cfg: PredicatesConfig) -> dict[str, Any]:
    """Write the predicates file (atomically) and ``<out stem>.config.json``; returns a summary."""
    from collections import Counter
    from pathlib import Path

    from tqdm.auto import tqdm

    from distill.config import write_resolved
    from eval.benchmark import Benchmark
    from eval.io import write_jsonl

    bench = Benchmark.load(cfg.data)
    queries = bench.queries(cfg.split)
    queries = queries[: cfg.limit] if cfg.limit is not None else queries
    kinds: Counter = Counter()
    sources: Counter = Counter()

    def rows():
        for ps in tqdm(build_predicates(bench, queries, use_sim=cfg.use_sim), total=len(queries), unit="q",
                       desc="predicates", disable=not cfg.progress):
            kinds.update(f.kind for f in ps.facts)
            sources.update(ps.sources)
            yield ps.to_dict()

    n = write_jsonl(cfg.out, rows())
    summary = {"queries": n, "facts_by_kind": dict(kinds), "sources": dict(sources)}
    out = Path(cfg.out)
    write_resolved(cfg, out.with_name(out.name.removesuffix(".jsonl") + ".config.json"), summary=summary,
                   thresholds={"IMMINENT_S": IMMINENT_S, "SOON_S": SOON_S})
    return summary
