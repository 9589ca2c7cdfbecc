"""The paper's complementarity analysis of retrieval spaces (App. I, Figs. 10-11): do two spaces solve different
queries, and do they organise states differently?

Given runs of one method in several spaces (e.g. LFTR in the semantic, SSL and CLIP-style spaces), over their common
queries with a main-pool GT in the population (`eval.evaluate.Population`; by default the main table's: fair test
queries of Q1-Q4, so both tables count the same queries):

- **per-query wins**: ``h_s(q)`` = the tie-aware expected hit@5 of run ``s`` on query ``q`` (eval's R@k per
  query: the probability that a GT item is in the top 5 under a random order of tied items, so a semantic space's
  state-level ties are not broken by corpus row order); tie orders of different runs are independent, so the share
  of queries only space ``s`` gets right is ``mean_q h_s prod_{t != s} (1 - h_t)``, all right ``mean_q prod_s h_s``,
  and the **union** (any space right: the per-query oracle over spaces) ``mean_q 1 - prod_s (1 - h_s)`` — plain
  counts when nothing ties — next to each run's R@5 and, when given, the fused run's;
- **pairwise**: for each pair of spaces, both / only A / only B / neither;
- **state-similarity correlation**: for each space, the cosine similarity of every pair of states' prototypes
  (`retrieval.spaces.Space.state_prototypes`: the state embedding in a semantic space, the mean segment feature in a
  visual one), over the states present in every space (all pairs up to ``max_pairs``, else a seeded random sample
  of pairs); Pearson r between spaces. The paper measures r = 0.40 between BGE and DINOv2.
- **space geometry** (`space_geometry`, a collapse diagnostic, not in the paper): per space, over its retrieval items
  (segment features of a visual space, state embeddings of a semantic one), the **effective dimension**
  ``(sum_i l_i)^2 / sum_i l_i^2`` of the eigenvalues ``l_i`` of the centred items' covariance (the participation
  ratio: ``d`` for isotropic items, 1 when they vary along one direction) and the **anisotropy**, the mean cosine of
  the items to their mean direction (0 for items spread around the origin, 1 when all point one way). A space
  whose items span a few directions cannot separate many states, whatever reads it. Each space also names its
  text model (``text_model``): a semantic space's encoder, or the locked text tower a CLIP-style image space maps
  into (``meta.json``'s ``text_model``); absent for a visual space with no text tower.

`complementarity` returns a JSON-able dict; `to_markdown` renders it (``python -m retrieval complementarity``
writes both).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.evaluate import Population
from eval.metrics import RankStats, recall_at_k
from eval.runs import read_run


def run_hits(run, k: int = 5) -> dict[str, float]:
    """query id -> tie-aware expected hit@k of the main pool, for queries with GT."""
    st = RankStats.from_run(run, "type2-all")
    h = recall_at_k(st, k)
    return {q: float(x) for q, x in zip(run.query_ids, h, strict=True) if np.isfinite(x)}


def run_space(path: str | Path) -> str:
    from retrieval.queries import load_query_vectors, sidecar_path

    return load_query_vectors(sidecar_path(path)).space


def state_similarity_correlation(bench: Benchmark, spaces: list[str], *, max_pairs: int = 200_000,
                                 seed: int = 0) -> dict:
    """Pearson r of per-pair state-prototype cosine similarities between every two ``spaces`` (module docstring)."""
    from retrieval.spaces import Space

    protos = {s: Space.load(bench, s).state_prototypes() for s in spaces}
    present = np.logical_and.reduce([np.linalg.norm(p, axis=1) > 0 for p in protos.values()])
    idx = np.flatnonzero(present)
    n = len(idx)
    total = n * (n - 1) // 2
    if total == 0:
        return {"states": int(n), "pairs": 0, "r": {}}
    rng = np.random.default_rng(seed)
    if total <= max_pairs:
        a, b = np.triu_indices(n, 1)
    else:
        a, b = rng.integers(0, n, max_pairs), rng.integers(0, n, max_pairs)
        keep = a != b
        a, b = a[keep], b[keep]
    sims = {s: np.einsum("ij,ij->i", p[idx[a]], p[idx[b]]) for s, p in protos.items()}
    r = {f"{x}~{y}": float(np.corrcoef(sims[x], sims[y])[0, 1]) for x, y in combinations(spaces, 2)}
    return {"states": int(n), "pairs": int(len(a)), "r": r,
            "mean_similarity": {s: float(v.mean()) for s, v in sims.items()}}


def geometry(x: np.ndarray) -> dict:
    """Effective dimension and anisotropy of the rows of ``x`` (module docstring)."""
    x = np.asarray(x, np.float64)
    if len(x) < 2:
        raise InputError("the geometry of a space needs at least two items")
    mu = x.mean(0)
    xc = x - mu
    ev = np.clip(np.linalg.eigvalsh(xc.T @ xc), 0.0, None)  # the covariance spectrum (up to 1/n): one d x d product
    eff = float(ev.sum() ** 2 / (ev ** 2).sum()) if ev.sum() > 0 else 0.0
    norms = np.linalg.norm(x, axis=1) * np.linalg.norm(mu)
    aniso = float(np.mean((x @ mu) / np.maximum(norms, 1e-12)))
    return {"items": int(len(x)), "dim": int(x.shape[1]), "effective_dim": eff, "anisotropy": aniso}


def space_geometry(bench: Benchmark, space: str, *, max_items: int = 50_000, seed: int = 0) -> dict:
    """`geometry` of a space's retrieval items: at most ``max_items`` (a seeded random sample beyond that)."""
    from retrieval.spaces import Space

    sp_ = Space.load(bench, space)
    x = sp_.items
    if len(x) > max_items:
        x = x[np.sort(np.random.default_rng(seed).choice(len(x), max_items, replace=False))]
    meta = sp_.meta
    text_model = meta.get("text_model") if meta.get("text_tower") else None
    if sp_.kind == "semantic":
        text_model = meta.get("model")
    return {"kind": sp_.kind, **geometry(x), **({"text_model": text_model} if text_model else {})}


def complementarity(bench: Benchmark, runs: dict[str, str | Path], *, fused: str | Path | None = None, k: int = 5,
                    max_pairs: int = 200_000, geometry_spaces: list[str] = (),
                    population: Population | None = Population()) -> dict:
    """The analysis of the runs ``{label: path}`` over their common queries in ``population`` (None: every query
    of the runs; module docstring)."""
    if len(runs) < 2:
        raise InputError("complementarity needs runs in at least two spaces")
    hits = {name: run_hits(read_run(p), k) for name, p in runs.items()}
    common = set.intersection(*(set(h) for h in hits.values()))
    if population is not None:
        common &= set(population.query_ids(bench))
    common = sorted(common)
    if not common:
        where = "" if population is None else f" in the population ({population.describe()})"
        raise InputError(f"the runs share no query with a main-pool GT{where}")
    H = np.asarray([[hits[n][q] for q in common] for n in runs], dtype=np.float64)  # (n_runs, n_queries)
    names = list(runs)
    miss = 1.0 - H
    out = {"queries": len(common), "k": k,
           "population": population.describe() if population is not None else "every query of the runs",
           "recall": {n: float(H[i].mean()) for i, n in enumerate(names)},
           "only": {n: float((H[i] * np.delete(miss, i, 0).prod(0)).mean()) for i, n in enumerate(names)},
           "all": float(H.prod(0).mean()), "union": float((1.0 - miss.prod(0)).mean()),
           "none": float(miss.prod(0).mean()), "pairs": {}}
    for i, j in combinations(range(len(names)), 2):
        a, b = H[i], H[j]
        out["pairs"][f"{names[i]}~{names[j]}"] = {"both": float((a * b).mean()), "only_a": float((a * (1 - b)).mean()),
                                                  "only_b": float(((1 - a) * b).mean()),
                                                  "neither": float(((1 - a) * (1 - b)).mean())}
    if fused is not None:
        fh = run_hits(read_run(fused), k)
        out["fused"] = {"run": str(fused), "recall": float(np.mean([fh[q] for q in common if q in fh]))}
    spaces = {n: run_space(p) for n, p in runs.items()}
    out["spaces"] = spaces
    out["state_similarity"] = state_similarity_correlation(bench, list(dict.fromkeys(spaces.values())),
                                                           max_pairs=max_pairs)
    out["geometry"] = {s: space_geometry(bench, s) for s in dict.fromkeys([*spaces.values(), *geometry_spaces])}
    return out


def to_markdown(res: dict) -> str:
    k = res["k"]
    pop = res.get("population", "every query of the runs")
    lines = [f"Per-query wins (tie-aware expected hit@{k}; {res['queries']} queries with GT common to all runs; "
             f"population: {pop})", "",
             f"| run (space) | R@{k} | only this space right |", "|---|---:|---:|"]
    for n, r in res["recall"].items():
        lines.append(f"| {n} ({res['spaces'][n]}) | {100 * r:.1f} | {100 * res['only'][n]:.1f} |")
    lines.append(f"| all right | {100 * res['all']:.1f} | |")
    lines.append(f"| **union (any space right)** | **{100 * res['union']:.1f}** | |")
    if "fused" in res:
        lines.append(f"| fused run | {100 * res['fused']['recall']:.1f} | |")
    lines += ["", "| pair | both | only A | only B | neither |", "|---|---:|---:|---:|---:|"]
    for p, v in res["pairs"].items():
        lines.append(f"| {p} | {100 * v['both']:.1f} | {100 * v['only_a']:.1f} | {100 * v['only_b']:.1f} | "
                     f"{100 * v['neither']:.1f} |")
    ss = res["state_similarity"]
    lines += ["", f"State-similarity correlation (Pearson r of per-pair state-prototype cosines; {ss['states']} states, "
                  f"{ss['pairs']} pairs)", "", "| spaces | r |", "|---|---:|"]
    lines += [f"| {p} | {r:.2f} |" for p, r in ss["r"].items()]
    if res.get("geometry"):
        lines += ["", "Space geometry (effective dimension: participation ratio of the items' covariance spectrum; "
                      "anisotropy: mean cosine of the items to their mean direction)", "",
                  "| space | kind | items | dim | effective dimension | anisotropy |", "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {s} | {g['kind']} | {g['items']} | {g['dim']} | {g['effective_dim']:.1f} | {g['anisotropy']:.2f} |"
                  for s, g in res["geometry"].items()]
    return "\n".join(lines) + "\n"
