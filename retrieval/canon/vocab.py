"""The raw state vocabulary that canonicalization clusters: unique phrases, their frequencies, and (when known) the
true canonical class of each and the query ids that produced each.

Sources:

- a benchmark (`from_benchmark`): each corpus segment's free-form description ``raw`` (its ``state`` when ``raw``
  is empty), counted over the corpus. The true class of a phrase is the simulator's true state ``sim_state`` of
  the segments that carry it where every segment records one (the synthetic benchmark: its canonical states are
  the clustering's own output, so scoring against them would be circular), else their canonical ``state_id`` (on
  the PSR release, the release's own canonicalization). A phrase seen under several classes takes the most
  frequent one (ties: smallest id) and is counted in ``ambiguous``.
- a file (`from_file`), its format named by its suffix (`PHRASE_SUFFIXES`; any other suffix is refused):

  - ``.txt``: one phrase a line (a repeated line counts again; blank lines are skipped);
  - ``.csv`` / ``.tsv``: a header line naming a ``phrase`` column and optionally ``count`` (default 1), ``label``
    (the true class) and ``query_id`` columns, other columns ignored; ``.csv`` as RFC 4180 (quoted fields may hold
    commas), ``.tsv`` split on tabs with no quoting;
  - ``.jsonl``: one object a line, ``phrase`` with optional ``count`` and ``label``; or a forecaster's phrase file
    (`eval.phrases`: lines with ``query_id``), where each sample (``phrases``, else ``phrase``) of each answered
    query counts once and keeps its query id, failed lines are skipped, a query id repeated by a rerun counts its
    last answered line (as `eval.phrases.read_phrases`) and a torn last line is ignored;
  - ``.json``: an array of phrase strings, or of objects as the lines of a ``.jsonl`` file.

  A UTF-8 byte-order mark is skipped; surrounding whitespace is stripped from phrases; a phrase repeated in the file
  adds its counts; phrases keep their first-seen order. A missing path, a directory or an unknown suffix raise
  `eval.errors.InputError`; invalid UTF-8, a malformed line, a count that is not an integer in ``[1, 2^63)`` (or
  counts adding up beyond it), mixed labelled and unlabelled lines, and a file without a phrase raise
  `eval.io.FormatError` naming the file, the line (the array index for ``.json``) and the field.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import FormatError, read_text
from eval.phrases import PhraseRecord


@dataclass
class PhraseVocab:
    """``phrases`` (unique, first-seen order), ``counts`` ``(n,)`` int64, ``truth`` (true class per phrase, or None
    when unknown), ``source`` (where it came from), ``ambiguous`` (phrases seen under several true classes),
    ``query_ids`` (per phrase, the query ids whose answer it was, in file order; None when the source has none)."""

    phrases: list[str]
    counts: np.ndarray
    truth: list[str] | None
    source: str
    ambiguous: int = 0
    query_ids: list[list[str]] | None = None

    def __post_init__(self) -> None:
        self.counts = np.asarray(self.counts, np.int64)
        if len(self.counts) != len(self.phrases):
            raise InputError(f"{len(self.counts)} counts for {len(self.phrases)} phrases")
        if len(set(self.phrases)) != len(self.phrases):
            raise InputError("phrases must be unique")
        if self.truth is not None and len(self.truth) != len(self.phrases):
            raise InputError(f"{len(self.truth)} true labels for {len(self.phrases)} phrases")
        if self.query_ids is not None and len(self.query_ids) != len(self.phrases):
            raise InputError(f"{len(self.query_ids)} query-id lists for {len(self.phrases)} phrases")

    def __len__(self) -> int:
        return len(self.phrases)

    @property
    def index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.phrases)}


def segment_phrases(raw: list[str], state: list[str]) -> list[str]:
    """Each segment's raw phrase (its canonical ``state`` when ``raw`` is empty), whitespace-stripped."""
    return [(r or "").strip() or s for r, s in zip(raw, state, strict=True)]


def from_benchmark(bench, truth: str = "auto") -> PhraseVocab:
    """The raw vocabulary of a loaded `eval.benchmark.Benchmark` (see the module docstring). ``truth``: the class
    of a phrase: ``auto`` (``sim_state`` where every segment records one, else ``state_id``), ``sim_state`` or
    ``state_id``."""
    import pandas as pd

    if truth not in ("auto", "sim_state", "state_id"):
        raise InputError(f"truth must be auto, sim_state or state_id, got {truth!r}")
    ds = bench.corpus_ds
    sim = ds["sim_state"][:] if "sim_state" in ds.column_names else None
    has_sim = sim is not None and all(s is not None for s in sim)
    if truth == "sim_state" and not has_sim:
        raise InputError(f"{bench.root}: not every corpus segment records a sim_state")
    # the simulator's true state (synthetic benchmark): its canonical ids are the clustering's own output
    labels = sim if truth == "sim_state" or (truth == "auto" and has_sim) else ds["state_id"][:]
    df = pd.DataFrame({"phrase": segment_phrases(ds["raw"][:], ds["state"][:]), "state": labels})
    df["first"] = np.arange(len(df))
    g = (df.groupby(["phrase", "state"], sort=False).agg(n=("first", "size"), first=("first", "min"))
         .reset_index().sort_values(["phrase", "n", "state"], ascending=[True, False, True]))
    per_phrase = g.groupby("phrase", sort=False).agg(count=("n", "sum"), truth=("state", "first"),
                                                      classes=("state", "size"), first=("first", "min"))
    per_phrase = per_phrase.sort_values("first")  # first-seen order
    return PhraseVocab(list(per_phrase.index), per_phrase["count"].to_numpy(), list(per_phrase["truth"]),
                       f"{bench.root} (corpus raw descriptions)", int((per_phrase["classes"] > 1).sum()))


PHRASE_SUFFIXES = (".txt", ".csv", ".tsv", ".json", ".jsonl")
#: Largest count (and total of counts) a vocabulary holds: counts are int64.
MAX_COUNT = 2**63 - 1


def check_phrase_path(path: str | os.PathLike, what: str = "phrase file") -> Path:
    """``path`` as a `Path` when it is an existing file with a known suffix, else `InputError` saying why."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} {path} does not exist")
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory, not a file")
    if path.suffix.lower() not in PHRASE_SUFFIXES:
        raise InputError(f"{what} {path}: unknown suffix {path.suffix or '(none)'!r}",
                         fix="name it .txt (one phrase a line), .csv/.tsv (a header with a 'phrase' column), "
                             ".json or .jsonl (objects with 'phrase', or a forecaster's phrase file)")
    return path


class _Counter:
    """Phrases of one file in first-seen order with their counts, true labels and query ids."""

    def __init__(self, path: Path):
        self.path = path
        self.counts: dict[str, int] = {}
        self.labels: dict[str, str] = {}
        self.query_ids: dict[str, dict[str, None]] = {}
        self.has_label: bool | None = None
        self.total = 0

    def add(self, phrase, count, label=None, query_id=None, *, line=None, at: str = "") -> None:
        """Add ``count`` occurrences of ``phrase``; ``at`` prefixes field names (``[3].`` in a JSON array)."""
        if not isinstance(phrase, str) or not phrase.strip():
            raise FormatError(self.path, f"expected a non-empty string, got {phrase!r}", line=line, field=at + "phrase")
        phrase = phrase.strip()
        count = _count(self.path, count, line, at + "count")
        given = label is not None
        if self.has_label is not None and given != self.has_label:
            raise FormatError(self.path, "either every phrase or no phrase carries a true label", line=line,
                              field=at + "label")
        self.has_label = given
        if given:
            if not isinstance(label, str) or not label:
                raise FormatError(self.path, f"expected a non-empty string, got {label!r}", line=line,
                                  field=at + "label")
            if self.labels.setdefault(phrase, label) != label:
                raise FormatError(self.path, f"phrase {phrase!r} has two labels: {self.labels[phrase]!r} and "
                                             f"{label!r}", line=line, field=at + "label")
        self.total += count
        if self.total > MAX_COUNT:
            raise FormatError(self.path, f"the counts add up to {self.total}, beyond 2^63 - 1", line=line,
                              field=at + "count")
        self.counts[phrase] = self.counts.get(phrase, 0) + count
        if query_id is not None:
            self.query_ids.setdefault(phrase, {})[str(query_id)] = None

    def vocab(self, empty_note: str = "") -> PhraseVocab:
        if not self.counts:
            raise FormatError(self.path, "holds no phrases" + empty_note)
        uniq = list(self.counts)
        truth = [self.labels[p] for p in uniq] if self.has_label else None
        qids = [list(self.query_ids.get(p, ())) for p in uniq] if self.query_ids else None
        return PhraseVocab(uniq, [self.counts[p] for p in uniq], truth, str(self.path), query_ids=qids)


def _count(path, value, line, field) -> int:
    """A count: a positive integer below 2^63 (an int, or a string of ASCII digits in a text format)."""
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii() or not text.isdigit():
            raise FormatError(path, f"expected a positive integer count, got {value!r}", line=line, field=field)
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(path, f"expected a positive integer count, got {value!r}", line=line, field=field)
    if not 1 <= value <= MAX_COUNT:
        raise FormatError(path, f"count must lie in [1, 2^63 - 1], got {value}", line=line, field=field)
    return value


def from_file(path: str | os.PathLike) -> PhraseVocab:
    """Read a phrase file (``.txt``, ``.csv``, ``.tsv``, ``.json`` or ``.jsonl``; see the module docstring)."""
    path = check_phrase_path(path)
    suffix = path.suffix.lower()
    text = read_text(path)
    acc = _Counter(path)
    if suffix == ".txt":
        for line, raw in enumerate(text.split("\n"), start=1):
            if raw.strip():
                acc.add(raw, 1, line=line)
        return acc.vocab()
    if suffix in (".csv", ".tsv"):
        _read_table(path, text, acc, "\t" if suffix == ".tsv" else ",")
        return acc.vocab()
    if suffix == ".json":
        return _read_json(path, text, acc)
    return _read_jsonl(path, text, acc)


def _read_table(path: Path, text: str, acc: _Counter, delimiter: str) -> None:
    """``.csv`` / ``.tsv`` rows into ``acc`` (module docstring)."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    header: list[str] | None = None
    col: dict[str, int] = {}
    try:
        for row in reader:
            line = reader.line_num
            if not any(c.strip() for c in row):
                continue
            if header is None:
                header = [c.strip().lower() for c in row]
                if "phrase" not in header or len(set(header)) != len(header):
                    raise FormatError(path, f"expected a header line naming a 'phrase' column (and optional 'count', "
                                            f"'label', 'query_id'), each once; got {row!r}", line=line)
                col = {k: header.index(k) for k in ("phrase", "count", "label", "query_id") if k in header}
                continue
            if len(row) != len(header):
                raise FormatError(path, f"expected {len(header)} columns as in the header, got {len(row)}", line=line)
            qid = row[col["query_id"]].strip() if "query_id" in col else ""
            acc.add(row[col["phrase"]], row[col["count"]] if "count" in col else 1,
                    row[col["label"]] if "label" in col else None, qid or None, line=line)
    except csv.Error as e:
        raise FormatError(path, f"malformed {'TSV' if delimiter == chr(9) else 'CSV'} ({e})",
                          line=reader.line_num) from None


def _read_json(path: Path, text: str, acc: _Counter) -> PhraseVocab:
    """A ``.json`` array of phrase strings or objects into ``acc``."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(path, f"not valid JSON ({e.msg})", line=e.lineno) from None
    if not isinstance(items, list):
        raise FormatError(path, f"expected a JSON array of phrases, got {type(items).__name__}")
    records = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            acc.add(item, 1, at=f"[{i}].")
        elif isinstance(item, dict):
            records.append((None, f"[{i}].", item))
        else:
            raise FormatError(path, f"expected a phrase string or an object, got {type(item).__name__}",
                              field=f"[{i}]")
    n = _add_records(acc, records)
    return acc.vocab(f" ({n} answered queries)" if n is not None else "")


def _read_jsonl(path: Path, text: str, acc: _Counter) -> PhraseVocab:
    """``.jsonl`` lines into ``acc``: phrase objects, or a forecaster's phrase file (module docstring)."""
    n = _add_records(acc, [(line, "", obj) for line, obj in json_lines(path, text)])
    return acc.vocab(f" ({n} answered queries)" if n is not None else "")


def json_lines(path: Path, text: str) -> list[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line of a ``.jsonl`` text; a torn last line (no newline, not
    JSON: a crash mid-append) is dropped when the first line is a phrase-file line (has ``query_id``)."""
    lines = text.split("\n")
    out: list[tuple[int, dict]] = []
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            if out and "query_id" in out[0][1] and i == len(lines):
                break
            raise FormatError(path, f"not valid JSON ({e.msg})", line=i) from None
        if not isinstance(obj, dict):
            raise FormatError(path, f"expected a JSON object, got {type(obj).__name__}", line=i)
        out.append((i, obj))
    return out


def last_answered(path: Path, records: list[tuple[int | None, str, dict]]) -> list[tuple[int | None, str, dict,
                                                                                          PhraseRecord]]:
    """The line kept per query id of a phrase file, as `eval.phrases.read_phrases` keeps it (the last answered
    line, else the last line), in order of first appearance: ``(line, at, object, record)``."""
    last: dict[str, tuple[int | None, str, dict, PhraseRecord]] = {}
    for line, at, obj in records:
        rec = PhraseRecord.from_dict(obj, path=str(path) + (f" {at[:-1]}" if at else ""), line=line)
        prev = last.get(rec.query_id)
        if not (prev is not None and prev[3].ok and not rec.ok):
            last[rec.query_id] = (line, at, obj, rec)
    return list(last.values())


def _add_records(acc: _Counter, records: list[tuple[int | None, str, dict]]) -> int | None:
    """Phrase objects into ``acc``; a forecaster's phrase file (records with ``query_id``) when the first record has
    one. Returns the number of answered queries of a phrase file, else None."""
    if not records or "query_id" not in records[0][2]:
        for line, at, obj in records:
            acc.add(obj.get("phrase"), obj.get("count", 1), obj.get("label"), obj.get("query_id"), line=line, at=at)
        return None
    answered = 0
    for line, at, _, rec in last_answered(acc.path, records):
        if rec.ok:
            answered += 1
            for sample in rec.samples:
                acc.add(sample, 1, query_id=rec.query_id, line=line, at=at)
    return answered


def load_vocab(data: str | None, phrases: str | None) -> PhraseVocab:
    """The vocabulary of a benchmark directory (``data``) or of a phrase file (`from_file`)."""
    if data is not None:
        from eval.benchmark import Benchmark

        if not Path(data).is_dir():
            raise InputError(f"benchmark directory {data} does not exist" if not Path(data).exists()
                             else f"--data {data} is not a directory (a benchmark is a directory)")
        return from_benchmark(Benchmark.load(data))
    return from_file(phrases)


def embed_vocab(vocab: PhraseVocab, model: str, *, batch_size: int = 128, device: str | None = None,
                progress: bool = True, encoder=None, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """``(n, d)`` float32 L2-normalised embeddings of the vocabulary (the encoder's corpus side); ``encoder``: an
    already loaded `retrieval.encoders.TextEncoder` of ``model``.

    ``cache_dir``: read and add the phrases' embeddings in the content-hash store of ``model``'s corpus side there
    (`retrieval.textcache`), so a sweep and the canonicalization at its chosen threshold embed a vocabulary once,
    and a call whose phrases are all stored does not load the model. Not with ``encoder`` (the store is keyed by
    ``model``, which a given encoder need not be)."""
    from retrieval.encoders import TextEncoder

    if cache_dir is None or encoder is not None:
        return (encoder or TextEncoder(model, device=device, batch_size=batch_size)).encode_items(
            vocab.phrases, progress=progress)
    from retrieval.textcache import CachedQueryEncoder

    cached = CachedQueryEncoder({"kind": "semantic", "model": model}, cache_dir, device=device,
                                build=lambda: TextEncoder(model, device=device, batch_size=batch_size))
    return cached.encode_items(vocab.phrases, progress=progress)
