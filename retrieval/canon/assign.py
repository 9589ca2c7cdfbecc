"""``python -m retrieval canon assign`` and ``python -m retrieval canon apply --phrases``: a user's phrases against a
saved clustering (`retrieval.canon.store`, written by ``canon cluster``).

Each phrase is resolved (`resolve_phrases`) with the clustering's model and threshold:

- ``member``: a phrase of the clustering keeps its state and similarity;
- every other phrase is embedded (corpus side, as the clustering's phrases were) and visited most frequent first
  (count ties by ``ties``) after the clustering's phrases, with the same greedy rule
  (`retrieval.canon.cluster.extend_clustering`): it joins the most similar seed at cosine ``>= threshold``
  (``joined``), the seeds being the clustering's and those founded earlier in this pass; a phrase that joins none
  founds a new state (``new``: ids continue the clustering's numbering, its text is the phrase). With
  ``new_states=False`` the seeds are the clustering's only and such a phrase has no state (``none``).

``canon assign`` writes one JSON row per phrase of its input (`retrieval.canon.vocab.from_file`, input order):
``phrase``, ``count``, ``state_id`` (null for ``none``), ``seed`` (the state's text), ``similarity`` (float64 cosine
to the seed), ``status`` and, for a forecaster's phrase file, ``query_ids``.

``canon apply --phrases`` re-keys a forecaster's phrase file (`eval.phrases`), one line per query id (the line
`eval.phrases.read_phrases` keeps): on answered lines ``phrase`` and ``phrases`` become the texts of their canonical
states (a ``none`` phrase keeps its text) and a ``canon`` object records the clustering, its threshold and, per
phrase, the original text, ``state_id``, ``similarity`` and ``status``; every other field, and failed lines, are
copied unchanged. The result is a phrase file that ``python -m retrieval search --phrases`` reads.

Outputs are single ``.jsonl`` files written atomically; an existing file is replaced only with ``overwrite``, and
never when it is one of the job's inputs.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError, OutputRefused
from eval.io import read_text, write_jsonl
from retrieval.canon.cluster import TIES, assign, extend_clustering, visit_order
from retrieval.canon.store import SavedClustering, state_id
from retrieval.canon.vocab import check_phrase_path, from_file, json_lines, last_answered

STATUSES = ("member", "joined", "new", "none")


@dataclass
class Resolved:
    """Resolution of ``n`` phrases against a clustering of ``n_fixed`` states (module docstring).

    ``state`` ``(n,)`` int64 (state number; -1 for ``none``), ``similarity`` ``(n,)`` float64 (NaN for ``none``),
    ``status`` (one of `STATUSES` per phrase), ``texts`` (text of every state, the clustering's then the new ones)."""

    phrases: list[str]
    state: np.ndarray
    similarity: np.ndarray
    status: list[str]
    texts: list[str]

    def row(self, i: int) -> dict:
        """``state_id``, ``seed``, ``similarity``, ``status`` of phrase ``i`` (JSON-ready)."""
        s = int(self.state[i])
        none = s < 0
        return {"state_id": None if none else state_id(s), "seed": None if none else self.texts[s],
                "similarity": None if none else float(self.similarity[i]), "status": self.status[i]}

    def text(self, i: int) -> str:
        """The canonical text of phrase ``i`` (its own text when it has no state)."""
        s = int(self.state[i])
        return self.phrases[i] if s < 0 else self.texts[s]


def resolve_phrases(saved: SavedClustering, phrases: list[str], counts, encoder, *, ties: str = "first",
                    new_states: bool = True) -> Resolved:
    """Resolve unique ``phrases`` (with their ``counts``) against ``saved``; ``encoder``: a text encoder of the
    clustering's model, or a callable returning one (called only when some phrase is not a member)."""
    if ties not in TIES:
        raise InputError(f"--ties must be one of {', '.join(TIES)}, got {ties!r}")
    n = len(phrases)
    state, sim = np.full(n, -1, np.int64), np.full(n, np.nan)
    status = ["none"] * n
    rest = []
    for i, p in enumerate(phrases):
        if p in saved.phrase_state:
            state[i], sim[i], status[i] = saved.phrase_state[p], saved.phrase_sim[p], "member"
        else:
            rest.append(i)
    texts = list(saved.texts)
    if not rest:
        return Resolved(list(phrases), state, sim, status, texts)
    enc = encoder() if callable(encoder) and not hasattr(encoder, "encode_items") else encoder
    emb = enc.encode_items([phrases[i] for i in rest])
    if emb.shape[1] != saved.seeds.shape[1]:
        raise InputError(f"the model gives {emb.shape[1]}-d embeddings but the clustering {saved.root} has "
                         f"{saved.seeds.shape[1]}-d seeds (made with {saved.model})",
                         fix="use the clustering's model (the default)")
    rest_arr = np.asarray(rest, np.int64)
    order = visit_order(np.asarray(counts, np.int64)[rest_arr], [phrases[i] for i in rest], ties)
    if new_states:
        ext = extend_clustering(saved.seeds, emb, saved.threshold, order)
        state[rest_arr], sim[rest_arr] = ext.labels, ext.seed_sim
        founders = set(ext.new_seeds.tolist())
        for r, j in enumerate(rest):
            status[j] = "new" if r in founders else "joined"
        texts += [phrases[rest[j]] for j in ext.new_seeds]
    else:
        idx, s = assign(emb, saved.seeds, saved.threshold)
        state[rest_arr], sim[rest_arr] = idx, s
        for j, lab in zip(rest, idx, strict=True):
            status[j] = "joined" if lab >= 0 else "none"
    return Resolved(list(phrases), state, sim, status, texts)


@dataclass
class AssignConfig:
    """One ``canon assign`` (``phrases``: a phrase file of any `retrieval.canon.vocab` format) or phrase-file
    ``canon apply`` job (``phrases``: a forecaster's phrase file); ``model`` defaults to the clustering's."""

    clustering: str
    phrases: str
    out: str
    model: str | None = None
    ties: str = "first"
    new_states: bool = True
    overwrite: bool = False
    batch_size: int = 128
    device: str | None = None


def check_out_file(out: str | os.PathLike, inputs: list[str | os.PathLike], overwrite: bool) -> Path:
    """``out`` (a ``.jsonl`` path) when the job may write it: not an input, and new unless ``overwrite``."""
    out = Path(out)
    if out.suffix.lower() != ".jsonl":
        raise InputError(f"--out {out}: expected a .jsonl file name")
    for i in inputs:
        if out.resolve() == Path(i).resolve() or Path(i).resolve() in out.resolve().parents:
            raise OutputRefused(f"--out {out} is an input of this job ({i}); refusing to replace it")
    if out.is_dir():
        raise OutputRefused(f"--out {out} is a directory; expected a .jsonl file name")
    if out.exists() and not overwrite:
        raise OutputRefused(f"--out {out} exists", fix="pass --overwrite to replace it, or choose another --out")
    return out


def _encoder_factory(cfg: AssignConfig, saved: SavedClustering, encoder):
    if encoder is not None:
        return encoder

    def load():
        from retrieval.encoders import TextEncoder

        return TextEncoder(cfg.model or saved.model, device=cfg.device, batch_size=cfg.batch_size)

    return load


def run_assign(cfg: AssignConfig, *, log=print, encoder=None) -> dict[str, int]:
    """``canon assign``: resolve the phrases of ``cfg.phrases`` and write one row per phrase to ``cfg.out``; returns
    the number of phrases per status."""
    saved = SavedClustering.load(cfg.clustering)
    out = check_out_file(cfg.out, [cfg.phrases, cfg.clustering], cfg.overwrite)
    vocab = from_file(cfg.phrases)
    res = resolve_phrases(saved, vocab.phrases, vocab.counts, _encoder_factory(cfg, saved, encoder), ties=cfg.ties,
                          new_states=cfg.new_states)
    rows = []
    for i, p in enumerate(vocab.phrases):
        row = {"phrase": p, "count": int(vocab.counts[i]), **res.row(i)}
        if vocab.query_ids is not None:
            row["query_ids"] = vocab.query_ids[i]
        rows.append(row)
    write_jsonl(out, rows)
    tally = {s: res.status.count(s) for s in STATUSES}
    log(f"{len(rows):,} phrases against {saved.root} (threshold {saved.threshold:g}): "
        + ", ".join(f"{v:,} {k}" for k, v in tally.items()) + f" -> {out}")
    return tally


def apply_phrase_file(cfg: AssignConfig, *, log=print, encoder=None) -> dict[str, int]:
    """``canon apply --phrases``: re-key a forecaster's phrase file (module docstring); returns the number of
    phrases per status."""
    saved = SavedClustering.load(cfg.clustering)
    path = check_phrase_path(cfg.phrases)
    out = check_out_file(cfg.out, [cfg.phrases, cfg.clustering], cfg.overwrite)
    records = json_lines(path, read_text(path)) if path.suffix.lower() == ".jsonl" else []
    if not records or "query_id" not in records[0][1]:
        raise InputError(f"{path} is not a forecaster's phrase file (JSONL lines with query_id)",
                         fix="re-key other phrase lists with `retrieval canon assign`")
    kept = last_answered(path, [(line, "", obj) for line, obj in records])
    counts: Counter = Counter()
    for _, _, obj, rec in kept:
        if rec.ok:
            counts.update(_texts(obj))
    uniq = list(counts)
    res = resolve_phrases(saved, uniq, [counts[p] for p in uniq], _encoder_factory(cfg, saved, encoder),
                          ties=cfg.ties, new_states=cfg.new_states)
    index = {p: i for i, p in enumerate(uniq)}
    rows = [_rekey(obj, rec.ok, res, index, saved) for _, _, obj, rec in kept]
    write_jsonl(out, rows)
    tally = {s: res.status.count(s) for s in STATUSES}
    log(f"re-keyed {sum(rec.ok for *_, rec in kept):,} answered of {len(kept):,} queries ({len(uniq):,} phrases: "
        + ", ".join(f"{v:,} {k}" for k, v in tally.items()) + f") -> {out}")
    return tally


def _texts(obj: dict) -> list[str]:
    """The stripped phrase texts of an answered line: ``phrase`` and each of ``phrases`` (non-empty strings)."""
    xs = [obj.get("phrase")] + list(obj.get("phrases") or [])
    return [x.strip() for x in xs if isinstance(x, str) and x.strip()]


def _rekey(obj: dict, ok: bool, res: Resolved, index: dict[str, int], saved: SavedClustering) -> dict:
    """One phrase-file line re-keyed (module docstring); unanswered lines unchanged."""
    if not ok:
        return obj

    def one(x):
        if not isinstance(x, str) or not x.strip():
            return x, None
        i = index[x.strip()]
        return res.text(i), {"text": x, **res.row(i)}

    new = dict(obj)
    canon = {"clustering": str(saved.root), "threshold": saved.threshold}
    new["phrase"], canon["phrase"] = one(obj.get("phrase"))
    if obj.get("phrases"):
        pairs = [one(x) for x in obj["phrases"]]
        new["phrases"], canon["phrases"] = [p[0] for p in pairs], [p[1] for p in pairs]
    new["canon"] = canon
    return new
