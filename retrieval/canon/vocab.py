"""The raw state vocabulary that canonicalization clusters: unique phrases, their frequencies, and (when known) the
true canonical class of each.

Sources:

- a benchmark (`from_benchmark`): each corpus segment's free-form description ``raw`` (its ``state`` when ``raw``
  is empty), counted over the corpus. The true class of a phrase is the canonical ``state_id`` of the segments that
  carry it (the synthetic benchmark draws ``raw`` from its state's exact synonym set, so this is the truth there; on
  the PSR release it is the release's own canonicalization). A phrase seen under several states takes the most
  frequent one (ties: smallest id) and is counted in ``ambiguous``.
- a file (`from_file`): ``.txt`` one phrase per line (a repeated line counts again); ``.tsv`` ``phrase<TAB>count``
  with an optional third column, the true class; ``.jsonl`` objects with ``phrase`` and optional ``count`` and
  ``label`` (so a phrase file of `eval.phrases` works too: each query's phrase counts once). Malformed lines raise
  `eval.io.FormatError` naming the file, the line and the field.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.io import FormatError, iter_jsonl


@dataclass
class PhraseVocab:
    """``phrases`` (unique, first-seen order), ``counts`` ``(n,)`` int64, ``truth`` (true class per phrase, or None
    when unknown), ``source`` (where it came from), ``ambiguous`` (phrases seen under several true classes)."""

    phrases: list[str]
    counts: np.ndarray
    truth: list[str] | None
    source: str
    ambiguous: int = 0

    def __post_init__(self) -> None:
        self.counts = np.asarray(self.counts, np.int64)
        if len(self.counts) != len(self.phrases):
            raise ValueError(f"{len(self.counts)} counts for {len(self.phrases)} phrases")
        if len(set(self.phrases)) != len(self.phrases):
            raise ValueError("phrases must be unique")
        if self.truth is not None and len(self.truth) != len(self.phrases):
            raise ValueError(f"{len(self.truth)} true labels for {len(self.phrases)} phrases")

    def __len__(self) -> int:
        return len(self.phrases)

    @property
    def index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.phrases)}


def segment_phrases(raw: list[str], state: list[str]) -> list[str]:
    """Each segment's raw phrase (its canonical ``state`` when ``raw`` is empty), whitespace-stripped."""
    return [(r or "").strip() or s for r, s in zip(raw, state, strict=True)]


def from_benchmark(bench) -> PhraseVocab:
    """The raw vocabulary of a loaded `eval.benchmark.Benchmark` (see the module docstring)."""
    import pandas as pd

    ds = bench.corpus_ds
    df = pd.DataFrame({"phrase": segment_phrases(ds["raw"][:], ds["state"][:]), "state": ds["state_id"][:]})
    df["first"] = np.arange(len(df))
    g = (df.groupby(["phrase", "state"], sort=False).agg(n=("first", "size"), first=("first", "min"))
         .reset_index().sort_values(["phrase", "n", "state"], ascending=[True, False, True]))
    per_phrase = g.groupby("phrase", sort=False).agg(count=("n", "sum"), truth=("state", "first"),
                                                      classes=("state", "size"), first=("first", "min"))
    per_phrase = per_phrase.sort_values("first")  # first-seen order
    return PhraseVocab(list(per_phrase.index), per_phrase["count"].to_numpy(), list(per_phrase["truth"]),
                       f"{bench.root} (corpus raw descriptions)", int((per_phrase["classes"] > 1).sum()))


def from_file(path: str | os.PathLike) -> PhraseVocab:
    """Read a phrase list (``.txt``, ``.tsv`` or ``.jsonl``; see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"phrase file {path} does not exist")
    counts: Counter = Counter()
    labels: dict[str, str] = {}
    has_label = None
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        for line, obj in iter_jsonl(path):
            p = obj.get("phrase")
            if p is None and "query_id" in obj:
                continue  # a failed line of a forecaster's phrase file: no phrase to count
            if not isinstance(p, str) or not p.strip():
                raise FormatError(path, "expected a non-empty string", line=line, field="phrase")
            c = obj.get("count", 1)
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise FormatError(path, f"expected a positive integer, got {c!r}", line=line, field="count")
            has_label = _add(path, line, p.strip(), c, obj.get("label"), counts, labels, has_label)
    else:
        with open(path, encoding="utf-8") as f:
            for line, text in enumerate(f, start=1):
                text = text.rstrip("\n")
                if not text.strip():
                    continue
                cols = text.split("\t") if suffix == ".tsv" else [text]
                if suffix == ".tsv" and not 2 <= len(cols) <= 3:
                    raise FormatError(path, f"expected 'phrase<TAB>count[<TAB>label]', got {len(cols)} column(s)",
                                      line=line)
                c = 1
                if len(cols) >= 2:
                    try:
                        c = int(cols[1])
                    except ValueError:
                        raise FormatError(path, f"expected an integer count, got {cols[1]!r}", line=line,
                                          field="count") from None
                    if c < 1:
                        raise FormatError(path, f"count must be positive, got {c}", line=line, field="count")
                label = cols[2] if len(cols) == 3 else None
                has_label = _add(path, line, cols[0].strip(), c, label, counts, labels, has_label)
    if not counts:
        raise FormatError(path, "holds no phrases")
    uniq = list(counts)
    truth = [labels[p] for p in uniq] if has_label else None
    return PhraseVocab(uniq, [counts[p] for p in uniq], truth, str(path))


def _add(path, line, phrase, count, label, counts, labels, has_label) -> bool:
    if not phrase:
        raise FormatError(path, "empty phrase", line=line, field="phrase")
    given = label is not None
    if has_label is not None and given != has_label:
        raise FormatError(path, "either every line or no line carries a true label", line=line, field="label")
    if given:
        if not isinstance(label, str) or not label:
            raise FormatError(path, f"expected a non-empty string, got {label!r}", line=line, field="label")
        if labels.setdefault(phrase, label) != label:
            raise FormatError(path, f"phrase {phrase!r} has two labels: {labels[phrase]!r} and {label!r}", line=line,
                              field="label")
    counts[phrase] += count
    return given
