r"""Tie-aware retrieval metrics from the rank statistics of a run (PSR paper §3.1, §5.1; Table 2).

Every metric is a function of one query's counts for one GT pool ``P`` (see `eval.scoring`):
``A = n_above`` (negatives scoring strictly above the best positive score ``t``), ``T = n_tie_pos`` (positives
scoring exactly ``t``), ``N = n_tie_neg`` (negatives scoring exactly ``t``), ``F = n_tie_neg_first`` (tied
negatives with a lower corpus row than the first tied positive). Ranks are 1-based positions in the ranking of the
whole corpus (own video removed for cross-instance pools), so nothing is capped at the run's k.

Ties. State-space methods give every segment of a state one score, so ties are common. The rank of the first
ground-truth item is ``R = A + X`` where ``X`` is the position of the first positive inside the tie group. Under a
uniformly random order of the ``T + N`` tied items (``tie="expected"``, the default) ``X`` follows

.. math::  P(X > m) = \prod_{i=0}^{m-1} \frac{N - i}{N + T - i} \quad (0 \le m \le N), \qquad P(X > N) = 0,

``E[X] = (N + T + 1)/(T + 1)``, and each metric below is the exact expectation (closed form, no sampling).
Deterministic tie-breaks: ``"row"`` (corpus row order, as in the run's top-k list: ``X = F + 1``),
``"optimistic"`` (positives first: ``X = 1``), ``"pessimistic"`` (positives last: ``X = N + 1``).
On runs without ties (``T = 1, N = 0``) all modes agree with the standard definitions.

Queries with an empty pool (``n_pos = 0``) have no value (NaN) and are skipped by every aggregate; reports count
them separately.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma

from eval.errors import InputError, UnknownName
from eval.schema import REPORT_MAX_HORIZON

TIE_MODES = ("expected", "row", "optimistic", "pessimistic")
#: Recall cut-offs of the paper's tables.
DEFAULT_KS = (1, 5, 10, 20, 50)
#: Default tier gains of the tier-weighted nDCG (an item's gain is the largest gain of the tiers it belongs to):
#: exact-state matches in another video of the same domain or of another domain count fully, embedding-similar
#: states half. The own-video tier is excluded from the ranking, so it has no gain.
DEFAULT_TIER_GAINS: dict[str, float] = {"in_dataset": 1.0, "cross_dataset": 1.0, "bge_similar": 0.5}
#: Horizons the macro average runs over (h >= 6 is folded into 5).
MACRO_HORIZONS = tuple(range(1, REPORT_MAX_HORIZON + 1))
_PRODUCT_MAX_M = 256
_EPS = 2.0 ** -52
RANK_STAT_FIELDS = ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")


@dataclass(frozen=True)
class RankStats:
    """One pool's rank statistics for n queries (int64 arrays of shape (n,))."""

    n_pos: np.ndarray
    n_above: np.ndarray
    n_tie_neg: np.ndarray
    n_tie_pos: np.ndarray
    n_tie_neg_first: np.ndarray

    @classmethod
    def from_arrays(cls, d: Mapping[str, np.ndarray]) -> RankStats:
        """From a pool's statistics (every field of `RANK_STAT_FIELDS`, integer arrays). A missing field or a
        non-integer array is an `eval.errors.InputError`: nothing defaults to "no ties" or is cast silently."""
        missing = [f for f in RANK_STAT_FIELDS if f not in d]
        if missing:
            raise InputError(f"rank statistics lack {missing}: tie-aware metrics need all of {RANK_STAT_FIELDS}")
        out = []
        for f in RANK_STAT_FIELDS:
            v = np.asarray(d[f])
            if not np.issubdtype(v.dtype, np.integer):
                raise InputError(f"rank statistic {f!r} must hold integer counts, got {v.dtype}")
            out.append(v.astype(np.int64, copy=False))
        return cls(*out)

    @classmethod
    def from_run(cls, run, pool: str = "type2-all") -> RankStats:
        if pool not in run.stats or "n_above" not in run.stats[pool]:
            raise UnknownName(f"run {run.name!r} has no rank statistics for pool {pool!r}; it has {run.pools}")
        return cls.from_arrays(run.stats[pool])

    @property
    def valid(self) -> np.ndarray:
        """Queries with a non-empty pool."""
        return self.n_pos > 0

    def select(self, mask: np.ndarray) -> RankStats:
        return RankStats(self.n_pos[mask], self.n_above[mask], self.n_tie_neg[mask], self.n_tie_pos[mask],
                         self.n_tie_neg_first[mask])


def _check_tie(tie: str) -> None:
    if tie not in TIE_MODES:
        raise InputError(f"unknown tie mode {tie!r}; expected one of {TIE_MODES}")


def _factors(m: np.ndarray, n: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shorter of the two products for ``P(X > m)`` (see `prob_first_after`): ``L = min(m, T)`` factors
    ``num_l / den_l``; as (L, first numerator, first denominator, step) with factor ``l`` = ``(num0 + l*step) /
    (den0 + l*step)``: the m-form counts ``(N-i)/(N+T-i)`` down (step -1), the T-form ``(N-m+j)/(N+j)`` up."""
    use_m = m <= t
    length = np.where(use_m, m, t)
    num0 = np.where(use_m, n, n - m + 1).astype(np.float64)
    den0 = np.where(use_m, n + t, n + 1).astype(np.float64)
    step = np.where(use_m, -1.0, 1.0)
    return length, num0, den0, step


def prob_first_after(m: np.ndarray, n_tie_neg: np.ndarray, n_tie_pos: np.ndarray) -> np.ndarray:
    r"""``P(X > m)``: the first of ``T`` tied positives lies after position ``m`` of its tie group of ``T + N``
    items in uniformly random order (1 for ``m <= 0``, 0 for ``m > N``), float64, shape of the broadcast inputs.

    For ``0 < m <= N``: ``P = \prod_{i<m} (N-i)/(N+T-i) = \prod_{j=1}^{T} (N-m+j)/(N+j)`` (both are
    ``C(N+T-m, T) / C(N+T, T)``); the shorter product, ``L = min(m, T)`` factors, is evaluated: directly for
    ``L <= 256``, as ``exp(sum log1p(-d/den))`` beyond. Either way the absolute error is at most ``(2L + 2) u``
    (``u = 2^-52``), the bound `median_first_rank` relies on."""
    m, n, t = np.broadcast_arrays(np.asarray(m, np.int64), np.asarray(n_tie_neg, np.int64),
                                  np.asarray(n_tie_pos, np.int64))
    out = np.zeros(m.shape, dtype=np.float64)
    out[m <= 0] = 1.0
    mid = (m > 0) & (m <= n)
    if not mid.any():
        return out
    length, num0, den0, step = _factors(m[mid], n[mid], t[mid])
    vals = np.empty(len(length))
    small = length <= _PRODUCT_MAX_M
    if small.any():
        ls = length[small]
        i = np.arange(int(ls.max()), dtype=np.float64)
        active = i[None, :] < ls[:, None]  # padded factors are 1 (their denominators may be 0)
        num = num0[small, None] + step[small, None] * i
        den = np.where(active, den0[small, None] + step[small, None] * i, 1.0)
        vals[small] = np.prod(np.where(active, num / den, 1.0), axis=1)
    for x in np.flatnonzero(~small):  # rare: both m and T above 256; one vector of L terms per query
        i = np.arange(int(length[x]), dtype=np.float64)
        den = den0[x] + step[x] * i
        vals[x] = np.exp(np.sum(np.log1p((num0[x] - den0[x]) / den)))
    out[mid] = vals
    return out


def first_rank(st: RankStats, tie: str = "expected") -> np.ndarray:
    r"""Rank of the first ground-truth item, float64 (n,) (NaN for empty pools).

    ``expected``: ``E[R] = A + (N + T + 1)/(T + 1)``; ``row``: ``A + F + 1``; ``optimistic``: ``A + 1``;
    ``pessimistic``: ``A + N + 1``."""
    _check_tie(tie)
    a, n, t = st.n_above.astype(np.float64), st.n_tie_neg.astype(np.float64), st.n_tie_pos.astype(np.float64)
    r = {"expected": lambda: a + (n + t + 1) / np.maximum(t + 1, 1), "row": lambda: a + st.n_tie_neg_first + 1,
         "optimistic": lambda: a + 1, "pessimistic": lambda: a + n + 1}[tie]()
    return np.where(st.valid, r, np.nan)


def recall_at_k(st: RankStats, k: int, tie: str = "expected") -> np.ndarray:
    r"""Recall@k as the PSR paper uses it (a hit when any item of the query's GT pool is in the top k), per query,
    float64 (n,) (NaN for empty pools). Micro R@k is the mean over queries.

    ``hit_k = 1[R <= k]``; tie-aware: ``E[hit_k] = P(X <= k - A) = 1 - P(X > k - A)`` (0 when ``A >= k``).
    Equals ranx ``hit_rate@k`` on runs without ties."""
    _check_tie(tie)
    if k < 1:
        raise InputError("k must be >= 1")
    if tie == "expected":
        v = 1.0 - prob_first_after(k - st.n_above, st.n_tie_neg, st.n_tie_pos)
    else:
        v = (first_rank(st, tie) <= k).astype(np.float64)
    return np.where(st.valid, v, np.nan)


def _expected_rr_sum(a: int, n: int, t: int) -> float:
    """E[1/(A+X)] by exact summation of the first-position distribution (one query, any N)."""
    x = np.arange(1, n + 2, dtype=np.float64)
    # P(X > x-1) for x = 1..N+1, then P(X = x) = P(X > x-1) * T / (N + T - x + 1)
    ratio = (n - (x[:-1] - 1)) / (n + t - (x[:-1] - 1))
    surv = np.concatenate([[1.0], np.cumprod(ratio)])
    pmf = surv * t / (n + t - x + 1)
    return float(np.sum(pmf / (a + x)))


def reciprocal_rank(st: RankStats, tie: str = "expected") -> np.ndarray:
    r"""Reciprocal rank of the first ground-truth item, per query, float64 (n,) (NaN for empty pools); MRR is the
    mean over queries. Equals ranx ``mrr`` (no cut-off) on runs without ties.

    Tie-aware: ``E[1/R] = sum_{x=1}^{N+1} P(X = x) / (A + x)`` with ``P(X = x) = P(X > x-1) T/(N+T-x+1)``;
    for ``T = 1`` (X uniform on 1..N+1) this is ``(psi(A+N+2) - psi(A+1)) / (N+1)`` (digamma)."""
    _check_tie(tie)
    if tie != "expected":
        return 1.0 / first_rank(st, tie)
    a, n, t = st.n_above, st.n_tie_neg, st.n_tie_pos
    out = np.full(len(a), np.nan)
    v = st.valid
    simple = v & (n == 0)
    out[simple] = 1.0 / (a[simple] + 1.0)
    one = v & (n > 0) & (t == 1)
    out[one] = (digamma(a[one] + n[one] + 2.0) - digamma(a[one] + 1.0)) / (n[one] + 1.0)
    for i in np.flatnonzero(v & (n > 0) & (t > 1)):
        out[i] = _expected_rr_sum(int(a[i]), int(n[i]), int(t[i]))
    return out


def median_first_rank(st: RankStats, tie: str = "expected") -> float:
    r"""Median rank of the first ground-truth item over the queries with a non-empty pool.

    Defined as the lower median ``min{m : (1/n) sum_i P(R_i <= m) >= 1/2}``, i.e. the ``ceil(n/2)``-th smallest
    rank on runs without ties (deterministic modes use the realised ranks). Tie-aware, ``P(R_i <= m)`` is the
    expected hit of `recall_at_k`, so this is the median of the pooled first-rank distribution.

    Robust at exactly one half. ``S(m) = sum_i P(R_i <= m)`` is a sum of rationals that may equal ``n/2`` exactly
    (e.g. 1/3 + 2/3) while its float64 value falls one rounding short, which would move the median one rank up.
    Each term is computed with absolute error at most ``(2 L_i + 3) u`` (`prob_first_after`, ``L_i`` its number of
    factors, plus the ``1 - P``), and the sum adds at most ``n u``; so ``S(m) >= n/2 - tol`` with ``tol = u
    (sum_i (2 L_i + 3) + n)`` is decided instead. A true sum within ``tol`` (~1e-12 for thousands of queries)
    below one half without reaching it is then counted as reaching it: at that distance the two medians are
    indistinguishable in float64 anyway."""
    _check_tie(tie)
    sub = st.select(st.valid)
    n = len(sub.n_pos)
    if n == 0:
        return float("nan")
    if tie != "expected":
        ranks = np.sort(first_rank(sub, tie))
        return float(ranks[(n + 1) // 2 - 1])

    def reaches_half(m: int) -> bool:
        d = m - sub.n_above
        hit = 1.0 - prob_first_after(d, sub.n_tie_neg, sub.n_tie_pos)
        mid = (d > 0) & (d <= sub.n_tie_neg)
        factors = np.minimum(d[mid], sub.n_tie_pos[mid])
        tol = _EPS * (float(np.sum(2 * factors + 3)) + n)
        return float(np.sum(hit)) >= n / 2 - tol

    lo, hi = 1, int((sub.n_above + sub.n_tie_neg + 1).max())
    while lo < hi:  # smallest m with mean hit >= 1/2 (monotone in m)
        mid_m = (lo + hi) // 2
        if reaches_half(mid_m):
            hi = mid_m
        else:
            lo = mid_m + 1
    return float(lo)


def _discount_prefix(k: int) -> np.ndarray:
    """``c[r] = sum_{s=1}^{r} 1/log2(s+1)`` for r = 0..k."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(2, k + 2)))])


def mask_gains(pool_names: Sequence[str], gains: Mapping[str, float], masks: np.ndarray) -> np.ndarray:
    """Gain of items from their pool bitmasks: the largest gain among their pools (0 when none has a gain)."""
    unknown = set(gains) - set(pool_names)
    if unknown:
        raise UnknownName(f"gains name pools the run does not hold: {sorted(unknown)}; it has {list(pool_names)}")
    out = np.zeros(len(masks), dtype=np.float64)
    for b, name in enumerate(pool_names):
        g = float(gains.get(name, 0.0))
        if g:
            out = np.where((masks >> b) & 1 == 1, np.maximum(out, g), out)
    return out


def ndcg_at_k(ranked, k: int, gains: Mapping[str, float] | None = None) -> np.ndarray:
    r"""Tier-weighted nDCG@k, tie-aware, per query, float64 (n,) (NaN when no positive has a gain).

    ``DCG@k = sum_j g_j / log2(r_j + 1)`` over items at rank ``r_j <= k`` (Järvelin & Kekäläinen; ranx ``ndcg``),
    ``g_j`` = the largest ``gains[tier]`` over the tiers holding item j (default `DEFAULT_TIER_GAINS`).
    An item whose tie group occupies ranks ``a+1 .. a+g`` has, under a uniformly random order of the group,
    expected discount ``(1/g) sum_{r=a+1}^{min(a+g, k)} 1/log2(r+1)``; by linearity ``E[DCG@k]`` sums these.
    ``IDCG@k`` ranks all the query's positives by gain. ``nDCG@k = E[DCG@k] / IDCG@k``. Needs ``k <=`` the run's k
    (``ranked`` is `eval.runs.RankedPositives`)."""
    if ranked is None:
        raise InputError("this run carries no ranked-positive information (written without it): nDCG unavailable")
    gains = dict(DEFAULT_TIER_GAINS if gains is None else gains)
    c = _discount_prefix(k)
    n = len(ranked.top_offsets) - 1
    g_top = mask_gains(ranked.pool_names, gains, ranked.mask)
    a, g = ranked.above, np.maximum(ranked.tie, 1)
    disc = (c[np.minimum(a + g, k)] - c[np.minimum(a, k)]) / g
    q_top = np.repeat(np.arange(n), np.diff(ranked.top_offsets))
    dcg = np.bincount(q_top, weights=g_top * disc, minlength=n)
    # ideal: positives sorted by gain, descending
    g_all = mask_gains(ranked.pool_names, gains, ranked.pos_mask)
    q_all = np.repeat(np.arange(n), np.diff(ranked.count_offsets))
    order = np.lexsort((-g_all, q_all))
    q_all, g_all, cnt = q_all[order], g_all[order], ranked.pos_count[order]
    keep = g_all > 0
    q_all, g_all, cnt = q_all[keep], g_all[keep], cnt[keep]
    end = np.cumsum(cnt)
    starts_q = np.searchsorted(q_all, np.arange(n))
    base = np.concatenate([[0], end])[starts_q]  # cumulative count before each query's first level
    p0 = np.concatenate([[0], end[:-1]]) - base[q_all]
    p1 = p0 + cnt
    idcg = np.bincount(q_all, weights=g_all * (c[np.minimum(p1, k)] - c[np.minimum(p0, k)]), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / idcg, np.nan)


def report_horizons(horizons: np.ndarray) -> np.ndarray:
    """The paper's reporting fold: horizons >= 6 count as 5."""
    return np.minimum(np.asarray(horizons, dtype=np.int64), REPORT_MAX_HORIZON)


def macro_over_horizons(values: np.ndarray, horizons: np.ndarray) -> float:
    r"""Macro average: ``(1/|H|) sum_{h in H} mean_{i: h_i = h} v_i`` over the horizons ``H`` of 1..5 that have at
    least one valued query (h >= 6 folded into 5). "macro" in the paper is this with ``v = hit@5``."""
    v = np.asarray(values, dtype=np.float64)
    h = report_horizons(horizons)
    means = [np.nanmean(v[h == x]) for x in MACRO_HORIZONS if np.isfinite(v[h == x]).any()]
    return float(np.mean(means)) if means else float("nan")


def mean_valid(values: np.ndarray) -> tuple[float, int]:
    """(mean over non-NaN values, their number)."""
    v = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(v)
    return (float(v[ok].mean()) if ok.any() else float("nan")), int(ok.sum())


def per_query_metrics(run, pool: str = "type2-all", ks: Sequence[int] = DEFAULT_KS, tie: str = "expected",
                      ndcg_k: int | None = 10, gains: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """Per-query values of every metric for one pool: ``R@k`` for ``ks``, ``RR``, ``rank`` (first-GT rank) and,
    when the run carries ranked positives and ``pool`` is the main pool, ``nDCG@ndcg_k``. NaN = empty pool."""
    st = RankStats.from_run(run, pool)
    out = {f"R@{k}": recall_at_k(st, k, tie) for k in ks}
    out["RR"] = reciprocal_rank(st, tie)
    out["rank"] = first_rank(st, tie)
    if ndcg_k and run.ranked is not None and pool == "type2-all" and ndcg_k <= run.k:
        out[f"nDCG@{ndcg_k}"] = ndcg_at_k(run.ranked, ndcg_k, gains)
    return out
