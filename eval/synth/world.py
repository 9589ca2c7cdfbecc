"""The simulated world of the synthetic benchmark: a pymunk space with its furniture, objects and scheduled events,
run into the per-frame record (`eval.synth.record`).

Scene families (`eval.synth.scenes`) build a `World` piece by piece: static pieces of a registered surface kind
(`eval.synth.surfaces`: floor, walls, tables, ramps, gates, containers), kinematic pieces (a pusher, a tilting shelf),
objects (`ObjectSpec`, materials from `OBJECT_MATERIALS`) that may be held by a gripper until released or struck at a
time; `World.run` simulates and records. Physics runs at `PHYSICS_HZ` with `SUBSTEPS` steps a frame after an
unrecorded `PREROLL_FRAMES` settle. Round shapes get a constant rolling resistance (`ROLL_DECEL`) while supported,
since pymunk has none. Builders are written left to right; a scene may ask to be mirrored (`World.mirror_if`), and
`World.run` mirrors its record (`eval.synth.record.mirror`).

Units: world units (``_U``; the world is about 400 x 300 of them, y up), seconds (``_S``), units per second
(``_U_S``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pymunk

from eval.synth import record as R
from eval.synth import surfaces
from eval.synth.lexicon import COLORS, ROUND_SHAPES, SHAPES, size_word, subject_name

FPS = 20
"""Frames per second of the record and of frame indices (frame ``f`` is at t = f / FPS)."""
SLOW_MOTION = 2.0
"""The world runs this many times slower than real gravity would make it: gravity is divided by its square, every
launch speed (kicks, releases, the pusher, the shelf's tilt) by it, so trajectories keep their shapes and states last
long enough to be watched and foreseen."""
SUBSTEPS = 3
PHYSICS_HZ = FPS * SUBSTEPS
PREROLL_FRAMES = 10
"""Unrecorded settling time before t = 0 (frames)."""
SOLVER_ITERATIONS = 20
"""pymunk's constraint-solver iterations per step."""
EVENT_TIME_TOL_S = 1e-9
"""A scheduled event fires at the first step whose time is within this of its time."""
GRAVITY = -900.0 / SLOW_MOTION**2
"""Gravity (units/s^2, y up)."""
DAMPING = 0.85 ** (1 / SLOW_MOTION)
"""Fraction of velocity kept after one second (a little air drag)."""
ROLL_DECEL = 50.0 / SLOW_MOTION**2
"""Rolling resistance of a supported round object (units/s^2)."""
SUPPORT_NORMAL_Y = 0.5
"""A contact supports an object when its normal (object -> other) has y < -0.5 (the other surface lies within 60
degrees of straight below)."""
FLOOR_Y = 20.0
"""Height of the floor surface."""
DURATION_S = 12.0
"""Video length (seconds)."""
WORLD_X = (0.0, 400.0)
"""Horizontal extent of every scene (walls just outside)."""

FLOOR_X_U = (-200.0, 600.0)
FLOOR_BOTTOM_U = -40.0
"""The floor slab: its horizontal extent and its bottom (its top is `FLOOR_Y`)."""
WALL_GAP_U = 10.0
"""The side walls stand this far outside `WORLD_X`."""
WALL_THICKNESS_U = 30.0
WALL_TOP_U = 420.0
TABLE_THICKNESS_U = 8.0
TABLE_LEG_WIDTH_U = 6.0
TABLE_LEG_INSET_U = 6.0
"""A table's legs stand this far inside its two ends."""
CONTAINER_WALL_U = 6.0
"""Thickness of a container's base and walls."""
SHELF_THICKNESS_U = 6.0
AREA_PER_MASS_U2 = 100.0
"""An object's mass is its density times its area divided by this."""

OBJECT_MATERIALS: dict[str, tuple[float, float, float]] = {
    "ball": (0.9, 0.65, 1.5), "wheel": (1.0, 0.35, 1.2), "cube": (0.45, 0.25, 1.2), "brick": (0.45, 0.2, 1.0),
    "domino": (0.7, 0.1, 0.5), "plank": (0.6, 0.15, 0.6), "wedge": (0.55, 0.2, 1.1), "can": (0.4, 0.3, 0.9)}
"""Shape -> friction, elasticity, density of the objects of that shape."""


@dataclass(frozen=True)
class ObjectSpec:
    """One dynamic object: ``object_id`` (``o0``...), palette ``color``, ``shape``, ``size`` (w, h), ``texture``."""

    object_id: str
    color: str
    shape: str
    size: tuple[float, float]
    texture: str = "solid"

    @property
    def subject(self) -> str:
        return subject_name(self.color, self.shape, size_word(self.shape, self.size[0]))

    @property
    def half_height(self) -> float:
        return self.size[1] / 2

    @property
    def radius(self) -> float:
        """Bounding-circle radius."""
        return float(math.hypot(*self.size)) / 2


TEXTURES = ("solid", "striped", "dotted", "two_tone")
SQUARE_SHAPES = ("ball", "wheel", "cube")
"""Shapes whose height is their width."""


def pick_objects(rng: np.random.Generator, shapes: list[str], colors: list[str] | None = None) -> list[ObjectSpec]:
    """Specs for the given shapes with distinct colours (every subject in a video is unique)."""
    colors = colors if colors is not None else [str(c) for c in rng.permutation(list(COLORS))]
    out = []
    for k, shape in enumerate(shapes):
        (w0, w1), (h0, h1) = SHAPES[shape]
        w = float(np.round(rng.uniform(w0, w1), 1))
        h = w if shape in SQUARE_SHAPES else float(np.round(rng.uniform(h0, h1), 1))
        texture = str(TEXTURES[int(rng.integers(len(TEXTURES)))])
        out.append(ObjectSpec(f"o{k}", colors[k], shape, (w, h), texture))
    return out


def box(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _verts(spec: ObjectSpec) -> list[tuple[float, float]]:
    """Body-frame vertices of a polygon shape (wedge: right angle at the bottom left)."""
    w, h = spec.size
    if spec.shape == "wedge":
        return [(-w / 2, -h / 2), (w / 2, -h / 2), (-w / 2, h / 2)]
    return box(-w / 2, -h / 2, w / 2, h / 2)


class World:
    """A pymunk space plus what the record needs: static pieces, kinematic pieces, objects, scheduled events, and
    whether the finished scene is mirrored (`mirror_if`)."""

    def __init__(self, family: str, walls: tuple[float, float] = (WORLD_X[0] - WALL_GAP_U, WORLD_X[1] + WALL_GAP_U)):
        self.family = family
        self.space = pymunk.Space()
        self.space.gravity = (0.0, GRAVITY)
        self.space.damping = DAMPING
        self.space.iterations = SOLVER_ITERATIONS
        self.statics: list[tuple[str, list[tuple[float, float]], float]] = []
        self.shape_info: dict[pymunk.Shape, tuple[int, int]] = {}  # shape -> (support code, object index or -1)
        self.objects: list[ObjectSpec] = []
        self.bodies: list[pymunk.Body] = []
        self.in_space: list[bool] = []
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.edges: list[tuple[float, float, float]] = []
        self.ramps: list[tuple[float, float, float, float]] = []
        self.container = (math.nan,) * 4
        self.kinematic: list[tuple[str, pymunk.Body, tuple[float, float]]] = []
        self.pusher: pymunk.Body | None = None
        self.pusher_stop_x = math.inf
        self.mirrored = False
        self.add_static("floor", box(FLOOR_X_U[0], FLOOR_BOTTOM_U, FLOOR_X_U[1], FLOOR_Y))
        self.add_static("wall", box(walls[0] - WALL_THICKNESS_U, FLOOR_Y, walls[0], WALL_TOP_U))
        self.add_static("wall", box(walls[1], FLOOR_Y, walls[1] + WALL_THICKNESS_U, WALL_TOP_U))

    # --- building ---
    def add_static(self, kind: str, verts: list[tuple[float, float]], until: float = math.inf,
                   support: int | None = None) -> None:
        """A static convex piece of 3 or 4 vertices of a registered surface ``kind`` (`eval.synth.surfaces`):
        ``until``: the time it is removed (an opening gate); ``support``: a code other than the kind's own (a
        container's walls hold objects up as walls do)."""
        surface = surfaces.get(kind)
        shape = pymunk.Poly(self.space.static_body, verts)
        shape.friction, shape.elasticity = surface.friction, surface.elasticity
        self.space.add(shape)
        self.shape_info[shape] = (surface.support if support is None else support, -1)
        self.statics.append((kind, verts, until))
        if math.isfinite(until):
            self.schedule(until, lambda: self.space.remove(shape))

    def add_ramp(self, x_top: float, y_top: float, x_bottom: float, y_bottom: float) -> None:
        """A ramp descending from (x_top, y_top) to (x_bottom, y_bottom), filled down to the floor."""
        verts = [(x_top, FLOOR_Y), (x_bottom, FLOOR_Y), (x_bottom, y_bottom), (x_top, y_top)]
        if x_bottom < x_top:
            verts = [(x_bottom, FLOOR_Y), (x_top, FLOOR_Y), (x_top, y_top), (x_bottom, y_bottom)]
        self.add_static("ramp", verts)
        self.ramps.append((x_top, y_top, x_bottom, y_bottom))

    def add_table(self, x0: float, x1: float, top: float, edges: tuple[int, ...] = (-1, 1)) -> None:
        """A table top [x0, x1] at height ``top`` with two legs; ``edges``: sides objects can go over."""
        self.add_static("table", box(x0, top - TABLE_THICKNESS_U, x1, top))
        for lx in (x0 + TABLE_LEG_INSET_U, x1 - (TABLE_LEG_INSET_U + TABLE_LEG_WIDTH_U)):
            self.add_static("leg", box(lx, FLOOR_Y, lx + TABLE_LEG_WIDTH_U, top - TABLE_THICKNESS_U))
        for d in edges:
            self.edges.append((x1 if d > 0 else x0, top, float(d)))

    def add_container(self, cx: float, width: float, wall_h: float, base: float = FLOOR_Y) -> None:
        """An open container centred at ``cx``: inner ``width``, walls ``wall_h`` high above its base."""
        th = CONTAINER_WALL_U
        ix0, ix1 = cx - width / 2, cx + width / 2
        bottom = base + th
        self.add_static("container", box(ix0 - th, base, ix1 + th, bottom))
        self.add_static("container", box(ix0 - th, bottom, ix0, bottom + wall_h), support=R.SUPPORT_WALL)
        self.add_static("container", box(ix1, bottom, ix1 + th, bottom + wall_h), support=R.SUPPORT_WALL)
        self.container = (ix0, ix1, bottom, bottom + wall_h)

    def schedule(self, t: float, fn: Callable[[], None]) -> None:
        self.events.append((t, len(self.events), fn))

    def mirror_if(self, flip: bool) -> World:
        """Mark the scene to be mirrored left-right about the middle of `WORLD_X` when ``flip`` (so layouts don't
        always run rightwards; `run` mirrors the record) and return it."""
        self.mirrored = bool(flip)
        return self

    def add_object(self, spec: ObjectSpec, pos: tuple[float, float], angle: float = 0.0,
                   vel: tuple[float, float] = (0.0, 0.0), release: float | None = None,
                   kick: tuple[float, tuple[float, float]] | None = None) -> int:
        """Add an object; ``release``: held by the gripper until then; ``kick``: (time, velocity) set at that time.
        Returns its index."""
        spec = replace(spec, object_id=f"o{len(self.objects)}")  # ids stay contiguous when a spec did not fit
        friction, elasticity, density = OBJECT_MATERIALS[spec.shape]
        w, h = spec.size
        if spec.shape in ROUND_SHAPES:
            mass = density * math.pi * (w / 2) ** 2 / AREA_PER_MASS_U2
            body = pymunk.Body(mass, pymunk.moment_for_circle(mass, 0, w / 2))
            shape: pymunk.Shape = pymunk.Circle(body, w / 2)
        else:
            verts = _verts(spec)
            area = w * h / (2.0 if spec.shape == "wedge" else 1.0)
            mass = density * area / AREA_PER_MASS_U2
            body = pymunk.Body(mass, pymunk.moment_for_poly(mass, verts))
            shape = pymunk.Poly(body, verts)
        shape.friction, shape.elasticity = friction, elasticity
        body.position, body.angle = pos, angle
        vel = (vel[0] / SLOW_MOTION, vel[1] / SLOW_MOTION)
        k = len(self.objects)
        self.shape_info[shape] = (R.SUPPORT_OBJECT, k)
        self.objects.append(spec)
        self.bodies.append(body)
        self.in_space.append(release is None)
        if release is None:
            body.velocity = vel
            self.space.add(body, shape)
        else:
            def drop(body=body, shape=shape, k=k, vel=vel):
                body.velocity = vel
                self.space.add(body, shape)
                self.in_space[k] = True
            self.schedule(release, drop)
        if kick is not None:
            t_kick, v_kick = kick
            v_kick = (v_kick[0] / SLOW_MOTION, v_kick[1] / SLOW_MOTION)
            spin = -v_kick[0] / (w / 2) if spec.shape in ROUND_SHAPES else 0.0  # a struck ball rolls, not skids

            def strike(body=body, v=v_kick, spin=spin):
                body.velocity, body.angular_velocity = v, spin
            self.schedule(t_kick, strike)
        return k

    def add_pusher(self, pos: tuple[float, float], size: tuple[float, float], start: float, speed: float,
                   stop_x: float) -> None:
        """A kinematic pusher of ``size`` at ``pos`` that starts moving right at ``start`` (``speed`` units/s) and
        stops at ``stop_x``."""
        body = self._kinematic("pusher", pos, size)
        self.pusher, self.pusher_stop_x = body, stop_x
        self.schedule(start, lambda: setattr(body, "velocity", (speed / SLOW_MOTION, 0.0)))

    def add_tilting_shelf(self, pivot: tuple[float, float], length: float, start: float, omega: float,
                          max_angle: float) -> None:
        """A shelf board hinged at its ``pivot`` end that starts rotating at ``start`` (rad/s ``omega``, sign = sense)
        and stops at ``max_angle``."""
        size = (length, SHELF_THICKNESS_U)
        body = self._kinematic("shelf", pivot, size,
                               offset=(length / 2 * (1 if omega < 0 else -1), -SHELF_THICKNESS_U / 2))

        omega = omega / SLOW_MOTION

        def go():
            body.angular_velocity = omega

        def stop():
            body.angular_velocity = 0.0

        self.schedule(start, go)
        self.schedule(start + abs(max_angle / omega), stop)

    def _kinematic(self, kind: str, pos: tuple[float, float], size: tuple[float, float],
                   offset: tuple[float, float] = (0.0, 0.0)) -> pymunk.Body:
        surface = surfaces.get(kind)
        body = pymunk.Body(body_type=pymunk.Body.KINEMATIC)
        body.position = pos
        w, h = size
        ox, oy = offset
        shape = pymunk.Poly(body, box(ox - w / 2, oy - h / 2, ox + w / 2, oy + h / 2))
        shape.friction, shape.elasticity = surface.friction, surface.elasticity
        self.space.add(body, shape)
        self.shape_info[shape] = (surface.support, -1)
        self.kinematic.append((kind, body, (ox, oy, w, h)))
        return body

    # --- running ---
    def run(self, duration: float) -> R.SimRecord:
        """Simulate ``duration`` seconds and return the per-frame record (mirrored when the scene asked for it,
        `mirror_if`)."""
        n_frames = int(round(duration * FPS)) + 1
        n, m = len(self.objects), len(self.kinematic)
        dt = 1.0 / PHYSICS_HZ
        preroll = PREROLL_FRAMES * SUBSTEPS
        arr = _Arrays(n_frames, n, m)
        acc = _Accumulator(n)
        bits = surfaces.contact_bits()
        events = sorted(self.events)
        next_event = 0
        for step in range(1, preroll + (n_frames - 1) * SUBSTEPS + 1):
            t_video = (step - 1 - preroll) * dt
            while next_event < len(events) and events[next_event][0] <= t_video + EVENT_TIME_TOL_S:
                events[next_event][2]()
                next_event += 1
            if self.pusher is not None and self.pusher.position.x >= self.pusher_stop_x:
                self.pusher.velocity = (0.0, 0.0)
            pre_v = [tuple(b.velocity) for b in self.bodies]
            self.space.step(dt)
            self._scan_contacts(acc, pre_v, bits)
            if step >= preroll and (step - preroll) % SUBSTEPS == 0:
                arr.store((step - preroll) // SUBSTEPS, self, acc)
                acc.reset()
        rec = self._record(n_frames, arr)
        return R.mirror(rec, sum(WORLD_X)) if self.mirrored else rec

    def _scan_contacts(self, acc: _Accumulator, pre_v: list[tuple[float, float]], bits: dict[int, int]) -> None:
        """Record each object's contacts, support and impacts of one substep (``bits``: support code -> contact
        bit) and slow supported round objects by the rolling resistance."""
        kin_v = {id(b): tuple(b.velocity) for _, b, _ in self.kinematic}
        for k, body in enumerate(self.bodies):
            if not self.in_space[k]:
                continue
            best = [-SUPPORT_NORMAL_Y, R.SUPPORT_NONE, -1]

            def visit(arb: pymunk.Arbiter, k=k, best=best) -> None:
                code, j = self.shape_info[arb.shapes[1]]
                acc.bits[k] |= bits[code]
                nx, ny = arb.normal
                if j >= 0:
                    acc.touch[k, j] = acc.touch[j, k] = True
                if arb.is_first_contact:
                    vx, vy = pre_v[k]
                    if j >= 0:
                        speed = math.hypot(vx - pre_v[j][0], vy - pre_v[j][1])
                    else:
                        ox, oy = kin_v.get(id(arb.shapes[1].body), (0.0, 0.0))
                        speed = abs((vx - ox) * nx + (vy - oy) * ny)
                    if speed > acc.impact_speed[k]:
                        acc.impact_speed[k], acc.impact_kind[k], acc.impact_other[k] = speed, code, j
                if ny < best[0]:
                    best[0], best[1], best[2] = ny, code, j

            body.each_arbiter(visit)
            acc.support[k], acc.support_other[k] = best[1], best[2]
            if self.objects[k].shape in ROUND_SHAPES and best[1] != R.SUPPORT_NONE:
                vx, vy = body.velocity
                speed = math.hypot(vx, vy)
                if speed > 0:
                    scale = max(0.0, speed - ROLL_DECEL / PHYSICS_HZ) / speed
                    body.velocity = (vx * scale, vy * scale)
                    body.angular_velocity *= scale

    def _record(self, n_frames: int, arr: _Arrays) -> R.SimRecord:
        specs = self.objects
        quads = np.array([list(v) + [v[-1]] * (4 - len(v)) for _, v, _ in self.statics], np.float32)
        pusher = [i for i, (kind, _, _) in enumerate(self.kinematic) if kind == "pusher"]
        pusher_pos = arr.kin_pose[:, pusher[0], :2] if pusher else np.full((n_frames, 2), np.nan, np.float32)
        pusher_size = np.array(self.kinematic[pusher[0]][2][2:], np.float32) if pusher else np.full(2, np.nan, np.float32)
        return R.SimRecord(
            domain=self.family, fps=float(FPS), t=np.arange(n_frames, dtype=np.float64) / FPS,
            object_ids=np.array([s.object_id for s in specs]), subjects=np.array([s.subject for s in specs]),
            colors=np.array([s.color for s in specs]), shapes=np.array([s.shape for s in specs]),
            sizes=np.array([s.size for s in specs], np.float32).reshape(-1, 2),
            textures=np.array([s.texture for s in specs]),
            static_kind=np.array([k for k, _, _ in self.statics]), static_vertices=quads,
            static_until=np.array([u for _, _, u in self.statics], np.float64),
            edges=np.array(self.edges, np.float32).reshape(-1, 3), container=np.array(self.container, np.float32),
            ramps=np.array(self.ramps, np.float32).reshape(-1, 4),
            kin_kind=np.array([k for k, _, _ in self.kinematic], dtype="<U8"),
            kin_shape=np.array([s for _, _, s in self.kinematic], np.float32).reshape(-1, 4),
            pusher_pos=pusher_pos.astype(np.float32), pusher_size=pusher_size, camera=np.zeros(3, np.float32),
            family=self.family, **arr.arrays())


class _Arrays:
    """The per-frame arrays of a record being simulated."""

    def __init__(self, n_frames: int, n: int, m: int):
        self.pos = np.zeros((n_frames, n, 2), np.float32)
        self.vel = np.zeros((n_frames, n, 2), np.float32)
        self.angle = np.zeros((n_frames, n), np.float32)
        self.angvel = np.zeros((n_frames, n), np.float32)
        self.contacts = np.zeros((n_frames, n), np.uint8)
        self.support = np.zeros((n_frames, n), np.int8)
        self.support_other = np.full((n_frames, n), -1, np.int8)
        self.impact_speed = np.zeros((n_frames, n), np.float32)
        self.impact_kind = np.zeros((n_frames, n), np.int8)
        self.impact_other = np.full((n_frames, n), -1, np.int8)
        self.touch = np.zeros((n_frames, n, n), bool)
        self.held = np.zeros((n_frames, n), bool)
        self.kin_pose = np.zeros((n_frames, m, 3), np.float32)

    def store(self, f: int, world: World, acc: _Accumulator) -> None:
        for k, body in enumerate(world.bodies):
            self.pos[f, k] = body.position
            self.vel[f, k] = body.velocity
            self.angle[f, k] = body.angle
            self.angvel[f, k] = body.angular_velocity
            self.held[f, k] = not world.in_space[k]
        for i, (_, body, _) in enumerate(world.kinematic):
            self.kin_pose[f, i] = (body.position.x, body.position.y, body.angle)
        self.contacts[f], self.support[f], self.support_other[f] = acc.bits, acc.support, acc.support_other
        self.impact_speed[f], self.impact_kind[f], self.touch[f] = acc.impact_speed, acc.impact_kind, acc.touch
        self.impact_other[f] = acc.impact_other

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in vars(self).items()}


class _Accumulator:
    """What happened to each object during one frame's substeps."""

    def __init__(self, n: int):
        self.n = n
        self.reset()

    def reset(self) -> None:
        n = self.n
        self.bits = np.zeros(n, np.uint8)
        self.support = np.zeros(n, np.int8)
        self.support_other = np.full(n, -1, np.int8)
        self.impact_speed = np.zeros(n, np.float32)
        self.impact_kind = np.zeros(n, np.int8)
        self.impact_other = np.full(n, -1, np.int8)
        self.touch = np.zeros((n, n), bool)
