"""Significance tests: determinism, calibration on known cases, agreement with scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from eval.stats import (
    MIN_BOOTSTRAP_N,
    mcnemar,
    mcnemar_exact,
    paired_bootstrap,
    paired_bootstrap_by,
    paired_ttest,
    seed_summary,
)


def test_bootstrap_detects_a_real_difference_and_is_seeded():
    rng = np.random.default_rng(0)
    b = (rng.random(2000) < 0.12).astype(float)
    a = np.where(rng.random(2000) < 0.06, 1.0, b)  # a = b plus extra hits: a true +~5pp
    r = paired_bootstrap(a, b, n_resamples=2000, seed=3)
    assert r.delta == pytest.approx(a.mean() - b.mean())
    assert r.ci_low < r.delta < r.ci_high and r.ci_low > 0
    assert r.p_value == pytest.approx(1 / 2001)
    assert paired_bootstrap(a, b, n_resamples=2000, seed=3) == r
    assert paired_bootstrap(a, b, n_resamples=2000, seed=4) != r
    # the CI matches the normal approximation of the mean difference
    se = (a - b).std(ddof=1) / np.sqrt(len(a))
    assert r.ci_high - r.ci_low == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_bootstrap_null_is_not_significant_and_p_is_calibrated():
    rng = np.random.default_rng(1)
    ps = np.array([paired_bootstrap(rng.random(200), rng.random(200), n_resamples=300, seed=i).p_value
                   for i in range(200)])
    # under H0 the p-values are roughly uniform
    assert 0.01 <= (ps < 0.05).mean() <= 0.1
    assert 0.38 <= (ps < 0.5).mean() <= 0.62


def test_bootstrap_drops_nan_pairs_and_stratifies():
    a = np.array([1, 0, np.nan, 1, 1, 0, 1, 1.0])
    b = np.array([0, 0, 1, np.nan, 1, 0, 0, 1.0])
    r = paired_bootstrap(a, b, n_resamples=500)
    assert r.n == 6 and r.delta == pytest.approx((3 - 1) / 6 * 1)
    h = np.array([1, 1, 2, 2, 2, 3, 3, 3])
    rs = paired_bootstrap(a, b, n_resamples=500, strata=h)
    assert rs.delta == r.delta and rs.n == 6
    by = paired_bootstrap_by(a, b, h, n_resamples=300, min_n=1)
    assert set(by) == {1, 2, 3} and by[1].n == 2 and by[2].n == 1
    # a stratum whose differences are constant leaves no resampling variance in it
    by = paired_bootstrap_by(np.ones(6), np.zeros(6), np.array([1, 1, 1, 2, 2, 2]), n_resamples=200, min_n=1)
    assert by[1].ci_low == by[1].ci_high == 1.0


def test_mcnemar_exact_matches_binomial_and_paper_counts():
    # the paper's fusion vs M3 discordant counts: 305 vs 188 -> p = 1.5e-7
    a = np.r_[np.ones(305), np.zeros(188), np.ones(100), np.zeros(1837)]
    b = np.r_[np.zeros(305), np.ones(188), np.ones(100), np.zeros(1837)]
    r = mcnemar_exact(a, b)
    assert (r.b, r.c, r.n) == (305, 188, 2430)
    assert r.p_value == pytest.approx(sps.binomtest(305, 493, 0.5).pvalue)
    assert 1.0e-7 < r.p_value < 2.0e-7
    assert mcnemar_exact(a, a).p_value == 1.0
    with pytest.raises(ValueError, match="binary"):
        mcnemar_exact([0.5, 1], [0, 1])


def test_seed_summary_and_paired_ttest():
    s = seed_summary({0: 16.0, 1: 17.0, 2: 15.0})
    assert (s.mean, s.n) == (16.0, 3) and s.std == pytest.approx(1.0) and str(s) == "16.00±1.00"
    assert seed_summary([3.0]).std == 0.0
    a = {0: 16.1, 1: 17.2, 2: 15.3, 3: 16.8, 4: 15.9}
    b = {0: 12.0, 1: 12.5, 2: 11.1, 3: 13.0, 4: 11.9, 9: 30.0}
    r = paired_ttest(a, b)
    ref = sps.ttest_rel([a[s] for s in range(5)], [b[s] for s in range(5)])
    assert r.seeds == (0, 1, 2, 3, 4) and r.df == 4
    assert r.t == pytest.approx(ref.statistic) and r.p_value == pytest.approx(ref.pvalue)
    with pytest.raises(ValueError, match="common seeds"):
        paired_ttest({0: 1.0}, {0: 2.0})


def test_bootstrap_gives_no_p_value_below_the_minimum_group():
    """One or two queries printed "p < 1e-4": a point-mass bootstrap. Below MIN_BOOTSTRAP_N there is no p-value."""
    for n in (1, 2, MIN_BOOTSTRAP_N - 1):
        r = paired_bootstrap(np.ones(n), np.zeros(n), n_resamples=500)
        assert r.p_value is None and not r.significant() and r.delta == 1.0
    r = paired_bootstrap(np.ones(MIN_BOOTSTRAP_N), np.zeros(MIN_BOOTSTRAP_N), n_resamples=500)
    assert r.p_value == pytest.approx(1 / 501)
    # the rule behind the minimum: an exact sign-flip test on n pairs cannot go below 2^(1-n)
    assert 2.0 ** (1 - MIN_BOOTSTRAP_N) < 1e-4 <= 2.0 ** (2 - MIN_BOOTSTRAP_N)
    by = paired_bootstrap_by(np.ones(20), np.zeros(20), np.r_[np.ones(18), 2, 2], n_resamples=200)
    assert by[1.0].p_value is not None and by[2.0].p_value is None


def _tied_hits(rng, n, reverse):
    """Per-query hit@1 of two methods under heavy ties, from the real scorer: the row tie-break hit (which depends
    on the corpus row order) and the expected hit (which does not)."""
    from eval.metrics import RankStats, recall_at_k
    from eval.scoring import DenseSource, score_stream

    n_items, n_states = 60, 4
    state = rng.integers(0, n_states, n_items)
    pools = [np.flatnonzero(state == rng.integers(0, n_states))[:3] for _ in range(n)]
    out = {}
    for name in ("a", "b"):
        qv = rng.integers(0, 3, (n, n_states)).astype(np.float32)  # a few distinct state scores: heavy ties
        src = DenseSource(qv, np.eye(n_states, dtype=np.float32), item_rows=state)
        order = np.arange(n_items)[::-1] if reverse else np.arange(n_items)
        perm = DenseSource(qv, np.eye(n_states, dtype=np.float32), item_rows=state[order])
        inv = np.argsort(order)
        res = score_stream(perm if reverse else src, {"p": [inv[p] for p in pools]}, None, k=1, progress=False)
        st = RankStats.from_arrays(res.stats["p"])
        out[name] = (recall_at_k(st, 1, "row"), recall_at_k(st, 1, "expected"))
    return out


def test_mcnemar_is_independent_of_row_order_and_honours_the_tie_rule():
    """The issue: b/c 45/25 (p = 0.022) vs 32/31 (p = 1) on the same scores with the corpus rows reversed."""
    fwd = _tied_hits(np.random.default_rng(5), 400, reverse=False)
    rev = _tied_hits(np.random.default_rng(5), 400, reverse=True)
    row_f = mcnemar(fwd["a"][0], fwd["b"][0])
    row_r = mcnemar(rev["a"][0], rev["b"][0])
    assert row_f.method == row_r.method == "exact"
    assert (row_f.b, row_f.c) != (row_r.b, row_r.c)  # the row tie-break moves the discordant counts
    np.testing.assert_allclose(fwd["a"][1], rev["a"][1], atol=1e-12)  # expected hits do not move
    exp_f = mcnemar(fwd["a"][1], fwd["b"][1], n_resamples=2000, seed=1)
    exp_r = mcnemar(rev["a"][1], rev["b"][1], n_resamples=2000, seed=1)
    assert exp_f.method == "randomization" and exp_f == exp_r
    assert exp_f.b - exp_f.c == pytest.approx(np.sum(fwd["a"][1] - fwd["b"][1]))


def test_mcnemar_on_binary_hits_is_the_exact_test_and_randomization_is_calibrated():
    rng = np.random.default_rng(2)
    a, b = (rng.random(300) < 0.3).astype(float), (rng.random(300) < 0.2).astype(float)
    r, ref = mcnemar(a, b), mcnemar_exact(a, b)
    assert (r.b, r.c, r.p_value, r.method) == (ref.b, ref.c, ref.p_value, "exact")
    # null: both methods' expected hits drawn from one distribution -> p roughly uniform
    ps = np.array([mcnemar(rng.beta(0.5, 2, 150), rng.beta(0.5, 2, 150), n_resamples=400, seed=i).p_value
                   for i in range(150)])
    assert 0.01 <= (ps < 0.05).mean() <= 0.1 and 0.35 <= (ps < 0.5).mean() <= 0.65
    # a real difference is found
    x = rng.beta(0.5, 2, 300)
    assert mcnemar(np.minimum(1, x + 0.1), x, n_resamples=1000).p_value < 0.01
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mcnemar([1.5, 0], [0, 0])
