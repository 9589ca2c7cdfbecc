"""Metrics: tie-aware closed forms against brute-force enumeration of orderings; tie-free runs against ranx."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from eval.metrics import (
    RankStats,
    first_rank,
    macro_over_horizons,
    median_first_rank,
    ndcg_at_k,
    prob_first_after,
    recall_at_k,
    reciprocal_rank,
)
from eval.runs import Run
from eval.scoring import DenseSource, score_stream


def _stats(a, n, t, f=None, n_pos=None):
    a, n, t = (np.atleast_1d(np.asarray(x, np.int64)) for x in (a, n, t))
    f = np.zeros_like(a) if f is None else np.atleast_1d(np.asarray(f, np.int64))
    n_pos = t if n_pos is None else np.atleast_1d(np.asarray(n_pos, np.int64))
    return RankStats(n_pos, a, n, t, f)


@pytest.mark.parametrize("a,n,t", [(0, 0, 1), (0, 3, 1), (2, 3, 2), (4, 5, 3), (0, 6, 4), (7, 1, 1), (1, 7, 2)])
def test_closed_forms_equal_permutation_average(a, n, t):
    """Average over every placement of the T tied positives among the T + N tied slots (all equally likely)."""
    ranks = []
    for pos in itertools.combinations(range(1, n + t + 1), t):
        ranks.append(a + min(pos))
    ranks = np.array(ranks, dtype=np.float64)
    st = _stats(a, n, t)
    for k in (1, 2, 3, 5, 8, 20):
        assert recall_at_k(st, k)[0] == pytest.approx((ranks <= k).mean(), abs=1e-12)
    assert reciprocal_rank(st)[0] == pytest.approx((1 / ranks).mean(), abs=1e-12)
    assert first_rank(st)[0] == pytest.approx(ranks.mean(), abs=1e-12)
    assert first_rank(st, "optimistic")[0] == ranks.min() and first_rank(st, "pessimistic")[0] == ranks.max()


def test_large_tie_groups_use_stable_forms():
    # T = 1: the digamma form against direct summation; big m: log-gamma against the product
    a, n = 3, 5000
    direct = np.mean(1.0 / (a + np.arange(1, n + 2)))
    assert reciprocal_rank(_stats(a, n, 1))[0] == pytest.approx(direct, rel=1e-12)
    m = np.array([300, 1000, 4000])
    prod = [np.prod([(n - i) / (n + 3 - i) for i in range(mm)]) for mm in m]
    np.testing.assert_allclose(prob_first_after(m, n, 3), prod, rtol=1e-9)
    # T > 1 summation against the permutation average computed in closed combinatorial form
    t = 4
    x = np.arange(1, n + 2)
    pmf = np.array([math.comb(n + t - xx, t - 1) for xx in x], dtype=np.float64) / math.comb(n + t, t)
    assert reciprocal_rank(_stats(a, n, t))[0] == pytest.approx(np.sum(pmf / (a + x)), rel=1e-10)


def test_empty_pools_are_nan_and_skipped():
    st = _stats([0, 5], [0, 0], [1, 0], n_pos=[2, 0])
    r = recall_at_k(st, 5)
    assert r[0] == 1.0 and np.isnan(r[1])
    assert np.isnan(reciprocal_rank(st)[1]) and np.isnan(first_rank(st)[1])
    assert median_first_rank(st) == 1.0


def test_median_rank():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 100, size=51)
    st = _stats(a, np.zeros(51), np.ones(51))
    assert median_first_rank(st) == np.sort(a + 1)[25]
    st = _stats(a[:50], np.zeros(50), np.ones(50))
    assert median_first_rank(st) == np.sort(a[:50] + 1)[24]  # lower median
    # with ties: the smallest m whose pooled P(R <= m) reaches 1/2, checked by enumeration
    a, n, t = np.array([0, 2, 5, 1]), np.array([3, 2, 0, 4]), np.array([1, 2, 1, 1])
    pooled = np.zeros(20)
    for ai, ni, ti in zip(a, n, t, strict=True):
        combos = list(itertools.combinations(range(1, ni + ti + 1), ti))
        for pos in combos:
            pooled[ai + min(pos)] += 1 / len(combos) / len(a)
    m = int(np.flatnonzero(np.cumsum(pooled) >= 0.5 - 1e-12)[0])
    assert median_first_rank(_stats(a, n, t)) == m
    assert median_first_rank(_stats(a, n, t), "row") == np.sort(a + 1)[1]


def test_macro_over_horizons_folds_and_skips():
    v = np.array([1, 0, 1, 1, 0, np.nan, 1.0])
    h = np.array([1, 1, 2, 6, 7, 3, 5])
    # h1: 0.5, h2: 1, h3: none, h5 (5, 6, 7 folded): (1 + 0 + 1) / 3
    assert macro_over_horizons(v, h) == pytest.approx((0.5 + 1 + 2 / 3) / 3)


# ---------- runs built by the real scorer ----------

def _tiny_tied_run(seed, n_items=7, nq=6, k=5):
    """Integer-valued scores on a tiny corpus: many ties. Pools: in/cross/bge tiers, main = in + cross."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-1, 2, size=(nq, 2)).astype(np.float32)
    x = rng.integers(-1, 2, size=(n_items, 2)).astype(np.float32)
    full = q @ x.T
    tiers = {}
    for name in ("in_dataset", "cross_dataset", "bge_similar"):
        tiers[name] = [rng.choice(n_items, size=rng.integers(0, 3), replace=False) for _ in range(nq)]
    main = [np.union1d(a, b) for a, b in zip(tiers["in_dataset"], tiers["cross_dataset"], strict=True)]
    pools = {"type2-all": main, **tiers}
    res = score_stream(DenseSource(q, x), pools, None, k=k, q_block=4, c_chunk=4, progress=False)
    run = Run("tiny", {}, [f"q{i}" for i in range(nq)], [[str(j) for j in r] for r in res.topk_rows],
              res.topk_scores, res.stats, "toy", res.kth_tie_unlisted, res.ranked)
    return run, full, pools


def _orderings(scores):
    """Every ranking consistent with the scores (ties permuted in all ways)."""
    levels = sorted(set(scores.tolist()), reverse=True)
    groups = [list(np.flatnonzero(scores == v)) for v in levels]
    for perms in itertools.product(*(itertools.permutations(g) for g in groups)):
        yield [i for p in perms for i in p]


@pytest.mark.parametrize("seed", range(6))
def test_tie_aware_metrics_equal_enumeration_on_real_runs(seed):
    run, full, pools = _tiny_tied_run(seed)
    gains = {"in_dataset": 2.0, "cross_dataset": 1.0, "bge_similar": 0.5}
    st = RankStats.from_run(run, "type2-all")
    got = {"R@1": recall_at_k(st, 1), "R@3": recall_at_k(st, 3), "RR": reciprocal_rank(st),
           "nDCG@4": ndcg_at_k(run.ranked, 4, gains)}
    for i in range(full.shape[0]):
        gain = np.zeros(full.shape[1])
        for name, g in gains.items():
            gain[pools[name][i]] = np.maximum(gain[pools[name][i]], g)
        pos = set(pools["type2-all"][i].tolist())
        ideal = np.sort(gain)[::-1][:4]
        idcg = np.sum(ideal / np.log2(np.arange(2, len(ideal) + 2)))
        acc = {key: [] for key in got}
        for order in _orderings(full[i]):
            ranks = [r for r, item in enumerate(order, 1) if item in pos]
            first = min(ranks) if ranks else None
            if first is not None:
                acc["R@1"].append(first <= 1)
                acc["R@3"].append(first <= 3)
                acc["RR"].append(1 / first)
            dcg = sum(gain[item] / np.log2(r + 1) for r, item in enumerate(order[:4], 1))
            acc["nDCG@4"].append(dcg / idcg if idcg > 0 else np.nan)
        for key, vals in acc.items():
            expect = np.mean(vals) if vals and not np.isnan(vals).all() else np.nan
            if np.isnan(expect):
                assert np.isnan(got[key][i]), (key, i)
            else:
                assert got[key][i] == pytest.approx(expect, abs=1e-12), (key, i)
    assert (run.stats["type2-all"]["n_tie_neg"] > 0).any()  # the data really has ties


def test_row_tie_break_matches_the_listed_order():
    for seed in range(4):
        run, full, pools = _tiny_tied_run(seed, k=7)  # k = corpus size: the list is the whole ranking
        st = RankStats.from_run(run, "type2-all")
        r = first_rank(st, "row")
        for i in range(full.shape[0]):
            pos = set(pools["type2-all"][i].tolist())
            listed = [int(x) for x in run.topk_ids[i]]
            ranks = [j for j, item in enumerate(listed, 1) if item in pos]
            assert (r[i] == min(ranks)) if ranks else np.isnan(r[i])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaTypeSafetyWarning")
def test_tie_free_runs_equal_ranx():
    ranx = pytest.importorskip("ranx")
    rng = np.random.default_rng(11)
    nq, n_items, d, k = 40, 300, 16, 50
    q = rng.standard_normal((nq, d)).astype(np.float32)
    x = rng.standard_normal((n_items, d)).astype(np.float32)
    full = q @ x.T
    exclude = [rng.choice(n_items, size=5, replace=False) for _ in range(nq)]
    tiers = {name: [np.setdiff1d(rng.choice(n_items, size=rng.integers(1, 6), replace=False), exclude[i])
                    for i in range(nq)] for name in ("in_dataset", "cross_dataset")}
    main = [np.union1d(a, b) for a, b in zip(tiers["in_dataset"], tiers["cross_dataset"], strict=True)]
    res = score_stream(DenseSource(q, x), {"type2-all": main, **tiers}, exclude, k=k, q_block=16, c_chunk=64,
                       progress=False)
    run = Run("r", {}, [f"q{i}" for i in range(nq)], [[f"d{j}" for j in r] for r in res.topk_rows], res.topk_scores,
              res.stats, "toy", res.kth_tie_unlisted, res.ranked)
    assert (res.stats["type2-all"]["n_tie_neg"] == 0).all()
    gains = {"in_dataset": 2, "cross_dataset": 1}
    qrels_d, run_d = {}, {}
    for i in range(nq):
        rel = {}
        for name, g in gains.items():
            for j in tiers[name][i]:
                rel[f"d{j}"] = max(rel.get(f"d{j}", 0), g)
        qrels_d[f"q{i:03d}"] = rel
        keep = np.setdiff1d(np.arange(n_items), exclude[i])
        run_d[f"q{i:03d}"] = {f"d{j}": float(full[i, j]) for j in keep}
    qrels, rrun = ranx.Qrels(qrels_d), ranx.Run(run_d)
    names = [f"hit_rate@{kk}" for kk in (1, 5, 10, 20, 50)] + ["mrr"] + [f"ndcg@{kk}" for kk in (1, 5, 10, 50)]
    ref = ranx.evaluate(qrels, rrun, names, return_mean=False)  # one call: ranx compiles per call
    st = RankStats.from_run(run, "type2-all")
    for tie in ("expected", "row", "pessimistic"):
        for kk in (1, 5, 10, 20, 50):
            np.testing.assert_allclose(recall_at_k(st, kk, tie), ref[f"hit_rate@{kk}"], atol=1e-9)
        np.testing.assert_allclose(reciprocal_rank(st, tie), ref["mrr"], atol=1e-9)
    for kk in (1, 5, 10, 50):
        np.testing.assert_allclose(ndcg_at_k(run.ranked, kk, gains), ref[f"ndcg@{kk}"], atol=1e-9)


def _exact_median(a, n, t):
    """The lower median of the pooled first-rank distribution in exact rational arithmetic."""
    from fractions import Fraction

    def p_after(m, nn, tt):
        if m <= 0:
            return Fraction(1)
        if m > nn:
            return Fraction(0)
        return Fraction(math.comb(nn + tt - m, tt), math.comb(nn + tt, tt))

    total = len(a)
    for m in range(1, int(max(a[i] + n[i] + 1 for i in range(total))) + 1):
        s = sum(1 - p_after(m - a[i], n[i], t[i]) for i in range(total))
        if 2 * s >= total:
            return m
    raise AssertionError("unreachable")


def test_median_rank_is_exact_at_one_half():
    """Sums of hit probabilities that equal n/2 exactly (1/3 + 2/3 + ...) but fall one rounding short in float64
    moved MedR one rank up; every case must agree with exact rational arithmetic."""
    # cases whose float64 sum fell short of exactly n/2 (found against the former implementation), then random ones
    cases = [([3, 1], [5, 8], [1, 2]), ([3, 2], [4, 4], [1, 1]), ([1, 0], [7, 7], [2, 2]), ([1, 3], [6, 3], [1, 4])]
    rng = np.random.default_rng(3)
    for _ in range(400):
        size = int(rng.integers(1, 9))
        cases.append((rng.integers(0, 4, size).tolist(), rng.integers(0, 12, size).tolist(),
                      rng.integers(1, 5, size).tolist()))
    hits_half = 0
    for a, n, t in cases:
        st = _stats(a, n, t)
        expect = _exact_median(a, n, t)
        assert median_first_rank(st) == expect, (a, n, t)
        from fractions import Fraction
        s = sum(1 - Fraction(math.comb(n[i] + t[i] - (expect - a[i]), t[i]), math.comb(n[i] + t[i], t[i]))
                if 0 < expect - a[i] <= n[i] else (1 if expect - a[i] > n[i] else 0) for i in range(len(a)))
        hits_half += 2 * s == len(a)
    assert hits_half > 20  # many cases sit exactly at one half: the test exercises the boundary


def test_prob_first_after_short_product_is_accurate():
    """P(X > m) is evaluated with min(m, T) factors; against exact rationals for large m and T."""
    from fractions import Fraction

    for m, n, t in [(300, 5000, 3), (4000, 5000, 2), (300, 800, 400), (700, 900, 600), (1, 10**6, 10**5)]:
        exact = Fraction(math.comb(n + t - m, t), math.comb(n + t, t))
        assert prob_first_after(np.array([m]), n, t)[0] == pytest.approx(float(exact), rel=1e-12, abs=1e-300)
