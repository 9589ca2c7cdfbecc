r"""Significance tests for comparing methods (PSR paper App. "Significance"; Table 2).

- `paired_bootstrap`: paired bootstrap over queries for a difference in a mean per-query metric (query-sampling
  variance; e.g. fusion vs M3 on the same queries), optionally stratified by horizon.
- `mcnemar`: McNemar's test, tie-aware (a sign-flip randomization test on per-query expected hits that is exactly
  McNemar's exact binomial test when every hit is 0/1); `mcnemar_exact`: the binomial test on 0/1 hits.
- `seed_summary`, `paired_ttest`: multi-seed mean +- std and a paired t-test across seeds (seed variance).

Each test is a short function returning a small frozen dataclass. Inputs are per-query arrays aligned on the same
queries; pairs where either value is NaN (an empty GT pool) are dropped first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from eval.errors import InputError

DEFAULT_RESAMPLES = 10_000
_CHUNK = 256
#: Smallest number of paired queries for which `paired_bootstrap` reports a p-value. With n pairs an exact paired
#: (sign-flip) test cannot give a two-sided p below 2^(1-n); from n = 15 on that floor (6.1e-5) is below the smallest
#: p the reports print ("<1e-4", the bootstrap's 1/(B+1) for B = 10^4), so every printed p is one an exact test on
#: the same pairs could reach. Below it the bootstrap's null distribution is too coarse to mean anything (one pair
#: is a point mass, which gives p = 1/(B+1)): the p-value is None, printed as "n too small".
MIN_BOOTSTRAP_N = 15


@dataclass(frozen=True)
class BootstrapResult:
    """``delta = mean(a) - mean(b)`` over n paired queries, its percentile CI, and the two-sided p-value (None when
    ``n < MIN_BOOTSTRAP_N``)."""

    delta: float
    ci_low: float
    ci_high: float
    p_value: float | None
    n: int
    mean_a: float
    mean_b: float
    n_resamples: int
    seed: int
    alpha: float

    def significant(self, level: float = 0.05) -> bool:
        return self.p_value is not None and self.p_value < level

    def to_dict(self) -> dict:
        return asdict(self)


def _paired(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise InputError(f"paired tests need two 1-d arrays of equal length, got {a.shape} and {b.shape}")
    ok = np.isfinite(a) & np.isfinite(b)
    return a[ok], b[ok], ok


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                     alpha: float = 0.05, strata: Sequence | None = None,
                     min_n: int = MIN_BOOTSTRAP_N) -> BootstrapResult:
    r"""Paired bootstrap for ``delta = mean(a) - mean(b)`` (a, b: per-query values of one metric, same queries).

    Resample the n per-query differences ``d_i = a_i - b_i`` with replacement ``B = n_resamples`` times (within each
    stratum, keeping its size, when ``strata`` are given: the stratified bootstrap); ``delta*_b`` is the resample
    mean. CI: the ``alpha/2`` and ``1 - alpha/2`` percentiles of ``delta*``. Two-sided p-value from the
    null-centred bootstrap distribution: ``p = (1 + #{b : |delta*_b - delta| >= |delta|}) / (B + 1)``
    (so the smallest reportable p is ``1/(B+1)``, i.e. "p < 1e-4" for 10^4 resamples). Deterministic for a seed.
    With fewer than ``min_n`` pairs (`MIN_BOOTSTRAP_N`) no p-value is given (``p_value = None``).
    """
    a, b, ok = _paired(a, b)
    n = len(a)
    if n == 0:
        raise InputError("no paired queries with values in both inputs")
    d = a - b
    delta = float(d.mean())
    rng = np.random.default_rng(seed)
    groups = [np.arange(n)]
    if strata is not None:
        s = np.asarray(strata)[ok]
        groups = [np.flatnonzero(s == v) for v in np.unique(s)]
    boots = np.empty(n_resamples)
    for c0 in range(0, n_resamples, _CHUNK):
        m = min(_CHUNK, n_resamples - c0)
        total = np.zeros(m)
        for g in groups:
            idx = g[rng.integers(0, len(g), size=(m, len(g)))]
            total += d[idx].sum(axis=1)
        boots[c0:c0 + m] = total / n
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    extreme = int(np.sum(np.abs(boots - delta) >= abs(delta)))
    p = float(min(1.0, (1 + extreme) / (n_resamples + 1))) if n >= min_n else None
    return BootstrapResult(delta, float(lo), float(hi), p, n, float(a.mean()), float(b.mean()), n_resamples, seed,
                           alpha)


def paired_bootstrap_by(a: Sequence[float], b: Sequence[float], groups: Sequence, **kw) -> dict:
    """`paired_bootstrap` within each group (e.g. per horizon); returns ``{group: BootstrapResult}`` (groups with
    no paired values are left out)."""
    a, b, g = np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(groups)
    out = {}
    for v in np.unique(g):
        m = g == v
        if (np.isfinite(a[m]) & np.isfinite(b[m])).any():
            out[v.item() if hasattr(v, "item") else v] = paired_bootstrap(a[m], b[m], **kw)
    return out


@dataclass(frozen=True)
class McNemarResult:
    """``b``: queries hit by A only, ``c``: by B only (expected counts for tie-aware hits); two-sided p-value;
    ``n`` paired queries; ``method``: "exact" (binomial on 0/1 hits) or "randomization" (sign flips,
    ``n_resamples`` draws)."""

    b: float
    c: float
    p_value: float
    n: int
    method: str = "exact"
    n_resamples: int = 0

    def significant(self, level: float = 0.05) -> bool:
        return self.p_value < level

    def to_dict(self) -> dict:
        return asdict(self)


def mcnemar_exact(hits_a: Sequence[float], hits_b: Sequence[float]) -> McNemarResult:
    r"""McNemar's exact test on paired binary hits: under H0 the discordant pairs split evenly, so
    ``p = P(|Bin(b + c, 1/2) - (b+c)/2| >= |b - (b+c)/2|)`` (scipy ``binomtest``, two-sided); ``p = 1`` without
    discordant pairs. Hits must be 0/1; `mcnemar` accepts tie-aware (expected) hits."""
    a, b_, _ = _paired(hits_a, hits_b)
    if not (np.isin(a, (0.0, 1.0)).all() and np.isin(b_, (0.0, 1.0)).all()):
        raise InputError("McNemar's exact test needs binary hits (0/1); use eval.stats.mcnemar for expected hits")
    only_a = int(np.sum((a == 1) & (b_ == 0)))
    only_b = int(np.sum((a == 0) & (b_ == 1)))
    from scipy import stats as sps  # slow to import: only where a test needs it

    p = 1.0 if only_a + only_b == 0 else float(sps.binomtest(only_a, only_a + only_b, 0.5).pvalue)
    return McNemarResult(only_a, only_b, p, len(a))


def mcnemar(hits_a: Sequence[float], hits_b: Sequence[float], *, n_resamples: int = DEFAULT_RESAMPLES,
            seed: int = 0) -> McNemarResult:
    r"""McNemar's test on per-query hits in [0, 1], tie-aware.

    ``h_i`` is a query's hit under the report's tie rule: 0/1 under a deterministic tie-break, the expected hit (a
    probability over orders of the tied items) under ``tie="expected"``. With ``d_i = h^A_i - h^B_i``:
    ``b = sum_i max(d_i, 0)``, ``c = sum_i max(-d_i, 0)`` (the expected discordant counts; ``b - c = D = sum_i
    d_i``). Under H0 the two methods are exchangeable within each query, so ``d_i`` and ``-d_i`` are equally likely
    and independent across queries: the randomization (sign-flip) test gives ``p = P(|sum_i s_i d_i| >= |D|)``
    with independent fair signs ``s_i``. When every ``d_i`` is in {-1, 0, 1} (0/1 hits), ``sum_i s_i d_i`` is
    ``2 Bin(b + c, 1/2) - (b + c)`` and the test *is* McNemar's exact test (computed by the binomial,
    ``method="exact"``). Otherwise the null is sampled (Fisher's paired randomization test):
    ``p = (1 + #{r : |sum_i s_ri d_i| >= |D|}) / (R + 1)`` over ``R = n_resamples`` seeded sign draws
    (``method="randomization"``; deterministic for a seed).

    Why this rule: hits under the row tie-break depend on the corpus row order -- under heavy ties, reversing the
    rows can turn b/c = 45/25 (p = 0.02) into 32/31 (p = 1) on the same scores -- and ignore the report's tie rule.
    Expected hits depend only on the scores, and where nothing ties the test is McNemar's own.
    """
    a, b_, _ = _paired(hits_a, hits_b)
    if ((a < 0) | (a > 1) | (b_ < 0) | (b_ > 1)).any():
        raise InputError("McNemar needs per-query hits (or expected hits) in [0, 1]")
    d = a - b_
    d = d[d != 0]
    if np.isin(d, (-1.0, 1.0)).all():
        res = mcnemar_exact(a, b_)
        return McNemarResult(res.b, res.c, res.p_value, res.n, "exact", 0)
    total = float(d.sum())
    rng = np.random.default_rng(seed)
    slack = 1e-9 * float(np.abs(d).sum())  # |D| is recomputed by each draw: count float-equal sums as extreme
    extreme = 0
    for c0 in range(0, n_resamples, _CHUNK):
        m = min(_CHUNK, n_resamples - c0)
        signs = rng.integers(0, 2, size=(m, len(d)), dtype=np.int8) * 2 - 1
        extreme += int(np.sum(np.abs(signs @ d) >= abs(total) - slack))
    p = min(1.0, (1 + extreme) / (n_resamples + 1))
    return McNemarResult(float(np.maximum(d, 0).sum()), float(np.maximum(-d, 0).sum()), p, len(a), "randomization",
                         n_resamples)


@dataclass(frozen=True)
class SeedSummary:
    """Mean and sample std (ddof = 1; 0 for a single seed) of one metric over seeds."""

    mean: float
    std: float
    n: int
    values: tuple[float, ...]

    def __str__(self) -> str:
        return f"{self.mean:.2f}±{self.std:.2f}"

    def to_dict(self) -> dict:
        return asdict(self)


def seed_summary(values: Sequence[float] | Mapping[int, float]) -> SeedSummary:
    v = np.asarray(list(values.values()) if isinstance(values, Mapping) else values, dtype=np.float64)
    if v.size == 0:
        raise InputError("no seeds")
    return SeedSummary(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, int(v.size), tuple(v.tolist()))


@dataclass(frozen=True)
class TTestResult:
    """Paired t-test across seeds: mean difference (a - b), t statistic, degrees of freedom, two-sided p."""

    delta: float
    t: float
    df: int
    p_value: float
    seeds: tuple

    def significant(self, level: float = 0.05) -> bool:
        return self.p_value < level

    def to_dict(self) -> dict:
        return asdict(self)


def paired_ttest(a: Mapping[int, float], b: Mapping[int, float]) -> TTestResult:
    r"""Paired t-test of per-seed metric values of two methods, paired by seed (seeds present in both):
    ``t = mean(d) / (sd(d)/sqrt(n))``, ``d_s = a_s - b_s``, df = n - 1 (scipy ``ttest_rel``)."""
    seeds = tuple(sorted(set(a) & set(b)))
    if len(seeds) < 2:
        raise InputError(f"a paired t-test needs >= 2 common seeds, got {list(seeds)}")
    x = np.array([a[s] for s in seeds], dtype=np.float64)
    y = np.array([b[s] for s in seeds], dtype=np.float64)
    from scipy import stats as sps

    res = sps.ttest_rel(x, y)
    t, p = float(res.statistic), float(res.pvalue)
    if not np.isfinite(p):  # identical differences: no variance
        t, p = (0.0, 1.0) if np.allclose(x, y) else (float(np.sign((x - y).mean()) * np.inf), 0.0)
    return TTestResult(float((x - y).mean()), t, len(seeds) - 1, p, seeds)
