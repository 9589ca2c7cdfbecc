"""Scene families and source domains of the synthetic benchmark, simulated with pymunk.

A *scene family* is a layout with its own dynamics; a *domain* (the benchmark's source dataset, which defines the
in-dataset / cross-dataset GT tiers) is a mixture of families (`DOMAIN_MIXTURES`), so a family's states occur in
several domains, as in PSR's four source datasets. Families (all randomness from the ``rng`` passed in):

- ``ramp``: objects wait behind a gate on a ramp; the gate opens, they roll or slide down onto a table, knock into
  what rests there, go over the table's edge, fall, bounce and settle.
- ``table_push``: a kinematic pusher shoves a row of objects across a table; some stay on it, some go over the edge.
- ``dominoes``: a ball (or cube) released on a small ramp runs into a row of standing dominoes, bricks or planks.
- ``container``: a gripper drops objects one after another towards an open container; they fall in, bounce off its
  walls, land on each other or miss it.
- ``stack``: a tower of two to four objects on the floor or a table is hit by a rolling ball or a pushed cube.
- ``shelf``: a shelf tilts and the objects on it slide or roll off onto what lies below (floor, container, table).
- ``billiards``: objects scattered on the floor; one or two balls are struck towards them and set them moving.

Every scene also holds *bystanders*: objects placed where nothing may reach them, which become the named others of
relations ("next to the red cube") and keep the video's object count realistic. Physics runs at `PHYSICS_HZ` with
`SUBSTEPS` steps a frame after an unrecorded `PREROLL_FRAMES` settle; the first event of a scene happens after
`QUIET_S` seconds, so each object's first state lasts long enough for an early prefix (`eval.synth.video`).
Round shapes get a constant rolling resistance (`ROLL_DECEL`) while supported, since pymunk has none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pymunk

from eval.synth import record as R
from eval.synth.lexicon import COLORS, ROUND_SHAPES, SHAPES, size_word, subject_name

FAMILIES = ("ramp", "table_push", "dominoes", "container", "stack", "shelf", "billiards")
DOMAINS = ("workshop", "kitchen", "playroom", "warehouse")
DOMAIN_MIXTURES: dict[str, dict[str, float]] = {
    "workshop": {"ramp": 0.35, "stack": 0.35, "dominoes": 0.30},
    "kitchen": {"table_push": 0.35, "shelf": 0.35, "container": 0.30},
    "playroom": {"billiards": 0.40, "dominoes": 0.20, "container": 0.20, "ramp": 0.20},
    "warehouse": {"shelf": 0.30, "stack": 0.30, "table_push": 0.20, "billiards": 0.20},
}
"""Family probabilities of each domain (every family occurs in at least two domains)."""

FPS = 20
"""Frames per second of the record and of frame indices (``frames/<video>/f0042.png`` is t = 42 / FPS)."""
SLOW_MOTION = 2.0
"""The world runs this many times slower than real gravity would make it (a video second is half a second of
the original scene tuning): gravity is divided by its square, every launch speed (kicks, releases, the pusher, the
shelf's tilt) by it, so trajectories keep their shapes and states last long enough to be watched and foreseen."""
SUBSTEPS = 3
PHYSICS_HZ = FPS * SUBSTEPS
PREROLL_FRAMES = 10
"""Unrecorded settling time before t = 0 (frames)."""
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
QUIET_S = (0.3, 1.0)
"""Range of the time of a scene's first event (gate, pusher, strike, tilt, first release), seconds: early, so
the scene is in motion when prefixes end (`eval.synth.prefix`)."""
DURATION_S = 12.0
"""Video length (seconds)."""
WORLD_X = (0.0, 400.0)
"""Horizontal extent of every scene (walls just outside)."""

# Surface materials: friction, elasticity (pymunk multiplies the two shapes' values).
_SURFACE = {"floor": (0.8, 0.5), "wall": (0.5, 0.6), "table": (0.6, 0.3), "leg": (0.5, 0.3), "ramp": (0.5, 0.2),
            "gate": (0.5, 0.1), "container": (0.7, 0.4), "pusher": (0.8, 0.0), "shelf": (0.35, 0.2)}
_MATERIAL = {"ball": (0.9, 0.65, 1.5), "wheel": (1.0, 0.35, 1.2), "cube": (0.45, 0.25, 1.2),
             "brick": (0.45, 0.2, 1.0), "domino": (0.7, 0.1, 0.5), "plank": (0.6, 0.15, 0.6),
             "wedge": (0.55, 0.2, 1.1), "can": (0.4, 0.3, 0.9)}  # friction, elasticity, density


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


def pick_objects(rng: np.random.Generator, shapes: list[str], colors: list[str] | None = None) -> list[ObjectSpec]:
    """Specs for the given shapes with distinct colours (every subject in a video is unique)."""
    colors = colors if colors is not None else [str(c) for c in rng.permutation(list(COLORS))]
    out = []
    for k, shape in enumerate(shapes):
        (w0, w1), (h0, h1) = SHAPES[shape]
        w = float(np.round(rng.uniform(w0, w1), 1))
        h = w if shape in ("ball", "wheel", "cube") else float(np.round(rng.uniform(h0, h1), 1))
        texture = str(TEXTURES[int(rng.integers(len(TEXTURES)))])
        out.append(ObjectSpec(f"o{k}", colors[k], shape, (w, h), texture))
    return out


def _box(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _verts(spec: ObjectSpec) -> list[tuple[float, float]]:
    """Body-frame vertices of a polygon shape (wedge: right angle at the bottom left)."""
    w, h = spec.size
    if spec.shape == "wedge":
        return [(-w / 2, -h / 2), (w / 2, -h / 2), (-w / 2, h / 2)]
    return _box(-w / 2, -h / 2, w / 2, h / 2)


class World:
    """A pymunk space plus what the record needs: static pieces, kinematic pieces, objects, scheduled events."""

    def __init__(self, family: str, walls: tuple[float, float] = (WORLD_X[0] - 10.0, WORLD_X[1] + 10.0)):
        self.family = family
        self.space = pymunk.Space()
        self.space.gravity = (0.0, GRAVITY)
        self.space.damping = DAMPING
        self.space.iterations = 20
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
        self.add_static("floor", R.SUPPORT_FLOOR, _box(-200.0, -40.0, 600.0, FLOOR_Y))
        self.add_static("wall", R.SUPPORT_WALL, _box(walls[0] - 30.0, FLOOR_Y, walls[0], 420.0))
        self.add_static("wall", R.SUPPORT_WALL, _box(walls[1], FLOOR_Y, walls[1] + 30.0, 420.0))

    # --- building ---
    def add_static(self, kind: str, code: int, verts: list[tuple[float, float]], until: float = math.inf,
                   friction: float | None = None) -> None:
        """A static convex piece of 3 or 4 vertices (``until``: the time it is removed, e.g. an opening gate)."""
        shape = pymunk.Poly(self.space.static_body, verts)
        shape.friction, shape.elasticity = _SURFACE[kind]
        if friction is not None:
            shape.friction = friction
        self.space.add(shape)
        self.shape_info[shape] = (code, -1)
        self.statics.append((kind, verts, until))
        if math.isfinite(until):
            self.schedule(until, lambda: self.space.remove(shape))

    def add_ramp(self, x_top: float, y_top: float, x_bottom: float, y_bottom: float) -> None:
        """A ramp descending from (x_top, y_top) to (x_bottom, y_bottom), filled down to the floor."""
        verts = [(x_top, FLOOR_Y), (x_bottom, FLOOR_Y), (x_bottom, y_bottom), (x_top, y_top)]
        if x_bottom < x_top:
            verts = [(x_bottom, FLOOR_Y), (x_top, FLOOR_Y), (x_top, y_top), (x_bottom, y_bottom)]
        self.add_static("ramp", R.SUPPORT_RAMP, verts)
        self.ramps.append((x_top, y_top, x_bottom, y_bottom))

    def add_table(self, x0: float, x1: float, top: float, edges: tuple[int, ...] = (-1, 1)) -> None:
        """A table top [x0, x1] at height ``top`` with two legs; ``edges``: sides objects can go over."""
        self.add_static("table", R.SUPPORT_TABLE, _box(x0, top - 8.0, x1, top))
        for lx in (x0 + 6.0, x1 - 12.0):
            self.add_static("leg", R.SUPPORT_TABLE, _box(lx, FLOOR_Y, lx + 6.0, top - 8.0))
        for d in edges:
            self.edges.append((x1 if d > 0 else x0, top, float(d)))

    def add_container(self, cx: float, width: float, wall_h: float, base: float = FLOOR_Y) -> None:
        th = 6.0
        ix0, ix1 = cx - width / 2, cx + width / 2
        bottom = base + th
        self.add_static("container", R.SUPPORT_CONTAINER, _box(ix0 - th, base, ix1 + th, bottom))
        self.add_static("container", R.SUPPORT_WALL, _box(ix0 - th, bottom, ix0, bottom + wall_h))
        self.add_static("container", R.SUPPORT_WALL, _box(ix1, bottom, ix1 + th, bottom + wall_h))
        self.container = (ix0, ix1, bottom, bottom + wall_h)

    def schedule(self, t: float, fn: Callable[[], None]) -> None:
        self.events.append((t, len(self.events), fn))

    def add_object(self, spec: ObjectSpec, pos: tuple[float, float], angle: float = 0.0,
                   vel: tuple[float, float] = (0.0, 0.0), release: float | None = None,
                   kick: tuple[float, tuple[float, float]] | None = None) -> int:
        """Add an object; ``release``: held by the gripper until then; ``kick``: (time, velocity) set at that time.
        Returns its index."""
        spec = replace(spec, object_id=f"o{len(self.objects)}")  # ids stay contiguous when a spec did not fit
        friction, elasticity, density = _MATERIAL[spec.shape]
        w, h = spec.size
        if spec.shape in ROUND_SHAPES:
            mass = density * math.pi * (w / 2) ** 2 / 100.0
            body = pymunk.Body(mass, pymunk.moment_for_circle(mass, 0, w / 2))
            shape: pymunk.Shape = pymunk.Circle(body, w / 2)
        else:
            verts = _verts(spec)
            area = w * h / (2.0 if spec.shape == "wedge" else 1.0)
            mass = density * area / 100.0
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
        body = self._kinematic("pusher", pos, size, R.SUPPORT_PUSHER, _SURFACE["pusher"])
        self.pusher, self.pusher_stop_x = body, stop_x
        self.schedule(start, lambda: setattr(body, "velocity", (speed / SLOW_MOTION, 0.0)))

    def add_tilting_shelf(self, pivot: tuple[float, float], length: float, start: float, omega: float,
                          max_angle: float) -> None:
        """A shelf board hinged at its ``pivot`` end that starts rotating at ``start`` (rad/s ``omega``, sign = sense)
        and stops at ``max_angle``."""
        size = (length, 6.0)
        body = self._kinematic("shelf", pivot, size, R.SUPPORT_SHELF, _SURFACE["shelf"],
                               offset=(length / 2 * (1 if omega < 0 else -1), -3.0))

        omega = omega / SLOW_MOTION

        def go():
            body.angular_velocity = omega

        def stop():
            body.angular_velocity = 0.0

        self.schedule(start, go)
        self.schedule(start + abs(max_angle / omega), stop)

    def _kinematic(self, kind: str, pos: tuple[float, float], size: tuple[float, float], code: int,
                   material: tuple[float, float], offset: tuple[float, float] = (0.0, 0.0)) -> pymunk.Body:
        body = pymunk.Body(body_type=pymunk.Body.KINEMATIC)
        body.position = pos
        w, h = size
        ox, oy = offset
        shape = pymunk.Poly(body, _box(ox - w / 2, oy - h / 2, ox + w / 2, oy + h / 2))
        shape.friction, shape.elasticity = material
        self.space.add(body, shape)
        self.shape_info[shape] = (code, -1)
        self.kinematic.append((kind, body, (ox, oy, w, h)))
        return body

    # --- running ---
    def run(self, duration: float) -> R.SimRecord:
        """Simulate ``duration`` seconds and return the per-frame record."""
        n_frames = int(round(duration * FPS)) + 1
        n, m = len(self.objects), len(self.kinematic)
        dt = 1.0 / PHYSICS_HZ
        preroll = PREROLL_FRAMES * SUBSTEPS
        arr = _Arrays(n_frames, n, m)
        acc = _Accumulator(n)
        events = sorted(self.events)
        next_event = 0
        for step in range(1, preroll + (n_frames - 1) * SUBSTEPS + 1):
            t_video = (step - 1 - preroll) * dt
            while next_event < len(events) and events[next_event][0] <= t_video + 1e-9:
                events[next_event][2]()
                next_event += 1
            if self.pusher is not None and self.pusher.position.x >= self.pusher_stop_x:
                self.pusher.velocity = (0.0, 0.0)
            pre_v = [tuple(b.velocity) for b in self.bodies]
            self.space.step(dt)
            self._scan_contacts(acc, pre_v)
            if step >= preroll and (step - preroll) % SUBSTEPS == 0:
                arr.store((step - preroll) // SUBSTEPS, self, acc)
                acc.reset()
        return self._record(n_frames, arr)

    def _scan_contacts(self, acc: _Accumulator, pre_v: list[tuple[float, float]]) -> None:
        kin_v = {id(b): tuple(b.velocity) for _, b, _ in self.kinematic}
        for k, body in enumerate(self.bodies):
            if not self.in_space[k]:
                continue
            best = [-SUPPORT_NORMAL_Y, R.SUPPORT_NONE, -1]

            def visit(arb: pymunk.Arbiter, k=k, best=best) -> None:
                code, j = self.shape_info[arb.shapes[1]]
                acc.bits[k] |= R.CODE_BIT[code]
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


# --------------------------------------------------------------------------------------------------------------
# Placement helpers.


def _lift(spec: ObjectSpec) -> float:
    """Height of the centre of an upright object above the surface it rests on."""
    return spec.size[0] / 2 if spec.shape in ROUND_SHAPES else spec.half_height


def _on_slope(x0: float, y0: float, x1: float, y1: float, s: float, spec: ObjectSpec) -> tuple[tuple[float, float], float]:
    """Position and angle of an object resting on the slope (x0,y0)-(x1,y1) at arc length ``s`` from (x0,y0)."""
    length = math.hypot(x1 - x0, y1 - y0)
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    nx, ny = -uy, ux
    if ny < 0:
        nx, ny = -nx, -ny
    lift = _lift(spec)
    angle = math.atan2(uy, ux) if ux > 0 else math.atan2(-uy, -ux)
    return (x0 + ux * s + nx * (lift + 0.5), y0 + uy * s + ny * (lift + 0.5)), angle


def _row(rng: np.random.Generator, specs: list[ObjectSpec], x_start: float, x_end: float,
         gap: tuple[float, float]) -> list[float]:
    """Centre x of objects placed left to right from ``x_start`` with random gaps; stops at ``x_end``."""
    xs, x = [], x_start
    for spec in specs:
        x += spec.size[0] / 2
        if x + spec.size[0] / 2 > x_end:
            break
        xs.append(x)
        x += spec.size[0] / 2 + rng.uniform(*gap)
    return xs


def _shapes(rng: np.random.Generator, n: int, weights: dict[str, float]) -> list[str]:
    names = list(weights)
    p = np.array([weights[s] for s in names], np.float64)
    return [str(s) for s in rng.choice(names, size=n, p=p / p.sum())]


_ANY = {"ball": 1.0, "wheel": 0.6, "cube": 1.0, "brick": 0.8, "domino": 0.5, "plank": 0.4, "wedge": 0.6, "can": 0.8}
_POSE_START = (0.0, 0.0, 0.0, math.pi / 2, -math.pi / 2, math.pi)
"""Start angles of a bystander or resting object (mostly upright; some on a side or upside down)."""


def _start_angle(rng: np.random.Generator, spec: ObjectSpec) -> float:
    if spec.shape in ROUND_SHAPES or spec.shape == "domino":
        return 0.0
    a = float(_POSE_START[int(rng.integers(len(_POSE_START)))])
    if spec.shape in ("plank", "brick") and abs(a) == math.pi / 2:
        return 0.0  # standing a plank on its end makes a domino scene of every family
    return a


def _rest_height(spec: ObjectSpec, angle: float) -> float:
    """Centre height above the surface of a box-like object resting at a multiple of 90 degrees."""
    w, h = spec.size
    return (w if abs(math.sin(angle)) > 0.5 else h) / 2


def _bystanders(world: World, rng: np.random.Generator, specs: list[ObjectSpec], slots: list[tuple[float, float]],
                 surface_y: float = FLOOR_Y) -> None:
    """Place resting objects side by side (gaps of `BYSTANDER_GAP` units) in one of the free floor intervals
    ``slots`` ([x0, x1] ranges nothing reaches), as a group that names each other in relations ("next to the
    cube"); objects that do not fit are left out."""
    slots = [sl for sl in slots if sl[1] - sl[0] > 12]
    if not slots or not specs:
        return
    x0, x1 = slots[int(rng.integers(len(slots)))]
    width = sum(sp.size[0] for sp in specs) + BYSTANDER_GAP[1] * (len(specs) - 1)
    x = float(rng.uniform(x0 + 1, max(x0 + 1, x1 - width - 1)))
    for spec in specs:
        if x + spec.size[0] + 1 > x1:
            return
        a = _start_angle(rng, spec)
        world.add_object(spec, (x + spec.size[0] / 2, surface_y + _rest_height(spec, a) + 0.5), angle=a)
        x += spec.size[0] + float(rng.uniform(*BYSTANDER_GAP))


BYSTANDER_GAP = (2.0, 14.0)
"""Gap (units) between neighbouring bystanders of a group."""
BYSTANDERS = {0: 0.2, 2: 0.6, 3: 0.2}
"""Size of a scene's group of bystanders and its probability (never one alone: a group names its members)."""
BILLIARDS_BYSTANDERS = {0: 0.6, 2: 0.4}
"""The same for billiards, whose floor is already crowded."""


def _n_bystanders(rng: np.random.Generator, sizes: dict[int, float] = BYSTANDERS) -> int:
    k = list(sizes)
    return int(k[int(rng.choice(len(k), p=np.array([sizes[x] for x in k]) / sum(sizes.values())))])


def _t0(rng: np.random.Generator) -> float:
    return float(rng.uniform(*QUIET_S))


# --------------------------------------------------------------------------------------------------------------
# Scene families. Each returns a World ready to run.


def build_ramp(rng: np.random.Generator) -> World:
    world = World("ramp")
    flip = rng.random() < 0.5
    top_y, ramp_x1, table_y = rng.uniform(150, 190), rng.uniform(120, 160), rng.uniform(60, 90)
    edge_x = ramp_x1 + rng.uniform(50, 90)
    world.add_ramp(15.0, top_y, ramp_x1, table_y)
    world.add_table(ramp_x1, edge_x, table_y, edges=(1,))
    n_ramp, n_table = int(rng.choice([1, 2, 3], p=[0.3, 0.45, 0.25])), int(rng.choice([0, 1, 2], p=[0.3, 0.5, 0.2]))
    n_by = _n_bystanders(rng)
    shapes = (_shapes(rng, n_ramp, {"ball": 1.0, "wheel": 0.6, "cube": 0.7, "brick": 0.4, "can": 0.4, "wedge": 0.3})
              + _shapes(rng, n_table + n_by, _ANY))
    specs = pick_objects(rng, shapes)
    slope_len = math.hypot(ramp_x1 - 15.0, top_y - table_y)
    s_gate = slope_len * rng.uniform(0.5, 0.62)
    (gx, gy), _ = _on_slope(15.0, top_y, ramp_x1, table_y, s_gate, ObjectSpec("g", "red", "cube", (0.0, 0.0)))
    world.add_static("gate", R.SUPPORT_GATE, _box(gx, gy - 6.0, gx + 4.0, gy + 34.0), until=_t0(rng))
    s = s_gate - 1.0
    for spec in specs[:n_ramp]:
        if s - spec.size[0] - 1.0 < 6.0:
            break
        s -= spec.size[0] / 2 + 1.0
        pos, ang = _on_slope(15.0, top_y, ramp_x1, table_y, s, spec)
        world.add_object(spec, pos, angle=ang if spec.shape not in ROUND_SHAPES else 0.0)
        s -= spec.size[0] / 2
    table = specs[n_ramp:n_ramp + n_table]
    for spec, x in zip(table, _row(rng, table, ramp_x1 + rng.uniform(12, 30), edge_x - 8.0, (6.0, 30.0)), strict=False):
        a = _start_angle(rng, spec)
        world.add_object(spec, (x, table_y + _rest_height(spec, a) + 0.5), angle=a)
    _bystanders(world, rng, specs[n_ramp + n_table:], [(edge_x + 90.0, WORLD_X[1] - 5.0)])
    return _maybe_flip(world, flip)


def build_table_push(rng: np.random.Generator) -> World:
    world = World("table_push")
    y_top, x0, x1 = rng.uniform(85, 115), rng.uniform(25, 50), rng.uniform(230, 290)
    world.add_table(x0, x1, y_top)
    n, n_by = int(rng.choice([2, 3, 4], p=[0.3, 0.45, 0.25])), _n_bystanders(rng)
    specs = pick_objects(rng, _shapes(rng, n + n_by, _ANY))
    pw, ph = 10.0, 30.0
    px = x0 + 8.0
    row = specs[:n]
    for spec, x in zip(row, _row(rng, row, px + pw / 2 + rng.uniform(4, 30), x1 - 6.0, (0.0, 40.0)), strict=False):
        a = _start_angle(rng, spec)
        world.add_object(spec, (x, y_top + _rest_height(spec, a) + 0.5), angle=a)
    start, speed = _t0(rng), float(rng.uniform(40, 110))
    stop_x = float(rng.uniform(x1 - 140, x1 - 20)) if rng.random() < 0.7 else x1 - 4.0
    world.add_pusher((px, y_top + ph / 2 + 1.0), (pw, ph), start, speed, stop_x)
    _bystanders(world, rng, specs[n:], [(x1 + 70.0, WORLD_X[1] - 5.0)])
    return _maybe_flip(world, rng.random() < 0.5)


def build_dominoes(rng: np.random.Generator) -> World:
    world = World("dominoes")
    on_table = rng.random() < 0.5
    y_s = float(rng.uniform(60, 80)) if on_table else FLOOR_Y
    n_dom, n_by = int(rng.choice([2, 3, 4, 5], p=[0.2, 0.3, 0.3, 0.2])), _n_bystanders(rng)
    hitter = "ball" if rng.random() < 0.6 else str(rng.choice(["cube", "wheel", "can"]))
    standing = str(rng.choice(["domino", "domino", "plank", "brick"]))
    shapes = [hitter] + [standing] * n_dom + _shapes(rng, n_by, _ANY)
    specs = pick_objects(rng, shapes)
    x_d = rng.uniform(115, 140)
    xs = []
    for _ in range(n_dom):
        xs.append(x_d)
        x_d += rng.uniform(18, 30) if rng.random() < 0.85 else rng.uniform(40, 50)
    edge_x = xs[-1] + rng.uniform(10, 35)
    if on_table:
        world.add_table(-40.0, edge_x, y_s, edges=(1,))
    h_r = rng.uniform(34, 56)
    world.add_ramp(10.0, y_s + h_r, 80.0, y_s)
    slope_len = math.hypot(70.0, h_r)
    s_gate = slope_len * rng.uniform(0.3, 0.42)
    (gx, gy), _ = _on_slope(10.0, y_s + h_r, 80.0, y_s, s_gate, ObjectSpec("g", "red", "cube", (0.0, 0.0)))
    t_gate = _t0(rng)
    world.add_static("gate", R.SUPPORT_GATE, _box(gx, gy - 6.0, gx + 4.0, gy + 30.0), until=t_gate)
    hit = specs[0]
    pos, ang = _on_slope(10.0, y_s + h_r, 80.0, y_s, s_gate - 1.5 - hit.size[0] / 2, hit)
    v = float(rng.uniform(120, 220))  # a nudge down the slope as the gate opens
    world.add_object(hit, pos, angle=ang if hit.shape not in ROUND_SHAPES else 0.0,
                     kick=(t_gate, (v * 70.0 / slope_len, -v * h_r / slope_len)))
    for spec, x in zip(specs[1:1 + n_dom], xs, strict=True):
        w, h = spec.size
        stand = math.pi / 2 if spec.shape in ("plank", "brick") else 0.0  # stood on end
        world.add_object(spec, (x, y_s + (w if stand else h) / 2 + 0.3), angle=stand)
    _bystanders(world, rng, specs[1 + n_dom:], [(edge_x + 80.0, WORLD_X[1] - 5.0)])
    return _maybe_flip(world, rng.random() < 0.5)


def build_container(rng: np.random.Generator) -> World:
    world = World("container")
    cx, w, wall_h = rng.uniform(170, 240), rng.uniform(70, 100), rng.uniform(38, 58)
    world.add_container(cx, w, wall_h)
    ix0, ix1, _, _ = world.container
    n, n_by = int(rng.choice([2, 3, 4], p=[0.3, 0.4, 0.3])), _n_bystanders(rng)
    specs = pick_objects(rng, _shapes(rng, n + n_by, _ANY))
    t = _t0(rng)
    for k, spec in enumerate(specs[:n]):
        aim = rng.choice(["inside", "rim", "outside"], p=[0.6, 0.2, 0.2])
        if aim == "inside":
            x = cx + rng.uniform(-0.3, 0.3) * w
        elif aim == "rim":
            x = (ix0 - 3 if rng.random() < 0.5 else ix1 + 3) + rng.uniform(-6, 6)
        else:
            x = rng.uniform(70, ix0 - 30) if rng.random() < 0.5 else rng.uniform(ix1 + 30, 330)
        y = rng.uniform(175, 235) + 8.0 * (k % 2)
        vx = float(rng.uniform(-50, 50)) if rng.random() < 0.4 else 0.0
        angle = float(rng.uniform(-0.4, 0.4)) if spec.shape not in ROUND_SHAPES else 0.0
        world.add_object(spec, (x, y), angle=angle, vel=(vx, 0.0), release=float(t))
        t += rng.uniform(0.6, 1.6)
    _bystanders(world, rng, specs[n:], [(WORLD_X[0] + 5.0, 45.0), (WORLD_X[1] - 40.0, WORLD_X[1] - 5.0)])
    return world


def build_stack(rng: np.random.Generator) -> World:
    world = World("stack")
    on_table = rng.random() < 0.4
    base = FLOOR_Y
    x_stack = float(rng.uniform(200, 260))
    if on_table:
        base = float(rng.uniform(60, 85))
        world.add_table(x_stack - rng.uniform(60, 90), x_stack + rng.uniform(40, 80), base)
    n_st, n_by = int(rng.choice([2, 3, 4], p=[0.35, 0.4, 0.25])), _n_bystanders(rng)
    striker = "ball" if rng.random() < 0.6 else str(rng.choice(["cube", "wheel"]))
    tower = _shapes(rng, n_st, {"cube": 1.0, "brick": 1.0, "plank": 0.5, "can": 0.6, "wedge": 0.3, "ball": 0.15})
    # only the top of a tower may be round or a wedge
    tower = [s if i == n_st - 1 or s not in ("ball", "wedge") else "cube" for i, s in enumerate(tower)]
    specs = pick_objects(rng, [striker] + tower + _shapes(rng, n_by, _ANY))
    y = base
    for spec in specs[1:1 + n_st]:
        a = 0.0 if spec.shape in ROUND_SHAPES else _start_angle(rng, spec) if spec.shape == "cube" else 0.0
        h = _rest_height(spec, a) if spec.shape not in ROUND_SHAPES else spec.size[0] / 2
        world.add_object(spec, (x_stack + float(rng.uniform(-3, 3)), y + h + 0.3), angle=a)
        y += 2 * h + 0.6
    t0 = _t0(rng)
    hit = specs[0]
    x_hit = x_stack - float(rng.uniform(45, 120)) if not on_table else x_stack - 45.0
    a = 0.0 if hit.shape in ROUND_SHAPES else 0.0
    world.add_object(hit, (x_hit, base + _lift(hit) + 0.5), angle=a,
                     kick=(t0, (float(rng.uniform(220, 380)), float(rng.uniform(0, 60)))))
    _bystanders(world, rng, specs[1 + n_st:], [(x_stack + 90.0, WORLD_X[1] - 5.0)])
    return _maybe_flip(world, rng.random() < 0.5)


def build_shelf(rng: np.random.Generator) -> World:
    world = World("shelf")
    length = float(rng.uniform(110, 160))
    pivot_x, pivot_y = float(rng.uniform(60, 90)), float(rng.uniform(140, 180))
    below = str(rng.choice(["floor", "container", "table"], p=[0.4, 0.35, 0.25]))
    if below == "container":
        world.add_container(pivot_x + length + rng.uniform(20, 60), rng.uniform(70, 100), rng.uniform(35, 50))
    elif below == "table":
        world.add_table(pivot_x + length * 0.5, pivot_x + length + rng.uniform(60, 110), float(rng.uniform(60, 85)),
                        edges=(1,))
    world.add_static("wall", R.SUPPORT_WALL, _box(pivot_x - 14.0, FLOOR_Y, pivot_x - 6.0, pivot_y - 6.0))
    n_on, n_by = int(rng.choice([2, 3, 4], p=[0.35, 0.4, 0.25])), _n_bystanders(rng)
    specs = pick_objects(rng, _shapes(rng, n_on + n_by, _ANY))
    row = specs[:n_on]
    for spec, x in zip(row, _row(rng, row, pivot_x + 6.0, pivot_x + length - 4.0, (4.0, 24.0)), strict=False):
        a = _start_angle(rng, spec)
        world.add_object(spec, (x, pivot_y + _rest_height(spec, a) + 0.5), angle=a)
    omega = -float(rng.uniform(0.5, 1.4))
    world.add_tilting_shelf((pivot_x, pivot_y), length, _t0(rng), omega, float(rng.uniform(0.35, 0.6)))
    slots = [(WORLD_X[0] + 5.0, pivot_x - 20.0)] if pivot_x > 60 else []
    _bystanders(world, rng, specs[n_on:], slots + [(WORLD_X[1] - 50.0, WORLD_X[1] - 5.0)])
    return _maybe_flip(world, rng.random() < 0.5)


def build_billiards(rng: np.random.Generator) -> World:
    world = World("billiards")
    n_tg, n_by = int(rng.choice([2, 3, 4], p=[0.3, 0.4, 0.3])), int(rng.integers(0, 2))
    n_st = 1 if rng.random() < 0.7 else 2
    specs = pick_objects(rng, ["ball"] * n_st + _shapes(rng, n_tg + n_by, _ANY))
    t0 = _t0(rng)
    targets = specs[n_st:n_st + n_tg]
    xs = _row(rng, targets, float(rng.uniform(150, 200)), WORLD_X[1] - 20.0, (2.0, 40.0))
    for spec, x in zip(targets, xs, strict=False):
        a = _start_angle(rng, spec)
        world.add_object(spec, (x, FLOOR_Y + _rest_height(spec, a) + 0.5), angle=a)
    for i, spec in enumerate(specs[:n_st]):
        x = float(rng.uniform(25, 70)) + 40.0 * i
        vx = float(rng.uniform(220, 420))
        world.add_object(spec, (x, FLOOR_Y + spec.size[0] / 2 + 0.5), kick=(t0 + 0.8 * i, (vx, 0.0)))
    _bystanders(world, rng, specs[n_st + n_tg:], [(95.0, 140.0)])
    return _maybe_flip(world, rng.random() < 0.5)


def _maybe_flip(world: World, flip: bool) -> World:
    """Mirror a finished scene left-right (about the middle of `WORLD_X`) so layouts don't always run rightwards.

    Scenes are built mirrored only through this flag: the mirroring is applied to the record after simulation
    (`eval.synth.record.mirror`), which keeps every family's code written in one direction."""
    world.mirror = flip
    return world


BUILDERS: dict[str, Callable[[np.random.Generator], World]] = {
    "ramp": build_ramp, "table_push": build_table_push, "dominoes": build_dominoes, "container": build_container,
    "stack": build_stack, "shelf": build_shelf, "billiards": build_billiards,
}


def family_of(domain: str, rng: np.random.Generator) -> str:
    """Draw a scene family from the domain's mixture."""
    mix = DOMAIN_MIXTURES[domain]
    names = list(mix)
    p = np.array([mix[n] for n in names])
    return str(names[int(rng.choice(len(names), p=p / p.sum()))])


def simulate(family: str, rng: np.random.Generator) -> R.SimRecord:
    """Build a scene of ``family`` from ``rng``, simulate it for `DURATION_S` and return its record (mirrored when
    the scene asked for it)."""
    if family not in BUILDERS:
        raise ValueError(f"unknown scene family {family!r}; expected one of {FAMILIES}")
    world = BUILDERS[family](rng)
    rec = world.run(DURATION_S)
    return R.mirror(rec, sum(WORLD_X)) if getattr(world, "mirror", False) else rec
