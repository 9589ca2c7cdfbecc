"""Motion predicates from the synthetic benchmark's simulator record (DynaPix's recipe, paper 004, appendix
"Rationale construction"): direction and relative speed, speed trend, collision course, contact and support at the
end of the clip. Every statement is qualitative evidence, none names a state; each `Fact` carries a machine-readable
``value`` (a direction, a support, the other object) for the validator's contradiction check; the thresholds are the named constants below (world units of
`eval.synth.record`: a 2D world about 400 x 300 units, y up; speeds in units/s).

Windows (frame ``f = round(t * fps)``):

- *observation window*: the last `COURSE_FRAMES` frames of the prefix, ending at ``f_end = round(prefix_end * fps)``
  (DynaPix inspects the 5 frames before its cut). Velocity ``v`` = the mean of the record's velocities over it;
  speed ``|v|``.
- *future window*: frames ``f_end + 1 .. f_target``, where the target moment is ``prefix_end + k`` for Q3 and the
  middle of the target segment otherwise (`target_moment`). Nothing after it is used, so no statement reaches past the
  question's horizon.

Rules:

- direction: not moving when ``|v| < STATIONARY_SPEED`` (the labeller's moving threshold; DynaPix: 0.05 in CLEVRER
  units); else horizontal when ``|v_y| < DIAGONAL_RATIO |v_x|``, vertical when ``|v_x| < DIAGONAL_RATIO |v_y|``,
  diagonal otherwise (image left/right = world x, up = world +y);
- relative speed: against the fastest other moving object: faster when the ratio of speeds ``>= SPEED_RATIO``,
  slower when ``<= 1 / SPEED_RATIO``, about as fast otherwise; "the only object moving" when no other moves;
- speed trend: speeding up when the speed at the end of the window is ``>= TREND_UP`` times the speed at its start,
  getting slower when ``<= TREND_DOWN`` times (only for moving objects);
- collision course: another object is on a collision course when their centre distance shrinks by at least
  `APPROACH_MIN` units over the observation window *and* they touch during the future window (the record's
  ``touch``); "no other object is on a collision course" when it touches none in the future window;
- support: what holds it up at ``f_end`` (the record's ``support``, named by `SUPPORT_NAMES`; another object is named
  by the record's ``support_other``, else the touching object below it; a container wall holding an object outside
  the opening within `RIM_ZONE` of it is the container's rim, `on_rim`); "nothing holds it up" for airborne frames.
  The support *at the target moment* is not stated: it is the answer's location reworded ("supported by the floor" -> resting on the floor), not evidence for it;
- contact: the other objects it touches at ``f_end`` (the record's ``touch``);
- layout: the furniture the frames show at ``f_end``, from the record's static and kinematic pieces (`LAYOUT_NAMES`:
  table, ramp, container, shelf, pusher, a gate still standing, a gripper still holding an object), so the scene is
  described by what is in it, whatever the family or domain.
"""

from __future__ import annotations

import numpy as np

from distill.facts import Fact
from eval.synth import record as R
from eval.synth.states import MOVING_SPEED

STATIONARY_SPEED = MOVING_SPEED
"""Below this speed (units/s) an object is not moving: the labeller's own threshold."""
COURSE_FRAMES = 5
"""Frames at the end of the prefix that direction, speed and collision course are read from (DynaPix: 5)."""
DIAGONAL_RATIO = 0.4
"""A velocity is horizontal (vertical) when its other component is below this fraction of it; else diagonal."""
SPEED_RATIO = 1.5
"""Speed ratio from which one object counts as faster than another (its inverse: slower)."""
TREND_UP = 1.25
"""End-of-window / start-of-window speed ratio from which an object is speeding up."""
TREND_DOWN = 0.8
"""End-of-window / start-of-window speed ratio up to which an object is getting slower."""
APPROACH_MIN = 2.0
"""Decrease of the centre distance (units) over the observation window that counts as approaching."""

RIM_ZONE = 10.0
"""A container wall supports an object on its rim when the object's centre is within this many units (x) of the
container's inner wall (`eval.synth.states` uses the same zone for the ``rim`` place)."""

SUPPORT_NAMES = {R.SUPPORT_FLOOR: "the floor", R.SUPPORT_TABLE: "the table", R.SUPPORT_RAMP: "the ramp",
                 R.SUPPORT_CONTAINER: "the bottom of the container", R.SUPPORT_PUSHER: "the pusher",
                 R.SUPPORT_WALL: "the wall", R.SUPPORT_GATE: "the gate", R.SUPPORT_SHELF: "the shelf"}
"""Support code (`eval.synth.record` ``SUPPORT_*``) -> its words; ``SUPPORT_OBJECT`` names the object."""

LAYOUT_NAMES = {"table": "a table", "ramp": "a ramp", "container": "an open container", "shelf": "a shelf on the wall",
                "pusher": "a flat pusher", "gate": "a gate across the ramp", "gripper": "a gripper holding an object"}
"""Pieces of the layout sentence, in this order."""


def frame_of(rec, t: float) -> int:
    """The record frame of time ``t`` (seconds), clipped to the record."""
    return int(np.clip(round(t * rec.fps), 0, rec.n_frames - 1))


def target_moment(query, segment: tuple[float, float] | None) -> float:
    """The time (s) the question asks about: ``prefix_end + k`` for Q3, else the middle of the target segment
    (its start when the segment's end is unknown)."""
    if query.qtype == "Q3" and query.k_seconds is not None:
        return float(query.prefix_end) + float(query.k_seconds)
    if segment is not None:
        return 0.5 * (segment[0] + segment[1])
    return float(query.target_time)


DIRECTION_TEXT = {"right": "to the right", "left": "to the left", "up": "upward", "down": "downward",
                  "up-right": "up and to the right", "up-left": "up and to the left",
                  "down-right": "down and to the right", "down-left": "down and to the left"}
"""direction value -> its words (the value ``still`` means not moving)."""


def direction_value(v: np.ndarray) -> str:
    """``"still"`` below `STATIONARY_SPEED`, else a key of `DIRECTION_TEXT`."""
    vx, vy = float(v[0]), float(v[1])
    if np.hypot(vx, vy) < STATIONARY_SPEED:
        return "still"
    horiz = "right" if vx > 0 else "left"
    vert = "up" if vy > 0 else "down"
    if abs(vy) < DIAGONAL_RATIO * abs(vx):
        return horiz
    if abs(vx) < DIAGONAL_RATIO * abs(vy):
        return vert
    return f"{vert}-{horiz}"


def direction_text(v: np.ndarray) -> str | None:
    """``"to the right"``, ``"downward"``, ``"down and to the left"``...; None below `STATIONARY_SPEED`."""
    d = direction_value(v)
    return None if d == "still" else DIRECTION_TEXT[d]


def _window(rec, f_end: int) -> slice:
    return slice(max(0, f_end - COURSE_FRAMES + 1), f_end + 1)


def _support_name(rec, f: int, k: int) -> str | None:
    code = int(rec.support[f, k])
    if code == R.SUPPORT_OBJECT:
        j = int(rec.support_other[f, k]) if rec.support_other is not None else -1
        if 0 <= j < rec.n_objects and j != k:
            return f"the {rec.subjects[j]}"
        others = [j for j in np.flatnonzero(rec.touch[f, k]) if j != k and rec.pos[f, j, 1] < rec.pos[f, k, 1]]
        return f"the {rec.subjects[others[0]]}" if others else "another object"
    if code == R.SUPPORT_WALL and on_rim(rec, f, k):
        return "the rim of the container"
    return SUPPORT_NAMES.get(code)


def on_rim(rec, f: int, k: int) -> bool:
    """Object ``k``'s centre at frame ``f`` is outside the container's opening and within `RIM_ZONE` (x) of one of
    its inner walls (`eval.synth.states` labels a wall-supported object there ``rim``)."""
    c = rec.container
    if not np.isfinite(c).all():
        return False
    x, y = (float(v) for v in rec.pos[f, k])
    inside = c[0] <= x <= c[1] and y < c[3]
    return not inside and min(abs(x - c[0]), abs(x - c[1])) < RIM_ZONE


def layout_fact(rec, f: int) -> Fact:
    """What furniture the frames show at frame ``f`` (`LAYOUT_NAMES`); ``value``: the pieces joined by ``|``."""
    t = float(rec.t[f])
    present = {str(k) for k, until in zip(rec.static_kind, rec.static_until, strict=True) if until > t}
    if rec.kin_kind is not None:
        present |= {str(k) for k in rec.kin_kind}
    if rec.held[f].any():
        present.add("gripper")
    pieces = [k for k in LAYOUT_NAMES if k in present]
    if not pieces:
        return Fact("layout", "The frames show objects on an open floor between two walls.", "scene", "")
    names = [LAYOUT_NAMES[k] for k in pieces]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    return Fact("layout", f"The frames show a room with {listed}.", "scene", "|".join(pieces))


def _speed_facts(rec, k: int, subject: str, w: slice) -> list[Fact]:
    v = rec.vel[w].mean(axis=0)  # (N, 2)
    speed = np.hypot(v[:, 0], v[:, 1])
    facts = []
    d = direction_value(v[k])
    if d == "still":
        facts.append(Fact("direction", f"The {subject} is not moving at the end of the clip.", "motion", d))
    else:
        facts.append(Fact("direction", f"At the end of the clip the {subject} is moving {DIRECTION_TEXT[d]}.",
                          "motion", d))
        s0, s1 = np.hypot(*rec.vel[w.start, k]), np.hypot(*rec.vel[w.stop - 1, k])
        if s1 >= TREND_UP * max(s0, 1e-6):
            facts.append(Fact("speed_trend", "It is speeding up.", "motion", "faster"))
        elif s1 <= TREND_DOWN * s0:
            facts.append(Fact("speed_trend", "It is getting slower.", "motion", "slower"))
    others = [j for j in range(rec.n_objects) if j != k and not rec.held[w.stop - 1, j]]
    moving = [j for j in others if speed[j] >= STATIONARY_SPEED]
    if speed[k] >= STATIONARY_SPEED:
        if not moving:
            if others:
                facts.append(Fact("relative_speed", f"The {subject} is the only object that is moving.", "motion",
                                  "only"))
        else:
            j = max(moving, key=lambda i: speed[i])
            r = speed[k] / speed[j]
            rel = "faster than" if r >= SPEED_RATIO else "slower than" if r <= 1 / SPEED_RATIO else "about as fast as"
            facts.append(Fact("relative_speed", f"It is moving {rel} the {rec.subjects[j]}.", "motion", rel))
    elif moving:
        j = max(moving, key=lambda i: speed[i])
        facts.append(Fact("relative_speed", f"The {rec.subjects[j]} is moving while the {subject} stays still.",
                          "motion", "still"))
    return facts


def _collision_facts(rec, k: int, subject: str, w: slice, f_end: int, f_target: int) -> list[Fact]:
    others = [j for j in range(rec.n_objects) if j != k]
    if not others:
        return []
    future = slice(f_end + 1, max(f_end + 1, f_target + 1))
    facts = []
    touched = False
    for j in others:
        contact = bool(rec.touch[future, k, j].any())
        touched |= contact
        d0 = np.hypot(*(rec.pos[w.start, k] - rec.pos[w.start, j]))
        d1 = np.hypot(*(rec.pos[w.stop - 1, k] - rec.pos[w.stop - 1, j]))
        if contact and d0 - d1 >= APPROACH_MIN and not rec.held[w.stop - 1, j]:
            sk, sj = np.hypot(*rec.vel[w.stop - 1, k]), np.hypot(*rec.vel[w.stop - 1, j])
            mover = f"the {subject} is heading toward the {rec.subjects[j]}" if sk >= sj else \
                f"the {rec.subjects[j]} is heading toward the {subject}"
            facts.append(Fact("collision_course", f"The {subject} and the {rec.subjects[j]} are on a collision "
                                                  f"course: {mover}.", "motion", str(rec.subjects[j])))
    if not touched:
        facts.append(Fact("collision_course", f"No other object is on a collision course with the {subject}.",
                          "motion", "none"))
    return facts


def _support_facts(rec, k: int, subject: str, f_end: int) -> list[Fact]:
    """What holds the object up, and what it touches, at the end of the clip."""
    if rec.held[f_end, k]:
        facts = [Fact("support_now", f"The {subject} is held by the gripper above the scene.", "scene", "gripper")]
    else:
        now = _support_name(rec, f_end, k)
        facts = [Fact("support_now", f"The {subject} is supported by {now}." if now else
                      f"Nothing is holding the {subject} up at the end of the clip.", "scene", now or "nothing")]
    touching = [str(rec.subjects[j]) for j in np.flatnonzero(rec.touch[f_end, k]) if j != k]
    if touching:
        listed = " and ".join(f"the {s}" for s in touching)
        facts.append(Fact("contact_now", f"At the end of the clip the {subject} is touching {listed}.", "scene",
                          "|".join(touching)))
    return facts


def _scene_facts(rec, k: int, subject: str, f_end: int) -> list[Fact]:
    n = rec.n_objects
    names = [str(s) for j, s in enumerate(rec.subjects) if j != k]
    facts = [layout_fact(rec, f_end)]
    if names:
        listed = names[0] if len(names) == 1 else ", ".join(f"the {x}" for x in names[:-1]) + f" and the {names[-1]}"
        if len(names) == 1:
            listed = f"the {listed}"
        facts.append(Fact("scene_objects", f"Besides the {subject}, the scene holds {listed}.", "scene",
                          "|".join(names)))
    elif n == 1:
        facts.append(Fact("scene_objects", f"The {subject} is the only object in the scene.", "scene", ""))
    x, y = rec.pos[f_end, k]
    for ex, ey, direction in rec.edges:
        ahead = (ex - x) * direction > 0
        if rec.support[f_end, k] == R.SUPPORT_TABLE and y > ey and ahead and \
                rec.vel[f_end, k, 0] * direction >= STATIONARY_SPEED:
            facts.append(Fact("edge", f"The {subject} is moving toward the edge of the table.", "motion", "edge"))
            break
    c = rec.container
    if np.isfinite(c).all() and c[0] <= x <= c[1] and y > c[3]:
        facts.append(Fact("container", f"The {subject} is above the opening of the container.", "scene",
                          "above_opening"))
    return facts


def motion_facts(rec, query, moment: float) -> list[Fact]:
    """The motion predicates of one query's object from its video's simulator record (empty when the object is
    not in the record)."""
    ids = [str(x) for x in rec.object_ids]
    if query.object_id not in ids:
        return []
    k = ids.index(query.object_id)
    subject = query.subject
    f_end = frame_of(rec, query.prefix_end)
    f_target = max(frame_of(rec, moment), f_end)
    w = _window(rec, f_end)
    facts = _scene_facts(rec, k, subject, f_end)
    facts += _support_facts(rec, k, subject, f_end)
    if not rec.held[f_end, k]:
        facts += _speed_facts(rec, k, subject, w)
    facts += _collision_facts(rec, k, subject, w, f_end, f_target)
    return facts


def _approach_facts(rec, k: int, subject: str, w: slice) -> list[Fact]:
    """The objects whose centre distance to object ``k`` shrinks by at least `APPROACH_MIN` units over the observation
    window ``w`` (the approach half of a collision course, read from the prefix alone)."""
    out = []
    for j in range(rec.n_objects):
        if j == k or rec.held[w.stop - 1, j]:
            continue
        d0 = np.hypot(*(rec.pos[w.start, k] - rec.pos[w.start, j]))
        d1 = np.hypot(*(rec.pos[w.stop - 1, k] - rec.pos[w.stop - 1, j]))
        if d0 - d1 >= APPROACH_MIN:
            out.append(str(rec.subjects[j]))
    if not out:
        return []
    listed = " and ".join(f"the {s}" for s in out)
    return [Fact("approaching", f"The {subject} and {listed} are getting closer.", "motion", "|".join(out))]


def prefix_facts(rec, query) -> list[Fact]:
    """The simulator facts of one query's object that frames up to the end of the prefix decide (frame ``f_end``
    and the observation window before it; never a later frame): layout, the other objects, table edge, container
    opening, support and contact, direction, speed trend, relative speed, and the objects it is approaching. Empty
    when the object is not in the record. The perception-solved student's evidence (`distill.evidence`)."""
    ids = [str(x) for x in rec.object_ids]
    if query.object_id not in ids:
        return []
    k = ids.index(query.object_id)
    f_end = frame_of(rec, query.prefix_end)
    w = _window(rec, f_end)
    facts = _scene_facts(rec, k, query.subject, f_end) + _support_facts(rec, k, query.subject, f_end)
    if not rec.held[f_end, k]:
        facts += _speed_facts(rec, k, query.subject, w)
    return facts + _approach_facts(rec, k, query.subject, w)
