"""State labelling: from the simulator's per-frame record to each object's timed state trajectory.

Two stages:

1. `label_frames` gives every (frame, object) one canonical state by the first matching rule below, using the
   record's kinematics, contacts, support and impacts (thresholds are the named constants of this module):

   ==  ==================================  =====================================================================
   #   state                               rule
   ==  ==================================  =====================================================================
   1   hanging in the air                  held by the gripper (not yet released)
   2   crashing into another object /      an object-object contact began within `COLLISION_HOLD_S` at a relative
       being hit by another object         speed >= `COLLISION_SPEED`; the faster of the two (speed in the frame
                                           before) is crashing, the slower one is being hit
   3   bouncing off the wall               a wall contact began within `WALL_HOLD_S` at normal speed >= `WALL_HIT_SPEED`
   4   being pushed                        touching the pusher, or an object that is being pushed, and moving
   5   dropping into the container         airborne, descending, above the container's opening (`DROP_ZONE_HEIGHT`)
   6   bouncing                            airborne, rising faster than `BOUNCE_UP_SPEED` or within
                                           `BOUNCE_WINDOW_S` of a landing at >= `LANDING_SPEED`
   7   spinning through the air            airborne, not a ball, rotating faster than `SPIN_OMEGA`
   7b  flying through the air              airborne, horizontal speed >= `FLY_SPEED` and >= half the vertical speed
   8   falling                             airborne otherwise
   9   going over the edge                 on a table, moving towards its edge, reaching it within `EDGE_TIME_S`
                                           (or already past it)
   10  tipping over                        a block or domino touching something and rotating faster than
                                           `TIP_OMEGA` (or than `WOBBLE_OMEGA` while tilted between upright and lying)
   11  rolling/sliding ...                 moving (speed >= `MOVING_SPEED`): by support -- ramp, table, floor
                                           (balls roll, other shapes slide); below `SLOW_SPEED` on floor or table:
                                           slowing down; in the container: moving around inside the container;
                                           on another object: sliding off another object
   12  wobbling                            not a ball, not moving, rotating faster than `WOBBLE_OMEGA`
   13  at rest                             dominoes by tilt (standing upright < `UPRIGHT_TILT_DEG` <= leaning on
                                           another object < `LYING_TILT_DEG` <= lying on its side); then by
                                           support -- stacked on another object, resting inside the container,
                                           on the ramp; on the table or floor: against the wall / against another
                                           object when touching one, else resting on the table / floor
   ==  ==================================  =====================================================================

   A frame no rule decides (e.g. pressed only against a wall) keeps the previous frame's state.

2. `smooth` turns the per-frame labels into segments: repeatedly the shortest run shorter than `MIN_SEGMENT_S`
   is merged into its neighbours (into both when they agree, so A-B-A flicker becomes A; else into the longer
   one, the earlier on ties), until every segment lasts at least `MIN_SEGMENT_S`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eval.synth import record as R
from eval.synth.vocab import STATE_BY_TEXT, STATES

MOVING_SPEED = 12.0
"""An object moves when its speed is at least this (units/s); below it is at rest (or wobbling)."""
SLOW_SPEED = 45.0
"""A moving object on the floor or a table below this speed (units/s) is slowing down."""
WOBBLE_OMEGA = 1.0
"""A resting non-ball object rotating faster than this (rad/s) is wobbling."""
TIP_OMEGA = 2.0
"""A block or domino in contact with something and rotating faster than this (rad/s) is tipping over."""
COLLISION_SPEED = 60.0
"""Relative speed (units/s) at the start of an object-object contact that counts as a collision."""
COLLISION_HOLD_S = 0.25
"""A collision is labelled for this long from its first contact (an instant event made watchable)."""
WALL_HIT_SPEED = 60.0
"""Normal speed (units/s) at the start of a wall contact that counts as bouncing off the wall."""
WALL_HOLD_S = 0.25
"""Bouncing off the wall is labelled for this long from the first contact."""
SPIN_OMEGA = 4.0
"""An airborne block, box or domino rotating faster than this (rad/s) is spinning through the air."""
LANDING_SPEED = 120.0
"""Normal speed (units/s) at the start of a surface contact that makes the following airborne phase a bounce."""
BOUNCE_UP_SPEED = 30.0
"""An airborne object rising faster than this (units/s) is bouncing."""
BOUNCE_WINDOW_S = 0.6
"""An airborne object within this long after a hard landing is bouncing (the whole hop, not only its rise)."""
FLY_SPEED = 80.0
"""An airborne object with at least this horizontal speed (units/s), and at least half its vertical speed,
is flying through the air rather than falling."""
EDGE_TIME_S = 0.3
"""An object on a table reaching its edge within this time at its current speed is going over the edge."""
DROP_ZONE_HEIGHT = 90.0
"""Height above the container's rim (units) within which a descending object over the opening is dropping into it."""
UPRIGHT_TILT_DEG = 12.0
"""A domino tilted less than this from vertical is standing upright."""
LYING_TILT_DEG = 55.0
"""A domino tilted more than this is lying on its side (in between, touching another object: leaning on it)."""
MIN_SEGMENT_S = 0.2
"""Minimum duration of a state segment after smoothing (seconds)."""

THRESHOLDS = {name: globals()[name] for name in (
    "MOVING_SPEED", "SLOW_SPEED", "WOBBLE_OMEGA", "TIP_OMEGA", "SPIN_OMEGA", "COLLISION_SPEED", "COLLISION_HOLD_S",
    "WALL_HIT_SPEED", "WALL_HOLD_S", "LANDING_SPEED", "BOUNCE_UP_SPEED", "BOUNCE_WINDOW_S", "FLY_SPEED",
    "EDGE_TIME_S", "DROP_ZONE_HEIGHT", "UPRIGHT_TILT_DEG", "LYING_TILT_DEG", "MIN_SEGMENT_S")}
"""Every labelling threshold by name (units: world units, seconds, radians/s, degrees)."""

STATE_INDEX = {s.text: i for i, s in enumerate(STATES)}
UNDECIDED = -1
_SURFACE_CODES = (R.SUPPORT_FLOOR, R.SUPPORT_TABLE, R.SUPPORT_RAMP, R.SUPPORT_CONTAINER, R.SUPPORT_OBJECT)


def _i(text: str) -> int:
    return STATE_INDEX[STATE_BY_TEXT[text].text]


@dataclass(frozen=True)
class StateSegment:
    """One smoothed segment of an object's trajectory: state index into `STATES`, frames [start, stop)."""

    state: int
    start: int
    stop: int

    @property
    def text(self) -> str:
        return STATES[self.state].text

    @property
    def middle(self) -> int:
        return (self.start + self.stop - 1) // 2


def _recent(events: np.ndarray, hold: int) -> np.ndarray:
    """(F, N) bool: an event happened in this frame or the ``hold - 1`` frames before."""
    out = np.zeros_like(events)
    for d in range(hold):
        out[d:] |= events[: events.shape[0] - d]
    return out


def _since(events: np.ndarray) -> np.ndarray:
    """(F, N) frames since the latest event at or before each frame (large when none)."""
    f_n = events.shape
    out = np.full(f_n, 10**6, np.int64)
    last = np.full(f_n[1], -(10**6), np.int64)
    for f in range(f_n[0]):
        last = np.where(events[f], f, last)
        out[f] = f - last
    return out


def _pushed(rec: R.SimRecord) -> np.ndarray:
    """(F, N) bool: touching the pusher, directly or through a chain of touching objects."""
    pushed = (rec.contacts & R.CONTACT_PUSHER) > 0
    for _ in range(rec.n_objects):
        pushed = pushed | np.einsum("fij,fj->fi", rec.touch, pushed)
    return pushed


def label_frames(rec: R.SimRecord) -> np.ndarray:
    """(F, N) int: the canonical state index (into `STATES`) of every object at every frame."""
    fps = rec.fps
    speed = np.linalg.norm(rec.vel, axis=-1)
    vx, vy = rec.vel[..., 0], rec.vel[..., 1]
    omega = np.abs(rec.angvel)
    airborne = (rec.contacts == 0) & ~rec.held
    crash, hit = _collisions(rec, speed)
    wall_hit = _recent((rec.impact_kind == R.SUPPORT_WALL) & (rec.impact_speed >= WALL_HIT_SPEED),
                       max(1, round(WALL_HOLD_S * fps)))
    landed = np.isin(rec.impact_kind, _SURFACE_CODES) & (rec.impact_speed >= LANDING_SPEED)
    after_landing = _since(landed) <= round(BOUNCE_WINDOW_S * fps)
    pushed = _pushed(rec)
    tilt = np.degrees(np.abs(np.mod(rec.angle + math.pi / 2, math.pi) - math.pi / 2))
    ix0, ix1, _c_floor, rim = (float(v) for v in rec.container)
    x, y = rec.pos[..., 0], rec.pos[..., 1]
    has_container = not math.isnan(ix0)
    in_container = (x >= ix0) & (x <= ix1) & (y < rim) if has_container else np.zeros_like(airborne)
    over_opening = (x >= ix0) & (x <= ix1) & (y < rim + DROP_ZONE_HEIGHT) if has_container else in_container
    edge_near = _edge_near(rec, vx)

    labels = np.full(speed.shape, UNDECIDED, np.int64)
    for k in range(rec.n_objects):
        shape = str(rec.shapes[k])
        for f in range(rec.n_frames):
            labels[f, k] = _rule(
                shape=shape, held=bool(rec.held[f, k]), crash=bool(crash[f, k]), hit=bool(hit[f, k]),
                wall_hit=bool(wall_hit[f, k]),
                pushed=bool(pushed[f, k]), airborne=bool(airborne[f, k]), vx=float(vx[f, k]), vy=float(vy[f, k]),
                speed=float(speed[f, k]), omega=float(omega[f, k]), after_landing=bool(after_landing[f, k]),
                over_opening=bool(over_opening[f, k]), in_container=bool(in_container[f, k]),
                edge_near=bool(edge_near[f, k]), support=int(rec.support[f, k]), tilt=float(tilt[f, k]),
                touching_object=bool(rec.contacts[f, k] & R.CONTACT_OBJECT),
                touching_wall=bool(rec.contacts[f, k] & R.CONTACT_WALL))
            if labels[f, k] == UNDECIDED:
                labels[f, k] = labels[f - 1, k] if f > 0 else _i("resting on the floor")
    return labels


def _collisions(rec: R.SimRecord, speed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(F, N) bool twice: within `COLLISION_HOLD_S` of a collision as the faster (crashing) / slower (hit) object."""
    event = (rec.impact_kind == R.SUPPORT_OBJECT) & (rec.impact_speed >= COLLISION_SPEED) & (rec.impact_other >= 0)
    before = np.concatenate([speed[:1], speed[:-1]])  # speed in the frame before the impact
    other = np.clip(rec.impact_other.astype(np.int64), 0, None)
    other_before = np.take_along_axis(before, other, axis=1)
    faster = before >= other_before
    hold = max(1, round(COLLISION_HOLD_S * rec.fps))
    return _recent(event & faster, hold), _recent(event & ~faster, hold)


def _edge_near(rec: R.SimRecord, vx: np.ndarray) -> np.ndarray:
    """(F, N) bool: on a table, heading to one of its edges and reaching it within `EDGE_TIME_S` (or past it)."""
    out = np.zeros(vx.shape, bool)
    on_table = rec.support == R.SUPPORT_TABLE
    x, y = rec.pos[..., 0], rec.pos[..., 1]
    for ex, ey, direction in rec.edges:
        towards = vx * direction > MOVING_SPEED
        dist = (ex - x) * direction
        soon = dist <= np.abs(vx) * EDGE_TIME_S
        out |= on_table & (y > ey) & ((towards & soon) | (dist < 0))
    return out


def _rule(*, shape: str, held: bool, crash: bool, hit: bool, wall_hit: bool, pushed: bool, airborne: bool, vx: float,
          vy: float, speed: float, omega: float, after_landing: bool, over_opening: bool, in_container: bool,
          edge_near: bool, support: int, tilt: float, touching_object: bool, touching_wall: bool) -> int:
    """The state of one object at one frame (rules 1-13 of the module docstring); `UNDECIDED` when none fits."""
    if held:
        return _i("hanging in the air")
    if crash:
        return _i("crashing into another object")
    if hit:
        return _i("being hit by another object")
    if wall_hit:
        return _i("bouncing off the wall")
    if pushed and speed >= MOVING_SPEED / 2:
        return _i("being pushed")
    if airborne:
        if over_opening and vy < 0:
            return _i("dropping into the container")
        if vy > BOUNCE_UP_SPEED or after_landing:
            return _i("bouncing")
        if shape != "ball" and omega >= SPIN_OMEGA:
            return _i("spinning through the air")
        if abs(vx) >= FLY_SPEED and abs(vx) >= 0.5 * abs(vy):
            return _i("flying through the air")
        return _i("falling")
    if edge_near and speed >= MOVING_SPEED:
        return _i("going over the edge")
    if shape in ("block", "domino") and (omega >= TIP_OMEGA or (
            omega >= WOBBLE_OMEGA and UPRIGHT_TILT_DEG <= tilt < LYING_TILT_DEG)):
        return _i("tipping over")
    if speed >= MOVING_SPEED:
        return _moving(shape, speed, support, in_container)
    if shape != "ball" and omega >= WOBBLE_OMEGA:
        return _i("wobbling")
    return _resting(shape, support, tilt, in_container, touching_object, touching_wall)


def _moving(shape: str, speed: float, support: int, in_container: bool) -> int:
    rolls = shape == "ball"
    if in_container:
        return _i("moving around inside the container")
    if support == R.SUPPORT_RAMP:
        return _i("rolling down the ramp" if rolls else "sliding down the ramp")
    if support in (R.SUPPORT_TABLE, R.SUPPORT_FLOOR) and speed < SLOW_SPEED:
        return _i("slowing down")
    if support == R.SUPPORT_TABLE:
        return _i("rolling across the table" if rolls else "sliding across the table")
    if support == R.SUPPORT_FLOOR:
        return _i("rolling on the floor" if rolls else "sliding on the floor")
    if support == R.SUPPORT_OBJECT:
        return _i("sliding off another object")
    return UNDECIDED


def _resting(shape: str, support: int, tilt: float, in_container: bool, touching_object: bool,
             touching_wall: bool) -> int:
    if shape == "domino":
        if tilt >= LYING_TILT_DEG:
            return _i("lying on its side")
        if tilt >= UPRIGHT_TILT_DEG and touching_object:
            return _i("leaning on another object")
        if tilt < UPRIGHT_TILT_DEG and support in (R.SUPPORT_FLOOR, R.SUPPORT_TABLE, R.SUPPORT_CONTAINER):
            return _i("standing upright")
    if support == R.SUPPORT_OBJECT:
        return _i("stacked on another object")
    if in_container:
        return _i("resting inside the container")
    if support == R.SUPPORT_RAMP:
        return _i("resting on the ramp")
    if support in (R.SUPPORT_TABLE, R.SUPPORT_FLOOR):
        if touching_wall:
            return _i("resting against the wall")
        if touching_object:
            return _i("resting against another object")
        return _i("resting on the table" if support == R.SUPPORT_TABLE else "resting on the floor")
    return UNDECIDED


def smooth(labels: np.ndarray, min_frames: int) -> list[StateSegment]:
    """Segments of one object's per-frame labels (F,), every one at least ``min_frames`` long (see module doc)."""
    runs = _runs(labels)
    while len(runs) > 1:
        short = [i for i, r in enumerate(runs) if r.stop - r.start < min_frames]
        if not short:
            break
        i = min(short, key=lambda j: (runs[j].stop - runs[j].start, j))
        left = runs[i - 1] if i > 0 else None
        right = runs[i + 1] if i + 1 < len(runs) else None
        if left is not None and right is not None and left.state == right.state:
            runs[i - 1: i + 2] = [StateSegment(left.state, left.start, right.stop)]
        elif right is None or (left is not None and left.stop - left.start >= right.stop - right.start):
            runs[i - 1: i + 1] = [StateSegment(left.state, left.start, runs[i].stop)]
        else:
            runs[i: i + 2] = [StateSegment(right.state, runs[i].start, right.stop)]
    return runs


def _runs(labels: np.ndarray) -> list[StateSegment]:
    change = np.flatnonzero(np.diff(labels)) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [len(labels)]])
    return [StateSegment(int(labels[a]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)]


def trajectories(rec: R.SimRecord) -> list[list[StateSegment]]:
    """Each object's smoothed state trajectory (segments cover all frames, in time order)."""
    labels = label_frames(rec)
    min_frames = max(1, round(MIN_SEGMENT_S * rec.fps))
    return [smooth(labels[:, k], min_frames) for k in range(rec.n_objects)]
