"""Which corpus segment a time of a video's object falls in: the one lookup every job uses for a query's target.

A query's target is the segment of its video and object that is *active* at ``target_time``: the segment with the
latest ``start <= target_time`` that has not ended (``target_time <= end``). For a state that begins after the
prefix, ``target_time`` is that segment's start; for a state that persists from the prefix (a Q3 asked inside the
current segment), it is the asked-about time inside the segment.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

TIME_EPS = 1e-6
"""Tolerance (seconds) of the time comparisons (times are written rounded to the millisecond)."""


class SegmentTimeline:
    """The corpus segments of every (video, object) in time order, for `active_rows` lookups."""

    def __init__(self, video: Sequence[str], obj: Sequence[str], start: Sequence[float], end: Sequence[float]):
        groups: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
        for r, (v, o, s, e) in enumerate(zip(video, obj, start, end, strict=True)):
            groups[(str(v), str(o))].append((float(s), float(e), r))
        self._starts: dict[tuple[str, str], list[float]] = {}
        self._rows: dict[tuple[str, str], list[tuple[float, int]]] = {}
        for key, segs in groups.items():
            segs.sort()
            self._starts[key] = [s for s, _, _ in segs]
            self._rows[key] = [(e, r) for _, e, r in segs]

    @classmethod
    def of(cls, bench) -> SegmentTimeline:
        """The timeline of a loaded benchmark's corpus (`eval.benchmark.Benchmark`)."""
        cd = bench.corpus_ds
        return cls(cd["video_id"][:], cd["object_id"][:], cd["start"][:], cd["end"][:])

    def active(self, video: str, obj: str, t: float) -> int:
        """Corpus row of the segment of ``(video, obj)`` active at ``t`` (module docstring); -1 when none."""
        starts = self._starts.get((str(video), str(obj)))
        if not starts:
            return -1
        i = bisect.bisect_right(starts, float(t) + TIME_EPS) - 1
        if i < 0:
            return -1
        end, row = self._rows[(str(video), str(obj))][i]
        return row if float(t) <= end + TIME_EPS else -1

    def active_rows(self, video: Sequence[str], obj: Sequence[str], t: Sequence[float]) -> np.ndarray:
        """``(n,)`` int64: `active` for each (video, object, time)."""
        return np.fromiter((self.active(v, o, x) for v, o, x in zip(video, obj, t, strict=True)), np.int64,
                           count=len(video))


def target_states(bench) -> np.ndarray:
    """``(n_queries,)`` state row of each query's target state (``target_state_id``; -1 when it is no state of the
    benchmark)."""
    sidx = bench.state_index
    qd = bench.queries_ds
    return np.fromiter((sidx.get(s, -1) for s in qd["target_state_id"][:]), np.int64, count=len(qd))


def current_states(bench) -> np.ndarray:
    """``(n_queries,)`` state row of each query's current state: its transcript entry with the latest time at or
    before ``prefix_end`` (-1 when none, or when the entry's text is no state of the benchmark)."""
    qd = bench.queries_ds
    text_row = {t: i for i, t in enumerate(bench.states_ds["text"][:])}
    out = np.full(len(qd), -1, np.int64)
    for i, (tr, end) in enumerate(zip(qd["transcript"][:], qd["prefix_end"][:], strict=True)):
        seen = [e for e in tr if e["t"] <= end + TIME_EPS]
        if seen:
            out[i] = text_row.get(max(seen, key=lambda e: e["t"])["state"], -1)
    return out
