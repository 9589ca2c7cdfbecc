"""LFTR inference: query vectors under a read rule, validation R@k, and runs.

Read rules (`retrieval.lftr.config.READ_RULES`), with ``mu_1..mu_H`` the rollout of a query:

- ``matched``: the K samples around ``mu_h`` (h = the query's horizon, clipped to H);
- ``fixed1``: the K samples around ``mu_1``;
- ``multi_hypothesis``: the H step means ``P(mu_1)..P(mu_H)`` at once (an item scores its max over steps);
- ``best_step_oracle``: per query, the K samples of the step whose ranking puts the main-pool GT highest
  (smallest tie-aware expected rank of the first GT item, `eval.metrics.first_rank`); it reads the GT, so it is
  an analysis oracle, never a method.

Sampling noise at inference is drawn once per query from a generator seeded with the config's seed and shared by
every rollout step, so predictions are deterministic and the step-``t`` vectors of every rule are identical;
sample 1 is always the mean.
"""

from __future__ import annotations

import numpy as np
import torch

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
    queries = [bench.query(int(r)) for r in rows]
    all_pools, exclude, _ = benchmark_groups(bench, queries)
    pools = {"type2-all": all_pools["type2-all"]}
    src = DenseSource(vectors, space.items, space.item_rows, reduce="max")
    return score_stream(src, pools, exclude, k=1, progress=progress).stats["type2-all"]


def recall_at_k(stats: dict, k: int) -> float:
    """Micro tie-aware R@k (expected hit@k) over the queries with a non-empty pool (`eval.metrics`)."""
    from eval.metrics import RankStats, mean_valid
    from eval.metrics import recall_at_k as per_query_recall

    return mean_valid(per_query_recall(RankStats.from_arrays(stats), k))[0]


def validation_recall(model: LFTR, prep: Prepared) -> float:
    """R@val_k of the matched read on the validation split (queries with a non-empty main pool)."""
    cfg = model.cfg
    rows = prep.data.rows(cfg.val_split)
    if len(rows) == 0:
        return 0.0
    vec = step_vectors(model, prep, rows, rule="matched", seed=cfg.seed)
    return recall_at_k(main_pool_stats(prep, rows, vec), cfg.val_k)


def predict_query_vectors(model: LFTR, prep: Prepared, rows: np.ndarray, *, rule: str = "matched", seed: int = 0,
                          progress: bool = False) -> QueryVectors:
    """LFTR query vectors of ``rows`` under a read rule (module docstring), as `QueryVectors` of the target space."""
    ids = [prep.bench.query_ids[int(r)] for r in rows]
    if rule in ("matched", "fixed1"):
        vec = step_vectors(model, prep, rows, rule=rule, seed=seed)
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
        raise ValueError(f"unknown read rule {rule!r}")
    return QueryVectors(ids, vec, prep.target.name)
