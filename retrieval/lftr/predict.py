"""LFTR inference: query vectors under a read rule, validation R@k, and runs.

Read rules (`retrieval.lftr.config.READ_RULES`), with ``mu_1..mu_H`` the rollout of a query:

- ``matched``: the K samples around ``mu_h`` (h = the query's horizon, clipped to H);
- ``fixed1``: the K samples around ``mu_1``;
- ``multi_hypothesis``: the H projected step means ``P(mu_1)..P(mu_H)`` at once, no sampling noise (an item
  scores its max over the H steps; the paper's "max-similarity over all steps at once");
- ``calibrated``: for a query of horizon h, the K samples of the step ``c(h)`` chosen on the validation split:
  ``c(h) = argmax_t R@val_k`` of reading step t for the validation queries of horizon h (ties -> the matched step,
  then the earliest); horizons without validation queries read the matched step. The map is computed once per
  checkpoint and kept in ``calibration.json`` beside it (`step_calibration`);
- ``best_step_oracle``: per query, the K samples of the step whose ranking puts the main-pool GT highest
  (smallest tie-aware expected rank of the first GT item, `eval.metrics.first_rank`); it reads the GT, so it is
  an analysis oracle, never a method.

Validation (`validation_recall`, the checkpoint-selection metric) scores the matched read of the validation
queries on the training device with torch (`torch_main_pool_stats`: the same tie-aware rank counts as eval's
streaming scorer, own video excluded; the pools and exclusions are built once and cached on the `Prepared`; in a
visual space a query stops being scored once ``val_k`` negatives certainly beat its best positive), so no numba
scorer runs inside the training loop; ``val_scorer: stream`` uses eval's scorer instead and
``val_max_queries`` scores a fixed random subset.

Sampling noise at inference is drawn once per query from a generator seeded with the config's seed and shared by
every rollout step, so predictions are deterministic and the step-``t`` vectors of every rule are identical;
sample 1 is always the mean.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eval.errors import InputError
from eval.metrics import RankStats, first_rank
from eval.scoring import DenseSource, benchmark_groups, score_stream
from retrieval.lftr.model import LFTR
from retrieval.lftr.train import Prepared
from retrieval.queries import QueryVectors


def _inputs(prep: Prepared, rows: np.ndarray, device: str):
    d = prep.data
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    q = d.question[rows] if d.question is not None else None
    return (t(d.prefix[d.prefix_row[rows]]), t(d.qtype[rows]), t(d.horizon[rows]),
            t(q) if q is not None else None)


@torch.no_grad()
def step_vectors(model: LFTR, prep: Prepared, rows: np.ndarray, *, steps: str = "read", rule: str = "matched",
                 seed: int = 0, batch: int = 512) -> np.ndarray:
    """Query vectors of ``rows``: ``steps="read"`` -> ``(n, K, d)`` samples at the rule's step;
    ``steps="means"`` -> ``(n, H, d)`` projected step means; ``steps="all"`` -> ``(n, H, K, d)`` samples per step."""
    model.eval()
    device = next(model.parameters()).device.type
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in range(0, len(rows), batch):
        prefix, qtype, horizon, question = _inputs(prep, rows[s:s + batch], device)
        mu = model.rollout(model.context(prefix, qtype, horizon, question))  # (B, H, D)
        eps = model.noise(mu.shape[0], mu.device, generator=gen)  # one draw per query, shared by every step
        if steps == "means":
            out.append(model.project_mean(mu).cpu().numpy())
        elif steps == "all":
            per = [model.sample(mu[:, t], horizon, eps) for t in range(mu.shape[1])]
            out.append(torch.stack(per, 1).cpu().numpy())
        else:
            step = model.read_step(horizon, rule)
            mu_r = mu[torch.arange(mu.shape[0], device=mu.device), step]
            out.append(model.sample(mu_r, horizon, eps).cpu().numpy())
    if not out:
        return np.zeros((0, 1, prep.data.items.shape[1]), np.float32)
    return np.concatenate(out).astype(np.float32)


def main_pool_stats(prep: Prepared, rows: np.ndarray, vectors: np.ndarray, *, progress: bool = False) -> dict:
    """Rank statistics of the main GT pool (``type2-all``) for ``vectors`` ``(n, K, d)`` of queries ``rows``,
    streamed over the corpus under the benchmark protocol (own video excluded)."""
    bench, space = prep.bench, prep.target
    all_pools, exclude, _ = benchmark_groups(bench, bench.query_table(rows))
    pools = {"type2-all": all_pools["type2-all"]}
    src = DenseSource(vectors, space.items, space.item_rows, reduce="max")
    return score_stream(src, pools, exclude, k=1, progress=progress).stats["type2-all"]


def recall_at_k(stats: dict, k: int) -> float:
    """Micro tie-aware R@k (expected hit@k) over the queries with a non-empty pool (`eval.metrics`)."""
    from eval.metrics import RankStats, mean_valid
    from eval.metrics import recall_at_k as per_query_recall

    return mean_valid(per_query_recall(RankStats.from_arrays(stats), k))[0]


def validation_rows(prep: Prepared, cfg) -> np.ndarray:
    """The validation queries scored for checkpoint selection: the main benchmark's (Q1-Q4, a non-empty main
    pool; Q5 is scored apart, as in the reports), all or a seeded subset of ``val_max_queries``."""
    rows = prep.data.rows(cfg.val_split, main_only=True)
    if cfg.val_max_queries and len(rows) > cfg.val_max_queries:
        rows = np.sort(np.random.default_rng(cfg.seed).choice(rows, cfg.val_max_queries, replace=False))
    return rows


def validation_recall(model: LFTR, prep: Prepared) -> float:
    """R@val_k of the matched read on the validation split's main queries (`validation_rows`)."""
    cfg = model.cfg
    rows = validation_rows(prep, cfg)
    if len(rows) == 0:
        return 0.0
    vec = step_vectors(model, prep, rows, rule="matched", seed=cfg.seed)
    if cfg.val_scorer == "stream":
        return recall_at_k(main_pool_stats(prep, rows, vec), cfg.val_k)
    device = next(model.parameters()).device
    return recall_at_k(torch_main_pool_stats(prep, rows, vec, device=device, cut=cfg.val_k), cfg.val_k)


@dataclass
class _PoolTargets:
    """Device tensors of the main-pool positives and own-video corpus rows of some queries (CSR, corpus rows)."""

    pos_ptr: torch.Tensor
    pos_rows: torch.Tensor
    own_ptr: torch.Tensor
    own_rows: torch.Tensor
    items: torch.Tensor
    item_rows: torch.Tensor | None


def _pool_targets(prep: Prepared, rows: np.ndarray, device) -> _PoolTargets:
    key = (hashlib.sha1(np.ascontiguousarray(rows).tobytes()).hexdigest(), str(device))
    cache = prep.__dict__.setdefault("_pool_targets", {})
    if key in cache:
        return cache[key]
    bench = prep.bench
    queries = [bench.query(int(r)) for r in rows]
    pos = bench.gt_rows(queries, "type2-all")
    video = np.asarray(bench.corpus_ds["video_id"][:])
    order = np.argsort(video, kind="stable")
    sv = video[order]
    own = [order[np.searchsorted(sv, q.video_id, "left"):np.searchsorted(sv, q.video_id, "right")] for q in queries]
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)  # noqa: E731

    def csr(lists):
        ptr = np.zeros(len(lists) + 1, np.int64)
        ptr[1:] = np.cumsum([len(x) for x in lists])
        return t(ptr), t(np.concatenate(lists) if ptr[-1] else np.zeros(0, np.int64))

    space = prep.target
    out = _PoolTargets(*csr(pos), *csr(own), torch.from_numpy(np.array(space.items, np.float32)).to(device),
                       None if space.item_rows is None else t(space.item_rows))
    cache.clear()  # one set of validation queries per job: keep memory bounded
    cache[key] = out
    return out


@torch.no_grad()
def torch_main_pool_stats(prep: Prepared, rows: np.ndarray, vectors: np.ndarray, *, device=None,
                          chunk: int = 256, cut: int | None = None) -> dict[str, np.ndarray]:
    """Rank statistics of the main pool (``type2-all``) for query vectors ``(n, K, d)`` of ``rows``, computed
    with torch on ``device`` in chunks of queries; the same counts as eval's streaming scorer
    (`main_pool_stats`) up to float rounding of near-ties.

    Per query: item scores ``s_i = max_k <v_k, x_i>`` expanded to corpus rows (a semantic space's states to their
    segments), own-video rows removed; ``t`` = the best positive score; ``n_above`` / ``n_tie_neg`` = negatives
    scoring ``> t`` / ``== t``; ``n_tie_pos`` = positives scoring ``== t``; ``n_tie_neg_first`` = tied negatives
    with a lower corpus row than the first tied positive (the row tie-break).

    ``cut``: only R@``cut`` is wanted (`validation_recall`). Where the items are the corpus rows (a visual space,
    whose products dominate the cost), a query then stops being scored as soon as ``cut`` of its negatives
    certainly score above its best positive (`_scores_until_cut`). Where the items are states (a semantic space,
    whose expansion to the corpus rows dominates), its negatives above its best positive are counted from the state
    scores, exactly (`_state_level_above`), and a query with ``cut`` or more is not expanded. Such a query reports
    ``n_above = cut`` and no ties, so its R@``cut`` is 0, as its full counts give. Every other query gets its full
    counts.
    """
    device = torch.device(device or "cpu")
    pt = _pool_targets(prep, rows, device)
    n = len(rows)
    out = {k: np.zeros(n, np.int64) for k in ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")}
    vec = torch.from_numpy(np.ascontiguousarray(vectors, np.float32)).to(device)
    n_corpus = len(prep.bench.corpus_ids)
    if cut is not None and cut < 1:
        raise InputError(f"cut must be >= 1, got {cut}")

    def masks(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pos, neg)`` masks ``(len(idx), n_corpus)`` of the queries ``idx``."""
        pos = _rows_mask(pt.pos_ptr, pt.pos_rows, idx, n_corpus)
        return pos, ~pos & ~_rows_mask(pt.own_ptr, pt.own_rows, idx, n_corpus)

    if cut is not None and pt.item_rows is None:
        out["n_pos"][:] = (pt.pos_ptr[1:] - pt.pos_ptr[:-1]).cpu().numpy()
        out["n_above"][:] = cut  # the dropped queries; the live ones are overwritten below
        live, sc = _scores_until_cut(vec, pt.items, masks, cut, chunk)
        for s in range(0, len(live), chunk):
            idx = live[s:s + chunk]
            _count(sc[s:s + chunk], *masks(idx), out, idx.cpu().numpy())
    else:
        state_rows = None
        if cut is not None:  # a semantic space: each state's corpus rows, for `_state_level_above`
            state_rows = torch.bincount(pt.item_rows, minlength=pt.items.shape[0])
            out["n_pos"][:] = (pt.pos_ptr[1:] - pt.pos_ptr[:-1]).cpu().numpy()
        for s in range(0, n, chunk):
            v = vec[s:s + chunk]
            c = v.shape[0]
            sc = v[:, 0] @ pt.items.T
            for k in range(1, v.shape[1]):  # max over the K samples without a (c, K, n_items) tensor
                torch.maximum(sc, v[:, k] @ pt.items.T, out=sc)
            idx = torch.arange(s, s + c, device=device)
            if state_rows is not None:
                keep = _state_level_above(sc, idx, pt, state_rows) < cut
                out["n_above"][s:s + c][~keep.cpu().numpy()] = cut
                idx, sc = idx[keep], sc[keep]
                if not len(idx):
                    continue
            if pt.item_rows is not None:
                sc = sc[:, pt.item_rows]  # (c, n_corpus)
            pos, neg = masks(idx)
            at = idx.cpu().numpy()
            out["n_pos"][at] = torch.count_nonzero(pos, dim=1).cpu().numpy()
            _count(sc, pos, neg, out, at)
    empty = out["n_pos"] == 0
    for k in ("n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first"):
        out[k][empty] = 0
    return out


def _state_level_above(sc: torch.Tensor, idx: torch.Tensor, pt: _PoolTargets, state_rows: torch.Tensor
                       ) -> torch.Tensor:
    """int64 ``(c,)``: per query ``idx``, its negatives scoring above its best positive, from its state scores ``sc``
    ``(c, m)`` of a semantic space. The expansion to corpus rows is a gather, so a row's score is its state's, bit
    for bit: ``t`` = the best state score among its positives' rows; the rows above ``t`` are the rows of the
    states above ``t`` (``state_rows``: rows per state) minus its own video's rows there (a positive never scores
    above ``t``). A query without positives gets every row."""
    c, dev = len(idx), sc.device
    q, rows = _csr_pairs(pt.pos_ptr, pt.pos_rows, idx)
    st = pt.item_rows[rows]
    best = torch.full((c,), -torch.inf, device=dev).scatter_reduce_(0, q, sc[q, st], reduce="amax")
    above = sc > best[:, None]
    n = (above.to(torch.int64) * state_rows).sum(1)
    q, rows = _csr_pairs(pt.own_ptr, pt.own_rows, idx)
    st = pt.item_rows[rows]
    return n - torch.zeros(c, dtype=torch.int64, device=dev).scatter_add_(0, q, above[q, st].to(torch.int64))


def _count(sc: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, out: dict[str, np.ndarray], at) -> None:
    """The rank counts (`torch_main_pool_stats`) of the queries ``at`` from their scores ``sc`` ``(c, n_corpus)``."""
    def count(mask: torch.Tensor) -> np.ndarray:
        return torch.count_nonzero(mask, dim=1).cpu().numpy()

    best = sc.masked_fill(~pos, -torch.inf).amax(1, keepdim=True)
    out["n_above"][at] = count((sc > best) & neg)
    tie = sc == best
    out["n_tie_neg"][at] = count(tie & neg)
    out["n_tie_pos"][at] = count(tie & pos)
    cols = torch.arange(sc.shape[1], device=sc.device)
    first = torch.where(tie & pos, cols, sc.shape[1]).amin(1, keepdim=True)  # row of the first tied positive
    out["n_tie_neg_first"][at] = count(tie & neg & (cols < first))


def _scores_until_cut(vec: torch.Tensor, items: torch.Tensor, masks, cut: int, chunk: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries that may still rank a positive in their top ``cut``, and their item scores.

    ``vec``: ``(n, K, d)`` samples; ``items``: ``(m, d)``, the corpus rows; ``masks(idx)``: the ``(pos, neg)``
    masks of queries ``idx``. The samples are scored one at a time into a running max, a lower bound of every
    item's final score: first every query's first sample, chunk by chunk, then the remaining samples of the
    queries still live, gathered into full chunks. After each sample, a query is dropped when ``cut`` of its
    negatives have a running max above ``hi``, an upper bound of its best positive score whatever the rounding:
    ``hi`` = its positives' scores (their own products) plus ``4 gamma_d |v| |x|``, twice the worst-case error of
    two float32 dot products of length ``d`` (Higham's ``gamma_d = d u / (1 - d u)``, ``u = 2^-24``, in any
    summation order), once for ``hi`` and once for the running max, whose products cover other rows than the
    unpruned chunk's. Under a float32 matmul precision other than ``highest`` (TF32 or bfloat16 products) ``u``
    is bfloat16's, ``2^-8``: the bound stays true, and prunes little. Returns ``(live, scores)``: the kept query
    indices and their ``(len(live), m)`` scores over all ``K`` samples."""
    n, K, d = vec.shape
    dev = vec.device
    u = 2.0 ** -24 if torch.get_float32_matmul_precision() == "highest" else 2.0 ** -8
    gamma = d * u / (1 - d * u)
    slack = 4 * gamma * float(vec.norm(dim=-1).max()) * float(items.norm(dim=1).max()) * 1.01 if n else 0.0

    def drop(idx, hi, run, neg):
        keep = torch.count_nonzero((run > hi[:, None]) & neg, dim=1) < cut
        if bool(keep.all()):
            return idx, hi, run, keep
        return idx[keep], hi[keep], run[keep], keep

    ids, his, runs = [], [], []
    for s in range(0, n, chunk):  # every query's first sample
        idx = torch.arange(s, min(n, s + chunk), device=dev)
        pos, neg = masks(idx)
        v = vec[s:s + chunk]
        q, p = pos.nonzero(as_tuple=True)
        hi = torch.full((len(idx),), -torch.inf, device=dev)
        if len(q):
            xp = items.index_select(0, p)
            pair = torch.stack([(v[:, k].index_select(0, q) * xp).sum(1) for k in range(K)], 1).amax(1)
            hi.scatter_reduce_(0, q, pair, reduce="amax")
        idx, hi, run, _ = drop(idx, hi + slack, v[:, 0] @ items.T, neg)
        ids.append(idx), his.append(hi), runs.append(run)
    live = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64, device=dev)
    hi = torch.cat(his) if his else torch.zeros(0, device=dev)
    run = torch.cat(runs) if runs else torch.zeros((0, items.shape[0]), device=dev)
    done_ids, done_runs = [], []
    for s in range(0, len(live), chunk):  # the others' remaining samples
        idx, h, r = live[s:s + chunk], hi[s:s + chunk], run[s:s + chunk]
        neg = masks(idx)[1]
        for k in range(1, K):
            torch.maximum(r, vec[idx, k] @ items.T, out=r)
            idx, h, r, keep = drop(idx, h, r, neg)
            neg = neg[keep]
            if not len(idx):
                break
        done_ids.append(idx), done_runs.append(r)
    if not done_ids:
        return live, run
    return torch.cat(done_ids), torch.cat(done_runs)


def _csr_pairs(ptr: torch.Tensor, flat: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, v)``: every entry ``v`` of the CSR rows ``idx``, with ``r`` its position in ``idx``."""
    start, count = ptr[idx], ptr[idx + 1] - ptr[idx]
    total = int(count.sum()) if len(idx) else 0
    r = torch.repeat_interleave(torch.arange(len(idx), device=idx.device), count)
    within = torch.arange(total, device=idx.device) - torch.repeat_interleave(count.cumsum(0) - count, count)
    return r, flat[torch.repeat_interleave(start, count) + within]


def _rows_mask(ptr: torch.Tensor, flat: torch.Tensor, idx: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``(len(idx), n_cols)`` bool mask of the CSR rows ``idx``."""
    mask = torch.zeros((len(idx), n_cols), dtype=torch.bool, device=idx.device)
    r, cols = _csr_pairs(ptr, flat, idx)
    mask[r, cols] = True
    return mask


def step_calibration(model: LFTR, prep: Prepared, ckpt_dir: Path | None = None) -> dict[int, int]:
    """Per-horizon read step (0-based) chosen on the validation split (module docstring, ``calibrated``); cached
    in ``ckpt_dir/calibration.json`` keyed by the checkpoint's weights."""
    import json

    cfg = model.cfg
    digest = hashlib.sha1(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    f = ckpt_dir / "calibration.json" if ckpt_dir is not None else None
    if f is not None and f.exists():
        d = json.loads(f.read_text(encoding="utf-8"))
        if d.get("weights_sha1") == digest:
            return {int(h): int(t) for h, t in d["steps"].items()}
    rows = prep.data.rows(cfg.val_split, main_only=True)
    steps: dict[int, int] = {}
    r_at: dict[int, list[float]] = {}
    if len(rows):
        per_step = step_vectors(model, prep, rows, steps="all", seed=cfg.seed)  # (n, H, K, d)
        device = next(model.parameters()).device
        hits = np.stack([recall_at_k_per_query(torch_main_pool_stats(prep, rows, per_step[:, t], device=device,
                                                                     cut=cfg.val_k), cfg.val_k)
                         for t in range(per_step.shape[1])], 1)  # (n, H)
        hz = prep.data.horizon[rows]
        for h in np.unique(hz):
            m = hz == h
            score = np.nanmean(hits[m], 0)
            matched = int(model.read_step(torch.tensor([int(h)]), "matched")[0])
            best = max(range(len(score)), key=lambda t: (score[t], t == matched, -t))
            steps[int(h)], r_at[int(h)] = best, [float(x) for x in score]
    if f is not None:
        from eval.io import write_json

        write_json(f, {"weights_sha1": digest, "val_k": cfg.val_k, "steps": {str(h): t for h, t in steps.items()},
                       "val_recall_by_step": {str(h): v for h, v in r_at.items()}})
    return steps


def recall_at_k_per_query(stats: dict, k: int) -> np.ndarray:
    from eval.metrics import recall_at_k as per_query_recall

    return per_query_recall(RankStats.from_arrays(stats), k)


def predict_query_vectors(model: LFTR, prep: Prepared, rows: np.ndarray, *, rule: str = "matched", seed: int = 0,
                          progress: bool = False, ckpt_dir: Path | None = None) -> QueryVectors:
    """LFTR query vectors of ``rows`` under a read rule (module docstring), as `QueryVectors` of the target space.
    ``ckpt_dir``: where the ``calibrated`` rule keeps its step map."""
    ids = [prep.bench.query_ids[int(r)] for r in rows]
    if rule in ("matched", "fixed1"):
        vec = step_vectors(model, prep, rows, rule=rule, seed=seed)
    elif rule == "calibrated":
        cal = step_calibration(model, prep, ckpt_dir)
        per_step = step_vectors(model, prep, rows, steps="all", seed=seed)  # (n, H, K, d)
        matched = model.read_step(torch.from_numpy(prep.data.horizon[rows]), "matched").numpy()
        step = np.asarray([cal.get(int(h), int(m)) for h, m in zip(prep.data.horizon[rows], matched, strict=True)],
                          np.int64)
        vec = per_step[np.arange(len(rows)), step]
    elif rule == "multi_hypothesis":
        vec = step_vectors(model, prep, rows, steps="means", seed=seed)
    elif rule == "best_step_oracle":
        per_step = step_vectors(model, prep, rows, steps="all", seed=seed)  # (n, H, K, d)
        cost = np.full((len(rows), per_step.shape[1]), np.inf)
        for t in range(per_step.shape[1]):
            st = main_pool_stats(prep, rows, per_step[:, t], progress=progress)
            cost[:, t] = np.nan_to_num(first_rank(RankStats.from_arrays(st)), nan=np.inf)
        best = np.where(np.isfinite(cost).any(1), cost.argmin(1), 0)
        vec = per_step[np.arange(len(rows)), best]
    else:
        raise InputError(f"unknown read rule {rule!r}")
    return QueryVectors(ids, vec, prep.target.name)
