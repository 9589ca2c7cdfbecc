"""The phrase file: what a forecaster (or any phrase source: a paraphraser, an oracle, a describer) predicts.

JSONL, one line per query::

    {"query_id": "q000123", "phrase": "falling off the edge", "phrases": ["falling off the edge"],
     "raw": "The ball will be falling off the edge.", "model": "Qwen/Qwen3-VL-32B-Instruct", "backend": "vllm",
     "forecaster": "m3", "prompt_id": "m3", "prompt_hash": "3f2a9c1e", "decoding": {"temperature": 0.0, "max_tokens": 24},
     "config_hash": "9b1c...", "error": null, "parse_ok": true, "flags": []}

- ``phrase`` is the parsed primary answer (``null`` when the request failed or nothing parseable came back);
  ``phrases`` holds every parsed sample (multi-sample mode writes K; retrieval scores a query by the max over them).
- ``raw`` is the model's untouched output (a list in multi-sample mode); ``error`` is null or a message;
  ``parse_ok`` is false for an empty or unparseable answer (scored as a miss); ``flags`` lists soft warnings
  such as ``"length"`` (outside 2-5 words).
- ``prompt_id``/``prompt_hash`` identify the exact template (`prompts`), ``config_hash`` the whole generation config.

This module lives in `eval` because both producers (forecasters) and consumers (retrieval) read it, and they never
import each other. Readers tolerate a torn last line (a crash mid-append) and, when a query id repeats (a rerun),
keep the last successful line.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from eval.io import FormatError, iter_jsonl

REQUIRED = ("query_id",)


@dataclass
class PhraseRecord:
    query_id: str
    phrase: str | None = None
    phrases: list[str] = field(default_factory=list)
    raw: str | list[str] | None = None
    model: str = ""
    backend: str = ""
    forecaster: str = ""
    prompt_id: str = ""
    prompt_hash: str = ""
    decoding: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""
    error: str | None = None
    parse_ok: bool = True
    flags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the line carries a usable phrase (no error, parsed)."""
        return self.error is None and self.parse_ok and bool(self.samples)

    @property
    def samples(self) -> list[str]:
        """The phrases to retrieve with (``phrases`` if given, else ``[phrase]``), empty ones dropped."""
        xs = self.phrases or ([self.phrase] if self.phrase else [])
        return [x for x in xs if x and x.strip()]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["phrases"] and self.phrase:
            d["phrases"] = [self.phrase]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, path: str | None = None, line: int | None = None) -> PhraseRecord:
        where = path or "<phrases>"
        if not isinstance(d.get("query_id"), str) or not d["query_id"]:
            raise FormatError(where, "required field missing or not a string", line=line, field="query_id")
        if d.get("phrase") is not None and not isinstance(d["phrase"], str):
            raise FormatError(where, f"expected a string or null, got {type(d['phrase']).__name__}", line=line, field="phrase")
        phrases = d.get("phrases")
        if phrases is not None and (not isinstance(phrases, list) or not all(isinstance(x, str) for x in phrases)):
            raise FormatError(where, "expected a list of strings", line=line, field="phrases")
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names and v is not None}
        extra = {k: v for k, v in d.items() if k not in names}
        rec = cls(**known)
        rec.extra.update(extra)
        return rec


def read_phrases(path: str | os.PathLike, *, keep: str = "last_ok") -> dict[str, PhraseRecord]:
    """Read a phrase file into ``{query_id: record}``.

    When a query id appears more than once (a resumed job retried it), ``keep="last_ok"`` keeps the last line that
    succeeded, else the last line; ``keep="last"`` keeps the last line. A torn last line is ignored.
    Malformed lines raise `FormatError` naming the file and line.
    """
    out: dict[str, PhraseRecord] = {}
    for line, d in iter_jsonl(path, allow_torn_tail=True):
        rec = PhraseRecord.from_dict(d, path=str(path), line=line)
        prev = out.get(rec.query_id)
        if prev is not None and keep == "last_ok" and prev.ok and not rec.ok:
            continue
        out[rec.query_id] = rec
    return out


def check_belongs(path: str | os.PathLike, recs: dict[str, PhraseRecord], query_index, selected: list[str], *,
                  benchmark: str, allow_empty: bool = False) -> None:
    """Refuse a phrase file that does not belong to the job (`eval.errors.InputError`, exit 2):

    - a query id the benchmark does not know (a phrase file of another benchmark or version): the count and the
      first ids with their lines, always;
    - no line at all (a 0-byte file), or no line for any ``selected`` query (a phrase file of another split): an
      `eval.errors.EmptySelection`, unless ``allow_empty`` (every query is then scored as a miss).
    """
    from eval.errors import EmptySelection, InputError

    unknown = [q for q in recs if q not in query_index]
    if unknown:
        first = set(unknown[:3])
        lines = {d["query_id"]: ln for ln, d in iter_jsonl(path, allow_torn_tail=True) if d.get("query_id") in first}
        shown = ", ".join(f"{q!r} (line {lines.get(q, '?')})" for q in unknown[:3])
        raise InputError(f"{path}: {len(unknown):,} of its {len(recs):,} query ids are not in the benchmark "
                         f"{benchmark}, e.g. {shown}: a phrase file of another benchmark?",
                         fix="pass the phrase file written for this benchmark (forecasters run --data with it)")
    if allow_empty:
        return
    if not recs:
        raise EmptySelection(f"{path} holds no phrase line", fix="pass the phrase file a forecaster wrote, or "
                             "--allow-empty to score every query as a miss")
    if not any(q in recs for q in selected):
        raise EmptySelection(f"no line of {path} answers a query of the selection ({len(selected):,} queries); "
                             f"its {len(recs):,} lines answer other queries of {benchmark}",
                             fix="pass the --split the phrase file covers, or --allow-empty to score every query "
                                 "as a miss")
