"""Oracle -> qualitative predicates: the evidence a model could truthfully state about a query at test time, from
which the answer follows, taken from the truth.

DynaPix (paper 004, §5.1, appendix "Rationale construction") grounds every rationale in the simulator's true record,
converted into qualitative statements without numbers. Here the truth is the query's timed state trajectory (every
benchmark has it), the simulator record on the synthetic benchmark (`distill.motion`) and, where corpus segments carry
one, the simulator's compositional ``sim_state`` of the segment the prefix shows.

Trajectory of a query (all times in seconds from the video start):

- *current*: the last transcript entry with ``t <= prefix_end`` (the state the prefix shows);
- *upcoming*: transcript entries with ``prefix_end < t < target_time``, then the target (``target_state`` at
  ``target_time``); for horizon ``h`` that is ``h`` states, the last being the answer; the ones before the target
  are the *intermediate* states;
- *after the horizon*: the object's corpus segments (same video and object) starting after ``target_time``; they
  are never stated, and `distill.validator` rejects a rationale that names one of them (unless the same state also
  occurs up to the horizon, or is named by the question, as the Q4 anchor is).

The predicates are evidence (`distill.facts` sections ``scene``, ``motion``) and trajectory labels (``trajectory``);
none of them names the answer, except the single ``answer`` fact that a narrator states only on its ``Answer:`` line
(so Q2's end state and Q3's state at the asked time are not restated as facts: the question already says which
moment is asked about).

=====================  =======================================================================================
kind                   statement
=====================  =======================================================================================
``current_state``      the state the prefix shows (scene)
``observed_detail``    the ``sim_state`` of the segment the prefix shows, when the corpus has one (scene): a
                       simulator key (``motion|place|relation|other|pose``) is rendered completely
                       (`eval.synth.lexicon.reference_text`); omitted when it contains a phrasing of the answer
``time_to_change``     time from ``prefix_end`` to the next state change, bucketed *relative to the benchmark*
                       (`TimingBuckets`: tertiles of the train split); omitted when one bucket would hold more
                       than `MAX_BUCKET_SHARE` of the train queries (a near-constant statement carries no evidence)
``time_to_target``     the same for the time from ``prefix_end`` to ``target_time`` (horizon >= 2, and Q3)
``intermediate``       the intermediate states, in order (horizon >= 2)
``heading_toward``     Q4: the question's named state, and that the asked state comes just before it
``other_end_state``    Q5: the end states of the other objects of the question's group
``answer``             the target state (stated once, on the final ``Answer:`` line)
motion kinds           synthetic benchmark only: see `distill.motion`
=====================  =======================================================================================

Where corpus segments carry a ``sim_state``, each set also records ``true_states``: the simulator keys of the
segments from the observed one through the target (aligned with ``[current, *upcoming]``; ``""`` where unknown), which
`distill.validator` uses to tell an honest partial description of a state from a contradiction.

`build_predicates` yields one `PredicateSet` per query; ``python -m distill predicates`` writes them as JSONL.
"""

from __future__ import annotations

import os
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from distill import motion
from distill.facts import SECTIONS, Fact, PredicateSet
from eval.synth.lexicon import TrueState

__all__ = ["SECTIONS", "Fact", "PredicateSet", "OracleIndex", "TimingBuckets", "build_predicates",
           "query_predicates", "trajectory_states"]

TIME_EPS = 1e-6
SIM_CACHE = 16
"""Simulator records kept in memory (queries come grouped by video, so a handful suffices)."""
MAX_BUCKET_SHARE = 0.8
"""A timing statement is omitted when one of its buckets holds more than this share of the train queries."""
BUCKETS = ("early", "middle", "late")
TIME_DECIMALS = 3
"""Timing gaps are compared at millisecond resolution."""


@dataclass(frozen=True)
class TimingBuckets:
    """Bucket edges of one timing quantity (seconds), fitted on the train split: ``edges`` are its 1/3 and 2/3
    quantiles, so a value ``x`` is ``early`` when ``x <= edges[0]``, ``middle`` when ``x <= edges[1]``, else
    ``late``. ``shares``: the train queries per bucket; ``informative``: no bucket holds more than
    `MAX_BUCKET_SHARE` of them (else the statement is omitted). Times are rounded to `TIME_DECIMALS` first, so
    float noise on equal gaps never splits them across buckets."""

    name: str
    edges: tuple[float, float]
    shares: tuple[float, float, float]
    n: int
    informative: bool

    @classmethod
    def fit(cls, name: str, values: Sequence[float]) -> TimingBuckets:
        x = np.round(np.asarray(values, dtype=np.float64), TIME_DECIMALS)
        if x.size == 0:
            return cls(name, (0.0, 0.0), (0.0, 0.0, 0.0), 0, False)
        e0, e1 = (float(v) for v in np.quantile(x, [1 / 3, 2 / 3]))
        counts = np.bincount(np.where(x <= e0, 0, np.where(x <= e1, 1, 2)), minlength=3)
        shares = tuple(float(c) / x.size for c in counts)
        return cls(name, (e0, e1), shares, int(x.size), max(shares) <= MAX_BUCKET_SHARE)

    def bucket(self, seconds: float) -> str:
        seconds = round(float(seconds), TIME_DECIMALS)
        return BUCKETS[0] if seconds <= self.edges[0] else BUCKETS[1] if seconds <= self.edges[1] else BUCKETS[2]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_CHANGE_TEXT = {"early": "Its current state changes shortly after the clip ends.",
                "middle": "Its current state lasts a little while after the clip ends before it changes.",
                "late": "Its current state lasts a long while after the clip ends before it changes."}
_TARGET_TEXT = {"early": "The moment the question asks about comes shortly after the clip ends.",
                "middle": "The moment the question asks about comes some time after the clip ends.",
                "late": "The moment the question asks about comes long after the clip ends."}


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

    @cached_property
    def video_objects(self) -> dict[str, dict[str, str]]:
        """video_id -> {object_id: subject}, from the corpus."""
        cols = self.bench.corpus_ds.select_columns(["video_id", "object_id", "subject"]).to_dict()
        out: dict[str, dict[str, str]] = defaultdict(dict)
        for v, o, s in zip(cols["video_id"], cols["object_id"], cols["subject"], strict=True):
            out[v].setdefault(o, s)
        return dict(out)

    @cached_property
    def sim_states(self) -> dict[tuple[str, str, float], Any]:
        """(video_id, object_id, start) -> the segment's ``sim_state`` (empty when the corpus has no such column, or
        with ``use_sim`` off: the simulator's truth is not used at all)."""
        c = self.bench.corpus_ds
        if not self.use_sim or "sim_state" not in c.column_names:
            return {}
        cols = c.select_columns(["video_id", "object_id", "start", "sim_state"]).to_dict()
        return {(v, o, round(float(s), 6)): st for v, o, s, st in
                zip(cols["video_id"], cols["object_id"], cols["start"], cols["sim_state"], strict=True) if st}

    def current_sim_state(self, query) -> Any:
        """The ``sim_state`` of the object's segment active at ``prefix_end`` (None when unknown)."""
        if not self.sim_states:
            return None
        active = [s for s, _, _ in self.segments.get((query.video_id, query.object_id), [])
                  if s <= query.prefix_end + TIME_EPS]
        return self.sim_states.get((query.video_id, query.object_id, round(active[-1], 6))) if active else None

    def true_states(self, query, upcoming: list[tuple[float, str]]) -> list[str]:
        """The ``sim_state`` keys of the observed segment and of each upcoming one (``""`` where unknown); empty
        when the corpus has no ``sim_state``."""
        if not self.sim_states:
            return []
        cur = self.current_sim_state(query)
        out = [cur if isinstance(cur, str) else ""]
        for t, _ in upcoming:
            st = self.sim_states.get((query.video_id, query.object_id, round(float(t), 6)))
            out.append(st if isinstance(st, str) else "")
        return out

    @cached_property
    def timing(self) -> dict[str, TimingBuckets]:
        """The timing buckets (``time_to_change``, ``time_to_target``) fitted on the train split (on every query
        when the benchmark has no train split)."""
        qs = self.bench.queries("train") or self.bench.queries()
        change, target = [], []
        for q in qs:
            _, upcoming = trajectory_states(q)
            change.append(upcoming[0][0] - q.prefix_end)
            if len(upcoming) >= 2 or q.qtype == "Q3":
                target.append(upcoming[-1][0] - q.prefix_end)
        return {"time_to_change": TimingBuckets.fit("time_to_change", change),
                "time_to_target": TimingBuckets.fit("time_to_target", target)}


def trajectory_states(query) -> tuple[str, list[tuple[float, str]]]:
    """(current state, upcoming [(t, state)] up to and including the target) from the transcript and the target."""
    entries = sorted((float(e.t), e.state) for e in query.transcript if float(e.t) < query.target_time - TIME_EPS)
    seen = [e for e in entries if e[0] <= query.prefix_end + TIME_EPS]
    current = seen[-1][1] if seen else (entries[0][1] if entries else query.target_state)
    upcoming = [e for e in entries if e[0] > query.prefix_end + TIME_EPS]
    upcoming.append((float(query.target_time), query.target_state))
    return current, upcoming


def _listing(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", then ".join(items[:-1]) + f", and then {items[-1]}"


def observed_detail_text(subject: str, sim_state: Any) -> str | None:
    """One sentence from a segment's ``sim_state`` (a simulator key ``motion|place|relation|other|pose``, a
    mapping of fields, or a plain string); None when it has nothing without digits to say."""
    if TrueState.is_key(sim_state):
        from eval.synth.lexicon import reference_text

        try:
            text = reference_text(TrueState.from_key(sim_state))
        except (KeyError, ValueError):
            return None
        return None if any(ch.isdigit() for ch in text) else f"Looking closely, the {subject} is {text}."
    if isinstance(sim_state, dict):
        parts = [f"{str(k).replace('_', ' ')} {v}" for k, v in sim_state.items()
                 if isinstance(v, str) and v.strip() and not any(ch.isdigit() for ch in v)]
    elif isinstance(sim_state, str) and sim_state.strip() and not any(ch.isdigit() for ch in sim_state):
        parts = [sim_state.strip()]
    else:
        parts = []
    return f"What the frames show of the {subject}: " + "; ".join(parts) + "." if parts else None


def _names_state(text: str, phrasings: Sequence[str]) -> bool:
    """Some phrasing's key sequence (`distill.lexicon.keys`) occurs in ``text``'s."""
    from distill.lexicon import contains, keys

    k = keys(text)
    return any(contains(k, keys(p)) for p in phrasings)


def trajectory_facts(query, current: str, upcoming: list[tuple[float, str]], index: OracleIndex) -> list[Fact]:
    """The trajectory predicates of one query (see the module docstring); only the ``answer`` fact names the
    target."""
    subj = query.subject
    states = [s for _, s in upcoming]
    facts = [Fact("current_state", f"In the frames, the {subj} is {current}.", "scene", current)]
    detail = observed_detail_text(subj, index.current_sim_state(query))
    if detail and not _names_state(detail, index.members.get(query.target_state, (query.target_state,))):
        facts.append(Fact("observed_detail", detail, "scene"))
    timing = index.timing
    if timing["time_to_change"].informative:
        b = timing["time_to_change"].bucket(upcoming[0][0] - query.prefix_end)
        facts.append(Fact("time_to_change", _CHANGE_TEXT[b], "motion", b))
    if (len(states) >= 2 or query.qtype == "Q3") and timing["time_to_target"].informative:
        b = timing["time_to_target"].bucket(upcoming[-1][0] - query.prefix_end)
        facts.append(Fact("time_to_target", _TARGET_TEXT[b], "motion", b))
    if len(states) >= 2:
        facts.append(Fact("intermediate", f"Before the moment the question asks about, the {subj} will first be "
                                          f"{_listing(states[:-1])}.", "trajectory"))
    if query.qtype == "Q4" and query.anchor_state:
        facts.append(Fact("heading_toward", f"The question names a later state of the {subj}, {query.anchor_state}; "
                                            "the state asked about comes just before it.", "trajectory",
                          query.anchor_state))
    if query.qtype == "Q5" and query.group_id:
        for qid, other, end in index.groups.get(query.group_id, []):
            if qid != query.id and other != subj:
                facts.append(Fact("other_end_state", f"The {other} ends up {end}.", "trajectory", end))
    facts.append(Fact("answer", f"The {subj} will be {query.target_state}.", "answer", query.target_state))
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
    """The `PredicateSet` of one query: trajectory predicates, plus motion predicates when a simulator record
    exists; facts ordered by section (`distill.facts.SECTIONS`: evidence first, the answer last)."""
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
            facts = facts + mfacts
    if index.sim_states:
        sources.append("sim_state")
    # stable sort by section (the layout first): trajectory facts before motion facts within a section
    facts = sorted(facts, key=lambda f: (SECTIONS.index(f.section), f.kind != "layout"))
    allowed, after = _allowed_and_after(query, current, states, index)
    nxt = next(((s, st) for s, _, st in index.segments.get((query.video_id, query.object_id), [])
                if s > query.target_time + TIME_EPS), None)
    nxt_truth = index.sim_states.get((query.video_id, query.object_id, round(nxt[0], 6)), "") if nxt else ""
    objects = [s for o, s in index.video_objects.get(query.video_id, {}).items() if o != query.object_id]
    return PredicateSet(query_id=query.id, qtype=query.qtype, horizon=int(query.horizon), domain=query.domain,
                        subject=query.subject, question=query.question, answer=query.target_state, current=current,
                        upcoming=states, facts=facts, allowed_states=allowed, after_horizon_states=after,
                        sources=sources, objects=objects, anchor=query.anchor_state, video_id=query.video_id,
                        true_states=index.true_states(query, upcoming), next_state=nxt[1] if nxt else None,
                        next_true_state=nxt_truth if isinstance(nxt_truth, str) else "",
                        family=str(getattr(rec, "family", "") or "") if rec is not None else "")


def build_predicates(bench, queries: Iterable, *, use_sim: bool = True, index: OracleIndex | None = None
                     ) -> Iterator[PredicateSet]:
    """`PredicateSet` for each query, in order (``index`` reuses an `OracleIndex` of ``bench``)."""
    index = index if index is not None else OracleIndex(bench, use_sim=use_sim)
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
    top_states: int | None = field(default=None, metadata={
        "help": "closed slice: only queries whose target is one of the K most frequent train targets "
                "(distill.slice; every later stage reads these sets only)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


def write_predicates(cfg: PredicatesConfig) -> dict[str, Any]:
    """Write the predicates file (atomically) and ``<out stem>.config.json``; returns a summary."""
    from collections import Counter
    from pathlib import Path

    from tqdm.auto import tqdm

    from distill.config import write_resolved
    from distill.slice import closed_slice, in_slice
    from eval.benchmark import Benchmark
    from eval.io import write_jsonl

    bench = Benchmark.load(cfg.data)
    sl = closed_slice(bench, cfg.top_states) if cfg.top_states else None
    queries = in_slice(bench.queries(cfg.split), sl)
    queries = queries[: cfg.limit] if cfg.limit is not None else queries
    index = OracleIndex(bench, use_sim=cfg.use_sim)
    kinds: Counter = Counter()
    sources: Counter = Counter()

    def rows():
        for ps in tqdm(build_predicates(bench, queries, index=index), total=len(queries), unit="q",
                       desc="predicates", disable=not cfg.progress):
            kinds.update(f.kind for f in ps.facts)
            sources.update(ps.sources)
            yield ps.to_dict()

    n = write_jsonl(cfg.out, rows())
    summary = {"queries": n, "facts_by_kind": dict(kinds), "sources": dict(sources),
               "timing_informative": {k: v.informative for k, v in index.timing.items()},
               "slice": sl.to_dict() if sl else None}
    out = Path(cfg.out)
    timing = {k: v.to_dict() for k, v in index.timing.items()}
    write_resolved(cfg, out.with_name(out.name.removesuffix(".jsonl") + ".config.json"), summary=summary,
                   timing=timing, max_bucket_share=MAX_BUCKET_SHARE)
    return summary
