"""State labelling: from the simulator's per-frame record to each object's timed trajectory of true states.

Three stages:

1. `frame_attributes` gives every (frame, object) the five attributes of `eval.synth.lexicon.TrueState`, decided
   from the record's kinematics, contacts, support and impacts with the thresholds of this module:

   *motion* (first rule that applies)

   ==  =============  ===========================================================================================
   1   hanging        held by the gripper (not yet released)
   2   crashing / hit an object-object contact began within `COLLISION_HOLD_S` at a relative speed >=
                      `COLLISION_SPEED`; the faster of the two (speed in the frame before) is crashing into the
                      other, the slower one is hit by it (``other`` = the other object)
   3   pushed         touching the pusher, or an object being pushed, at speed >= `MOVING_SPEED` / 2
   4   airborne       no contact: bouncing (rising faster than `BOUNCE_UP_SPEED`, or within `BOUNCE_WINDOW_S` of a
                      landing at >= `LANDING_SPEED`); spinning (not round, |omega| >= `SPIN_OMEGA`); flying
                      (|vx| >= `FLY_SPEED` and >= half |vy|); else falling
   5   toppling       an elongated shape touching something and rotating at |omega| >= `TIP_OMEGA` while its speed
                      is below `TUMBLE_SPEED`
   6   moving         speed >= `MOVING_SPEED`: round shapes roll; others tumble when |omega| >= `TUMBLE_OMEGA`,
                      else slide
   7   wobbling       not round, |omega| >= `WOBBLE_OMEGA`
   8   at rest        otherwise
   ==  =============  ===========================================================================================

   *place*: hanging -> none; airborne -> ``over_container`` above the container's opening (within
   `DROP_ZONE_HEIGHT` of its rim), else ``air``; supported -> by what holds it up: ``floor`` (``wall`` when also
   touching a wall; ``floor_table`` / ``floor_ramp`` / ``floor_container`` / ``floor_shelf`` within `FLOOR_NEAR`
   of that furniture's horizontal extent), ``table`` / ``table_edge`` (centre within `EDGE_ZONE` of an edge objects can go over),
   ``ramp_upper`` / ``ramp_lower`` (which half of the slope), ``container`` (on its floor, or on an object inside
   it), ``rim`` (on a container wall's top), ``shelf``, ``on_object`` (supported by another object: ``other``),
   or the ``place`` of a registered surface that has one (`eval.synth.surfaces`).

   *relation* (only for objects at rest, wobbling or toppling, `RELATED_MOTIONS`; not for on_object, whose
   ``other`` is already named), to another object that is not held: ``under`` (it supports the other), ``leaning`` (elongated, tilted by `LEAN_MIN_DEG` to
   `LEAN_MAX_DEG`, touching it), ``touching``, ``next_to`` (the nearest object whose surface gap is below
   `NEAR_GAP`); else none.

   *pose* (shapes with a marked top, i.e. not round; only while at rest, wobbling, sliding, being pushed or
   hanging): ``upright`` / ``side`` / ``upside_down`` within `POSE_TOL_DEG` of 0 / +-90 / 180 degrees, else
   ``tilted``.

2. Each attribute's per-frame values are smoothed on their own: runs shorter than `MIN_ATTRIBUTE_S` are merged into
   their neighbours (`smooth`), so a relation or a pose does not flicker at a threshold.
3. The combined per-frame states are smoothed again (`MIN_SEGMENT_S`), giving each object's segments in time order,
   each with one `TrueState`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eval.synth import record as R
from eval.synth import surfaces
from eval.synth.lexicon import ELONGATED_SHAPES, ROUND_SHAPES, TrueState

MOVING_SPEED = 6.0
"""An object moves when its speed is at least this (units/s)."""
WOBBLE_OMEGA = 0.5
"""A resting non-round object rotating faster than this (rad/s) wobbles."""
TIP_OMEGA = 0.75
"""An elongated object in contact rotating faster than this (rad/s), below `TUMBLE_SPEED`, is toppling."""
TUMBLE_SPEED = 30.0
"""Below this speed (units/s) a rotating elongated object topples; above it, it tumbles."""
TUMBLE_OMEGA = 1.5
"""A moving non-round object in contact rotating faster than this (rad/s) tumbles rather than slides."""
COLLISION_SPEED = 35.0
"""Relative speed (units/s) at the start of an object-object contact that counts as a collision."""
COLLISION_HOLD_S = 0.5
"""A collision is labelled for this long from its first contact (an instant event made watchable)."""
SPIN_OMEGA = 2.0
"""An airborne non-round object rotating faster than this (rad/s) is spinning."""
LANDING_SPEED = 60.0
"""Normal speed (units/s) at the start of a surface contact that makes the following airborne phase a bounce."""
BOUNCE_UP_SPEED = 15.0
"""An airborne object rising faster than this (units/s) is bouncing."""
BOUNCE_WINDOW_S = 1.0
"""An airborne object within this long after a hard landing is bouncing."""
FLY_SPEED = 45.0
"""An airborne object with at least this horizontal speed (units/s), and at least half its vertical speed, flies."""
DROP_ZONE_HEIGHT = 90.0
"""Height above the container's rim (units) within which an airborne object over the opening is over the container."""
EDGE_ZONE = 22.0
"""A supported object whose centre is within this distance (units) of a table edge is at the table's edge."""
LEAN_MIN_DEG, LEAN_MAX_DEG = 12.0, 75.0
"""Tilt range (degrees from its resting orientation) in which an elongated object touching another leans on it."""
FLOOR_NEAR = 30.0
"""An object on the floor within this horizontal distance (units) of a table, ramp, container or shelf is on the
floor by it (``floor_table`` ...); elsewhere it is on the open floor."""
NEAR_GAP = 28.0
"""Largest surface gap (units; centre distance minus both bounding radii) at which another object is next to it."""
POSE_TOL_DEG = 20.0
"""Angular tolerance (degrees) of the upright / on its side / upside down poses."""
MIN_ATTRIBUTE_S = 0.3
"""Minimum duration of a run of one attribute's value after smoothing (seconds)."""
MIN_SEGMENT_S = 0.5
"""Minimum duration of a state segment after smoothing (seconds)."""

THRESHOLDS = {name: globals()[name] for name in (
    "MOVING_SPEED", "WOBBLE_OMEGA", "TIP_OMEGA", "TUMBLE_SPEED", "TUMBLE_OMEGA",
    "COLLISION_SPEED", "COLLISION_HOLD_S", "SPIN_OMEGA", "LANDING_SPEED", "BOUNCE_UP_SPEED", "BOUNCE_WINDOW_S",
    "FLY_SPEED", "DROP_ZONE_HEIGHT", "EDGE_ZONE", "FLOOR_NEAR", "LEAN_MIN_DEG", "LEAN_MAX_DEG", "NEAR_GAP", "POSE_TOL_DEG",
    "MIN_ATTRIBUTE_S", "MIN_SEGMENT_S")}
"""Every labelling threshold by name (units: world units, seconds, radians/s, degrees)."""

POSED_MOTIONS = ("at_rest", "wobbling", "sliding", "pushed", "hanging")
RELATED_MOTIONS = ("at_rest", "wobbling", "toppling")
"""Motions that carry a relation to a nearby object (a moving object's neighbours change as it passes them)."""
ATTRIBUTES = ("motion", "place", "relation", "other", "pose")


@dataclass(frozen=True)
class StateSegment:
    """One smoothed segment of an object's trajectory: its true ``state`` over frames [start, stop)."""

    state: TrueState
    start: int
    stop: int

    @property
    def middle(self) -> int:
        return (self.start + self.stop - 1) // 2


# --------------------------------------------------------------------------------------------------------------
# Stage 1: per-frame attributes (vectorised over frames and objects).


def _recent(events: np.ndarray, hold: int) -> np.ndarray:
    """(F, N) bool: an event happened in this frame or the ``hold - 1`` frames before."""
    out = np.zeros_like(events)
    for d in range(hold):
        out[d:] |= events[: events.shape[0] - d]
    return out


def _since(events: np.ndarray) -> np.ndarray:
    """(F, N) frames since the latest event at or before each frame (large when none)."""
    f = np.arange(events.shape[0])[:, None]
    last = np.where(events, f, -(10**6))
    return f - np.maximum.accumulate(last, axis=0)


def _pushed(rec: R.SimRecord) -> np.ndarray:
    """(F, N) bool: touching the pusher, directly or through a chain of touching objects."""
    pushed = (rec.contacts & R.CONTACT_PUSHER) > 0
    for _ in range(rec.n_objects):
        pushed = pushed | np.einsum("fij,fj->fi", rec.touch, pushed)
    return pushed


def _tilt_deg(angle: np.ndarray) -> np.ndarray:
    """Absolute angle from the resting orientation, folded to [0, 180] degrees."""
    a = np.degrees(np.mod(angle + math.pi, 2 * math.pi) - math.pi)
    return np.abs(a)


def _collisions(rec: R.SimRecord, speed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F, N) bool crashing, bool hit, int other: within `COLLISION_HOLD_S` of a collision as the faster / slower."""
    event = (rec.impact_kind == R.SUPPORT_OBJECT) & (rec.impact_speed >= COLLISION_SPEED) & (rec.impact_other >= 0)
    before = np.concatenate([speed[:1], speed[:-1]])
    other = np.clip(rec.impact_other.astype(np.int64), 0, None)
    faster = before >= np.take_along_axis(before, other, axis=1)
    hold = max(1, round(COLLISION_HOLD_S * rec.fps))
    who = np.where(event, other, -1)
    # the other object of the latest collision within the hold window
    f = np.arange(event.shape[0])[:, None]
    last = np.maximum.accumulate(np.where(event, f, -(10**6)), axis=0)
    recent_other = np.take_along_axis(who, np.clip(last, 0, None), axis=0)
    return _recent(event & faster, hold), _recent(event & ~faster, hold), recent_other


def _motion(rec: R.SimRecord) -> tuple[np.ndarray, np.ndarray]:
    """(F, N) motion names and (F, N) index of the motion's other object (-1 when none)."""
    speed = np.linalg.norm(rec.vel, axis=-1)
    vx, vy = rec.vel[..., 0], rec.vel[..., 1]
    omega = np.abs(rec.angvel)
    shapes = np.asarray(rec.shapes).astype(str)
    round_ = np.isin(shapes, ROUND_SHAPES)[None, :]
    elongated = np.isin(shapes, ELONGATED_SHAPES)[None, :]
    airborne = (rec.contacts == 0) & ~rec.held
    crash, hit, other = _collisions(rec, speed)
    landed = np.isin(rec.impact_kind, surfaces.landing_codes()) & (rec.impact_speed >= LANDING_SPEED)
    after_landing = _since(landed) <= round(BOUNCE_WINDOW_S * rec.fps)
    pushed = _pushed(rec) & (speed >= MOVING_SPEED / 2)
    moving = speed >= MOVING_SPEED
    conds = [
        (rec.held, "hanging"), (crash, "crashing"), (hit, "hit"), (pushed, "pushed"),
        (airborne & ((vy > BOUNCE_UP_SPEED) | after_landing), "bouncing"),
        (airborne & ~round_ & (omega >= SPIN_OMEGA), "spinning"),
        (airborne & (np.abs(vx) >= FLY_SPEED) & (np.abs(vx) >= 0.5 * np.abs(vy)), "flying"),
        (airborne, "falling"),
        (elongated & (omega >= TIP_OMEGA) & (speed < TUMBLE_SPEED), "toppling"),
        (moving & round_, "rolling"), (moving & (omega >= TUMBLE_OMEGA), "tumbling"), (moving, "sliding"),
        (~round_ & (omega >= WOBBLE_OMEGA), "wobbling"),
    ]
    motion = np.select([c for c, _ in conds], [m for _, m in conds], default="at_rest").astype("<U10")
    event_other = np.where(np.isin(motion, ("crashing", "hit")), other, -1)
    return motion, event_other


def _place(rec: R.SimRecord, motion: np.ndarray) -> np.ndarray:
    """(F, N) place names (see the module docstring)."""
    x, y = rec.pos[..., 0], rec.pos[..., 1]
    sup = rec.support
    ix0, ix1, _floor, rim = (float(v) for v in rec.container)
    has_c = not math.isnan(ix0)
    inside = (x >= ix0) & (x <= ix1) & (y < rim) if has_c else np.zeros(x.shape, bool)
    over = (x >= ix0) & (x <= ix1) & (y >= rim) & (y < rim + DROP_ZONE_HEIGHT) if has_c else inside
    on_rim = has_c & ~inside & (np.minimum(np.abs(x - ix0), np.abs(x - ix1)) < 10.0) & (sup == R.SUPPORT_WALL)
    edge = np.zeros(x.shape, bool)
    for ex, ey, _d in rec.edges:
        edge |= (np.abs(x - ex) < EDGE_ZONE) & (y > ey)
    upper = _ramp_upper(rec)
    near = _floor_landmark(rec)
    wall = (rec.contacts & R.CONTACT_WALL) > 0
    airborne = np.isin(motion, ("falling", "flying", "bouncing", "spinning")) & (rec.contacts == 0)
    conds = [
        (rec.held, ""), (airborne & over, "over_container"), (airborne, "air"),
        (inside & np.isin(sup, (R.SUPPORT_CONTAINER, R.SUPPORT_OBJECT)), "container"),
        (on_rim, "rim"), (sup == R.SUPPORT_OBJECT, "on_object"),
        ((sup == R.SUPPORT_TABLE) & edge, "table_edge"), (sup == R.SUPPORT_TABLE, "table"),
        ((sup == R.SUPPORT_RAMP) & upper, "ramp_upper"), (sup == R.SUPPORT_RAMP, "ramp_lower"),
        (sup == R.SUPPORT_SHELF, "shelf"), *[(sup == s.support, s.place) for s in surfaces.placed()],
        ((sup == R.SUPPORT_FLOOR) & wall, "wall"),
        *[((sup == R.SUPPORT_FLOOR) & (near == k), f"floor_{k}") for k in FLOOR_LANDMARKS],
        (sup == R.SUPPORT_FLOOR, "floor"),
        (sup == R.SUPPORT_CONTAINER, "container"),
    ]
    return np.select([c for c, _ in conds], [p for _, p in conds], default="?").astype("<U20")


FLOOR_LANDMARKS = ("table", "ramp", "container", "shelf")


def _floor_landmark(rec: R.SimRecord) -> np.ndarray:
    """(F, N) str: the furniture (`FLOOR_LANDMARKS`) whose horizontal extent is nearest to the object, when within
    `FLOOR_NEAR` units of it (else ``""``): where on the floor the object is."""
    x = rec.pos[..., 0]
    extents: list[tuple[str, float, float]] = []
    for kind, verts, until in zip(rec.static_kind, rec.static_vertices, rec.static_until, strict=True):
        if str(kind) in ("table", "ramp", "container") and math.isinf(until):
            extents.append((str(kind), float(verts[:, 0].min()), float(verts[:, 0].max())))
    kinds = rec.kin_kind if rec.kin_kind is not None else []
    for i, kind in enumerate(kinds):
        if str(kind) == "shelf":
            ox, _oy, w, _h = (float(v) for v in rec.kin_shape[i])
            px = float(rec.kin_pose[0, i, 0])
            extents.append(("shelf", px + ox - w / 2, px + ox + w / 2))
    best = np.full(x.shape, np.inf)
    out = np.full(x.shape, "", "<U9")
    for kind, lo, hi in extents:
        d = np.maximum(0, np.maximum(lo - x, x - hi))
        closer = (d < best) & (d <= FLOOR_NEAR)
        out = np.where(closer, kind, out)
        best = np.where(closer, d, best)
    return out


def _ramp_upper(rec: R.SimRecord) -> np.ndarray:
    """(F, N) bool: on the upper half of the nearest ramp (by horizontal position along its slope)."""
    x = rec.pos[..., 0]
    ramps = rec.ramps if rec.ramps is not None else np.zeros((0, 4), np.float32)
    if len(ramps) == 0:
        return np.zeros(x.shape, bool)
    best = np.full(x.shape, np.inf)
    upper = np.zeros(x.shape, bool)
    for xt, _yt, xb, _yb in ramps:
        lo, hi = min(xt, xb), max(xt, xb)
        dist = np.maximum(0, np.maximum(lo - x, x - hi))
        u = (x - xt) / (xb - xt) if xb != xt else np.zeros_like(x)  # 0 at the top end, 1 at the bottom
        closer = dist < best
        upper = np.where(closer, u < 0.5, upper)
        best = np.where(closer, dist, best)
    return upper


def _relation(rec: R.SimRecord, motion: np.ndarray, place: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(F, N) relation names and (F, N) other-object index (-1 when none)."""
    n = rec.n_objects
    F = rec.n_frames
    rel = np.full((F, n), "", "<U8")
    other = np.full((F, n), -1, np.int64)
    if n < 2:
        return rel, other
    shapes = np.asarray(rec.shapes).astype(str)
    radius = np.hypot(rec.sizes[:, 0], rec.sizes[:, 1]) / 2
    d = np.linalg.norm(rec.pos[:, :, None, :] - rec.pos[:, None, :, :], axis=-1)
    gap = d - radius[None, :, None] - radius[None, None, :]
    idx = np.arange(n)
    gap[:, idx, idx] = np.inf
    gap = np.where(rec.held[:, None, :], np.inf, gap)  # held objects are nobody's neighbour
    sup_other = rec.support_other if rec.support_other is not None else np.full((F, n), -1)
    supported_by = (sup_other[:, None, :] == idx[None, :, None]) & (rec.support[:, None, :] == R.SUPPORT_OBJECT)
    # supported_by[f, k, j]: object j rests on k
    tilt = _tilt_deg(rec.angle)
    lean_tilt = np.minimum(tilt, np.abs(180 - tilt))  # from upright or upside down
    lean_tilt = np.where(np.isin(shapes, ("plank", "brick"))[None, :], np.minimum(lean_tilt, np.abs(90 - tilt)), lean_tilt)
    elong = np.isin(shapes, ELONGATED_SHAPES)[None, :]
    touch = rec.touch.copy()
    touch[:, idx, idx] = False
    touch &= ~rec.held[:, None, :]
    near_gap = np.where(touch, -1.0, gap)
    nearest = np.argmin(near_gap, axis=2)
    nearest_gap = np.take_along_axis(near_gap, nearest[..., None], axis=2)[..., 0]
    any_under = supported_by.any(axis=2)
    under_j = np.argmax(supported_by, axis=2)
    touching = touch.any(axis=2)
    leaning = elong & (lean_tilt >= LEAN_MIN_DEG) & (lean_tilt <= LEAN_MAX_DEG) & touching
    rel = np.select([any_under, leaning, touching, nearest_gap <= NEAR_GAP], ["under", "leaning", "touching", "next_to"],
                    default="").astype("<U8")
    other = np.where(any_under, under_j, np.where(rel != "", nearest, -1))
    skip = ~np.isin(motion, RELATED_MOTIONS) | (place == "on_object")
    rel = np.where(skip, "", rel)
    other = np.where(skip, -1, other)
    return rel, other


def _pose(rec: R.SimRecord, motion: np.ndarray) -> np.ndarray:
    tilt = _tilt_deg(rec.angle)
    round_ = np.isin(np.asarray(rec.shapes).astype(str), ROUND_SHAPES)[None, :]
    pose = np.select([tilt <= POSE_TOL_DEG, tilt >= 180 - POSE_TOL_DEG, np.abs(tilt - 90) <= POSE_TOL_DEG],
                     ["upright", "upside_down", "side"], default="tilted").astype("<U11")
    return np.where(round_ | ~np.isin(motion, POSED_MOTIONS), "", pose)


def frame_attributes(rec: R.SimRecord) -> dict[str, np.ndarray]:
    """(F, N) arrays ``motion``, ``place``, ``relation``, ``pose`` (str) and ``other`` (object index or
    -1: the other object of an event motion, of ``on_object`` or of the relation)."""
    motion, event_other = _motion(rec)
    place = _fill_unknown(_place(rec, motion))
    # an event names its other object; the object it rests on is then not named too
    place = np.where((event_other >= 0) & (place == "on_object"), "", place)
    relation, rel_other = _relation(rec, motion, place)
    sup_other = rec.support_other if rec.support_other is not None else np.full(motion.shape, -1)
    other = np.where(event_other >= 0, event_other,
                     np.where(place == "on_object", sup_other, rel_other)).astype(np.int64)
    return {"motion": motion, "place": place, "relation": relation, "other": other,
            "pose": _pose(rec, motion)}


def _fill_unknown(place: np.ndarray) -> np.ndarray:
    """Frames whose place no rule decides (e.g. pressed only against a wall or a gate) keep the previous place."""
    out = place.copy()
    for f in range(1, out.shape[0]):
        unknown = out[f] == "?"
        out[f, unknown] = out[f - 1, unknown]
    return np.where(out == "?", "floor", out)


# --------------------------------------------------------------------------------------------------------------
# Stages 2-3: smoothing into segments.


def smooth(labels: np.ndarray, min_frames: int) -> list[tuple[int, int, int]]:
    """Runs ``(label, start, stop)`` of one object's integer labels (F,), every one at least ``min_frames`` long:
    repeatedly the shortest run shorter than that is merged into its neighbours (into both when they agree, so
    A-B-A flicker becomes A; else into the longer one, the earlier on ties)."""
    change = np.flatnonzero(np.diff(labels)) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [len(labels)]])
    runs = [[int(labels[a]), int(a), int(b)] for a, b in zip(starts, stops, strict=True)]
    while len(runs) > 1:
        short = [i for i, r in enumerate(runs) if r[2] - r[1] < min_frames]
        if not short:
            break
        i = min(short, key=lambda j: (runs[j][2] - runs[j][1], j))
        left = runs[i - 1] if i > 0 else None
        right = runs[i + 1] if i + 1 < len(runs) else None
        if left is not None and right is not None and left[0] == right[0]:
            runs[i - 1: i + 2] = [[left[0], left[1], right[2]]]
        elif right is None or (left is not None and left[2] - left[1] >= right[2] - right[1]):
            runs[i - 1: i + 1] = [[left[0], left[1], runs[i][2]]]
        else:
            runs[i: i + 2] = [[right[0], runs[i][1], right[2]]]
    return [tuple(r) for r in runs]


def _smoothed(values: np.ndarray, min_frames: int) -> np.ndarray:
    """One attribute's per-frame values of one object (F,), with short runs merged (`smooth`)."""
    uniq, codes = np.unique(values, return_inverse=True)
    out = np.empty_like(values)
    for label, a, b in smooth(codes, min_frames):
        out[a:b] = uniq[label]
    return out


def trajectories(rec: R.SimRecord) -> list[list[StateSegment]]:
    """Each object's smoothed trajectory of true states (segments cover all frames, in time order)."""
    attrs = frame_attributes(rec)
    kinds = [str(s) for s in rec.shapes]
    min_attr = max(1, round(MIN_ATTRIBUTE_S * rec.fps))
    min_seg = max(1, round(MIN_SEGMENT_S * rec.fps))
    out = []
    for k in range(rec.n_objects):
        cols = {a: _smoothed(attrs[a][:, k], min_attr) for a in ("motion", "place", "relation", "pose")}
        other = attrs["other"][:, k]
        names = np.array(["" if j < 0 else kinds[j] for j in other], dtype=object)
        cols["other"] = _smoothed(names.astype(str), min_attr)
        cols["other"] = np.where((cols["relation"] == "") & ~np.isin(cols["motion"], ("crashing", "hit"))
                                 & (cols["place"] != "on_object"), "", cols["other"])
        keys = np.array(["|".join(str(cols[a][f]) for a in ATTRIBUTES) for f in range(rec.n_frames)], dtype=object)
        uniq, codes = np.unique(keys.astype(str), return_inverse=True)
        segs = [StateSegment(_state(uniq[label], names[a:b]), a, b) for label, a, b in smooth(codes, min_seg)]
        out.append(segs)
    return out


def _state(key: str, raw_others: np.ndarray) -> TrueState:
    """A true state from a smoothed frame key, made consistent: a slot that names another object gets one (the
    segment's most frequent raw other object when smoothing left it empty), and ``other`` is kept only where a slot
    names it; pose only for the motions that have it."""
    motion, place, relation, other, pose = key.split("|")
    needs_other = bool(relation) or motion in ("crashing", "hit") or place == "on_object"
    if needs_other and not other:
        named = [str(o) for o in raw_others if o]
        if named:
            values, counts = np.unique(named, return_counts=True)
            other = str(values[int(np.argmax(counts))])
        else:
            relation = ""
            place = "floor" if place == "on_object" else place
            motion = "at_rest" if motion in ("crashing", "hit") else motion
    if other and not needs_other:
        other = ""
    return TrueState(motion, place, relation, other if (relation or motion in ("crashing", "hit")
                                                         or place == "on_object") else "",
                     pose if motion in POSED_MOTIONS else "")
