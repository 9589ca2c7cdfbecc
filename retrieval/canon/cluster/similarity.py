r"""The similarity of the greedy rule: float32 unit rows (`unit_rows`) and their exact dot products (`exact_dots`).

``sim(i, k)`` is the float64 cosine of unit rows ``x_i``, ``x_k``: the exact real dot product
``S = sum_j x_ij x_kj`` rounded once to the nearest float64 (ties to even), the value ``math.fsum`` returns on the
float64 products (a product of two float32 numbers is exact in float64). It does not depend on a summation order.

Exact dot products (`exact_dots`, numba, vectorised over pairs). The products are added with error-free
transformations (TwoSum; Ogita, Rump & Oishi, "Accurate sum and dot product", SIAM J. Sci. Comput. 26, 2005) in four
interleaved chains, so that ``S = s + sum(errors)`` exactly; the errors are added in float64 into ``c`` with
``|c - sum(errors)| <= eta = gamma_{d+4}^2 M`` (``gamma_n = n u / (1 - n u)``, ``u = 2^-53``,
``M = sum_j |x_ij x_kj|``, accumulated alongside and doubled for its own rounding). ``r = fl(s + c)`` and its exact
residual ``e`` (TwoSum) give ``S in [r + e - eta, r + e + eta]``: ``r`` is the correctly rounded ``S`` when that
interval lies strictly inside ``r``'s rounding interval (``|e| + eta < ulp / 2`` on each side). Pairs that fail the
test (in practice an exact sum sitting on a rounding midpoint, about 1% of random pairs) are summed again with
`math.fsum`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from numba import njit

from eval.errors import InputError

#: Rows whose squared norm is within this of 1 are unit rows as given (float32 normalisers stay far inside it).
UNIT_TOL = 1e-5
#: Rows converted at once (bounded temporary memory).
ROW_CHUNK = 16384
_PAIR_CHUNK = 65536


def row_chunks(g: np.ndarray) -> Iterator[np.ndarray]:
    """``g`` in chunks of `ROW_CHUNK` rows (one empty chunk for an empty ``g``)."""
    return (g[s:s + ROW_CHUNK] for s in range(0, max(len(g), 1), ROW_CHUNK))


def sq_norms(g: np.ndarray) -> np.ndarray:
    """Squared row norms, float64 accumulation (over row chunks: bounded temporary memory)."""
    return np.concatenate([np.einsum("ij,ij->i", c, c, dtype=np.float64) for c in row_chunks(g)])


def l1_norms(g: np.ndarray) -> np.ndarray:
    """Row L1 norms, float64 accumulation (rounded up by a relative 1e-12 to stay an upper bound)."""
    return np.concatenate([np.abs(c).sum(axis=1, dtype=np.float64) for c in row_chunks(g)]) * (1 + 1e-12)


def unit_rows(emb: np.ndarray) -> np.ndarray:
    """``(n, d)`` float32 unit rows (module docstring): rows with ``|sum x^2 - 1| <= UNIT_TOL`` (float64
    sum of the float32 values) as given, other rows divided by their float64 norm and rounded to float32.

    Raises `ValueError` for non-finite values or zero rows."""
    x = np.asarray(emb)
    if x.ndim != 2:
        raise InputError(f"embeddings must be (n, d), got shape {x.shape}")
    out = np.empty(x.shape, np.float32)
    for s in range(0, len(x), ROW_CHUNK):
        c = np.asarray(x[s:s + ROW_CHUNK], np.float32)
        sq = np.einsum("ij,ij->i", c, c, dtype=np.float64)
        bad = ~np.isfinite(sq)
        if bad.any():
            raise InputError(f"embeddings hold NaN/inf values (first bad row {s + int(np.flatnonzero(bad)[0])})")
        if (sq == 0).any():
            raise InputError(f"embedding row {s + int(np.flatnonzero(sq == 0)[0])} is zero: cannot normalise")
        out[s:s + ROW_CHUNK] = c
        off = np.flatnonzero(np.abs(sq - 1.0) > UNIT_TOL)
        if len(off):
            out[s + off] = (c[off].astype(np.float64) / np.sqrt(sq[off])[:, None]).astype(np.float32)
    return out


def check_threshold(threshold: float) -> float:
    """``threshold`` as a float in ``[-1, 1]`` (a cosine), else `ValueError`."""
    t = float(threshold)
    if not -1.0 <= t <= 1.0:
        raise InputError(f"threshold must lie in [-1, 1], got {threshold}")
    return t


@njit(cache=True, nogil=True)
def _dd_dots(xa, xb, a, b, out, unsure):  # pragma: no cover - compiled
    """Exact-sum dot products of rows ``a[p]`` of ``xa`` and ``b[p]`` of ``xb`` (float32): ``out[p]`` is
    ``fl(s + c)`` and ``unsure[p]`` says it may not be the correctly rounded sum (module docstring)."""
    d = xa.shape[1]
    u = 2.0**-53
    g = (d + 4) * u / (1.0 - (d + 4) * u)
    for p in range(a.shape[0]):
        x, y = xa[a[p]], xb[b[p]]
        s0 = s1 = s2 = s3 = 0.0
        c0 = c1 = c2 = c3 = 0.0
        m = 0.0
        j = 0
        while j + 4 <= d:  # four independent TwoSum chains (instruction-level parallelism)
            q0 = np.float64(x[j]) * np.float64(y[j])
            q1 = np.float64(x[j + 1]) * np.float64(y[j + 1])
            q2 = np.float64(x[j + 2]) * np.float64(y[j + 2])
            q3 = np.float64(x[j + 3]) * np.float64(y[j + 3])
            t = s0 + q0
            z = t - s0
            c0 += (s0 - (t - z)) + (q0 - z)
            s0 = t
            t = s1 + q1
            z = t - s1
            c1 += (s1 - (t - z)) + (q1 - z)
            s1 = t
            t = s2 + q2
            z = t - s2
            c2 += (s2 - (t - z)) + (q2 - z)
            s2 = t
            t = s3 + q3
            z = t - s3
            c3 += (s3 - (t - z)) + (q3 - z)
            s3 = t
            m += (abs(q0) + abs(q1)) + (abs(q2) + abs(q3))
            j += 4
        while j < d:
            q0 = np.float64(x[j]) * np.float64(y[j])
            t = s0 + q0
            z = t - s0
            c0 += (s0 - (t - z)) + (q0 - z)
            s0 = t
            m += abs(q0)
            j += 1
        c = (c0 + c1) + (c2 + c3)
        s = s0
        for v in (s1, s2, s3):  # fold the chains, errors into c
            t = s + v
            z = t - s
            c += (s - (t - z)) + (v - z)
            s = t
        r = s + c
        z = r - s
        e = (s - (r - z)) + (c - z)  # r + e == s + c exactly
        out[p] = r
        eta = 2.0 * g * g * m + 1e-300  # m: the float sum of |products|, within a factor 1 + g of the exact one
        up = np.nextafter(r, np.inf) - r
        down = r - np.nextafter(r, -np.inf)
        unsure[p] = not (e + eta < 0.5 * up and e - eta > -0.5 * down)


def exact_dots(x: np.ndarray, a: np.ndarray, b: np.ndarray, x_b: np.ndarray | None = None) -> np.ndarray:
    """``(len(a),)`` float64: the exact dot product, rounded once to float64 (module docstring), of rows ``a[i]`` of
    ``x`` and ``b[i]`` of ``x_b`` (default ``x``), both float32 (`unit_rows` for ``sim``), vectorised over pairs."""
    a, b = np.ascontiguousarray(a, np.int64), np.ascontiguousarray(b, np.int64)
    x_b = x if x_b is None else x_b
    out = np.empty(len(a), np.float64)
    if not len(a):
        return out
    unsure = np.empty(len(a), np.bool_)
    for s in range(0, len(a), _PAIR_CHUNK):
        e = min(s + _PAIR_CHUNK, len(a))
        _dd_dots(x, x_b, a[s:e], b[s:e], out[s:e], unsure[s:e])
    for p in np.flatnonzero(unsure):  # rare: the exact sum sits on (or next to) a rounding midpoint
        out[p] = math.fsum((x[a[p]].astype(np.float64) * x_b[b[p]].astype(np.float64)).tolist())
    return out

