"""Where a prefix ends: the scene is already in motion, and what decides the object's next states is on screen.

An object's prefix is 8 frames ending at frame ``e`` (`choose_prefix`). The rule, on the simulator record:

- **Engaged** (`engaged`): at frame ``f`` the object *is engaged* when, in frames ``f - 1`` and ``f``, it moves, or
  another body that moves touches it, or another body that moves is on a collision course with it. *Moves*: speed
  >= `MOVING_SPEED` or ``|omega|`` >= `TURNING_OMEGA` (an object), velocity above zero (the pusher, the tilting
  shelf). *Collision course*: the two approach (their centre distance shrinks by at least `APPROACH_MIN` units over
  the last `APPROACH_FRAMES` frames) and they touch within `COURSE_HORIZON_S` after ``f`` -- the course is measured
  with the record's future contacts, but only to decide *where* to cut: nothing after ``e`` reaches a query.
- **Current and next state**: ``e`` lies in the object's segment ``c`` (its *current* state); the gap to the next
  change, ``start(c + 1) - e``, is drawn from `GAP_S` (DynaPix cuts about 12 frames before the event; PSR's median
  prefix-to-target gap is 1.9 s over all horizons).
- **The label holds at the cut** (`label_holds`): the current state's motion is true of frame ``e`` itself, not only
  of its (smoothed) segment: an object labelled at rest is not moving at ``e``, one labelled rolling, sliding,
  tumbling, flying or falling moves at ``e``. So the last frame never shows what its label denies.
- **Choice** (`choose_prefix`): a wanted gap is drawn from `GAP_S`; among the engaged frames of the object's first
  `MAX_CURRENT` segments (not its last) whose gap lies in `GAP_S` and whose label holds, the one with the gap closest
  to it ends the prefix.
  Objects whose whole trajectory has no such frame get no prefix, except objects that stay put (a single segment)
  when another object moves near them: they are asked about their (persisting) state, a rare, measured case.

The 8 frames span at most `SPAN_S` seconds, evenly spaced, ending at ``e``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eval.schema import PREFIX_FRAMES
from eval.synth import record as R

MOVING_SPEED = 6.0
"""An object moves when its speed is at least this (units/s; `eval.synth.states.MOVING_SPEED`)."""
TURNING_OMEGA = 0.5
"""...or when it turns at least this fast (rad/s; `eval.synth.states.WOBBLE_OMEGA`)."""
APPROACH_FRAMES = 4
"""Frames over which an approach is measured."""
APPROACH_MIN = 1.0
"""Decrease of the centre distance (units) over `APPROACH_FRAMES` that counts as approaching."""
COURSE_HORIZON_S = 2.5
"""A body approaching the object is on a collision course when they touch within this long (seconds)."""
GAP_S = (0.5, 2.0)
"""Range of the gap (seconds) between the prefix's last frame and the object's next state change."""
MAX_CURRENT = 3
"""The prefix ends in one of the object's first this many segments (so most objects have several states ahead)."""
SPAN_S = 1.5
"""At most this long (seconds) between the first and the last prefix frame."""
NEAR_S = 40.0
"""A staying object is asked about only when a moving body comes within this many units of it during the prefix."""


def moving(rec: R.SimRecord) -> np.ndarray:
    """(F, N) bool: the object moves (speed >= `MOVING_SPEED` or |omega| >= `TURNING_OMEGA`) and is simulated."""
    speed = np.linalg.norm(rec.vel, axis=-1)
    return ((speed >= MOVING_SPEED) | (np.abs(rec.angvel) >= TURNING_OMEGA)) & ~rec.held


def _kinematic_moving(rec: R.SimRecord) -> dict[str, np.ndarray]:
    """kind -> (F,) bool: the pusher / the shelf moves at the frame (its pose changes from the previous frame)."""
    out: dict[str, np.ndarray] = {}
    kinds = [] if rec.kin_kind is None else [str(k) for k in rec.kin_kind]
    for i, kind in enumerate(kinds):
        d = np.abs(np.diff(rec.kin_pose[:, i, :], axis=0)).sum(axis=1) > 1e-4
        out[kind] = np.concatenate([[False], d]) | out.get(kind, np.zeros(rec.n_frames, bool))
    return out


def engaged(rec: R.SimRecord) -> np.ndarray:
    """(F, N) bool: the module docstring's *engaged* at each frame, for every object."""
    F, n = rec.n_frames, rec.n_objects
    mv = moving(rec)
    touch = rec.touch.copy()
    idx = np.arange(n)
    touch[:, idx, idx] = False
    # a moving body touching it
    by_touch = np.einsum("fkj,fj->fk", touch.astype(np.int8), mv.astype(np.int8)) > 0
    kin = _kinematic_moving(rec)
    if "pusher" in kin:
        by_touch |= ((rec.contacts & R.CONTACT_PUSHER) > 0) & kin["pusher"][:, None]
    if "shelf" in kin:
        by_touch |= (rec.support == R.SUPPORT_SHELF) & kin["shelf"][:, None]
    # a moving body on a collision course: approaching now, touching within the horizon
    horizon = max(1, round(COURSE_HORIZON_S * rec.fps))
    soon = np.zeros_like(touch)
    # soon[f] = any touch in (f, f + horizon]
    cum = np.concatenate([np.zeros((1, n, n), np.int32), np.cumsum(touch, axis=0, dtype=np.int32)])
    hi = np.minimum(np.arange(F) + horizon + 1, F)
    soon = (cum[hi] - cum[np.arange(F) + 1]) > 0
    d = np.linalg.norm(rec.pos[:, :, None, :] - rec.pos[:, None, :, :], axis=-1)
    lag = np.concatenate([np.repeat(d[:1], APPROACH_FRAMES, axis=0), d[:-APPROACH_FRAMES]])
    approach = (lag - d) >= APPROACH_MIN
    course = np.einsum("fkj,fj->fk", (approach & soon).astype(np.int8), mv.astype(np.int8)) > 0
    if "pusher" in kin:  # the pusher heading for it: it will be pushed within the horizon
        pushed = (rec.contacts & R.CONTACT_PUSHER) > 0
        pcum = np.concatenate([np.zeros((1, n), np.int32), np.cumsum(pushed, axis=0, dtype=np.int32)])
        course |= ((pcum[hi] - pcum[np.arange(F) + 1]) > 0) & kin["pusher"][:, None]
    now = mv | by_touch | course
    prev = np.concatenate([now[:1], now[:-1]])
    return now & prev


@dataclass(frozen=True)
class PrefixChoice:
    """One object's prefix: its 8 frame indices, the index of its current segment, whether it was engaged."""

    frames: tuple[int, ...]
    current: int
    engaged: bool


def prefix_frames(end: int, fps: float) -> tuple[int, ...]:
    """8 evenly spaced frames over at most `SPAN_S` seconds ending at ``end`` (frame 0 at the earliest)."""
    start = max(0, end - int(round(SPAN_S * fps)))
    return tuple(int(f) for f in np.round(np.linspace(start, end, PREFIX_FRAMES)).astype(int))


#: Motions whose label says the object translates (`label_holds`), and the one that says it does not.
TRANSLATING = ("rolling", "sliding", "tumbling", "flying", "falling")
RESTING = "at_rest"


def label_holds(rec: R.SimRecord, k: int, motions: list[tuple[int, int, str]]) -> np.ndarray:
    """(F,) bool: object ``k``'s motion label (``motions``: its segments' ``(start, stop, motion)``) is true of each
    frame by the object's own speed: at rest below `MOVING_SPEED`, a translating motion (`TRANSLATING`) at or above
    it; other motions (wobbling, toppling, pushed, collisions, hanging, ...) hold wherever their segment is."""
    speed = np.linalg.norm(rec.vel[:, k], axis=-1)
    out = np.ones(rec.n_frames, bool)
    for start, stop, motion in motions:
        if motion == RESTING:
            out[start:stop] = speed[start:stop] < MOVING_SPEED
        elif motion in TRANSLATING:
            out[start:stop] = speed[start:stop] >= MOVING_SPEED
    return out


def choose_prefix(bounds: list[tuple[int, int]], eng: np.ndarray, near_motion: np.ndarray, fps: float,
                  rng: np.random.Generator, holds: np.ndarray | None = None) -> PrefixChoice | None:
    """The prefix of one object (module docstring) from its segments' frame ``bounds`` ``[(start, stop), ...]`` in
    time order, its ``(F,)`` engaged flags, ``(F,)`` flags of a moving body within `NEAR_S` units and ``(F,)`` flags
    of frames where its label holds (`label_holds`; None: everywhere); None when it has none.

    A wanted gap ``g`` is drawn uniformly from `GAP_S`; among the engaged frames of the first `MAX_CURRENT` segments
    that leave a gap in `GAP_S` before the next change, the one whose gap is closest to ``g`` ends the prefix (an
    earlier segment wins a tie), so the gaps spread over the whole range even when most segments are short."""
    lo, hi = (int(round(g * fps)) for g in GAP_S)
    want = rng.uniform(*GAP_S) * fps
    if holds is not None:
        eng, near_motion = eng & holds, near_motion & holds
    first = PREFIX_FRAMES - 1
    best: tuple[float, int, int] | None = None
    for c in range(min(len(bounds) - 1, MAX_CURRENT)):
        start, stop = bounds[c]
        nxt = bounds[c + 1][0]
        cand = np.arange(max(start, first, nxt - hi), min(stop, nxt - lo + 1))
        cand = cand[eng[cand]] if len(cand) else cand
        if len(cand):
            i = int(np.argmin(np.abs((nxt - cand) - want)))
            key = (abs(float(nxt - cand[i]) - want), c, int(cand[i]))
            best = key if best is None or key < best else best
    if best is not None:
        return PrefixChoice(prefix_frames(best[2], fps), best[1], True)
    if len(bounds) == 1:
        start, stop = bounds[0]
        cand = np.arange(max(start, first), stop - hi)
        cand = cand[near_motion[cand]] if len(cand) else cand
        if len(cand):
            e = int(cand[int(rng.integers(len(cand)))])
            return PrefixChoice(prefix_frames(e, fps), 0, bool(eng[e]))
    return None


def near_motion(rec: R.SimRecord) -> np.ndarray:
    """(F, N) bool: another object that moves is within `NEAR_S` units (surface gap) of the object."""
    mv = moving(rec)
    radius = np.hypot(rec.sizes[:, 0], rec.sizes[:, 1]) / 2
    d = np.linalg.norm(rec.pos[:, :, None, :] - rec.pos[:, None, :, :], axis=-1)
    gap = d - radius[None, :, None] - radius[None, None, :]
    n = rec.n_objects
    gap[:, np.arange(n), np.arange(n)] = np.inf
    return ((gap <= NEAR_S) & mv[:, None, :]).any(axis=2)
