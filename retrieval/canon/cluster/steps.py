r"""The fast path's steps for one block of phrases (positions ``start:stop`` of the visiting order).

1. screen (`retrieval.canon.cluster.screen`): candidate pairs of the block against the seeds that exist;
2. refine (`refine`): exact similarities of the candidates (`exact_dots`); keep ``sim >= t`` (`Pairs`);
3. resolve (`resolve`): phrases with no old seed at ``>= t`` are the block's potential seeds. Their exact pairs with
   earlier potential seeds of the block (`pairs_with_earlier_potential`, screened and refined the same way) feed one
   sequential pass (numba) over them: a phrase becomes a seed iff none of the block's earlier new seeds is at
   ``>= t`` (`NewSeeds`);
4. assign (`assign_block`): each other phrase joins the best of its old-seed pairs and of its pairs with the
   block's new seeds that precede it (similarity descending, seed number ascending).

`cluster_block` runs the four steps on a `GreedyPass` and records the block's clusters and seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from retrieval.canon.cluster.screen import Encoded, Screen
from retrieval.canon.cluster.similarity import exact_dots


class SeedBuffer:
    """The seeds so far, in seed order: their screen codes (a growing matrix, capacity doubling) and their positions
    in the visiting order. Seed ``s`` founded cluster ``s``."""

    def __init__(self, dim: int, dtype: type, capacity: int = 1024):
        self.codes = np.empty((capacity, dim), dtype)
        self.pos = np.empty(capacity, np.int64)
        self.n = 0

    def add(self, codes: np.ndarray, positions: np.ndarray) -> None:
        m = len(positions)
        if self.n + m > len(self.pos):
            cap = max(2 * len(self.pos), self.n + m)
            grown = np.empty((cap, self.codes.shape[1]), self.codes.dtype)
            grown[: self.n] = self.codes[: self.n]
            pos = np.empty(cap, np.int64)
            pos[: self.n] = self.pos[: self.n]
            self.codes, self.pos = grown, pos
        self.codes[self.n:self.n + m] = codes
        self.pos[self.n:self.n + m] = positions
        self.n += m


@dataclass
class GreedyPass:
    """The state of one fast pass, by visiting position: ``units`` float32 ``(n, d)`` unit rows, the ``screen`` (built
    for them), the ``seeds`` so far, and per position its cluster ``label`` (int64, = seed number) and its exact
    similarity to its seed ``value`` (float64), filled block by block; ``t`` the threshold and ``seed_chunk`` the
    seeds per screen tile."""

    units: np.ndarray
    screen: Screen
    seeds: SeedBuffer
    label: np.ndarray
    value: np.ndarray
    t: float
    seed_chunk: int


@dataclass
class Pairs:
    """Pairs at exact similarity ``>= t``: ``rows`` (block-local rows), ``targets`` (what the step compared them
    with: seed numbers, or indices of potential seeds), ``sims`` (float64)."""

    rows: np.ndarray
    targets: np.ndarray
    sims: np.ndarray

    def __getitem__(self, keep: np.ndarray) -> Pairs:
        return Pairs(self.rows[keep], self.targets[keep], self.sims[keep])


@dataclass
class NewSeeds:
    """Step 3's outcome. ``potential``: block-local rows with no old seed at ``>= t``, ascending (= visiting order);
    ``is_seed``: bool per potential row; ``seed_id``: per potential row its seed (cluster) number, or -1."""

    potential: np.ndarray
    is_seed: np.ndarray
    seed_id: np.ndarray

    @property
    def rows(self) -> np.ndarray:
        """Block-local rows of the new seeds, in seed order."""
        return self.potential[self.is_seed]


def refine(units: np.ndarray, rows: np.ndarray, targets: np.ndarray, row_pos: np.ndarray, target_pos: np.ndarray,
           t: float) -> Pairs:
    """Step 2: the candidates ``(rows, targets)`` whose units at visiting positions ``(row_pos, target_pos)`` have an
    exact similarity ``>= t``."""
    sims = exact_dots(units, row_pos, target_pos)
    return Pairs(rows, targets, sims)[sims >= t]


def pairs_with_old_seeds(run: GreedyPass, start: int, block: Encoded) -> Pairs:
    """Steps 1-2 for the block at visiting position ``start`` against the seeds that exist when it starts (targets:
    seed numbers)."""
    rows, seed = run.screen.pairs(block, run.seeds.codes[: run.seeds.n], run.seed_chunk)
    return refine(run.units, rows, seed, start + rows, run.seeds.pos[seed], run.t)


def pairs_with_earlier_potential(run: GreedyPass, start: int, block: Encoded, potential: np.ndarray) -> Pairs:
    """Steps 1-2 within the block: every row against the potential seeds visited before it (targets: indices into
    ``potential``)."""
    rows, idx = run.screen.pairs(block, block.codes[potential], run.seed_chunk)
    before = potential[idx] < rows
    rows, idx = rows[before], idx[before]
    return refine(run.units, rows, idx, start + rows, start + potential[idx], run.t)


@njit(cache=True, nogil=True)
def _sequential_seeds(indptr, indices):  # pragma: no cover - compiled
    """Potential seeds in visiting order; ``indices[indptr[i]:indptr[i+1]]`` are the earlier potential seeds at
    ``>= t`` from ``i``. ``i`` becomes a seed iff none of those became one."""
    n = indptr.shape[0] - 1
    is_seed = np.zeros(n, np.bool_)
    for i in range(n):
        ok = True
        for a in range(indptr[i], indptr[i + 1]):
            if is_seed[indices[a]]:
                ok = False
                break
        is_seed[i] = ok
    return is_seed


def resolve(potential: np.ndarray, within: Pairs, size: int, n_old: int) -> NewSeeds:
    """Step 3: which potential seeds found clusters (numbered from ``n_old`` in visiting order), from the block's
    pairs with earlier potential seeds (``within``; only those whose row is itself potential matter)."""
    pot_index = np.full(size, -1, np.int64)
    pot_index[potential] = np.arange(len(potential))
    among = pot_index[within.rows] >= 0
    later, earlier = pot_index[within.rows[among]], within.targets[among]
    by_row = np.lexsort((earlier, later))
    indptr = np.zeros(len(potential) + 1, np.int64)
    np.cumsum(np.bincount(later, minlength=len(potential)), out=indptr[1:])
    is_seed = _sequential_seeds(indptr, earlier[by_row].astype(np.int64))
    seed_id = np.full(len(potential), -1, np.int64)
    seed_id[is_seed] = n_old + np.arange(int(is_seed.sum()))
    return NewSeeds(potential, is_seed, seed_id)


def best_per_row(rows: np.ndarray, values: np.ndarray, seed_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per distinct row: the pair with the largest value, ties by the smallest seed id."""
    by = np.lexsort((seed_ids, -values, rows))
    rows, values, seed_ids = rows[by], values[by], seed_ids[by]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else np.zeros(0, np.int64)
    return rows[first], values[first], seed_ids[first]


def assign_block(old: Pairs, within: Pairs, new: NewSeeds, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 4: ``(rows, similarity, seed number)`` of every block row that is not a new seed, each with its best
    seed among its old-seed pairs (``old``) and its pairs with earlier new seeds (``within`` whose target seeded)."""
    to_new = new.seed_id[within.targets] >= 0
    rows = np.concatenate([old.rows, within.rows[to_new]])
    sims = np.concatenate([old.sims, within.sims[to_new]])
    seeds = np.concatenate([old.targets, new.seed_id[within.targets[to_new]]])
    is_new_seed = np.zeros(size, bool)
    is_new_seed[new.rows] = True
    joins = ~is_new_seed[rows]
    return best_per_row(rows[joins], sims[joins], seeds[joins])


def cluster_block(run: GreedyPass, start: int, stop: int) -> None:
    """Steps 1-4 for visiting positions ``start:stop``: fills their ``label`` and ``value`` and appends the block's
    new seeds to ``run.seeds``."""
    size = stop - start
    block = run.screen.encode(run.units[start:stop])
    old = pairs_with_old_seeds(run, start, block)
    has_old = np.zeros(size, bool)
    has_old[old.rows] = True
    potential = np.flatnonzero(~has_old)  # ascending = visiting order
    within = pairs_with_earlier_potential(run, start, block, potential)
    new = resolve(potential, within, size, run.seeds.n)
    rows, sims, seed = assign_block(old, within, new, size)
    run.label[start + rows], run.value[start + rows] = seed, sims
    new_rows = new.rows
    run.label[start + new_rows] = new.seed_id[new.is_seed]
    if len(new_rows):
        run.value[start + new_rows] = exact_dots(run.units, start + new_rows, start + new_rows)
        run.seeds.add(block.codes[new_rows], start + new_rows)
    if len(rows) + len(new_rows) != size:  # cannot happen: a non-seed has a pair at >= t by construction
        raise RuntimeError(f"internal error: positions {start}..{stop} were not all assigned")
