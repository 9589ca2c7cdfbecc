r"""Step 1 of the fast path, the screen: candidate pairs at a threshold, never losing a pair with ``sim >= t``.

A screen scores rows against targets in an approximate arithmetic and keeps every pair whose exact dot product
``S`` may reach ``t' = t - 2^-52`` (the least ``S`` whose rounding to float64 can reach ``t``, ``|t| <= 1``), by a
rigorous bound on that arithmetic's error; the refine step (`exact_dots`) then decides exactly. Every screen is
built for the unit-row matrices whose rows it will compare (the scale and the norm bounds cover them all), encodes
rows once (`Screen.encode`) and finds the candidate pairs of encoded rows against target codes (`Screen.pairs`):

- `Int8Screen` (``"int8"``, the default where torch multiplies int8 matrices): every unit row is quantised with one
  global scale ``Q = max|x| / 127``, ``x = Q x^ + e`` with ``|e_k| <= Q/2``; tiles are exact int32 products
  ``x^ . y^`` (``torch._int_mm``: VNNI / AVX2 integer kernels, half the time of a float32 product and a quarter of
  its memory). Then ``|x.y - Q^2 x^.y^| <= (Q/2)(|x|_1 + |y|_1 + d Q) + d Q^2/4 =: B_x`` (with ``|y|_1`` bounded by
  its maximum over all rows), and a pair is a candidate iff ``x^.y^ >= floor((t' - B_x) / Q^2) - 1`` (an integer
  compare per row);
- `Float32Screen` (``"float32"``): BLAS float32 tiles; a float32 dot product of vectors of norm at most ``r`` is
  within ``gamma_d r^2`` of the exact value (``u = 2^-24``; Higham, *Accuracy and Stability of Numerical
  Algorithms*, 3.1), for any summation order: candidates are the pairs with score ``>= t' - 2 gamma_d r^2``
  (`screen_margin`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from eval.errors import InputError
from retrieval.canon.cluster.similarity import l1_norms, row_chunks, sq_norms

#: Screens keep every pair with exact dot >= t - SCREEN_SLACK: below it no rounding reaches t (|t| <= 1).
SCREEN_SLACK = 2.0**-52


@dataclass(frozen=True)
class Encoded:
    """Rows in a screen's arithmetic: ``codes`` ``(n, d)`` and ``limit`` (a scalar, or one per row): the pair
    (row ``i``, target ``y``) is a candidate iff ``codes[i] . y >= limit[i]``."""

    codes: np.ndarray
    limit: np.ndarray | float

    def __len__(self) -> int:
        return len(self.codes)


class Screen(ABC):
    """Candidate pairs at ``threshold`` for rows of ``units`` (module docstring)."""

    #: the name `make_screen` knows it by
    kind: str
    #: the dtype of its codes (a seed buffer stores them)
    code_dtype: type

    def __init__(self, units: Sequence[np.ndarray], threshold: float):
        self.t = float(threshold) - SCREEN_SLACK
        self.units = [g for g in units if len(g)]
        self.dim = self.units[0].shape[1] if self.units else 1

    @abstractmethod
    def encode(self, rows: np.ndarray) -> Encoded:
        """Unit rows ``(n, d)`` float32 in this screen's arithmetic, with their candidate limits."""

    @abstractmethod
    def _tile_test(self, block: Encoded) -> Callable[[np.ndarray], np.ndarray]:
        """A function from a tile of target codes ``(m, d)`` to the candidate matrix, bool ``(len(block), m)``."""

    def pairs(self, block: Encoded, targets: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidate pairs ``(row of block, row of targets)``, int64, tile by tile (``chunk`` targets at a time)."""
        rows, cols = [], []
        if len(block) == 0 or len(targets) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        test = self._tile_test(block)
        for s in range(0, len(targets), chunk):
            tile = targets[s:s + chunk]
            r, c = np.divmod(np.flatnonzero(test(tile).ravel()), len(tile))  # one pass over a contiguous tile
            if r.size:
                rows.append(r)
                cols.append(c + s)
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(cols)


def screen_margin(dim: int, max_norm: float) -> float:
    """``delta = 2 gamma_d r^2``: the float32 screen keeps every pair whose exact similarity is ``>= t``."""
    u = 2.0**-24
    gamma = dim * u / (1.0 - dim * u)
    return 2.0 * gamma * max_norm * max_norm


class Float32Screen(Screen):
    """BLAS float32 products against the scalar limit ``lo = fl32(t' - screen_margin(d, r))``."""

    kind = "float32"
    code_dtype = np.float32

    def __init__(self, units: Sequence[np.ndarray], threshold: float):
        super().__init__(units, threshold)
        r = max((float(np.sqrt(sq_norms(g).max())) for g in self.units), default=1.0)
        self.lo = float(np.float32(self.t - screen_margin(self.dim, r)))

    def encode(self, rows: np.ndarray) -> Encoded:
        return Encoded(rows, self.lo)

    def _tile_test(self, block: Encoded) -> Callable[[np.ndarray], np.ndarray]:
        return lambda tile: np.matmul(block.codes, tile.T) >= block.limit


class Int8Screen(Screen):
    """Exact int32 products of int8 codes (scale ``Q``) against per-row integer limits."""

    kind = "int8"
    code_dtype = np.int8

    def __init__(self, units: Sequence[np.ndarray], threshold: float):
        super().__init__(units, threshold)
        self.scale = max((max(float(np.abs(c).max(initial=0.0)) for c in row_chunks(g)) for g in self.units),
                         default=1.0) / 127.0 or 1.0
        self.l1_max = max((float(l1_norms(g).max()) for g in self.units), default=0.0)

    def encode(self, rows: np.ndarray) -> Encoded:
        s = self.scale
        codes = np.rint(rows.astype(np.float64) / s).astype(np.int8)
        bound = (s / 2) * (l1_norms(rows) + self.l1_max + self.dim * s) + self.dim * s * s / 4
        limit = np.floor((self.t - bound) / (s * s)) - 1  # conservative: only ever adds candidates
        return Encoded(codes, np.clip(limit, -(2**31), 2**31 - 1).astype(np.int64))

    def _tile_test(self, block: Encoded) -> Callable[[np.ndarray], np.ndarray]:
        import torch

        a = torch.from_numpy(np.ascontiguousarray(block.codes))
        limit = np.asarray(block.limit, np.int32)[:, None]
        return lambda tile: torch._int_mm(a, torch.from_numpy(np.ascontiguousarray(tile)).T).numpy() >= limit


#: The screens by name (`make_screen`); every one gives the same clustering, at a different speed.
SCREEN_TYPES: dict[str, type[Screen]] = {"int8": Int8Screen, "float32": Float32Screen}
SCREENS = tuple(SCREEN_TYPES)


@functools.lru_cache(maxsize=1)
def int8_screen_available() -> bool:
    """Whether this torch build multiplies int8 matrices (``torch._int_mm``, a private op: probed, never assumed)."""
    try:
        import torch

        a, b = torch.ones((32, 64), dtype=torch.int8), torch.ones((64, 32), dtype=torch.int8)
        return int(torch._int_mm(a, b)[0, 0]) == 64
    except (AttributeError, RuntimeError, TypeError, NotImplementedError):
        return False


def resolve_screen(kind: str) -> str:
    """``"auto"`` -> ``"int8"`` where `int8_screen_available`, else ``"float32"`` (same result, slower)."""
    if kind == "auto":
        return "int8" if int8_screen_available() else "float32"
    if kind not in SCREENS:
        raise InputError(f"screen must be 'auto' or one of {SCREENS}, got {kind!r}")
    return kind


def make_screen(kind: str, units: Sequence[np.ndarray], threshold: float) -> Screen:
    """The screen ``kind`` (`resolve_screen`: ``"auto"``, or one of `SCREENS`) for rows of ``units``."""
    return SCREEN_TYPES[resolve_screen(kind)](units, threshold)

