"""Typed records of a PSR benchmark directory; their Arrow schemas and validator field tables derive from them.

A benchmark directory holds::

    manifest.json            name, version, counts, domains, spaces (see `Manifest`)
    queries.jsonl            one `Query` per line
    corpus.jsonl             one `Segment` per line
    states.jsonl             one `State` per line (canonical type2 states and their raw member phrasings)
    frames/                  prefix frames and segment middle frames (paths in the records are relative to the directory)
    features/<space>/        precomputed float32 features of one retrieval space (see `eval.features`)
    sim/                     optional simulator record (synthetic benchmark only)

This module is the one place that converts file rows to records (`Query.from_dict`, ...) and back (`to_dict`).
The dataclasses are the one declaration of each record: the Arrow schemas the loader reads with (`QUERY_FEATURES`,
..., `arrow_features`) and the validator's tables (required and optional fields with their JSON types,
`field_types`; allowed values and ranges, `field_rules`) are derived from their fields, annotations and field
metadata (``dtype``: the Arrow leaf type where the Python type does not fix it; ``choices``/``label``, ``range``).
A field with a default is optional (may be missing or null). It depends on nothing of ours.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import datasets

from eval.errors import UnknownName

FORMAT_VERSION = "1.0"

SPLITS = ("train", "val", "test")
QUESTION_TYPES = ("Q1", "Q2", "Q3", "Q4", "Q5")
#: The main benchmark's question types (Q5, multi-object, is scored apart).
MAIN_QTYPES = QUESTION_TYPES[:4]
QUESTION_TYPE_NAMES = {
    "Q1": "next state",
    "Q2": "end state",
    "Q3": "state after k seconds",
    "Q4": "intermediate state before a named state",
    "Q5": "multi-object end states",
}
MIN_HORIZON, MAX_HORIZON = 1, 7
#: The paper reports h1..h5 and folds the small h >= 6 tail into h = 5.
REPORT_MAX_HORIZON = 5
#: GT tiers, in the order of the paper. `in_video` is the self tier, excluded from the main pool.
GT_TIERS = ("in_video", "in_dataset", "cross_dataset", "bge_similar", "consensus")
#: Tiers whose union is the main (cross-instance) pool.
MAIN_POOL_TIERS = ("in_dataset", "cross_dataset")
#: Ground-truth definitions used for stratified scoring (App. N of the paper): name -> the query fields whose corpus
#: ids (concatenated, in this order) are its positives; ``gt_pools.<tier>`` is a tier of the type2 pools. The first
#: is the main pool. A benchmark with another per-query GT list adds an entry (and the field to `Query`, whence
#: `QUERY_FEATURES` and the validator): scoring (`eval.scoring.score_benchmark`), the fingerprint, the evaluator and
#: the reports read this mapping; a definition that no query of a benchmark has is not scored.
GT_DEFINITION_FIELDS: dict[str, tuple[str, ...]] = {
    "type2-all": ("gt_pools.in_dataset", "gt_pools.cross_dataset"),
    "type2-consensus": ("gt_pools.consensus",),
    "type1-all": ("gt_type1",),
    # the simulator's exact true state, another video (synthetic benchmark only)
    "sim-exact": ("gt_sim_exact",),
}
GT_DEFINITIONS = tuple(GT_DEFINITION_FIELDS)
PREFIX_FRAMES = 8


def report_horizon(h: int) -> int:
    """The paper's reporting fold: horizons >= 6 are counted as 5."""
    return min(int(h), REPORT_MAX_HORIZON)


def _build(cls, row: dict[str, Any]):
    """Build a dataclass from a dict, ignoring unknown keys (forward compatible)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in row.items() if k in names})


@dataclass(frozen=True)
class TranscriptEntry:
    """One observed state of the queried object: `state` holds from time `t` (seconds from video start)."""

    t: float
    state: str


@dataclass(frozen=True)
class GTPools:
    """Ground-truth corpus segment ids of one query, by tier (type2, canonical-state definition).

    - ``in_video``: the query's own video (self tier; excluded from the main pool).
    - ``in_dataset``: a different video of the same source domain with the target canonical state.
    - ``cross_dataset``: a segment of a different domain with the target canonical state.
    - ``bge_similar``: segments whose state is an embedding neighbour of the target (looser, recall-oriented).
    - ``consensus``: the high-precision subset (intersection of mining and verification).
    """

    in_video: tuple[str, ...] = ()
    in_dataset: tuple[str, ...] = ()
    cross_dataset: tuple[str, ...] = ()
    bge_similar: tuple[str, ...] = ()
    consensus: tuple[str, ...] = ()

    @property
    def main(self) -> tuple[str, ...]:
        """The main pool: in-dataset + cross-dataset (cross-instance; the self tier excluded)."""
        return self.in_dataset + self.cross_dataset

    def tier(self, name: str) -> tuple[str, ...]:
        if name not in GT_TIERS:
            raise UnknownName(f"unknown GT tier {name!r}; expected one of {GT_TIERS}")
        return getattr(self, name)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> GTPools:
        d = d or {}
        return cls(**{t: tuple(d.get(t) or ()) for t in GT_TIERS})

    def to_dict(self) -> dict[str, list[str]]:
        return {t: list(getattr(self, t)) for t in GT_TIERS}


@dataclass(frozen=True)
class Query:
    """One PSR query: a prefix of a video, a question about one object, and the ground truth.

    Times are seconds from the start of the source video. ``horizon`` is the index (1-based) of the target
    in the object's future trajectory after the prefix. ``transcript`` lists the object's observed states with
    timestamps strictly before ``target_time`` (never the answer). ``fair`` is true when the main GT pool is
    non-empty (the GT is present in the retrieval corpus).
    """

    id: str
    prefix_id: str
    video_id: str
    domain: str
    object_id: str
    subject: str
    qtype: str = field(metadata={"choices": QUESTION_TYPES, "label": "question type"})
    horizon: int = field(metadata={"dtype": "int32", "range": (MIN_HORIZON, MAX_HORIZON)})
    question: str
    target_state: str
    target_state_id: str
    target_state_type1: str
    target_time: float
    prefix_start: float
    prefix_end: float
    prefix_frames: tuple[str, ...]
    transcript: tuple[TranscriptEntry, ...]
    split: str = field(metadata={"choices": SPLITS, "label": "split"})
    gt_pools: GTPools
    gt_type1: tuple[str, ...] = ()
    fair: bool = True
    group_id: str | None = None
    k_seconds: float | None = None
    anchor_state: str | None = None
    gt_sim_exact: tuple[str, ...] = ()
    #: the queried object's box ``[x0, y0, x1, y1]`` (pixels) in each prefix frame, when known (`eval.images`)
    prefix_boxes: tuple[tuple[float, ...], ...] | None = field(default=None, metadata={"dtype": "float32"})

    @property
    def report_horizon(self) -> int:
        return report_horizon(self.horizon)

    def gt(self, definition: str = "type2-all") -> tuple[str, ...]:
        """The ground-truth segment ids under one GT definition (`GT_DEFINITION_FIELDS`; self tier excluded)."""
        if definition not in GT_DEFINITION_FIELDS:
            raise UnknownName(f"unknown GT definition {definition!r}; expected one of {GT_DEFINITIONS}")
        out: tuple[str, ...] = ()
        for path in GT_DEFINITION_FIELDS[definition]:
            obj: Any = self
            for part in path.split("."):
                obj = getattr(obj, part)
            out += tuple(obj or ())
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Query:
        d = dict(d)
        d["prefix_frames"] = tuple(d.get("prefix_frames") or ())
        d["transcript"] = tuple(TranscriptEntry(float(e["t"]), str(e["state"])) for e in d.get("transcript") or ())
        d["gt_pools"] = GTPools.from_dict(d.get("gt_pools"))
        d["gt_type1"] = tuple(d.get("gt_type1") or ())
        d["gt_sim_exact"] = tuple(d.get("gt_sim_exact") or ())
        if d.get("prefix_boxes") is not None:
            d["prefix_boxes"] = tuple(tuple(float(v) for v in b) for b in d["prefix_boxes"])
        return _build(cls, d)

    def to_dict(self) -> dict[str, Any]:
        # Shallow on purpose: `dataclasses.asdict` deep-copies the (large) GT pools and is ~10x slower.
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["prefix_frames"] = list(self.prefix_frames)
        d["transcript"] = [{"t": e.t, "state": e.state} for e in self.transcript]
        d["gt_pools"] = self.gt_pools.to_dict()
        d["gt_type1"] = list(self.gt_type1)
        d["gt_sim_exact"] = list(self.gt_sim_exact)
        d["prefix_boxes"] = None if self.prefix_boxes is None else [list(b) for b in self.prefix_boxes]
        return d


@dataclass(frozen=True)
class Segment:
    """One corpus item: a state segment of a video, represented for retrieval by its middle frame
    (visual spaces) or its canonical state text (semantic spaces)."""

    id: str
    video_id: str
    domain: str
    object_id: str
    subject: str
    state: str
    state_id: str
    state_type1: str
    start: float
    end: float
    frame: str
    raw: str = ""
    #: the simulator's exact true state (`eval.synth.lexicon.TrueState.key`); synthetic benchmark only
    sim_state: str | None = None
    #: the object's box ``[x0, y0, x1, y1]`` (pixels) in ``frame``, when known (`eval.images`)
    box: tuple[float, ...] | None = field(default=None, metadata={"dtype": "float32"})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        d = dict(d)
        if d.get("box") is not None:
            d["box"] = tuple(float(v) for v in d["box"])
        return _build(cls, d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["box"] = None if self.box is None else list(self.box)
        return d


@dataclass(frozen=True)
class State:
    """A canonical predicate-level (type2) state and the raw phrasings canonicalized into it."""

    id: str
    text: str
    members: tuple[str, ...] = ()
    n_segments: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> State:
        d = dict(d)
        d["members"] = tuple(d.get("members") or ())
        return _build(cls, d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["members"] = list(self.members)
        return d


@dataclass
class Manifest:
    """`manifest.json`: what the directory holds. ``spaces`` maps a space name to its metadata
    (``kind``: "visual" | "semantic", ``dim``, ``model``)."""

    name: str
    version: str
    counts: dict[str, int] = field(default_factory=dict)
    spaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    domains: list[str] = field(default_factory=list)
    format_version: str = FORMAT_VERSION
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Folders this benchmark links into (`eval.outputs.dependency_record`: path, the SHA-256 of its manifest when
    #: linked, the links); loaders refuse the benchmark when one is gone or rebuilt (`eval.validate.link_problems`).
    dependencies: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        return _build(cls, d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- derived schemas: the dataclasses above are the one declaration of each record ---


def _unwrap_optional(tp) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); any other annotation -> (itself, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _is_tuple(tp) -> bool:
    return typing.get_origin(tp) is tuple and len(typing.get_args(tp)) == 2 and typing.get_args(tp)[1] is Ellipsis


def _feature(tp, dtype: str | None = None):
    """The `datasets` feature of one annotation: ``str``/``int``/``float``/``bool`` -> a `Value` (``int`` int64,
    ``float`` float64 unless ``dtype`` names the leaf type), ``tuple[X, ...]`` -> a `List` of X, a record dataclass
    -> a struct of its fields (a dict), ``X | None`` -> X (every Arrow column is nullable)."""
    tp, _ = _unwrap_optional(tp)
    if _is_tuple(tp):
        return datasets.List(_feature(typing.get_args(tp)[0], dtype))
    if dataclasses.is_dataclass(tp):
        return _struct(tp)
    leaf = {str: "string", int: "int64", float: "float64", bool: "bool"}.get(tp)
    if leaf is None:
        raise TypeError(f"no Arrow feature for the annotation {tp!r}")
    return datasets.Value(dtype or leaf)


def _struct(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _feature(hints[f.name], f.metadata.get("dtype")) for f in fields(cls)}


def arrow_features(cls) -> datasets.Features:
    """The `datasets.Features` (Arrow schema) of a record dataclass, in field order, from its annotations and the
    ``dtype`` field metadata (the Arrow leaf type where the Python type does not fix it: ``int32``, ``float32``).
    Explicit, so optional fields and empty lists never confuse type inference."""
    return datasets.Features(_struct(cls))


def _json_type(tp) -> type | tuple[type, ...]:
    """The Python type(s) a JSON value of one annotation parses to (a float field takes an int too)."""
    tp, _ = _unwrap_optional(tp)
    if _is_tuple(tp) or typing.get_origin(tp) is list:
        return list
    if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict:
        return dict
    return (int, float) if tp is float else tp


def field_types(cls) -> tuple[dict[str, type | tuple[type, ...]], dict[str, type | tuple[type, ...]]]:
    """(required, optional) keys of a record dataclass's JSON lines and their Python types, in field order, for
    the validator: a field without a default is required (present and not null); one with a default may be
    missing or null."""
    hints = typing.get_type_hints(cls)
    required: dict[str, type | tuple[type, ...]] = {}
    optional: dict[str, type | tuple[type, ...]] = {}
    for f in fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        (optional if has_default else required)[f.name] = _json_type(hints[f.name])
    return required, optional


def field_rules(cls) -> dict[str, dict[str, Any]]:
    """The value constraints of a record dataclass's fields, in field order, from their metadata: ``choices``
    (the allowed values, with ``label`` naming the value in messages) and ``range`` (inclusive ``(lo, hi)``)."""
    keys = ("choices", "label", "range")
    return {f.name: {k: f.metadata[k] for k in keys if k in f.metadata}
            for f in fields(cls) if any(k in f.metadata for k in keys)}


QUERY_FEATURES = arrow_features(Query)
SEGMENT_FEATURES = arrow_features(Segment)
STATE_FEATURES = arrow_features(State)

#: Required keys and their Python types, per file (used by the validator; optional keys may be null).
REQUIRED_QUERY_FIELDS, OPTIONAL_QUERY_FIELDS = field_types(Query)
REQUIRED_SEGMENT_FIELDS, OPTIONAL_SEGMENT_FIELDS = field_types(Segment)
REQUIRED_STATE_FIELDS, OPTIONAL_STATE_FIELDS = field_types(State)
#: Value constraints per file (``qtype`` and ``split`` choices, the ``horizon`` range).
QUERY_RULES = field_rules(Query)
