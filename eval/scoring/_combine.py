"""Numba kernels of `eval.scoring.FusionSource`'s affine combination (compiled once, cached on disk).

``out = sum_k a_k * s_k - b`` per query row, in one pass over the tile instead of numpy's four passes and two
temporaries of ``queries x items`` float32. Every operation is a float32 one, in numpy's order (the products, then
their sum from the first input on, then ``- b``), with no fused multiply-add, so the result is bitwise numpy's.
"""

from __future__ import annotations

from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True)
def scale(s, a, out):
    """``out[i, j] = s[i, j] * a[i]`` (float32)."""
    for i in prange(s.shape[0]):
        ai = a[i]
        for j in range(s.shape[1]):
            out[i, j] = s[i, j] * ai


@njit(parallel=True, cache=True, nogil=True)
def add_scaled(out, s, a):
    """``out[i, j] += s[i, j] * a[i]`` (the product rounded to float32 first)."""
    for i in prange(s.shape[0]):
        ai = a[i]
        for j in range(s.shape[1]):
            out[i, j] = out[i, j] + s[i, j] * ai


@njit(parallel=True, cache=True, nogil=True)
def add_scaled_minus(out, s, a, b):
    """``out[i, j] = (out[i, j] + s[i, j] * a[i]) - b[i]``: the last input, and the offset."""
    for i in prange(s.shape[0]):
        ai, bi = a[i], b[i]
        for j in range(s.shape[1]):
            out[i, j] = (out[i, j] + s[i, j] * ai) - bi


@njit(parallel=True, cache=True, nogil=True)
def scale_minus(s, a, b, out):
    """``out[i, j] = s[i, j] * a[i] - b[i]``: a fusion of one input."""
    for i in prange(s.shape[0]):
        ai, bi = a[i], b[i]
        for j in range(s.shape[1]):
            out[i, j] = s[i, j] * ai - bi


@njit(parallel=True, cache=True, nogil=True)
def combine2(s0, s1, a0, a1, b, out):
    """``out[i, j] = (s0[i, j] * a0[i] + s1[i, j] * a1[i]) - b[i]``: two inputs in one pass."""
    for i in prange(s0.shape[0]):
        x, y, bi = a0[i], a1[i], b[i]
        for j in range(s0.shape[1]):
            out[i, j] = (s0[i, j] * x + s1[i, j] * y) - bi
