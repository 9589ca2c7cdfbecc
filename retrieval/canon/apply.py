"""``python -m retrieval canon apply``: canonicalize a benchmark's raw state vocabulary at one threshold and write a
re-keyed benchmark (PSR appendix: "every corpus segment and query target is re-keyed to its canonical state; all
retrieval and ground truth are defined at this canonical level").

1. Cluster the corpus's raw phrases (`retrieval.canon.vocab.from_benchmark`) with the greedy rule
   (`retrieval.canon.cluster`); cluster ``c`` becomes canonical state ``c<c:06d>`` whose ``text`` is its seed (its
   most frequent phrase) and whose ``members`` are its phrases, most frequent first.
2. Re-key every segment to the state of its raw phrase (``state``, ``state_id``; ``state_type1`` =
   ``"<subject> <state>"``).
3. Re-key every query target to the state of its target segment: the segment of the same video and object that
   is active at ``target_time`` (the single-prefix protocol; a target state that persists from the prefix is asked
   about at a time inside its segment). A query without such a segment is re-keyed through its
   ``target_state`` text, canonicalized with the same rule against the seeds (`retrieval.canon.cluster.assign`); a
   text that joins no seed becomes a state of its own with no segments (the query is then not ``fair``).
   Transcript entries are re-keyed the same way (the object's segment starting at ``t``, else their text).
   The question, ``anchor_state`` and everything else are kept.
4. Recompute the GT pools of each query from the re-keyed corpus, with the tier definitions of `eval.schema`:
   ``in_video`` / ``in_dataset`` / ``cross_dataset`` by video and domain; ``consensus`` = the main pool's
   segments that were in some consensus pool of the source benchmark (their verification status carries over);
   ``bge_similar`` = other videos' segments whose canonical state is an embedding neighbour of the target's
   (seed cosine >= ``similar_threshold``; default ``threshold - 0.10``: seeds of one clustering are below the
   threshold apart by construction); ``gt_type1`` = other videos' segments with the same subject and state;
   ``fair`` = main pool non-empty.
5. Write the benchmark beside ``out`` and move it into place: the three JSONL files, ``manifest.json`` (name
   ``<name>+canon<T>``, counts, ``extra.canonicalization``), ``phrase_map.jsonl`` (raw phrase -> state, count,
   similarity to the seed), ``canon_config.json`` (the resolved config), and links to the source's ``frames/``,
   ``sim/`` and visual and prefix feature spaces (segment and prefix ids are unchanged). Semantic spaces embed the old
   states and are not carried over: encode the new states with ``python -m retrieval encode``.

Every decision above that compares cosines (clustering, texts joining a seed, ``bge_similar`` neighbours, the mining
order) is made on float64 embeddings rounded to a grid (`retrieval.canon.grid`), so the same source and settings
build the same benchmark on every machine (``python -m eval card`` prints its build fingerprint).

With ``mine_budget`` / ``verify`` (the synthetic benchmark's construction, `retrieval.canon.mining`), step 4's
tiers are then mined within a budget and verified against the simulator truth; queries carry ``gt_sim_exact``
wherever segments carry ``sim_state``; a question that names its answer (a member phrasing of the target state as a
whole-word substring, e.g. a Q4 anchor that canonicalizes to the target) is dropped and counted.

The output passes ``python -m eval validate``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from eval.benchmark import Benchmark
from eval.errors import InputError, UnknownName
from eval.features import list_spaces, read_meta
from eval.io import write_json, write_jsonl
from eval.outputs import link_dependencies, register_dependent
from eval.schema import GT_TIERS
from eval.segments import SegmentTimeline
from retrieval.canon._files import check_out_dir, staged_dir
from retrieval.canon.cluster import Clustering, assign, greedy_cluster, similar_pairs, unit_rows, visit_order
from retrieval.canon.grid import CACHE_NAME, GRID_BITS, cached_grid_embeddings, grid_embeddings, store_grid_embeddings
from retrieval.canon.metrics import partition_scores, vocabulary_stats
from retrieval.canon.mining import Judge, Verifier, canonicalization_errors, mine_verified, sim_exact_pools
from retrieval.canon.vocab import PhraseVocab, from_benchmark, segment_phrases
from retrieval.textcache import default_cache_dir


@dataclass
class ApplyConfig:
    """Resolved config of one ``canon apply`` job (written to ``canon_config.json``)."""

    data: str
    out: str
    threshold: float = 0.85
    model: str = "BAAI/bge-small-en-v1.5"
    similar_threshold: float | None = None
    batch_size: int = 128
    device: str | None = None
    copy: bool = False  # copy frames / visual features instead of linking them
    #: GT mining budget per tier (None: every segment of the state, as the tiers' definitions); see `mining`
    mine_budget: int | None = None
    #: emulate the verification of mined candidates (needs ``sim_state`` and ``sim/phrases.jsonl``; see `mining`)
    verify: bool = False
    verify_tpr: float = 0.95
    verify_fpr: float = 0.25
    verify_seed: int = 0
    #: name of the output benchmark (default ``<source name>+canon<threshold>``)
    name: str | None = None
    ties: str = "first"  # count ties of the visiting order: `retrieval.canon.cluster.visit_order`
    overwrite: bool = False  # replace an --out that is not an earlier apply output (eval.outputs)

    def resolved_similar(self) -> float:
        return self.threshold - 0.10 if self.similar_threshold is None else self.similar_threshold


@dataclass
class Canonical:
    """Canonical states from a clustering: ``texts[c]``, ``members[c]`` (phrases, visiting order), ``grid`` the
    seed embeddings ``(n_states, d)`` on the similarity grid, and ``phrase_state`` (vocab row -> state)."""

    texts: list[str]
    members: list[list[str]]
    grid: np.ndarray
    phrase_state: np.ndarray

    @property
    def ids(self) -> list[str]:
        return [f"c{c:06d}" for c in range(len(self.texts))]

    def add_state(self, text: str, vec: np.ndarray) -> int:
        """Append a state with no raw phrase (a target text that joined no seed); returns its index."""
        self.texts.append(text)
        self.members.append([text])
        self.grid = np.vstack([self.grid, unit_rows(vec[None])])
        return len(self.texts) - 1


def canonical_states(vocab: PhraseVocab, emb: np.ndarray, cl: Clustering) -> Canonical:
    grid = unit_rows(emb)
    members = [[vocab.phrases[i] for i in rows] for rows in cl.members()]
    return Canonical([m[0] for m in members], members, grid[cl.seeds], cl.labels.copy())


def _phrase_rows(vocab: PhraseVocab, phrases: list[str]) -> np.ndarray:
    """Vocabulary row of each phrase (vectorised lookup; every phrase must be in the vocabulary)."""
    voc = np.asarray(vocab.phrases, dtype=object)
    srt = np.argsort(voc)
    q = np.asarray(phrases, dtype=object)
    pos = np.searchsorted(voc[srt], q)
    pos = np.minimum(pos, len(voc) - 1)
    rows = srt[pos]
    if len(q) and not (voc[rows] == q).all():
        bad = q[voc[rows] != q][0]
        raise UnknownName(f"phrase {bad!r} is not in the vocabulary")
    return rows


class _TextCanonicalizer:
    """Canonical state of free texts (targets, transcript entries): the state of a known raw phrase, else the
    clustering rule against the seeds, else a new state. Texts are embedded once, in batches."""

    def __init__(self, vocab: PhraseVocab, canon: Canonical, encoder, threshold: float):
        self.vocab_index, self.canon, self.encoder, self.threshold = vocab.index, canon, encoder, threshold
        self.cache: dict[str, int] = {}
        self.by_rule = self.new_states = 0

    def resolve(self, texts) -> None:
        todo = sorted({t for t in texts if t not in self.cache})
        known = [t for t in todo if t in self.vocab_index]
        for t in known:
            self.cache[t] = int(self.canon.phrase_state[self.vocab_index[t]])
        rest = [t for t in todo if t not in self.vocab_index]
        if not rest:
            return
        emb = grid_embeddings(self.encoder, rest)
        idx, _ = assign(emb, self.canon.grid, self.threshold)
        for t, i, e in zip(rest, idx, emb, strict=True):
            if i >= 0:
                self.cache[t] = int(i)
                self.by_rule += 1
            else:
                self.cache[t] = self.canon.add_state(t, e)
                self.new_states += 1

    def __getitem__(self, text: str) -> int:
        return self.cache[text]


def _lookup_segments(corpus: pd.DataFrame, video, obj, t) -> np.ndarray:
    """Corpus row of the segment of this (video, object) that is active at time ``t`` (`eval.segments`), -1 when
    none."""
    timeline = SegmentTimeline(corpus["video_id"], corpus["object_id"], corpus["start"], corpus["end"])
    return timeline.active_rows(list(video), list(obj), list(t))


@dataclass
class _Groups:
    """Corpus rows grouped by a key (CSR): rows of key k are ``rows[off[k]:off[k+1]]``, ascending."""

    rows: np.ndarray
    off: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, n_keys: int) -> _Groups:
        order = np.argsort(keys, kind="stable")
        off = np.zeros(n_keys + 1, np.int64)
        np.cumsum(np.bincount(keys, minlength=n_keys), out=off[1:])
        return cls(order.astype(np.int64), off)

    def get(self, k: int) -> np.ndarray:
        return self.rows[self.off[k]:self.off[k + 1]]


def mine_pools(*args, **kw) -> list[dict]:
    """`iter_pools` as a list."""
    return list(iter_pools(*args, **kw))


def iter_pools(seg_state: np.ndarray, seg_video: np.ndarray, seg_domain: np.ndarray, seg_type1: np.ndarray,
               clear: np.ndarray, neighbours: list[np.ndarray], n_states: int, n_type1: int,
               q_state: np.ndarray, q_video: np.ndarray, q_domain: np.ndarray, q_type1: np.ndarray) -> Iterator[dict]:
    """GT pools (corpus rows) per query, in query order, from integer-coded corpus and query arrays (see the module
    docstring, 4). A generator: budgeted mining consumes one query's full pools at a time, so the full pools of every
    query (thousands of rows each when canonical states are coarse) are never held at once."""
    by_state, by_type1 = _Groups.of(seg_state, n_states), _Groups.of(seg_type1, n_type1)
    for s, v, d, t1 in zip(q_state, q_video, q_domain, q_type1, strict=True):  # per query: numpy over its groups
        same = by_state.get(s)
        sv, sd = seg_video[same], seg_domain[same]
        in_video, in_dataset, cross = same[sv == v], same[(sv != v) & (sd == d)], same[sd != d]
        main = np.sort(np.concatenate([in_dataset, cross]))
        near = [by_state.get(n) for n in neighbours[s]]
        near = np.sort(np.concatenate(near)) if near else np.zeros(0, np.int64)
        near = near[seg_video[near] != v]
        t1rows = by_type1.get(t1) if t1 >= 0 else np.zeros(0, np.int64)
        yield {"in_video": in_video, "in_dataset": in_dataset, "cross_dataset": cross, "bge_similar": near,
               "consensus": main[clear[main]], "gt_type1": t1rows[seg_video[t1rows] != v]}


def _codes(values) -> tuple[np.ndarray, list]:
    uniq, inv = np.unique(np.asarray(values, dtype=object), return_inverse=True)
    return inv.astype(np.int64), list(uniq)


def rekey(bench: Benchmark, vocab: PhraseVocab, canon: Canonical, encoder, cfg: ApplyConfig,
          emb: np.ndarray | None = None) -> dict:
    """Re-key corpus, queries and transcripts; returns ``{"segments", "queries", "states", "stats"}`` as JSON rows.
    ``emb``: the vocabulary's embeddings (needed for budgeted mining)."""
    cds, qds = bench.corpus_ds, bench.queries_ds
    corpus = pd.DataFrame({c: cds[c][:] for c in ("video_id", "object_id", "start", "end", "domain", "subject")})
    corpus["_row"] = np.arange(len(corpus))
    seg_phrase = _phrase_rows(vocab, segment_phrases(cds["raw"][:], cds["state"][:]))
    seg_state = canon.phrase_state[seg_phrase]
    texts = _TextCanonicalizer(vocab, canon, encoder, cfg.threshold)
    # query targets: their target segment, else their text
    target_row = _lookup_segments(corpus, qds["video_id"][:], qds["object_id"][:], qds["target_time"][:])
    q_text = qds["target_state"][:]
    texts.resolve([q_text[i] for i in np.flatnonzero(target_row < 0)])
    q_state = np.array([seg_state[r] if r >= 0 else texts[t] for r, t in zip(target_row, q_text, strict=True)],
                       np.int64)
    # transcripts: the object's segment starting at t, else the entry's text
    transcripts = qds["transcript"][:]
    flat = [(i, e["t"], e["state"]) for i, tr in enumerate(transcripts) for e in tr]
    q_video, q_obj = qds["video_id"][:], qds["object_id"][:]
    tr_rows = _lookup_segments(corpus, [q_video[i] for i, _, _ in flat], [q_obj[i] for i, _, _ in flat],
                               [t for _, t, _ in flat]) if flat else np.zeros(0, np.int64)
    texts.resolve([s for (_, _, s), r in zip(flat, tr_rows, strict=True) if r < 0])
    n_states = len(canon.texts)
    # integer codes for mining
    vid_codes, vids = _codes(list(corpus["video_id"]) + list(q_video))
    dom_codes, _ = _codes(list(corpus["domain"]) + list(qds["domain"][:]))
    nc = len(corpus)
    subj = list(corpus["subject"]) + list(qds["subject"][:])
    t1_codes, _ = _codes([f"{s}\x00{st}" for s, st in zip(subj, np.concatenate([seg_state, q_state]), strict=True)])
    clear = np.zeros(nc, bool)  # segments verified in the source (in some consensus pool)
    # read in Arrow: a simulator-truth build's pools hold every same-state segment (GBs as Python lists at PSR scale)
    verified = pc.list_flatten(pc.struct_field(qds.data.column("gt_pools"), "consensus"))
    if len(verified):
        rows = pd.Index(bench.corpus_ids).get_indexer(np.unique(verified.to_numpy(zero_copy_only=False)))
        clear[rows[rows >= 0]] = True
    i, j = similar_pairs(canon.grid, cfg.resolved_similar()) if n_states > 1 else (np.zeros(0, int), np.zeros(0, int))
    neighbours = np.split(j, np.searchsorted(i, np.arange(1, n_states)))
    pools = iter_pools(seg_state, vid_codes[:nc], dom_codes[:nc], t1_codes[:nc], clear, neighbours, n_states,
                       int(t1_codes.max()) + 1 if len(t1_codes) else 0, q_state, vid_codes[nc:], dom_codes[nc:],
                       t1_codes[nc:])
    sim = _sim_codes(cds)
    extra_stats: dict = {}
    if cfg.mine_budget is None and not cfg.verify:
        pools = list(pools)
    else:
        if emb is None:
            raise InputError("budgeted mining needs the vocabulary's embeddings")
        judge = None
        if cfg.verify:
            judge, clear = _judge(bench, canon, sim, corpus)
        pools, extra_stats["mining"] = mine_verified(
            pools, target_row, seg_state, emb[seg_phrase], clear, cfg.mine_budget, judge,
            Verifier(cfg.verify_tpr, cfg.verify_fpr, cfg.verify_seed))
        extra_stats["mining"].update(budget=cfg.mine_budget, verify=cfg.verify, tpr=cfg.verify_tpr,
                                     fpr=cfg.verify_fpr, seed=cfg.verify_seed)
    if sim is not None:
        exact = sim_exact_pools(sim[0], vid_codes[:nc], target_row)
        for p, e in zip(pools, exact, strict=True):
            p["gt_sim_exact"] = e
        extra_stats["canonicalization_errors"] = canonicalization_errors(seg_state, sim[0])
    ids = np.asarray(bench.corpus_ids, dtype=object)
    state_ids = canon.ids
    # rows
    segments = []
    for r, row in enumerate(cds):
        s = int(seg_state[r])
        row.update(state=canon.texts[s], state_id=state_ids[s], state_type1=f"{row['subject']} {canon.texts[s]}")
        segments.append(row)
    queries, dropped = [], []
    tr_iter = iter(zip(flat, tr_rows, strict=True))
    # the source's pools are replaced below: iterate without them (each would be parsed into Python lists)
    for qi, row in enumerate(qds.remove_columns([c for c in ("gt_pools", "gt_type1", "gt_sim_exact")
                                                 if c in qds.column_names])):
        s = int(q_state[qi])
        p = pools[qi]
        new_tr = []
        for _ in row["transcript"]:
            (_, t, text), r = next(tr_iter)
            new_tr.append({"t": t, "state": canon.texts[int(seg_state[r]) if r >= 0 else texts[text]]})
        row.update(target_state=canon.texts[s], target_state_id=state_ids[s],
                   target_state_type1=f"{row['subject']} {canon.texts[s]}", transcript=new_tr,
                   gt_pools={t: list(ids[p[t]]) for t in GT_TIERS}, gt_type1=list(ids[p["gt_type1"]]),
                   fair=bool(len(p["in_dataset"]) + len(p["cross_dataset"])))
        if "gt_sim_exact" in p:
            row["gt_sim_exact"] = list(ids[p["gt_sim_exact"]])
        if names_answer(row["question"], canon.members[s]):
            dropped.append(row["id"])
            continue
        queries.append(row)
    n_seg = np.bincount(seg_state, minlength=n_states)
    states = [{"id": state_ids[c], "text": canon.texts[c], "members": canon.members[c], "n_segments": int(n_seg[c])}
              for c in range(n_states)]
    stats = {"targets_by_segment": int((target_row >= 0).sum()), "targets_by_text": int((target_row < 0).sum()),
             "texts_by_rule": texts.by_rule, "new_states_from_texts": texts.new_states,
             "transcript_by_segment": int((tr_rows >= 0).sum()), "transcript_by_text": int((tr_rows < 0).sum()),
             "fair_queries": int(sum(q["fair"] for q in queries)), "videos": len(set(vids)),
             "dropped_naming_answer": len(dropped), **extra_stats}
    return {"segments": segments, "queries": queries, "states": states, "stats": stats}


def names_answer(question: str, members) -> bool:
    """True when the question contains a member phrasing of its answer state as a whole-word substring."""
    q = f" {' '.join(question.lower().replace('?', ' ').replace(',', ' ').replace('.', ' ').split())} "
    return any(f" {m.lower()} " in q for m in members if m)


def _sim_codes(cds) -> tuple[np.ndarray, list[str]] | None:
    """Integer codes of the segments' ``sim_state`` (None when the benchmark has none)."""
    if "sim_state" not in cds.column_names:
        return None
    keys = cds["sim_state"][:]
    if not keys or any(k is None for k in keys):
        return None
    uniq, inv = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
    return inv.astype(np.int64), list(uniq)


def _judge(bench: Benchmark, canon: Canonical, sim, corpus: pd.DataFrame) -> tuple[Judge, np.ndarray]:
    """The verification emulation's judge (true states + the canonical seeds' denotations) and the segments clear
    enough for the consensus pool (at least `eval.synth.video.CONSENSUS_MIN_DURATION_S` long)."""
    from eval.synth.build import read_denotations
    from eval.synth.video import CONSENSUS_MIN_DURATION_S

    if sim is None:
        raise InputError(f"{bench.root}: --verify needs segments with sim_state (a synthetic build)")
    try:
        den = read_denotations(bench.root)
    except FileNotFoundError:
        raise InputError(f"{bench.root}: --verify needs sim/phrases.jsonl (a synthetic build)") from None
    codes, keys = sim
    judge = Judge([keys[c] for c in codes], [den.get(t) for t in canon.texts])
    clear = (corpus["end"].to_numpy() - corpus["start"].to_numpy()) >= CONSENSUS_MIN_DURATION_S
    return judge, clear


def _link_or_copy(src: Path, dst: Path, copy: bool) -> None:
    if copy:
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    else:
        os.symlink(src.resolve(), dst, target_is_directory=src.is_dir())


def apply_canonicalization(cfg: ApplyConfig, *, progress: bool = True, log=print, encoder=None) -> Path:
    """Run the job of the module docstring; returns the output directory. ``encoder``: an already loaded text
    encoder of ``cfg.model`` (else it is loaded)."""
    from retrieval.encoders import TextEncoder

    src = Path(cfg.data)
    check_out_dir(cfg.out, "apply", inputs=[src], overwrite=cfg.overwrite)  # never the source benchmark
    bench = Benchmark.load(src)
    vocab = from_benchmark(bench)
    encoder = encoder or TextEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size)
    log(f"{len(vocab):,} raw phrases ({int(vocab.counts.sum()):,} segments); embedding with {cfg.model}")
    # machine-independent decisions; kept in the source's cache and the output's, so that canonicalizing either
    # again with the same model (at any threshold) does not embed its phrases again
    emb, grid_key = cached_grid_embeddings(encoder, vocab.phrases, cfg.model,
                                            default_cache_dir(src, CACHE_NAME), progress=progress)
    cl = greedy_cluster(emb, cfg.threshold, visit_order(vocab.counts, vocab.phrases, cfg.ties), progress=progress)
    canon = canonical_states(vocab, emb, cl)
    log(f"threshold {cfg.threshold:g}: {cl.n_clusters:,} canonical states (source benchmark: {len(bench.state_ids):,})")
    out = rekey(bench, vocab, canon, encoder, cfg, emb)
    m = bench.manifest
    # spaces of the frames and of the prefixes stay valid (segment and prefix ids are unchanged); semantic ones do not
    visual = [s for s in list_spaces(src) if read_meta(src, s).get("kind") in ("visual", "prefix")]
    dropped = [s for s in list_spaces(src) if s not in visual]
    canon_info = {"source": str(src.resolve()), "source_name": m.name, "threshold": cfg.threshold, "model": cfg.model,
                  "similar_threshold": cfg.resolved_similar(), "raw_phrases": len(vocab),
                  "canonical_states": len(out["states"]), "source_states": len(bench.state_ids),
                  "vocabulary": vocabulary_stats(cl.labels), "dropped_spaces": dropped,
                  "embedding": {"precision": "float64", "grid": f"2^-{GRID_BITS}"}, **out["stats"]}
    if vocab.truth is not None:
        canon_info["agreement_with_source_states"] = partition_scores(cl.labels, vocab.truth)
    manifest = m.to_dict()
    manifest.update(name=cfg.name or f"{m.name}+canon{cfg.threshold:g}",
                    counts={**m.counts, "queries": len(out["queries"]), "corpus": len(out["segments"]),
                            "states": len(out["states"]), "fair_queries": out["stats"]["fair_queries"]},
                    spaces={k: v for k, v in m.spaces.items() if k in visual},
                    extra={**m.extra, "canonicalization": canon_info})
    phrase_map = [{"phrase": p, "count": int(c), "state_id": canon.ids[int(s)], "similarity": float(sim)}
                  for p, c, s, sim in zip(vocab.phrases, vocab.counts, cl.labels, cl.seed_sim, strict=True)]
    with staged_dir(cfg.out, "apply", inputs=[src], overwrite=cfg.overwrite) as d:
        write_jsonl(d / "corpus.jsonl", out["segments"])
        write_jsonl(d / "queries.jsonl", out["queries"])
        write_jsonl(d / "states.jsonl", out["states"])
        write_jsonl(d / "phrase_map.jsonl", phrase_map)
        for name in ("frames", "sim"):
            if (src / name).exists():
                _link_or_copy(src / name, d / name, cfg.copy)
        for s in visual:
            (d / "features").mkdir(exist_ok=True)
            _link_or_copy(src / "features" / s, d / "features" / s, cfg.copy)
        write_json(d / "canon_config.json", asdict(cfg))
        store_grid_embeddings(emb, d / ".cache" / CACHE_NAME, grid_key)
        manifest["dependencies"] = link_dependencies(d)  # where the links land: loaders check it is unchanged
        write_json(d / "manifest.json", manifest)
    for dep in manifest["dependencies"]:  # so that a command about to replace the source knows what it would break
        if not register_dependent(dep["path"], cfg.out):
            log(f"warning: {dep['path']} is read-only: could not record that {cfg.out} links into it")
    log(f"re-keyed {len(out['segments']):,} segments and {len(out['queries']):,} queries "
        f"({out['stats']['fair_queries']:,} fair) -> {cfg.out}")
    return Path(cfg.out)

