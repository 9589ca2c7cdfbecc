"""``python -m retrieval canon sweep``: the threshold sweep of the greedy canonicalization (PSR appendix: the pilot
sweep over {0.80, 0.85, 0.90} that picked 0.85, "keeping mean cluster size <= 5").

The raw vocabulary (`retrieval.canon.vocab`) is embedded once with a sentence-transformers model (the semantic
spaces' `retrieval.encoders.TextEncoder`, corpus side) and clustered at each threshold (`retrieval.canon.cluster`,
most frequent phrase first). Per threshold: vocabulary size, merge rate, mean / max cluster size, singletons, the
rule of thumb ``mean size <= 5`` (`retrieval.canon.metrics`), and, when the vocabulary has a true partition (the
synthetic benchmark's synonym sets), purity, inverse purity and the adjusted Rand index.

Output directory (``<T>``: `threshold_label`, the threshold to full precision, so two thresholds never share a
file; a threshold given twice is refused)::

    sweep.{md,csv,tex}       one row per threshold
    sweep.json               every number, the vocabulary summary, the resolved config
    clusters_t<T>.jsonl      per threshold, one canonical state per line: id, text (the seed), phrases, counts
    phrases_t<T>.jsonl       per threshold, one phrase per line (input order): phrase, count, state_id, seed,
                             similarity (to the seed), query_ids (phrase files), label (when known)
    cluster_sizes.png        cluster-size distribution per threshold (and vocabulary size vs threshold)
    config.json              the resolved config
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import write_json, write_jsonl
from retrieval.canon._files import check_out_dir, staged_dir
from retrieval.canon.cluster import TIES, greedy_cluster, visit_order
from retrieval.canon.metrics import MAX_MEAN_CLUSTER_SIZE, partition_scores, vocabulary_stats
from retrieval.canon.store import clusters_rows, phrase_rows
from retrieval.canon.vocab import PhraseVocab, embed_vocab, load_vocab
from retrieval.textcache import default_cache_dir

DEFAULT_THRESHOLDS = (0.80, 0.85, 0.90)


@dataclass
class SweepConfig:
    """A sweep: ``data`` (benchmark dir) or ``phrases`` (phrase list file), the thresholds and the text model."""

    out: str
    data: str | None = None
    phrases: str | None = None
    thresholds: list[float] = field(default_factory=lambda: list(DEFAULT_THRESHOLDS))
    model: str = "BAAI/bge-small-en-v1.5"
    ties: str = "first"
    batch_size: int = 128
    device: str | None = None
    overwrite: bool = False  # replace an --out that is not an earlier sweep (eval.outputs)

    def check(self) -> None:
        if (self.data is None) == (self.phrases is None):
            raise InputError("give exactly one of --data (a benchmark directory) or --phrases (a phrase list file)")
        if not self.thresholds:
            raise InputError("give at least one threshold")
        seen: dict[float, str] = {}
        for t in self.thresholds:
            if not 0.0 < float(t) <= 1.0:
                raise InputError(f"thresholds must lie in (0, 1], got {t}")
            if float(t) in seen:
                raise InputError(f"threshold {threshold_label(t)} is given twice (as {seen[float(t)]} and {t!r}): "
                                 "each threshold has its own output files")
            seen[float(t)] = repr(t)
        if self.ties not in TIES:
            raise InputError(f"--ties must be one of {', '.join(TIES)}, got {self.ties!r}")


def threshold_label(t: float) -> str:
    """The threshold to full precision, with at least two decimals: 0.8 -> ``0.80``, 0.854 -> ``0.854`` (labels of
    distinct thresholds differ, so their files never collide)."""
    two = f"{float(t):.2f}"
    return two if float(two) == float(t) else repr(float(t))


def sweep_vocab(vocab: PhraseVocab, emb: np.ndarray, thresholds, *, ties: str = "first",
                progress: bool = True) -> list[dict]:
    """Cluster at each threshold (most frequent first, count ties by ``ties``: `visit_order`); per threshold a dict
    of statistics (and truth scores when known)."""
    order = visit_order(vocab.counts, vocab.phrases, ties)
    out = []
    for t in thresholds:
        t0 = time.perf_counter()
        cl = greedy_cluster(emb, float(t), order, progress=progress)
        row = {"threshold": float(t), "seconds": time.perf_counter() - t0, **vocabulary_stats(cl.labels)}
        sizes = cl.sizes()
        row["size_histogram"] = {int(s): int(n) for s, n in zip(*np.unique(sizes, return_counts=True), strict=True)}
        if vocab.truth is not None:
            row.update(partition_scores(cl.labels, vocab.truth))
        row["_clustering"] = cl
        out.append(row)
    return out


def _table(rows: list[dict], has_truth: bool):
    from eval.report import Table

    cols = ["threshold", "vocabulary", "merge rate", "mean size", "max size", "singletons", f"mean <= {MAX_MEAN_CLUSTER_SIZE:g}"]
    if has_truth:
        cols += ["purity", "inverse purity", "ARI"]
    body = []
    for r in rows:
        cells = [threshold_label(r["threshold"]), f"{r['clusters']:,}", f"{100 * r['merge_rate']:.1f}%", f"{r['mean_size']:.2f}",
                 str(r["max_size"]), f"{r['singletons']:,}", "yes" if r["mean_size_ok"] else "no"]
        if has_truth:
            cells += [f"{r['purity']:.3f}", f"{r['inverse_purity']:.3f}", f"{r['ari']:.3f}"]
        body.append(cells)
    cap = ("Greedy canonicalization (most frequent phrase first, count ties by first occurrence or text as configured; "
           "join the most similar seed at cosine >= threshold). merge rate = 1 - clusters / phrases; mean size = phrases per canonical state (paper: keep <= 5).")
    if has_truth:
        cap += " Purity / inverse purity / adjusted Rand index against the true synonym sets, over unique phrases."
    return Table("sweep", "Canonicalization threshold sweep", cols, body, cap)


def plot_sizes(rows: list[dict], path: Path, title: str) -> None:
    """Cluster-size distribution per threshold (log-log) and vocabulary size vs threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        h = r["size_histogram"]
        a.plot(list(h), list(h.values()), marker="o", ms=3, label=f"t = {threshold_label(r['threshold'])}")
    a.set(xscale="log", yscale="log", xlabel="cluster size (phrases)", ylabel="canonical states",
          title="cluster-size distribution")
    a.legend()
    ts = [r["threshold"] for r in rows]
    b.plot(ts, [r["clusters"] for r in rows], marker="o", label="canonical states")
    b.set(xlabel="threshold", ylabel="canonical states", title="vocabulary size")
    b2 = b.twinx()
    b2.plot(ts, [r["mean_size"] for r in rows], marker="s", color="tab:orange", label="mean size")
    b2.axhline(MAX_MEAN_CLUSTER_SIZE, color="tab:orange", ls=":", lw=1)
    b2.set_ylabel("mean cluster size")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_sweep(cfg: SweepConfig, *, progress: bool = True, log=print, encoder=None) -> dict:
    """Run the sweep and write the output directory (see the module docstring); returns the JSON document.
    ``encoder``: an already loaded text encoder of ``cfg.model`` (else it is loaded)."""
    cfg.check()
    inputs = [cfg.data, cfg.phrases]
    check_out_dir(cfg.out, "sweep", inputs=inputs, overwrite=cfg.overwrite)  # refuse before the work
    vocab = load_vocab(cfg.data, cfg.phrases)
    log(f"{len(vocab):,} unique phrases ({int(vocab.counts.sum()):,} occurrences) from {vocab.source}")
    emb = embed_vocab(vocab, cfg.model, batch_size=cfg.batch_size, device=cfg.device, progress=progress,
                      encoder=encoder, cache_dir=default_cache_dir(cfg.data))
    rows = sweep_vocab(vocab, emb, cfg.thresholds, ties=cfg.ties, progress=progress)
    ok = [r["threshold"] for r in rows if r["mean_size_ok"]]
    doc = {
        "config": asdict(cfg),
        "vocabulary": {"source": vocab.source, "phrases": len(vocab), "occurrences": int(vocab.counts.sum()),
                       "true_classes": len(set(vocab.truth)) if vocab.truth is not None else None,
                       "ambiguous_phrases": vocab.ambiguous, "dim": int(emb.shape[1])},
        "thresholds": [{k: v for k, v in r.items() if k != "_clustering"} for r in rows],
        "rule_of_thumb": {"max_mean_size": MAX_MEAN_CLUSTER_SIZE, "thresholds_ok": ok},
    }
    if vocab.truth is not None:
        best = max(rows, key=lambda r: r["ari"])
        doc["best_ari_threshold"] = best["threshold"]
    with staged_dir(cfg.out, "sweep", inputs=inputs, overwrite=cfg.overwrite) as d:
        table = _table(rows, vocab.truth is not None)
        table.write(d)
        for r in rows:
            label = threshold_label(r["threshold"])
            write_jsonl(d / f"clusters_t{label}.jsonl", clusters_rows(vocab, r["_clustering"]))
            write_jsonl(d / f"phrases_t{label}.jsonl", phrase_rows(vocab, r["_clustering"]))
        plot_sizes(rows, d / "cluster_sizes.png", f"{len(vocab):,} phrases, {cfg.model}")
        write_json(d / "sweep.json", doc)
        write_json(d / "config.json", asdict(cfg))
    doc["markdown"] = table.markdown()
    return doc
