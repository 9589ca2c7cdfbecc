"""Numba kernel of the random baseline's scores (`eval.scoring.sources.RandomSource`; compiled once, cached on disk).

The same splitmix64 counter hash as `eval.scoring.sources._splitmix64`, bit for bit, in one pass over the block
instead of numpy's five temporaries of ``queries x items`` uint64 (the stage's cost at PSR scale:
`scripts/psr_scale.py`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_S27, _S30, _S31, _S40 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(40)
_UNIT = np.float32(2.0 ** -24)


@njit(parallel=True, cache=True, nogil=True)
def random_scores(q0, nq, cols, n_items, key, out):
    """``out[i, j]`` (float32 ``(nq, len(cols))``) = the 24-bit uniform of ``splitmix64(((q0 + i) * n_items +
    cols[j]) ^ key)``."""
    for i in prange(nq):
        row = np.uint64(q0 + i) * np.uint64(n_items)
        for j in range(cols.shape[0]):
            x = ((row + cols[j]) ^ key) + _GOLD
            x = (x ^ (x >> _S30)) * _M1
            x = (x ^ (x >> _S27)) * _M2
            x = x ^ (x >> _S31)
            out[i, j] = np.float32(x >> _S40) * _UNIT
