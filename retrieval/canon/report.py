r"""``python -m retrieval canon report``: the forecasting-vs-canonicalization decomposition and the robust reads.

Decomposition (PSR appendix, Table 21). On the queries every run holds (fair ones: a non-empty main pool):

- exact-string oracle ``E``: the true canonical state text retrieves (``python -m retrieval oracle semantic-text``);
- paraphrase oracle ``P``: a rewording of the true state retrieves (content right, wording changed);
- best predictor ``F``: the predictor run with the highest R@k (a forecaster's phrases, LFTR, ...);
- description probe (optional): a VLM's from-scratch description of the true target frame.

``E - P`` is the canonicalization channel (what exact-string matching costs a correct answer); ``P - F`` the
forecasting gap (what a better predictor can still close). Both differences come with a paired bootstrap CI.

Robust reads. The paraphrase oracle's phrases read through a paraphrase-robust variant (the canonicalize-then-
retrieve snap; the fine-tuned index) against the plain read, per query subset (all; seen / held-out target states
of the fine-tune's ``holdout.json``): R@k, ``delta = R@k(robust) - R@k(plain)`` with the paired bootstrap (95% CI,
two-sided p; `eval.stats.paired_bootstrap`) and McNemar's exact test on row-tie-break hits
(`eval.stats.mcnemar_exact`), and the share of the paraphrase gap it closes,
``closed = (R@k(robust) - R@k(plain)) / (R@k(E) - R@k(plain))`` with ``E`` the exact-string oracle of the plain space.

Output directory: ``decomposition.{md,csv,tex}``, ``robust.{md,csv,tex}``, ``report.md`` (both, with the
definitions), ``report.json`` (every number), ``decomposition.png``, ``config.json``.
R@k is tie-aware (``tie="expected"``, `eval.metrics`), in points.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import write_json
from eval.metrics import RankStats, mean_valid, recall_at_k, reciprocal_rank
from eval.runs import read_run
from eval.stats import mcnemar_exact, paired_bootstrap
from retrieval.canon._files import check_out_dir, staged_dir

#: The paper's numbers (R@5, fair test set, BGE): exact-string oracle, paraphrase oracle, best method (fusion),
#: cross-model description (LLaVA-1.6-7B).
PAPER_R5 = {"exact": 53.0, "paraphrase": 29.7, "predictor": 16.1, "describe": 3.2}


@dataclass
class CanonReportConfig:
    """Resolved config of a report (``config.json``)."""

    data: str
    out: str
    exact: str
    paraphrase: str
    predictors: list[str] = field(default_factory=list)
    describe: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)  # "label=RUN": more probe rows (an LLM paraphrase, ...)
    robust: list[str] = field(default_factory=list)  # "label=RUN"
    holdout: str | None = None
    pool: str = "type2-all"
    k: int = 5
    n_resamples: int = 10_000
    seed: int = 0
    overwrite: bool = False  # replace an --out that is not an earlier canon report (eval.outputs)

    def inputs(self) -> list[str | None]:
        """Every file and folder the report reads (never replaced by its output)."""
        labelled = [x.partition("=")[2] for x in (*self.others, *self.robust)]
        return [self.data, self.exact, self.paraphrase, *self.predictors, *self.describe, *labelled, self.holdout]


@dataclass
class _Scored:
    name: str
    path: str
    rk: np.ndarray  # tie-aware R@k per query (aligned on the common queries)
    hits: np.ndarray  # row-tie-break hit@k
    r1: np.ndarray
    r10: np.ndarray
    rr: np.ndarray


def _score(path: str, ids: list[str], pool: str, k: int, name: str | None = None) -> _Scored:
    run = read_run(path).select(ids)
    st = RankStats.from_run(run, pool)
    return _Scored(name or run.name, str(path), recall_at_k(st, k), recall_at_k(st, k, "row"), recall_at_k(st, 1),
                   recall_at_k(st, 10), reciprocal_rank(st))


def _common_ids(paths: list[str]) -> list[str]:
    runs = [read_run(p) for p in paths]
    common = set(runs[0].query_ids)
    for r in runs[1:]:
        common &= set(r.query_ids)
    ids = [q for q in runs[0].query_ids if q in common]
    if not ids:
        raise InputError(f"the runs share no query ids: {paths}")
    return ids


def _pct(x: float) -> str:
    return "—" if not np.isfinite(x) else f"{100 * x:.2f}"


def _fmt_p(p: float | None) -> str:
    if p is None:  # eval.stats gives no bootstrap p-value below MIN_BOOTSTRAP_N queries
        return "n too small"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _diff(a: _Scored, b: _Scored, mask: np.ndarray, cfg: CanonReportConfig) -> dict:
    boot = paired_bootstrap(a.rk[mask], b.rk[mask], n_resamples=cfg.n_resamples, seed=cfg.seed)
    mc = mcnemar_exact(a.hits[mask], b.hits[mask])
    return {"bootstrap": boot.to_dict(), "mcnemar": mc.to_dict()}


def _labelled(items: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for it in items:
        label, sep, path = it.partition("=")
        if not sep or not label or not path:
            raise InputError(f"{option} expects LABEL=RUN, got {it!r}")
        out.append((label, path))
    return out


def build(cfg: CanonReportConfig) -> dict:
    """Compute every number of the report (no files written)."""
    from eval.benchmark import Benchmark
    from eval.report import Table

    robust, others = _labelled(cfg.robust, "--robust"), _labelled(cfg.others, "--other")
    paths = [cfg.exact, cfg.paraphrase, *cfg.predictors, *cfg.describe, *(p for _, p in robust + others)]
    ids = _common_ids(paths)
    ex = _score(cfg.exact, ids, cfg.pool, cfg.k)
    para = _score(cfg.paraphrase, ids, cfg.pool, cfg.k)
    preds = [_score(p, ids, cfg.pool, cfg.k) for p in cfg.predictors]
    descs = [_score(p, ids, cfg.pool, cfg.k) for p in cfg.describe]
    extra = [(label, _score(p, ids, cfg.pool, cfg.k)) for label, p in others]
    valid = np.isfinite(ex.rk)
    k = cfg.k
    best = max(preds, key=lambda s: mean_valid(s.rk)[0]) if preds else None

    def row(role, s: _Scored, paper):
        return [role, s.name, _pct(mean_valid(s.r1)[0]), _pct(mean_valid(s.rk)[0]), _pct(mean_valid(s.r10)[0]),
                f"{mean_valid(s.rr)[0]:.3f}", str(int(np.isfinite(s.rk).sum())), "—" if paper is None else f"{paper:.1f}"]

    cols = ["role", "run", "R@1", f"R@{k}", "R@10", "MRR", "n", "paper R@5"]
    rows = [row("exact-string oracle", ex, PAPER_R5["exact"]), row("paraphrase oracle", para, PAPER_R5["paraphrase"])]
    if best is not None:
        rows.append(row("best predictor", best, PAPER_R5["predictor"]))
    rows += [row("description probe", d, PAPER_R5["describe"]) for d in descs]
    rows += [row(label, x, None) for label, x in extra]
    channels = {"canonicalization_channel": _diff(ex, para, valid, cfg)}
    if best is not None:
        channels["forecasting_gap"] = _diff(para, best, valid, cfg)
    for key, label in (("canonicalization_channel", "canonicalization channel (exact − paraphrase)"),
                       ("forecasting_gap", "forecasting gap (paraphrase − best predictor)")):
        if key in channels:
            b = channels[key]["bootstrap"]
            rows.append([label, "Δ", "", f"{100 * b['delta']:+.2f} [{100 * b['ci_low']:+.2f}, {100 * b['ci_high']:+.2f}]",
                         "", "", str(b["n"]), f"{PAPER_R5['exact'] - PAPER_R5['paraphrase']:+.1f}"
                         if key == "canonicalization_channel" else f"{PAPER_R5['paraphrase'] - PAPER_R5['predictor']:+.1f}"])
    cap = (f"R@k tie-aware, x100, main pool, {int(valid.sum())} queries held by every run. Δ rows: paired bootstrap "
           f"({cfg.n_resamples} resamples) 95% CI. Paper: PSR fair test set with BGE (exact 53.0, paraphrase 29.7, "
           "fusion 16.1, LLaVA description 3.2).")
    decomposition = Table("decomposition", "Forecasting vs canonicalization", cols, rows, cap)
    # robust reads, per subset
    bench = Benchmark.load(cfg.data)
    subsets = {"all": valid}
    if cfg.holdout:
        from retrieval.canon.snap import read_holdout

        seen = set(read_holdout(cfg.holdout)["train_states"])
        tsid = np.asarray(bench.queries_ds.select([bench.query_index[q] for q in ids])["target_state_id"][:], object)
        is_seen = np.isin(tsid, list(seen))
        subsets.update({"seen states": valid & is_seen, "held-out states": valid & ~is_seen})
    rob = [_score(p, ids, cfg.pool, cfg.k, name=label) for label, p in robust]
    rcols = ["subset", "read", "n", f"R@{k}", f"ΔR@{k} [95% CI]", "p (bootstrap)", "McNemar b/c", "p (McNemar)",
             "gap closed"]
    rrows, rjson = [], {}
    for sub, mask in subsets.items():
        if not mask.any():
            continue
        e, p = mean_valid(ex.rk[mask])[0], mean_valid(para.rk[mask])[0]
        rrows.append([sub, f"exact-string oracle ({ex.name})", str(int(mask.sum())), _pct(e), "", "", "", "", ""])
        rrows.append([sub, f"plain read ({para.name})", str(int(mask.sum())), _pct(p), "", "", "", "", ""])
        rjson[sub] = {"n": int(mask.sum()), "exact": e, "plain": p, "reads": {}}
        for r in rob:
            d = _diff(r, para, mask, cfg)
            b, m = d["bootstrap"], d["mcnemar"]
            closed = (b["mean_a"] - p) / (e - p) if abs(e - p) > 1e-12 else float("nan")
            rrows.append([sub, r.name, str(b["n"]), _pct(b["mean_a"]),
                          f"{100 * b['delta']:+.2f} [{100 * b['ci_low']:+.2f}, {100 * b['ci_high']:+.2f}]",
                          _fmt_p(b["p_value"]), f"{m['b']}/{m['c']}", _fmt_p(m["p_value"]),
                          "—" if not np.isfinite(closed) else f"{100 * closed:.0f}%"])
            rjson[sub]["reads"][r.name] = {**d, "r_at_k": b["mean_a"], "gap_closed": closed, "path": r.path}
    rcap = (f"The paraphrase oracle's phrases read plainly and through each robust read; Δ = robust − plain on the "
            f"same queries (paired bootstrap, {cfg.n_resamples} resamples; McNemar exact on row-tie-break hits, "
            "b = robust only, c = plain only). gap closed = Δ / (exact-string oracle − plain read).")
    robust_table = Table("robust", "Paraphrase-robust reads vs the plain read", rcols, rrows, rcap)
    doc = {"config": asdict(cfg), "queries": len(ids), "valid_queries": int(valid.sum()), "k": k,
           "decomposition": [{"role": role, "name": s.name, "path": s.path, "r_at_1": mean_valid(s.r1)[0],
                              "r_at_k": mean_valid(s.rk)[0], "r_at_10": mean_valid(s.r10)[0],
                              "mrr": mean_valid(s.rr)[0]}
                             for role, s in [("exact", ex), ("paraphrase", para), *(("predictor", x) for x in preds),
                                             *(("describe", x) for x in descs), *extra]],
           "best_predictor": best.name if best else None, "channels": channels, "robust": rjson,
           "paper_r5": PAPER_R5}
    return {"doc": doc, "tables": [decomposition, robust_table]}


_EXPLAIN = """\
- **exact-string oracle**: the true canonical state string retrieves: the ceiling of the benchmark's index.
- **paraphrase oracle**: a rewording of the true state retrieves; content is right, only the wording changes, so
  its drop from the exact-string oracle is the *canonicalization channel*, not forecasting.
- **best predictor**: the strongest predictor run given; *paraphrase − predictor* is the forecasting gap a better
  predictor can close.
- **robust reads**: the paraphrase oracle's phrases through the canonicalize-then-retrieve snap and through the
  fine-tuned (paraphrase-robust) index; *gap closed* is the share of the canonicalization channel recovered.
"""


def _plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [d["name"] for d in doc["decomposition"]]
    vals = [100 * d["r_at_k"] for d in doc["decomposition"]]
    roles = [d["role"] for d in doc["decomposition"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.barh(range(len(names)), vals, color=["tab:green" if r == "exact" else "tab:blue" if r == "paraphrase"
                                             else "tab:gray" for r in roles])
    a.set_yticks(range(len(names)), [f"{r}: {n}"[:48] for r, n in zip(roles, names, strict=True)], fontsize=7)
    a.invert_yaxis()
    a.set_xlabel(f"R@{doc['k']}")
    a.set_title("forecasting vs canonicalization")
    subs = list(doc["robust"])
    reads = sorted({r for s in subs for r in doc["robust"][s]["reads"]})
    w = 0.8 / (2 + len(reads))
    for j, (label, key) in enumerate([("plain", None), *((r, r) for r in reads), ("exact", "exact")]):
        ys = [100 * (doc["robust"][s]["plain"] if key is None else doc["robust"][s]["exact"] if key == "exact"
                     else doc["robust"][s]["reads"].get(key, {}).get("r_at_k", np.nan)) for s in subs]
        b.bar(np.arange(len(subs)) + j * w, ys, w, label=label[:30])
    b.set_xticks(np.arange(len(subs)) + w * (1 + len(reads)) / 2, subs)
    b.set_ylabel(f"R@{doc['k']}")
    b.set_title("paraphrase-robust reads")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(cfg: CanonReportConfig) -> dict:
    """Build the report and write its directory (module docstring); returns the JSON document."""
    check_out_dir(cfg.out, "report", inputs=cfg.inputs(), overwrite=cfg.overwrite)
    res = build(cfg)
    doc, tables = res["doc"], res["tables"]
    md = "# Canonicalization probes\n\n" + _EXPLAIN + "\n" + "\n".join(t.markdown() for t in tables)
    with staged_dir(cfg.out, "report", inputs=cfg.inputs(), overwrite=cfg.overwrite) as d:
        for t in tables:
            t.write(d)
        (d / "report.md").write_text(md, encoding="utf-8")
        write_json(d / "report.json", doc)
        write_json(d / "config.json", asdict(cfg))
        _plot(doc, d / "decomposition.png")
    doc["markdown"] = md
    return doc
