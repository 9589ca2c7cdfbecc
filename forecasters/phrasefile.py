"""Resuming phrase files and merging shards (the format is `eval.phrases`).

Crash safety comes from the resumable-JSONL layer, `eval.resumable`: the runner appends whole lines only, as answers
arrive (`eval.resumable.Appender`: the records answered since the last write are encoded first, then written with
one ``os.write`` on an ``O_APPEND`` descriptor and ``fsync``-ed). A crash (even ``kill -9``) can therefore lose only
the requests still in flight and tear at most the last line. On resume:

1. an exclusive ``flock`` on ``<out>.lock`` keeps a second job off the same file (`eval.resumable.locked`);
2. a torn tail (the file does not end in a newline) is cut back to the last newline (`eval.resumable.cut_torn_tail`);
3. lines of another config (a different ``config_hash``) stop the job, unless ``--drop-foreign`` (those lines move
   to ``<out>.foreign``, appended and fsynced before the file is rewritten, so nothing is lost; the job's own lines
   stay) or ``--overwrite`` (the file starts empty);
4. when a query id appears more than once, or failed queries are to be redone (``--redo-failed``), the file is
   rewritten atomically (temp file + fsync + rename) keeping the last line per done query, in file order.

So after any crash and rerun, each query id appears exactly once.

Coverage (`coverage`): over a list of query ids, a phrase file's lines are *answered* (no ``error``: ``ok`` when a
phrase parsed, else a parse failure: the model's answer, kept as it is), *failed* (the line records an error; redone
by ``--redo-failed``) or *missing* (no line). A job or a merge is complete when every query is answered.

Merging shards (`merge_phrase_files`): all inputs must share one ``config_hash``; the last successful line of each
query wins; the output is written atomically; coverage against an expected id list is reported.

Before any work, `check_phrase_out` refuses an ``--out`` this toolkit did not write (`eval.outputs`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eval import resumable
from eval.io import FormatError, iter_jsonl, write_jsonl
from eval.phrases import PhraseRecord


def record_failed(d: dict) -> bool:
    """A line whose request failed (an ``error``), as opposed to a result (possibly a parse failure)."""
    return d.get("error") is not None


@dataclass
class ExistingOutput:
    """What a phrase file already holds: ``last`` line per query id (file order of first appearance)."""

    path: Path
    last: dict[str, dict] = field(default_factory=dict)
    n_lines: int = 0
    torn_tail: bool = False
    config_hashes: Counter = field(default_factory=Counter)
    by_config: dict[str, dict[str, dict]] = field(default_factory=dict)

    @property
    def duplicates(self) -> bool:
        return self.n_lines > len(self.last)

    def lines_of(self, config_hash: str) -> dict[str, dict]:
        """The last line of each query among the lines of one config (file order of first appearance)."""
        return self.by_config.get(config_hash, {})

    def done_ids(self, config_hash: str, *, redo_failed: bool) -> set[str]:
        """Query ids not to run again: lines of this config, minus failed ones when ``redo_failed``."""
        return {q for q, d in self.lines_of(config_hash).items() if not (redo_failed and record_failed(d))}


def scan(path: str | os.PathLike) -> ExistingOutput:
    """Read an existing phrase file (a missing file is empty). A torn tail (bytes after the last newline) is noted,
    not read; any other malformed line raises `FormatError` naming the line (`eval.resumable.scan`)."""
    lines = resumable.scan(path)
    out = ExistingOutput(lines.path, torn_tail=lines.torn_tail > 0)
    for i, d in lines.rows:
        rec = PhraseRecord.from_dict(d, path=str(path), line=i)  # validates the required fields
        out.n_lines += 1
        out.config_hashes[rec.config_hash] += 1
        out.last[rec.query_id] = d
        out.by_config.setdefault(rec.config_hash, {})[rec.query_id] = d
    return out


def move_foreign_lines(path: str | os.PathLike, config_hash: str) -> tuple[int, Path]:
    """Append the complete lines of ``path`` whose ``config_hash`` differs to ``<path>.foreign`` (fsynced); the
    caller then rewrites ``path`` without them. Returns (lines moved, the .foreign path)."""
    path = Path(path)
    dest = Path(str(path) + ".foreign")
    data = path.read_bytes()
    moved = []
    for raw in data[: data.rfind(b"\n") + 1].split(b"\n"):
        if raw.strip() and json.loads(raw).get("config_hash") != config_hash:
            moved.append(raw + b"\n")
    if moved:
        with resumable.Appender(dest) as foreign:
            foreign.append_bytes(b"".join(moved))
    return len(moved), dest


@dataclass
class Coverage:
    """How far the lines of a phrase file answer a list of queries (see the module docstring). ``error_kinds``
    counts the failed lines by ``error_kind``; ``failed_ids`` / ``missing_ids`` hold up to 5 examples each."""

    queries: int = 0
    ok: int = 0
    parse_failures: int = 0
    failed: int = 0
    missing: int = 0
    length_flags: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    failed_ids: list[str] = field(default_factory=list)
    missing_ids: list[str] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return self.ok + self.parse_failures

    @property
    def complete(self) -> bool:
        return self.answered == self.queries

    def describe(self) -> str:
        """``"29 of 49 queries have no answer (20 failed, 9 missing)"``-style text (empty when complete)."""
        if self.complete:
            return ""
        parts = [f"{self.failed} failed" + (f" ({_kinds(self.error_kinds)})" if self.error_kinds else ""),
                 f"{self.missing} missing"]
        return f"{self.queries - self.answered} of {self.queries} queries have no answer ({', '.join(parts)})"


def _kinds(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))


def coverage(lines: dict[str, dict], query_ids: Iterable[str]) -> Coverage:
    """`Coverage` of ``query_ids`` by ``lines`` (query id -> its line)."""
    c = Coverage()
    for q in query_ids:
        c.queries += 1
        d = lines.get(q)
        if d is None:
            c.missing += 1
            if len(c.missing_ids) < 5:
                c.missing_ids.append(q)
        elif record_failed(d):
            c.failed += 1
            kind = (d.get("extra") or {}).get("error_kind") or d.get("error_kind") or "unknown"
            c.error_kinds[kind] = c.error_kinds.get(kind, 0) + 1
            if len(c.failed_ids) < 5:
                c.failed_ids.append(q)
        elif PhraseRecord.from_dict(d).ok:
            c.ok += 1
            c.length_flags += "length" in (d.get("flags") or [])
        else:
            c.parse_failures += 1
    return c


@dataclass
class MergeReport:
    """``n_queries`` written (``n_ok`` with a phrase, ``n_failed`` with an error); ``missing``: expected ids without
    a line; ``coverage``: over the expected ids when given, else over the merged queries."""

    n_inputs: int
    n_lines: int
    n_queries: int
    n_ok: int
    n_failed: int
    config_hash: str
    coverage: Coverage
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def merge_phrase_files(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, *,
                       expected_ids: Sequence[str] | None = None, allow_mixed: bool = False) -> MergeReport:
    """Merge shard phrase files into ``out`` (atomic). The last successful line of each query wins; lines are
    ordered as ``expected_ids`` when given, else by query id. Raises `FormatError` for mixed configs (unless
    ``allow_mixed``)."""
    best: dict[str, dict] = {}
    hashes: Counter = Counter()
    n_lines = 0
    for p in inputs:
        for line, d in iter_jsonl(p, allow_torn_tail=True):
            rec = PhraseRecord.from_dict(d, path=str(p), line=line)
            n_lines += 1
            hashes[rec.config_hash] += 1
            prev = best.get(rec.query_id)
            if prev is not None and rec.config_hash != prev.get("config_hash") and not allow_mixed:
                raise FormatError(p, f"query {rec.query_id} has lines of two configs "
                                     f"({prev.get('config_hash')} and {rec.config_hash})", line=line, field="config_hash")
            if prev is None or not (PhraseRecord.from_dict(prev).ok and not rec.ok):
                best[rec.query_id] = d
    if len(hashes) > 1 and not allow_mixed:
        raise FormatError(inputs[0], f"inputs hold different configs {dict(hashes)}; merge shards of one run only "
                                     "(or pass --allow-mixed)", field="config_hash")
    if expected_ids is not None:
        order = [q for q in expected_ids if q in best]
        missing = [q for q in expected_ids if q not in best]
        exp = set(expected_ids)
        unexpected = sorted(q for q in best if q not in exp)
        order += unexpected
    else:
        order, missing, unexpected = sorted(best), [], []
    write_jsonl(out, (best[q] for q in order))
    n_ok = sum(PhraseRecord.from_dict(best[q]).ok for q in order)
    return MergeReport(n_inputs=len(inputs), n_lines=n_lines, n_queries=len(order), n_ok=n_ok,
                       n_failed=sum(record_failed(best[q]) for q in order),
                       config_hash=next(iter(hashes), "") if len(hashes) == 1 else "mixed",
                       coverage=coverage(best, expected_ids if expected_ids is not None else order),
                       missing=missing, unexpected=unexpected)


def check_phrase_out(out: Path, inputs: list, overwrite: bool, sidecars: tuple[str, ...] = ()) -> None:
    """Refuse --out before any work (`eval.outputs`): missing, a phrase file of this toolkit (its first line holds
    query_id and config_hash), or --overwrite; never a job input. ``sidecars``: ``OUT.<kind>.json`` files written
    beside it (they hold a config_hash)."""
    from eval.outputs import check_output_file, json_with_keys, jsonl_with_keys

    check_output_file(out, "phrase", recognise=jsonl_with_keys("query_id", "config_hash"), inputs=inputs,
                      overwrite=overwrite)
    for kind in sidecars:
        side = out.with_name(out.name.removesuffix(".jsonl") + f".{kind}.json")
        check_output_file(side, f"phrase-file {kind}", recognise=json_with_keys("config_hash"), inputs=inputs,
                          overwrite=overwrite, option="--out's sidecar")
