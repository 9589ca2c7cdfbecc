"""The closed slice of the CPU experiments (``--top-states K``): the queries whose target is one of the K canonical
states most often asked about in the train split.

A closed vocabulary of K answers lets a tiny student on CPU learn the answer distribution in minutes and makes the
chance levels explicit: the majority class (the most frequent train target, scored on the slice's test queries) and
``1/K``. Ties in frequency are broken by the state's text, so the slice is a function of the benchmark alone. The
GPU recipe runs on the full vocabulary (``top_states`` null).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from eval.errors import InputError


@dataclass(frozen=True)
class ClosedSlice:
    """``states``: the K states (most frequent first) with their train ``counts``; ``majority``: the first of them."""

    k: int
    split: str
    states: tuple[str, ...]
    counts: tuple[int, ...]

    @property
    def majority(self) -> str:
        return self.states[0]

    def __contains__(self, state: str) -> bool:
        return state in set(self.states)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "majority": self.majority}


def closed_slice(bench, k: int, split: str = "train") -> ClosedSlice:
    """The K most frequent target states of ``split`` (`ClosedSlice`); an error when the split has no queries."""
    if k < 1:
        raise InputError(f"top_states must be >= 1, got {k}")
    targets = [q.target_state for q in bench.queries(split)]
    if not targets:
        raise InputError(f"the benchmark has no {split!r} queries to rank target states by")
    ranked = sorted(Counter(targets).items(), key=lambda sc: (-sc[1], sc[0]))[:k]
    return ClosedSlice(k=k, split=split, states=tuple(s for s, _ in ranked), counts=tuple(c for _, c in ranked))


def in_slice(queries, sl: ClosedSlice | None) -> list:
    """The queries whose target is in ``sl`` (all of them without a slice), in order."""
    if sl is None:
        return list(queries)
    keep = set(sl.states)
    return [q for q in queries if q.target_state in keep]
