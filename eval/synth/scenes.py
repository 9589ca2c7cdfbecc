"""The four scene families (source domains) of the synthetic benchmark, simulated with pymunk.

Each family builds a 2D rigid-body scene from a seeded `numpy.random.Generator` and runs it for a fixed duration,
recording every object at `FPS` frames per second (see `eval.synth.record` for the record's fields):

- ``ramp``: balls, boxes and blocks wait behind a gate on a ramp; the gate opens, they roll or slide down onto a
  table, knock into what rests there, go over the table's edge, fall, bounce and settle on the floor.
- ``table_push``: a kinematic pusher shoves a row of objects across a table; some stay on it, some go over the edge.
- ``dominoes``: a ball (or box) released on a small ramp runs into a row of standing dominoes, which topple
  (sometimes off the edge of a low table).
- ``container``: a gripper drops objects one after another towards an open container; they fall in, bounce off
  its walls, land on each other or miss it and roll away on the floor.

Physics runs at `PHYSICS_HZ` with `SUBSTEPS` steps a frame, after an unrecorded `PREROLL_FRAMES` settle so resting
contacts exist at t = 0. Balls get a constant rolling resistance (`ROLL_DECEL`) while supported, since pymunk has none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pymunk

from eval.synth import record as R
from eval.synth.vocab import COLORS, SHAPES, subject_name

FAMILIES = ("ramp", "table_push", "dominoes", "container")

FPS = 20
"""Frames per second of the record and of frame indices (``frames/<video>/f0042.png`` is t = 42 / FPS)."""
SUBSTEPS = 6
"""Physics steps per recorded frame."""
PHYSICS_HZ = FPS * SUBSTEPS
PREROLL_FRAMES = 10
"""Unrecorded settling time before t = 0 (frames)."""
GRAVITY = -900.0
"""Gravity (units/s^2, y up)."""
DAMPING = 0.85
"""Fraction of velocity kept after one second (pymunk global damping: a little air drag)."""
ROLL_DECEL = 110.0
"""Rolling resistance of a supported ball (units/s^2): without it a ball on a flat floor never stops."""
SUPPORT_NORMAL_Y = 0.5
"""A contact supports an object when the contact normal (object -> other) points down by more than this
(y component < -0.5, i.e. the other surface lies within 60 degrees of straight below)."""
FLOOR_Y = 20.0
"""Height of the floor surface."""

DURATIONS = {"ramp": 7.0, "table_push": 8.0, "dominoes": 7.0, "container": 8.0}
"""Video length per family (seconds)."""

# Surface materials: friction and elasticity (pymunk multiplies the two shapes' values).
_SURFACE = {"floor": (0.8, 0.5), "wall": (0.5, 0.6), "table": (0.6, 0.3), "leg": (0.5, 0.3),
            "ramp": (0.5, 0.2), "gate": (0.5, 0.1), "container": (0.7, 0.4), "pusher": (0.8, 0.0)}
_MATERIAL = {"ball": (0.9, 0.65, 1.5), "box": (0.4, 0.25, 1.2), "block": (0.4, 0.2, 1.0),
             "domino": (0.7, 0.1, 0.5)}  # friction, elasticity, density


@dataclass(frozen=True)
class ObjectSpec:
    """One dynamic object: ``object_id`` (``o0``...), palette ``color``, ``shape`` and ``size`` (w, h)."""

    object_id: str
    color: str
    shape: str
    size: tuple[float, float]

    @property
    def subject(self) -> str:
        return subject_name(self.color, self.shape)

    @property
    def half_height(self) -> float:
        return self.size[1] / 2


def pick_objects(rng: np.random.Generator, shapes: list[str]) -> list[ObjectSpec]:
    """Specs for the given shapes with distinct colours (so every subject in a video is unique)."""
    colors = rng.permutation(list(COLORS))[: len(shapes)]
    out = []
    for k, (color, shape) in enumerate(zip(colors, shapes, strict=True)):
        (w0, w1), (h0, h1) = SHAPES[shape]
        w = float(np.round(rng.uniform(w0, w1), 1))
        h = w if shape in ("ball", "box") else float(np.round(rng.uniform(h0, h1), 1))
        out.append(ObjectSpec(f"o{k}", str(color), shape, (w, h)))
    return out


def _box(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


class World:
    """A pymunk space plus what the record needs: static pieces, objects, scheduled events, edges, pusher."""

    def __init__(self, domain: str, walls: tuple[float, float]):
        self.domain = domain
        self.space = pymunk.Space()
        self.space.gravity = (0.0, GRAVITY)
        self.space.damping = DAMPING
        self.space.iterations = 20
        self.statics: list[tuple[str, list[tuple[float, float]], float]] = []
        self.shape_info: dict[pymunk.Shape, tuple[int, int]] = {}  # shape -> (support code, object index or -1)
        self.objects: list[ObjectSpec] = []
        self.bodies: list[pymunk.Body] = []
        self.release: list[float | None] = []  # None: simulated from the start; t: held until t
        self.in_space: list[bool] = []
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.edges: list[tuple[float, float, float]] = []
        self.container = (math.nan,) * 4
        self.pusher: pymunk.Body | None = None
        self.pusher_size = (math.nan, math.nan)
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

    def schedule(self, t: float, fn: Callable[[], None]) -> None:
        self.events.append((t, len(self.events), fn))

    def add_object(self, spec: ObjectSpec, pos: tuple[float, float], angle: float = 0.0,
                   vel: tuple[float, float] = (0.0, 0.0), release: float | None = None) -> None:
        spec = replace(spec, object_id=f"o{len(self.objects)}")  # ids stay contiguous when a spec did not fit
        friction, elasticity, density = _MATERIAL[spec.shape]
        w, h = spec.size
        if spec.shape == "ball":
            mass = density * math.pi * (w / 2) ** 2 / 100.0
            body = pymunk.Body(mass, pymunk.moment_for_circle(mass, 0, w / 2))
            shape: pymunk.Shape = pymunk.Circle(body, w / 2)
        else:
            mass = density * w * h / 100.0
            body = pymunk.Body(mass, pymunk.moment_for_box(mass, (w, h)))
            shape = pymunk.Poly.create_box(body, (w, h))
        shape.friction, shape.elasticity = friction, elasticity
        body.position, body.angle = pos, angle
        k = len(self.objects)
        self.shape_info[shape] = (R.SUPPORT_OBJECT, k)
        self.objects.append(spec)
        self.bodies.append(body)
        self.release.append(release)
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

    def add_pusher(self, pos: tuple[float, float], size: tuple[float, float], start: float, speed: float,
                   stop_x: float) -> None:
        body = pymunk.Body(body_type=pymunk.Body.KINEMATIC)
        body.position = pos
        shape = pymunk.Poly.create_box(body, size)
        shape.friction, shape.elasticity = _SURFACE["pusher"]
        self.space.add(body, shape)
        self.shape_info[shape] = (R.SUPPORT_PUSHER, -1)
        self.pusher, self.pusher_size, self.pusher_stop_x = body, size, stop_x
        self.schedule(start, lambda: setattr(body, "velocity", (speed, 0.0)))

    # --- running ---
    def run(self, duration: float, camera: tuple[float, float, float]) -> R.SimRecord:
        """Simulate ``duration`` seconds and return the per-frame record."""
        n_frames = int(round(duration * FPS)) + 1
        n = len(self.objects)
        dt = 1.0 / PHYSICS_HZ
        preroll = PREROLL_FRAMES * SUBSTEPS
        pos = np.zeros((n_frames, n, 2), np.float32)
        vel = np.zeros((n_frames, n, 2), np.float32)
        angle = np.zeros((n_frames, n), np.float32)
        angvel = np.zeros((n_frames, n), np.float32)
        contacts = np.zeros((n_frames, n), np.uint8)
        support = np.zeros((n_frames, n), np.int8)
        impact_speed = np.zeros((n_frames, n), np.float32)
        impact_kind = np.zeros((n_frames, n), np.int8)
        impact_other = np.full((n_frames, n), -1, np.int8)
        touch = np.zeros((n_frames, n, n), bool)
        held = np.zeros((n_frames, n), bool)
        pusher_pos = np.full((n_frames, 2), np.nan, np.float32)
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
                f = (step - preroll) // SUBSTEPS
                for k, body in enumerate(self.bodies):
                    pos[f, k] = body.position
                    vel[f, k] = body.velocity
                    angle[f, k] = body.angle
                    angvel[f, k] = body.angular_velocity
                    held[f, k] = not self.in_space[k]
                contacts[f], support[f] = acc.bits, acc.support
                impact_speed[f], impact_kind[f], touch[f] = acc.impact_speed, acc.impact_kind, acc.touch
                impact_other[f] = acc.impact_other
                if self.pusher is not None:
                    pusher_pos[f] = self.pusher.position
                acc.reset()
        return self._record(n_frames, camera, pos=pos, vel=vel, angle=angle, angvel=angvel, contacts=contacts,
                            support=support, impact_speed=impact_speed, impact_kind=impact_kind,
                            impact_other=impact_other, touch=touch,
                            held=held, pusher_pos=pusher_pos)

    def _scan_contacts(self, acc: _Accumulator, pre_v: list[tuple[float, float]]) -> None:
        pusher_v = tuple(self.pusher.velocity) if self.pusher is not None else (0.0, 0.0)
        for k, body in enumerate(self.bodies):
            if not self.in_space[k]:
                continue
            best = [-SUPPORT_NORMAL_Y, R.SUPPORT_NONE]

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
                        ox, oy = pusher_v if code == R.SUPPORT_PUSHER else (0.0, 0.0)
                        speed = abs((vx - ox) * nx + (vy - oy) * ny)
                    if speed > acc.impact_speed[k]:
                        acc.impact_speed[k], acc.impact_kind[k], acc.impact_other[k] = speed, code, j
                if ny < best[0]:
                    best[0], best[1] = ny, code

            body.each_arbiter(visit)
            acc.support[k] = best[1]
            if self.objects[k].shape == "ball" and best[1] != R.SUPPORT_NONE:
                vx, vy = body.velocity
                speed = math.hypot(vx, vy)
                if speed > 0:
                    scale = max(0.0, speed - ROLL_DECEL / PHYSICS_HZ) / speed
                    body.velocity = (vx * scale, vy * scale)
                    body.angular_velocity *= scale

    def _record(self, n_frames: int, camera: tuple[float, float, float], **arrays: np.ndarray) -> R.SimRecord:
        specs = self.objects
        quads = np.array([list(v) + [v[-1]] * (4 - len(v)) for _, v, _ in self.statics], np.float32)
        return R.SimRecord(
            domain=self.domain, fps=float(FPS), t=np.arange(n_frames, dtype=np.float64) / FPS,
            object_ids=np.array([s.object_id for s in specs]), subjects=np.array([s.subject for s in specs]),
            colors=np.array([s.color for s in specs]), shapes=np.array([s.shape for s in specs]),
            sizes=np.array([s.size for s in specs], np.float32),
            static_kind=np.array([k for k, _, _ in self.statics]), static_vertices=quads,
            static_until=np.array([u for _, _, u in self.statics], np.float64),
            edges=np.array(self.edges, np.float32).reshape(-1, 3), container=np.array(self.container, np.float32),
            pusher_size=np.array(self.pusher_size, np.float32), camera=np.array(camera, np.float32), **arrays)


class _Accumulator:
    """What happened to each object during one frame's substeps."""

    def __init__(self, n: int):
        self.n = n
        self.reset()

    def reset(self) -> None:
        n = self.n
        self.bits = np.zeros(n, np.uint8)
        self.support = np.zeros(n, np.int8)
        self.impact_speed = np.zeros(n, np.float32)
        self.impact_kind = np.zeros(n, np.int8)
        self.impact_other = np.full(n, -1, np.int8)
        self.touch = np.zeros((n, n), bool)


# --------------------------------------------------------------------------------------------------------------
# Scene families. Each returns a World ready to run; all randomness comes from ``rng``.


def _on_slope(x0: float, y0: float, x1: float, y1: float, s: float, spec: ObjectSpec) -> tuple[tuple[float, float], float]:
    """Position and angle of an object resting on the slope (x0,y0)-(x1,y1) at arc length ``s`` from (x0,y0)."""
    length = math.hypot(x1 - x0, y1 - y0)
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    nx, ny = -uy, ux  # upward normal for a slope going right and down
    if ny < 0:
        nx, ny = -nx, -ny
    lift = spec.size[0] / 2 if spec.shape == "ball" else spec.half_height
    return (x0 + ux * s + nx * (lift + 0.5), y0 + uy * s + ny * (lift + 0.5)), math.atan2(uy, ux)


def _row_on_surface(rng: np.random.Generator, specs: list[ObjectSpec], x_start: float, x_end: float,
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


def build_ramp(rng: np.random.Generator) -> World:
    world = World("ramp", walls=(5.0, 365.0))
    top_y, ramp_x1, table_y = rng.uniform(150, 185), rng.uniform(120, 150), rng.uniform(70, 90)
    edge_x = ramp_x1 + rng.uniform(40, 80)
    world.add_static("ramp", R.SUPPORT_RAMP, [(15.0, FLOOR_Y), (ramp_x1, FLOOR_Y), (ramp_x1, table_y), (15.0, top_y)])
    world.add_static("table", R.SUPPORT_TABLE, _box(ramp_x1, FLOOR_Y, edge_x, table_y), friction=0.3)
    world.edges.append((edge_x, table_y, 1.0))
    n_table = int(rng.choice([0, 1, 2], p=[0.4, 0.5, 0.1]))
    n_ramp = int(rng.choice([1, 2, 3], p=[0.3, 0.45, 0.25])) if n_table else int(rng.choice([2, 3]))
    shapes = [str(s) for s in rng.choice(["ball", "box", "block"], size=n_ramp + n_table, p=[0.5, 0.3, 0.2])]
    specs = pick_objects(rng, shapes)
    # gate across the ramp; objects line up uphill of it
    slope_len = math.hypot(ramp_x1 - 15.0, top_y - table_y)
    s_gate = slope_len * rng.uniform(0.5, 0.62)
    (gx, gy), _ = _on_slope(15.0, top_y, ramp_x1, table_y, s_gate, ObjectSpec("g", "red", "box", (0.0, 0.0)))
    t_gate = float(rng.uniform(1.0, 2.2))
    world.add_static("gate", R.SUPPORT_GATE, _box(gx, gy - 6.0, gx + 4.0, gy + 34.0), until=t_gate)
    s = s_gate - 1.0
    for spec in specs[:n_ramp]:
        if s - spec.size[0] - 1.0 < 6.0:
            break  # no room left uphill of the gate
        s -= spec.size[0] / 2 + 1.0
        pos, ang = _on_slope(15.0, top_y, ramp_x1, table_y, s, spec)
        world.add_object(spec, pos, angle=ang if spec.shape != "ball" else 0.0)
        s -= spec.size[0] / 2
    table_specs = specs[n_ramp:]
    xs = _row_on_surface(rng, table_specs, ramp_x1 + rng.uniform(12, 30), edge_x - 8.0, (6.0, 30.0))
    for spec, x in zip(table_specs, xs, strict=False):
        world.add_object(spec, (x, table_y + spec.half_height + 0.5))
    return world


def build_table_push(rng: np.random.Generator) -> World:
    world = World("table_push", walls=(8.0, 362.0))
    y_top, x0, x1 = rng.uniform(95, 112), rng.uniform(28, 45), rng.uniform(235, 275)
    world.add_static("table", R.SUPPORT_TABLE, _box(x0, y_top - 10.0, x1, y_top))
    for lx in (x0 + 6.0, x1 - 12.0):
        world.add_static("leg", R.SUPPORT_TABLE, _box(lx, FLOOR_Y, lx + 6.0, y_top - 10.0))
    world.edges.extend([(x1, y_top, 1.0), (x0, y_top, -1.0)])
    n = int(rng.choice([2, 3, 4], p=[0.3, 0.45, 0.25]))
    shapes = [str(s) for s in rng.choice(["ball", "box", "block", "domino"], size=n, p=[0.25, 0.35, 0.25, 0.15])]
    specs = pick_objects(rng, shapes)
    pw, ph = 10.0, 30.0
    px = x0 + 8.0
    xs = _row_on_surface(rng, specs, px + pw / 2 + rng.uniform(4, 30), x1 - 6.0, (0.0, 40.0))
    for spec, x in zip(specs, xs, strict=False):
        world.add_object(spec, (x, y_top + spec.half_height + 0.5))
    start, speed = float(rng.uniform(0.9, 1.9)), float(rng.uniform(55, 110))
    stop_x = float(rng.uniform(x1 - 130, x1 - 20)) if rng.random() < 0.75 else x1 - 4.0
    world.add_pusher((px, y_top + ph / 2 + 1.0), (pw, ph), start, speed, stop_x)
    return world


def build_dominoes(rng: np.random.Generator) -> World:
    world = World("dominoes", walls=(5.0, 300.0))
    on_table = rng.random() < 0.5
    y_s = 70.0 if on_table else FLOOR_Y
    n_dom = int(rng.choice([1, 2, 3, 4], p=[0.15, 0.3, 0.3, 0.25]))
    hitter = "ball" if rng.random() < 0.75 else "box"
    specs = pick_objects(rng, [hitter] + ["domino"] * n_dom)
    x_d = rng.uniform(115, 140)
    xs = []
    for _ in specs[1:]:
        xs.append(x_d)
        x_d += rng.uniform(16, 28) if rng.random() < 0.85 else rng.uniform(40, 50)
    edge_x = xs[-1] + rng.uniform(8, 30)
    if on_table:
        world.add_static("table", R.SUPPORT_TABLE, _box(-40.0, y_s - 10.0, edge_x, y_s))
        world.add_static("leg", R.SUPPORT_TABLE, _box(edge_x - 14.0, FLOOR_Y, edge_x - 8.0, y_s - 10.0))
        world.edges.append((edge_x, y_s, 1.0))
    h_r = rng.uniform(34, 56)
    world.add_static("ramp", R.SUPPORT_RAMP, [(10.0, y_s), (80.0, y_s), (10.0, y_s + h_r)])
    slope_len = math.hypot(70.0, h_r)
    s_gate = slope_len * rng.uniform(0.3, 0.42)
    (gx, gy), _ = _on_slope(10.0, y_s + h_r, 80.0, y_s, s_gate, ObjectSpec("g", "red", "box", (0.0, 0.0)))
    t_gate = float(rng.uniform(0.8, 1.8))
    world.add_static("gate", R.SUPPORT_GATE, _box(gx, gy - 6.0, gx + 4.0, gy + 30.0), until=t_gate)
    hit = specs[0]
    pos, ang = _on_slope(10.0, y_s + h_r, 80.0, y_s, s_gate - 1.5 - hit.size[0] / 2, hit)
    world.add_object(hit, pos, angle=ang if hit.shape != "ball" else 0.0)
    for spec, x in zip(specs[1:], xs, strict=True):
        world.add_object(spec, (x, y_s + spec.half_height + 0.3))
    return world


def build_container(rng: np.random.Generator) -> World:
    world = World("container", walls=(30.0, 370.0))
    cx, w, wall_h, th = rng.uniform(170, 230), rng.uniform(70, 100), rng.uniform(38, 58), 6.0
    ix0, ix1 = cx - w / 2, cx + w / 2
    bottom = FLOOR_Y + th
    world.add_static("container", R.SUPPORT_CONTAINER, _box(ix0 - th, FLOOR_Y, ix1 + th, bottom))
    world.add_static("container", R.SUPPORT_WALL, _box(ix0 - th, bottom, ix0, bottom + wall_h))
    world.add_static("container", R.SUPPORT_WALL, _box(ix1, bottom, ix1 + th, bottom + wall_h))
    world.container = (ix0, ix1, bottom, bottom + wall_h)
    n = int(rng.choice([2, 3, 4, 5], p=[0.25, 0.35, 0.25, 0.15]))
    shapes = [str(s) for s in rng.choice(["ball", "box", "block", "domino"], size=n, p=[0.45, 0.3, 0.15, 0.1])]
    specs = pick_objects(rng, shapes)
    t = rng.uniform(0.8, 1.6)
    for k, spec in enumerate(specs):
        aim = rng.choice(["inside", "rim", "outside"], p=[0.6, 0.2, 0.2])
        if aim == "inside":
            x = cx + rng.uniform(-0.3, 0.3) * w
        elif aim == "rim":
            x = (ix0 - th / 2 if rng.random() < 0.5 else ix1 + th / 2) + rng.uniform(-6, 6)
        else:
            x = rng.uniform(70, ix0 - 30) if rng.random() < 0.5 else rng.uniform(ix1 + 30, 330)
        y = rng.uniform(175, 235) + 8.0 * (k % 2)
        vx = float(rng.uniform(-50, 50)) if rng.random() < 0.4 else 0.0
        angle = float(rng.uniform(-0.4, 0.4)) if spec.shape != "ball" else 0.0
        world.add_object(spec, (x, y), angle=angle, vel=(vx, 0.0), release=float(t))
        t += rng.uniform(0.35, 1.3)
    return world


BUILDERS: dict[str, Callable[[np.random.Generator], World]] = {
    "ramp": build_ramp, "table_push": build_table_push, "dominoes": build_dominoes, "container": build_container,
}


def simulate(domain: str, rng: np.random.Generator, camera: tuple[float, float, float]) -> R.SimRecord:
    """Build a scene of family ``domain`` from ``rng`` and simulate it; ``camera`` is stored in the record."""
    if domain not in BUILDERS:
        raise ValueError(f"unknown scene family {domain!r}; expected one of {FAMILIES}")
    world = BUILDERS[domain](rng)
    return world.run(DURATIONS[domain], camera)
