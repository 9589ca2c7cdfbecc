"""``python -m eval validate DIR``: check a benchmark directory end to end.

Every problem is a `Problem` naming the file, the line (1-based, for JSONL files) and the field. Errors make the
directory invalid; warnings flag things a hand-built benchmark may do on purpose. Checks:

- files: the four required files exist and parse; every line is a JSON object;
- records: required fields present with the right types; optional fields typed when present; ids unique;
  ``qtype`` in Q1..Q5; ``horizon`` in 1..7; ``split`` in train/val/test; GT tiers known and lists of ids (the
  field tables and value rules are derived from the record dataclasses: `eval.schema.field_types`, `field_rules`);
- references: GT ids in the corpus; tiers consistent with their definition (in-video = same video, in-dataset = other
  video same domain, cross-dataset = other domain; consensus within the main pool); segment ``state_id`` in states;
  ``fair`` consistent with a non-empty main pool; frame files exist;
- leakage: a video in two splits; a prefix that does not end before the target time; transcript entries at or after
  the target time;
- features: per space, ``meta.json`` present; row count equal to the id count; dimension equal to meta and across
  tables; prefixes shaped (n, frames, dim); ids unknown to the benchmark or duplicated; NaN/inf values;
- manifest counts equal to the files.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval import features as feats
from eval.io import FormatError, read_json
from eval.schema import (
    GT_TIERS,
    OPTIONAL_QUERY_FIELDS,
    OPTIONAL_SEGMENT_FIELDS,
    OPTIONAL_STATE_FIELDS,
    QUERY_RULES,
    REQUIRED_QUERY_FIELDS,
    REQUIRED_SEGMENT_FIELDS,
    REQUIRED_STATE_FIELDS,
    SPLITS,
    report_horizon,
)

_NAN_CHUNK_ROWS = 65536


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str | None
    message: str
    severity: str = "error"  # "error" | "warning"
    kind: str = ""

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line is not None else "") + (f" [{self.field}]" if self.field else "")
        return f"{self.severity.upper()} {where}: {self.message}"


@dataclass
class Report:
    root: Path
    problems: list[Problem] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def kinds(self) -> set[str]:
        return {p.kind for p in self.problems}


def _type_name(t) -> str:
    return " or ".join(x.__name__ for x in t) if isinstance(t, tuple) else t.__name__


def _is_type(v, t) -> bool:
    if isinstance(v, bool) and (t is int or (isinstance(t, tuple) and bool not in t and int in t)):
        return False  # JSON true/false is not a number here
    return isinstance(v, t)


def _closest(name: str, known: list[str]) -> str:
    """"did you mean 'x'?" for a misspelt field, else how many fields the schema has."""
    import difflib

    near = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {near[0]!r}?" if near else f"{len(known)} fields"


class _Validator:
    def __init__(self, root: Path, check_frames: bool = True):
        self.root = root
        self.check_frames = check_frames
        self.report = Report(root)
        self._frame_cache: dict[str, bool] = {}
        self.n_records: dict[str, int] = {}  # JSON-object lines per file: what a manifest count counts

    def add(self, file: str, line: int | None, fld: str | None, msg: str, kind: str, severity: str = "error") -> None:
        self.report.problems.append(Problem(file, line, fld, msg, severity, kind))

    # --- generic JSONL reading with per-line errors ---
    def read(self, name: str) -> list[tuple[int, dict]]:
        path = self.root / name
        if not path.exists():
            self.add(name, None, None, "missing (a benchmark directory needs manifest.json, queries.jsonl, "
                     "corpus.jsonl, states.jsonl)", "missing_file")
            return []
        rows = []
        with open(path, "rb") as f:
            for i, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    self.add(name, i, None, f"not valid JSON ({getattr(e, 'msg', e)})", "bad_json")
                    continue
                if not isinstance(obj, dict):
                    self.add(name, i, None, f"expected a JSON object, got {type(obj).__name__}", "bad_json")
                    continue
                rows.append((i, obj))
        self.n_records[name] = len(rows)
        return rows

    def check_fields(self, name: str, line: int, obj: dict, required: dict, optional: dict) -> bool:
        """Types of the known fields; a field the schema does not know is an error (the one rule of the loader and
        the validator: its column would not fit the record's Arrow schema)."""
        ok = True
        for k in obj:
            if k not in required and k not in optional:
                self.add(name, line, k, f"unknown field: not in the {name} record schema (`eval.schema`: "
                         f"{_closest(k, [*required, *optional])})", "unknown_field")
                ok = False
        for k, t in required.items():
            if k not in obj or obj[k] is None:
                self.add(name, line, k, "required field missing", "missing_field")
                ok = False
            elif not _is_type(obj[k], t):
                self.add(name, line, k, f"expected {_type_name(t)}, got {type(obj[k]).__name__} ({obj[k]!r:.60})", "bad_type")
                ok = False
        for k, t in optional.items():
            if obj.get(k) is not None and not _is_type(obj[k], t):
                self.add(name, line, k, f"expected {_type_name(t)} or null, got {type(obj[k]).__name__}", "bad_type")
                ok = False
        return ok

    def check_values(self, name: str, line: int, obj: dict, rules: dict[str, dict]) -> None:
        """The allowed values (``choices``) and inclusive ranges (``range``) of `eval.schema.field_rules`."""
        for k, rule in rules.items():
            v = obj.get(k)
            if v is None:
                continue
            if "choices" in rule and v not in rule["choices"]:
                self.add(name, line, k, f"unknown {rule['label']} {v!r}; expected one of {rule['choices']}", "bad_value")
            if "range" in rule and not rule["range"][0] <= v <= rule["range"][1]:
                lo, hi = rule["range"]
                self.add(name, line, k, f"{k} {v} out of range {lo}..{hi}", f"{k}_range")

    def unique(self, name: str, rows: list[tuple[int, dict]]) -> dict[str, tuple[int, dict]]:
        seen: dict[str, tuple[int, dict]] = {}
        for line, obj in rows:
            i = obj.get("id")
            if not isinstance(i, str):
                continue
            if i in seen:
                self.add(name, line, "id", f"duplicate id {i!r} (first on line {seen[i][0]})", "duplicate_id")
            else:
                seen[i] = (line, obj)
        return seen

    def frame_exists(self, rel: str) -> bool:
        if rel not in self._frame_cache:
            p = Path(rel)
            self._frame_cache[rel] = (p if p.is_absolute() else self.root / p).exists()
        return self._frame_cache[rel]

    # --- files ---
    def run(self) -> Report:
        self.report.problems += link_problems(self.root)
        manifest = self.check_manifest()
        states = self.check_states()
        corpus = self.check_corpus(states)
        queries = self.check_queries(corpus)
        self.check_features(manifest, corpus, states, queries)
        if manifest is not None:
            self.check_counts(manifest)
        self.summarise(queries, corpus, states)
        return self.report

    def check_manifest(self) -> dict | None:
        p = self.root / "manifest.json"
        if not p.exists():
            self.add("manifest.json", None, None, "missing", "missing_file")
            return None
        try:
            m = read_json(p)
        except FormatError as e:
            self.add("manifest.json", e.line, None, e.reason, "bad_json")
            return None
        if not isinstance(m, dict):
            self.add("manifest.json", None, None, "expected a JSON object", "bad_json")
            return None
        for k in ("name", "version"):
            if not isinstance(m.get(k), str):
                self.add("manifest.json", None, k, "required string field missing", "missing_field")
        return m

    def check_states(self) -> dict[str, tuple[int, dict]]:
        name = "states.jsonl"
        rows = [(ln, o) for ln, o in self.read(name)
                if self.check_fields(name, ln, o, REQUIRED_STATE_FIELDS, OPTIONAL_STATE_FIELDS)]
        return self.unique(name, rows)

    def check_corpus(self, states: dict) -> dict[str, tuple[int, dict]]:
        name = "corpus.jsonl"
        rows = []
        for ln, o in self.read(name):
            if not self.check_fields(name, ln, o, REQUIRED_SEGMENT_FIELDS, OPTIONAL_SEGMENT_FIELDS):
                continue
            rows.append((ln, o))
            if states and o["state_id"] not in states:
                self.add(name, ln, "state_id", f"unknown state id {o['state_id']!r} (not in states.jsonl)", "unknown_id")
            elif states and states[o["state_id"]][1].get("text") != o["state"]:
                self.add(name, ln, "state", f"state text {o['state']!r} differs from states.jsonl text "
                         f"{states[o['state_id']][1].get('text')!r} of {o['state_id']!r}", "state_mismatch")
            if o["end"] < o["start"]:
                self.add(name, ln, "end", f"segment ends ({o['end']}) before it starts ({o['start']})", "bad_time")
            if self.check_frames and not self.frame_exists(o["frame"]):
                self.add(name, ln, "frame", f"frame file {o['frame']!r} does not exist", "missing_frame")
        return self.unique(name, rows)

    def check_queries(self, corpus: dict) -> dict[str, tuple[int, dict]]:
        name = "queries.jsonl"
        rows = []
        video_splits: dict[str, dict[str, int]] = defaultdict(dict)
        for ln, o in self.read(name):
            if not self.check_fields(name, ln, o, REQUIRED_QUERY_FIELDS, OPTIONAL_QUERY_FIELDS):
                continue
            rows.append((ln, o))
            self.check_values(name, ln, o, QUERY_RULES)
            if o["split"] in SPLITS:
                video_splits[o["video_id"]].setdefault(o["split"], ln)
            self.check_times(name, ln, o)
            self.check_pools(name, ln, o, corpus)
            if self.check_frames:
                for j, fr in enumerate(o["prefix_frames"]):
                    if not isinstance(fr, str) or not self.frame_exists(fr):
                        self.add(name, ln, f"prefix_frames[{j}]", f"frame file {fr!r} does not exist", "missing_frame")
                        break
        for vid, splits in video_splits.items():
            if len(splits) > 1:
                where = ", ".join(f"{s} (line {ln})" for s, ln in sorted(splits.items(), key=lambda x: x[1]))
                self.add(name, max(splits.values()), "split", f"video {vid!r} appears in several splits: {where}", "split_leakage")
        return self.unique(name, rows)

    def check_times(self, name: str, ln: int, o: dict) -> None:
        tt = o["target_time"]
        if not all(math.isfinite(float(o[k])) for k in ("target_time", "prefix_start", "prefix_end")):
            self.add(name, ln, "target_time", "times must be finite", "bad_time")
            return
        if o["prefix_start"] > o["prefix_end"]:
            self.add(name, ln, "prefix_start", f"prefix starts ({o['prefix_start']}) after it ends ({o['prefix_end']})", "bad_time")
        if not o["prefix_end"] < tt:
            self.add(name, ln, "prefix_end", f"prefix ends at {o['prefix_end']}s, not before the target time {tt}s "
                     "(the target must be strictly in the future)", "prefix_leak")
        for j, e in enumerate(o["transcript"]):
            if not isinstance(e, dict) or not isinstance(e.get("state"), str) or not _is_type(e.get("t"), (int, float)):
                self.add(name, ln, f"transcript[{j}]", "expected {\"t\": number, \"state\": string}", "bad_type")
            elif not e["t"] < tt:
                self.add(name, ln, f"transcript[{j}]", f"entry at {e['t']}s ({e['state']!r}) is not before the target "
                         f"time {tt}s: the transcript would reveal the answer", "transcript_leak")

    def check_pools(self, name: str, ln: int, o: dict, corpus: dict) -> None:
        pools = o["gt_pools"]
        for k in pools:
            if k not in GT_TIERS:
                self.add(name, ln, f"gt_pools.{k}", f"unknown GT tier; expected {GT_TIERS}", "bad_value")
        ids_by_tier = {}
        for t in GT_TIERS:
            ids = pools.get(t) or []
            if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
                self.add(name, ln, f"gt_pools.{t}", "expected a list of segment ids", "bad_type")
                ids = []
            ids_by_tier[t] = ids
        t1 = o.get("gt_type1") or []
        for fld, ids in [*((f"gt_pools.{t}", v) for t, v in ids_by_tier.items()), ("gt_type1", t1)]:
            if not corpus:
                break
            missing = [x for x in ids if x not in corpus]
            if missing:
                self.add(name, ln, fld, f"{len(missing)} GT id(s) not in corpus.jsonl, e.g. {missing[0]!r}", "gt_missing")
        if corpus:
            self.check_tier_definitions(name, ln, o, ids_by_tier, corpus)
        main = set(ids_by_tier["in_dataset"]) | set(ids_by_tier["cross_dataset"])
        extra = [x for x in ids_by_tier["consensus"] if x not in main]
        if extra:
            self.add(name, ln, "gt_pools.consensus", f"{len(extra)} consensus id(s) outside the main pool "
                     f"(in_dataset + cross_dataset), e.g. {extra[0]!r}", "tier_mismatch")
        fair = o.get("fair")
        if fair is not None and bool(fair) != bool(main):
            self.add(name, ln, "fair", f"fair={fair} but the main GT pool has {len(main)} item(s)", "fair_mismatch")

    def check_tier_definitions(self, name: str, ln: int, o: dict, ids_by_tier: dict, corpus: dict) -> None:
        rules = {
            "in_video": lambda s: s["video_id"] == o["video_id"],
            "in_dataset": lambda s: s["video_id"] != o["video_id"] and s["domain"] == o["domain"],
            "cross_dataset": lambda s: s["domain"] != o["domain"],
        }
        text = {"in_video": "the query's own video", "in_dataset": "another video of the same domain",
                "cross_dataset": "another domain"}
        for tier, rule in rules.items():
            bad = [x for x in ids_by_tier[tier] if x in corpus and not rule(corpus[x][1])]
            if bad:
                self.add(name, ln, f"gt_pools.{tier}", f"{len(bad)} id(s) not from {text[tier]}, e.g. {bad[0]!r}", "tier_mismatch")
            wrong_state = [x for x in ids_by_tier[tier] if x in corpus and corpus[x][1]["state_id"] != o["target_state_id"]]
            if wrong_state:
                self.add(name, ln, f"gt_pools.{tier}", f"{len(wrong_state)} id(s) whose state differs from the target "
                         f"{o['target_state_id']!r}, e.g. {wrong_state[0]!r}", "gt_state_mismatch", severity="warning")

    # --- features ---
    def check_features(self, manifest: dict | None, corpus: dict, states: dict, queries: dict) -> None:
        known = {"corpus": set(corpus), "states": set(states), "prefixes": {o["prefix_id"] for _, o in queries.values()}}
        for space in feats.list_spaces(self.root):
            base = f"features/{space}"
            try:
                meta = feats.read_meta(self.root, space)
            except FormatError as e:
                self.add(f"{base}/meta.json", e.line, None, e.reason, "feature_meta")
                meta = {}
            dims = {}
            for table in feats.TABLES:
                if not feats.has_table(self.root, space, table) and not (feats.space_dir(self.root, space) / f"{table}_ids.txt").exists():
                    continue
                fname = f"{base}/{table}.npy"
                try:
                    t = feats.load_table(self.root, space, table)
                except FormatError as e:
                    self.add(Path(e.path).relative_to(self.root).as_posix(), e.line, e.field, e.reason,
                             "bad_text" if "UTF-8" in e.reason else "feature_rows")
                    continue
                want_ndim = 3 if table == "prefixes" else 2
                if t.array.ndim != want_ndim:
                    self.add(fname, None, None, f"expected {want_ndim} dimensions, got shape {t.array.shape}", "feature_dim")
                    continue
                if t.array.dtype != np.float32:
                    self.add(fname, None, None, f"expected float32, got {t.array.dtype}", "feature_dtype", severity="warning")
                dims[table] = t.dim
                if meta.get("dim") is not None and t.dim != meta["dim"]:
                    self.add(fname, None, None, f"dimension {t.dim} disagrees with meta.json dim {meta['dim']}", "feature_dim")
                self.check_feature_ids(f"{base}/{table}_ids.txt", t.ids, known[table], table)
                self.check_finite(fname, t.array)
            if len(set(dims.values())) > 1:
                self.add(base, None, None, f"tables disagree on dimension: {dims}", "feature_dim")

    def check_feature_ids(self, fname: str, ids: list[str], known: set[str], table: str) -> None:
        counts = Counter(ids)
        dups = [x for x, c in counts.items() if c > 1]
        if dups:
            self.add(fname, ids.index(dups[0]) + 1, None, f"{len(dups)} duplicated id(s), e.g. {dups[0]!r}", "duplicate_id")
        if known:
            for i, x in enumerate(ids, start=1):
                if x not in known:
                    self.add(fname, i, None, f"id {x!r} is unknown to the benchmark's {table}", "unknown_id")
                    break

    def check_finite(self, fname: str, arr: np.ndarray) -> None:
        flat = arr.reshape(arr.shape[0], -1)
        for start in range(0, flat.shape[0], _NAN_CHUNK_ROWS):
            block = np.asarray(flat[start:start + _NAN_CHUNK_ROWS])
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                row = start + int(np.flatnonzero(bad)[0])
                self.add(fname, None, f"row {row}", f"{int(bad.sum())}+ row(s) with NaN/inf values, first at row {row} "
                         "(line " + str(row + 1) + " of the ids file)", "feature_nan")
                return

    def check_counts(self, manifest: dict) -> None:
        """Manifest counts against the records in the files (every JSON object line, so a record with a bad field
        or a duplicate id is reported once, not again as a count mismatch)."""
        counts = manifest.get("counts") or {}
        for key in ("queries", "corpus", "states"):
            n = self.n_records.get(f"{key}.jsonl", 0)
            if key in counts and counts[key] != n:
                self.add("manifest.json", None, f"counts.{key}", f"says {counts[key]} but the file holds {n}", "count_mismatch")

    def summarise(self, queries: dict, corpus: dict, states: dict) -> None:
        qs = [o for _, o in queries.values()]
        s: dict[str, Any] = {
            "queries": len(qs), "corpus": len(corpus), "states": len(states),
            "videos": len({o["video_id"] for o in qs}), "prefixes": len({o["prefix_id"] for o in qs}),
            "fair": sum(bool(o.get("fair", True)) for o in qs),
        }
        s["by_split"] = dict(sorted(Counter(o["split"] for o in qs).items()))
        s["by_qtype"] = dict(sorted(Counter(o["qtype"] for o in qs).items()))
        s["by_horizon"] = dict(sorted(Counter(o["horizon"] for o in qs if isinstance(o["horizon"], int)).items()))
        s["by_report_horizon"] = dict(sorted(Counter(report_horizon(o["horizon"]) for o in qs
                                                     if isinstance(o["horizon"], int)).items()))
        s["by_domain"] = dict(sorted(Counter(o["domain"] for o in qs).items()))
        tiers = {}
        for t in GT_TIERS:
            sizes = [len(o["gt_pools"].get(t) or []) for o in qs]
            tiers[t] = {"queries_with_gt": sum(x > 0 for x in sizes), "mean_size": float(np.mean(sizes)) if sizes else 0.0}
        sizes1 = [len(o.get("gt_type1") or []) for o in qs]
        tiers["type1"] = {"queries_with_gt": sum(x > 0 for x in sizes1), "mean_size": float(np.mean(sizes1)) if sizes1 else 0.0}
        s["by_tier"] = tiers
        self.report.summary = s


REBUILD_HINT = ("rebuild the benchmark from its source: `python -m retrieval synth --out {root}` for a synthetic "
                "build, else `python -m retrieval canon apply --data SOURCE --out {root} --overwrite`")


def link_problems(root: str | Path) -> list[Problem]:
    """What a benchmark reaches through links, checked (`eval.validate` and every `eval.benchmark.Benchmark.load`):
    the target of each link at its layout's link points exists (`eval.outputs.layout_links`), and each folder its
    manifest records as a dependency exists and still holds the build it was linked to (the SHA-256 of its
    manifest; `eval.outputs.dependency_record`)."""
    import os

    from eval.outputs import layout_links, manifest_dependencies, manifest_sha256

    root = Path(root)
    out = []
    for name, link in layout_links(root):
        if not link.exists():
            out.append(Problem(name, None, None, f"is a link to {os.readlink(link)}, which does not exist",
                               "error", "broken_link"))
    for i, dep in enumerate(manifest_dependencies(root)):
        fld, src = f"dependencies[{i}]", dep["path"]
        now = manifest_sha256(src)
        if now is None:
            out.append(Problem("manifest.json", None, fld, f"built from {src}, which no longer holds a benchmark "
                               "(its links into it are broken)", "error", "broken_link"))
        elif dep.get("manifest_sha256") not in (None, now):
            out.append(Problem("manifest.json", None, fld, f"built from {src}, which has been rebuilt since (its "
                               "manifest changed): the frames and features this benchmark links there are no longer "
                               "the ones it was built with", "error", "stale_dependency"))
    return out


def validate(root: str | Path, *, check_frames: bool = True) -> Report:
    """Validate a benchmark directory; returns a `Report` (``report.ok`` is False when any error was found)."""
    root = Path(root)
    if not root.is_dir():
        r = Report(root)
        r.problems.append(Problem(str(root), None, None, "not a directory", "error", "missing_file"))
        return r
    return _Validator(root, check_frames=check_frames).run()


_RECORD_FIELDS = {"queries.jsonl": (REQUIRED_QUERY_FIELDS, OPTIONAL_QUERY_FIELDS),
                  "corpus.jsonl": (REQUIRED_SEGMENT_FIELDS, OPTIONAL_SEGMENT_FIELDS),
                  "states.jsonl": (REQUIRED_STATE_FIELDS, OPTIONAL_STATE_FIELDS)}


def first_record_problem(path: str | Path) -> Problem | None:
    """The first line-level problem (JSON, record type, field types) of one of a benchmark's three JSONL files, for
    a loader that failed and must say where; None when the lines look right (the problem lies deeper)."""
    path = Path(path)
    v = _Validator(path.parent, check_frames=False)
    required, optional = _RECORD_FIELDS[path.name]
    for ln, o in v.read(path.name):
        if v.report.errors:
            break
        v.check_fields(path.name, ln, o, required, optional)
    return v.report.errors[0] if v.report.errors else None
