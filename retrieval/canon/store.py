"""``python -m retrieval canon cluster``: one canonicalization of a user's phrases, saved so that new phrases and
phrase files can be re-keyed to it later (`retrieval.canon.assign`).

The phrases (a phrase file or a benchmark's raw descriptions, `retrieval.canon.vocab`) are embedded once with a
sentence-transformers model (corpus side) and clustered at one threshold with the greedy rule
(`retrieval.canon.cluster`: most frequent first, count ties by ``ties``). Output directory::

    clustering.json   threshold, model, ties, source, numbers of phrases / occurrences / states, dimension
    states.jsonl      one canonical state a line: id (c<number>), text (its seed), phrases and counts (visiting
                      order, seed first), count (total)
    phrases.jsonl     one phrase a line, input order: phrase, count, state_id, seed (the state's text), similarity
                      (float64 cosine to the seed), query_ids (phrase files), label (when the input has true labels)
    seeds.npy         (n_states, d) float32: the seeds' unit embeddings, the exact vectors new phrases are compared to
    config.json       the resolved config
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import FormatError, read_json, read_jsonl, write_json, write_jsonl
from retrieval.canon._files import check_out_dir, staged_dir
from retrieval.canon.cluster import TIES, Clustering, greedy_cluster, unit_rows, visit_order
from retrieval.canon.metrics import vocabulary_stats
from retrieval.canon.vocab import PhraseVocab, embed_vocab, load_vocab
from retrieval.textcache import default_cache_dir

CLUSTERING_KIND = "cluster"


def state_id(c: int) -> str:
    """The id of canonical state (cluster) number ``c``."""
    return f"c{c:06d}"


def clusters_rows(vocab: PhraseVocab, cl: Clustering) -> list[dict]:
    """One JSON row per canonical state: ``id``, ``text`` (the seed phrase), ``phrases`` and their ``counts``
    (visiting order, seed first), ``count`` (total)."""
    rows = []
    for c, rows_c in enumerate(cl.members()):
        ph = [vocab.phrases[i] for i in rows_c]
        cnt = [int(vocab.counts[i]) for i in rows_c]
        rows.append({"id": state_id(c), "text": ph[0], "phrases": ph, "counts": cnt, "count": int(sum(cnt))})
    return rows


def phrase_rows(vocab: PhraseVocab, cl: Clustering) -> list[dict]:
    """One JSON row per phrase, input order: ``phrase``, ``count``, ``state_id``, ``seed`` (the seed phrase of its
    state), ``similarity`` (to the seed), ``query_ids`` (when the source has them), ``label`` (when known)."""
    rows = []
    for i, (p, c, lab, sim) in enumerate(zip(vocab.phrases, vocab.counts, cl.labels, cl.seed_sim, strict=True)):
        row = {"phrase": p, "count": int(c), "state_id": state_id(int(lab)),
               "seed": vocab.phrases[int(cl.seeds[lab])], "similarity": float(sim)}
        if vocab.query_ids is not None:
            row["query_ids"] = vocab.query_ids[i]
        if vocab.truth is not None:
            row["label"] = vocab.truth[i]
        rows.append(row)
    return rows


@dataclass
class ClusterConfig:
    """One ``canon cluster`` job: ``data`` (benchmark dir) or ``phrases`` (phrase file), threshold, model, tie rule."""

    out: str
    data: str | None = None
    phrases: str | None = None
    threshold: float = 0.85
    model: str = "BAAI/bge-small-en-v1.5"
    ties: str = "first"
    batch_size: int = 128
    device: str | None = None
    overwrite: bool = False  # replace an --out that is not an earlier clustering (eval.outputs)

    def check(self) -> None:
        if (self.data is None) == (self.phrases is None):
            raise InputError("give exactly one of --data (a benchmark directory) or --phrases (a phrase file)")
        if not -1.0 <= float(self.threshold) <= 1.0:
            raise InputError(f"--threshold must lie in [-1, 1] (a cosine), got {self.threshold}")
        if self.ties not in TIES:
            raise InputError(f"--ties must be one of {', '.join(TIES)}, got {self.ties!r}")


@dataclass
class SavedClustering:
    """A `canon cluster` directory read back: ``texts[c]`` / ``ids[c]`` of each state, ``seeds`` ``(n_states, d)``
    float32 unit rows, and the clustering's own phrases (``phrase_state``: phrase -> state number,
    ``phrase_sim``: phrase -> similarity to its seed)."""

    root: Path
    threshold: float
    model: str
    ties: str
    texts: list[str]
    seeds: np.ndarray
    phrase_state: dict[str, int]
    phrase_sim: dict[str, float]

    @property
    def ids(self) -> list[str]:
        return [state_id(c) for c in range(len(self.texts))]

    @classmethod
    def load(cls, root: str | Path) -> SavedClustering:
        """Read ``root``; `InputError` / `FormatError` when it is not a complete ``canon cluster`` directory."""
        root = Path(root)
        if not root.is_dir():
            raise InputError(f"clustering {root} is not a directory", fix="pass a directory written by `retrieval "
                                                                          "canon cluster`")
        missing = [f for f in ("clustering.json", "states.jsonl", "phrases.jsonl", "seeds.npy") if not (root / f).exists()]
        if missing:
            raise InputError(f"clustering {root} lacks {', '.join(missing)}",
                             fix="pass a directory written by `retrieval canon cluster`")
        meta = read_json(root / "clustering.json")
        if not isinstance(meta, dict) or not all(k in meta for k in ("threshold", "model")):
            raise FormatError(root / "clustering.json", "expected an object with 'threshold' and 'model'")
        states = read_jsonl(root / "states.jsonl")
        seeds = np.load(root / "seeds.npy", allow_pickle=False)
        if seeds.ndim != 2 or len(seeds) != len(states):
            raise FormatError(root / "seeds.npy", f"expected {len(states)} seed rows, got shape {seeds.shape}")
        for i, s in enumerate(states):
            if s.get("id") != state_id(i) or not isinstance(s.get("text"), str):
                raise FormatError(root / "states.jsonl", f"expected id {state_id(i)!r} and a text", line=i + 1)
        index = {state_id(i): i for i in range(len(states))}
        phrase_state, phrase_sim = {}, {}
        for i, r in enumerate(read_jsonl(root / "phrases.jsonl"), start=1):
            if r.get("state_id") not in index or not isinstance(r.get("phrase"), str):
                raise FormatError(root / "phrases.jsonl", "expected a phrase and a known state_id", line=i)
            phrase_state[r["phrase"]] = index[r["state_id"]]
            phrase_sim[r["phrase"]] = float(r["similarity"])
        return cls(root, float(meta["threshold"]), str(meta["model"]), str(meta.get("ties", "first")),
                   [s["text"] for s in states], unit_rows(seeds), phrase_state, phrase_sim)


def write_clustering(out: str | Path, vocab: PhraseVocab, emb: np.ndarray, cl: Clustering, info: dict,
                     config: dict, *, inputs=(), overwrite: bool = False) -> None:
    """Write the directory of the module docstring (staged, then swapped in; see `retrieval.canon._files`)."""
    units = unit_rows(emb)
    with staged_dir(out, CLUSTERING_KIND, inputs=inputs, overwrite=overwrite) as d:
        write_jsonl(d / "states.jsonl", clusters_rows(vocab, cl))
        write_jsonl(d / "phrases.jsonl", phrase_rows(vocab, cl))
        np.save(d / "seeds.npy", units[cl.seeds])
        write_json(d / "clustering.json", info)
        write_json(d / "config.json", config)


def run_cluster(cfg: ClusterConfig, *, progress: bool = True, log=print, encoder=None) -> dict:
    """Embed, cluster at ``cfg.threshold`` and write ``cfg.out``; returns the ``clustering.json`` document.
    ``encoder``: an already loaded text encoder of ``cfg.model`` (else it is loaded)."""
    cfg.check()
    inputs = [cfg.data, cfg.phrases]
    check_out_dir(cfg.out, CLUSTERING_KIND, inputs=inputs, overwrite=cfg.overwrite)  # refuse before the work
    vocab = load_vocab(cfg.data, cfg.phrases)
    log(f"{len(vocab):,} unique phrases ({int(vocab.counts.sum()):,} occurrences) from {vocab.source}")
    emb = embed_vocab(vocab, cfg.model, batch_size=cfg.batch_size, device=cfg.device, progress=progress,
                      encoder=encoder, cache_dir=default_cache_dir(cfg.data))
    t0 = time.perf_counter()
    cl = greedy_cluster(emb, cfg.threshold, visit_order(vocab.counts, vocab.phrases, cfg.ties), progress=progress)
    info = {"threshold": cfg.threshold, "model": cfg.model, "ties": cfg.ties, "source": vocab.source,
            "phrases": len(vocab), "occurrences": int(vocab.counts.sum()), "states": cl.n_clusters,
            "dim": int(emb.shape[1]), "seconds": time.perf_counter() - t0, **vocabulary_stats(cl.labels),
            "similarity": "float64 cosine of the float32 unit embeddings (exact dot product, rounded once)"}
    write_clustering(cfg.out, vocab, emb, cl, info, asdict(cfg), inputs=inputs, overwrite=cfg.overwrite)
    log(f"threshold {cfg.threshold:g}: {cl.n_clusters:,} canonical states -> {cfg.out}")
    return info
