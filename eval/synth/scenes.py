"""Scene families and source domains of the synthetic benchmark.

A *scene family* is a layout with its own dynamics, registered with `family` (its builder, and its share of each
source domain it occurs in); a *domain* (`DOMAINS`: the benchmark's source dataset, which defines the in-dataset /
cross-dataset GT tiers) is a mixture of families (`domain_mixtures`), so a family's states occur in several domains,
as in PSR's four source datasets. The registered families (all randomness from the ``rng`` passed in):

- ``ramp``: objects wait behind a gate on a ramp; the gate opens, they roll or slide down onto a table, knock into
  what rests there, go over the table's edge, fall, bounce and settle.
- ``table_push``: a kinematic pusher shoves a row of objects across a table; some stay on it, some go over the edge.
- ``dominoes``: a ball (or cube) released on a small ramp runs into a row of standing dominoes, bricks or planks.
- ``container``: a gripper drops objects one after another towards an open container; they fall in, bounce off its
  walls, land on each other or miss it.
- ``stack``: a tower of two to four objects on the floor or a table is hit by a rolling ball or a pushed cube.
- ``shelf``: a shelf tilts and the objects on it slide or roll off onto what lies below (floor, container, table).
- ``billiards``: objects scattered on the floor; one or two balls are struck towards them and set them moving.

Adding a family is one decorated builder in this module (`family`; a builder puts pieces and objects into an
`eval.synth.world.World`); a piece kind it needs beyond the built-in ones is one `eval.synth.surfaces.surface` call.
Every scene also holds *bystanders*: objects placed where nothing may reach them, which become the named others of
relations ("next to the red cube") and keep the video's object count realistic. The first event of a scene happens
after `QUIET_S` seconds, so each object's first state lasts long enough for an early prefix (`eval.synth.video`).

Units: world units (``_U``), seconds (``_S``), units per second (``_U_S``), radians per second (``_RAD_S``), radians
(``_RAD``); ``P_`` names a probability. A ``(lo, hi)`` tuple is the range of a uniform draw; a ``{value:
probability}`` dict a discrete distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from eval.errors import UnknownName
from eval.synth import record as R
from eval.synth.lexicon import ROUND_SHAPES
from eval.synth.world import DURATION_S, FLOOR_Y, WORLD_X, ObjectSpec, World, box, pick_objects

DOMAINS = ("workshop", "kitchen", "playroom", "warehouse")
"""The source domains, in the order videos are assigned to them (video ``i`` belongs to ``DOMAINS[i % 4]``)."""

QUIET_S = (0.3, 1.0)
"""Range of the time of a scene's first event (gate, pusher, strike, tilt, first release), seconds: early, so
the scene is in motion when prefixes end (`eval.synth.prefix`)."""
WORLD_MARGIN_U = 5.0
"""Free space kept between a bystander slot and the world's horizontal extent."""
SPAWN_GAP_U = 0.5
"""Clearance between an object and the surface it is placed on (it settles during the preroll)."""
TOWER_GAP_U = 0.3
"""Clearance below each object of a tower or a row of standing pieces."""

# --------------------------------------------------------------------------------------------------------------
# Placement helpers.

P_MIRROR = 0.5
"""Probability that a scene (of a family that mirrors) runs right to left."""
SLOT_MIN_WIDTH_U = 12.0
"""A bystander slot narrower than this holds no one."""
SLOT_MARGIN_U = 1.0
"""Free space kept at each end of a bystander slot."""
BYSTANDER_GAP = (2.0, 14.0)
"""Gap (units) between neighbouring bystanders of a group."""
BYSTANDERS = {0: 0.2, 2: 0.6, 3: 0.2}
"""Size of a scene's group of bystanders and its probability (never one alone: a group names its members)."""
ANY_SHAPES = {"ball": 1.0, "wheel": 0.6, "cube": 1.0, "brick": 0.8, "domino": 0.5, "plank": 0.4, "wedge": 0.6,
              "can": 0.8}
"""Shape weights of an object of no particular role (bystanders, objects on a table or a shelf, targets)."""
START_ANGLES_RAD = (0.0, 0.0, 0.0, math.pi / 2, -math.pi / 2, math.pi)
"""Start angles of a bystander or resting object, drawn uniformly (mostly upright; some on a side or upside
down)."""
ON_END_SHAPES = ("plank", "brick")
"""Shapes that stand on their end only in a row of dominoes (elsewhere they start lying down)."""
GATE_WIDTH_U = 4.0
GATE_BELOW_U = 6.0
"""A gate reaches this far below the point `SPAWN_GAP_U` above the slope (into the ramp)."""
_POINT = ObjectSpec("point", "red", "cube", (0.0, 0.0))
"""A zero-size spec: `_on_slope` of it is the point `SPAWN_GAP_U` above the slope."""


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
    return (x0 + ux * s + nx * (lift + SPAWN_GAP_U), y0 + uy * s + ny * (lift + SPAWN_GAP_U)), angle


def _gate(world: World, x0: float, y0: float, x1: float, y1: float, s: float, top: float, until: float) -> None:
    """A gate across the slope (x0,y0)-(x1,y1) at arc length ``s``, ``top`` units high, removed at ``until``."""
    (gx, gy), _ = _on_slope(x0, y0, x1, y1, s, _POINT)
    world.add_static("gate", box(gx, gy - GATE_BELOW_U, gx + GATE_WIDTH_U, gy + top), until=until)


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


def _count(rng: np.random.Generator, dist: dict[int, float]) -> int:
    """A count drawn from ``dist`` (count -> probability)."""
    return int(rng.choice(list(dist), p=list(dist.values())))


def _start_angle(rng: np.random.Generator, spec: ObjectSpec) -> float:
    if spec.shape in ROUND_SHAPES or spec.shape == "domino":
        return 0.0
    a = float(START_ANGLES_RAD[int(rng.integers(len(START_ANGLES_RAD)))])
    if spec.shape in ON_END_SHAPES and abs(a) == math.pi / 2:
        return 0.0  # standing a plank on its end makes a domino scene of every family
    return a


def _rest_height(spec: ObjectSpec, angle: float) -> float:
    """Centre height above the surface of a box-like object resting at a multiple of 90 degrees."""
    w, h = spec.size
    return (w if abs(math.sin(angle)) > 0.5 else h) / 2


def _place_resting(world: World, rng: np.random.Generator, spec: ObjectSpec, x: float, surface_y: float) -> None:
    """Place ``spec`` at rest on a surface at height ``surface_y``, centred at ``x``, in a drawn start pose."""
    a = _start_angle(rng, spec)
    world.add_object(spec, (x, surface_y + _rest_height(spec, a) + SPAWN_GAP_U), angle=a)


def _bystanders(world: World, rng: np.random.Generator, specs: list[ObjectSpec], slots: list[tuple[float, float]],
                surface_y: float = FLOOR_Y) -> None:
    """Place resting objects side by side (gaps of `BYSTANDER_GAP` units) in one of the free floor intervals
    ``slots`` ([x0, x1] ranges nothing reaches), as a group that names each other in relations ("next to the
    cube"); objects that do not fit are left out."""
    slots = [sl for sl in slots if sl[1] - sl[0] > SLOT_MIN_WIDTH_U]
    if not slots or not specs:
        return
    x0, x1 = slots[int(rng.integers(len(slots)))]
    width = sum(sp.size[0] for sp in specs) + BYSTANDER_GAP[1] * (len(specs) - 1)
    x = float(rng.uniform(x0 + SLOT_MARGIN_U, max(x0 + SLOT_MARGIN_U, x1 - width - SLOT_MARGIN_U)))
    for spec in specs:
        if x + spec.size[0] + SLOT_MARGIN_U > x1:
            return
        _place_resting(world, rng, spec, x + spec.size[0] / 2, surface_y)
        x += spec.size[0] + float(rng.uniform(*BYSTANDER_GAP))


def _n_bystanders(rng: np.random.Generator, sizes: dict[int, float] = BYSTANDERS) -> int:
    k = list(sizes)
    return int(k[int(rng.choice(len(k), p=np.array([sizes[x] for x in k]) / sum(sizes.values())))])


def _t0(rng: np.random.Generator) -> float:
    return float(rng.uniform(*QUIET_S))


# --------------------------------------------------------------------------------------------------------------
# The family registry.

Builder = Callable[[np.random.Generator], World]


@dataclass(frozen=True)
class Share:
    """A family's part of one domain's mixture: its ``weight`` (relative probability) and its ``slot``, its place in
    the order in which the domain's families split a draw (a seed picks another family when the order changes, so
    each family keeps its slot)."""

    weight: float
    slot: int


@dataclass(frozen=True)
class Family:
    """A registered scene family: its ``name``, its ``build`` (rng -> a `World` ready to run), its ``domains``."""

    name: str
    build: Builder
    domains: Mapping[str, Share]


REGISTRY: dict[str, Family] = {}
"""name -> `Family`, in registration order (the order of `families`)."""


def family(name: str, *, domains: Mapping[str, Share]) -> Callable[[Builder], Builder]:
    """Register the decorated builder as scene family ``name`` occurring in ``domains`` (domain -> `Share`).

    Example::

        @family("seesaw", domains={"workshop": Share(0.2, slot=3), "playroom": Share(0.1, slot=4)})
        def build_seesaw(rng: np.random.Generator) -> World:
            world = World("seesaw")
            ...
            return world
    """
    def register(build: Builder) -> Builder:
        if name in REGISTRY:
            raise ValueError(f"scene family {name!r} is already registered")
        if not domains:
            raise ValueError(f"scene family {name!r}: give at least one domain of {DOMAINS}")
        for domain, share in domains.items():
            if domain not in DOMAINS:
                raise ValueError(f"scene family {name!r}: unknown domain {domain!r}; expected one of {DOMAINS}")
            taken = {f.name: f.domains[domain].slot for f in REGISTRY.values() if domain in f.domains}
            if share.slot in taken.values():
                raise ValueError(f"scene family {name!r}: slot {share.slot} of domain {domain!r} is taken "
                                 f"({taken})")
        REGISTRY[name] = Family(name, build, dict(domains))
        return build
    return register


def families() -> tuple[str, ...]:
    """The registered scene families, in registration order."""
    return tuple(REGISTRY)


def domain_mixtures() -> dict[str, dict[str, float]]:
    """Each domain's family -> weight, in slot order (every family occurs in at least two domains)."""
    out: dict[str, dict[str, float]] = {}
    for domain in DOMAINS:
        members = sorted((f.domains[domain].slot, f.name) for f in REGISTRY.values() if domain in f.domains)
        out[domain] = {name: REGISTRY[name].domains[domain].weight for _, name in members}
    return out


def family_of(domain: str, rng: np.random.Generator) -> str:
    """Draw a scene family from the domain's mixture."""
    mix = domain_mixtures()[domain]
    names = list(mix)
    p = np.array([mix[n] for n in names])
    return str(names[int(rng.choice(len(names), p=p / p.sum()))])


def simulate(family: str, rng: np.random.Generator,
             hooks: tuple[tuple[float, Callable[[World], None]], ...] = ()) -> R.SimRecord:
    """Build a scene of ``family`` from ``rng``, simulate it for `DURATION_S` and return its record (mirrored when
    the scene asked for it). ``hooks``: ``(t, fn)`` pairs; ``fn(world)`` runs at video time ``t`` after the scene's
    own events of that time (`eval.synth.predictability` perturbs the world this way)."""
    if family not in REGISTRY:
        raise UnknownName(f"unknown scene family {family!r}; expected one of {families()}")
    world = REGISTRY[family].build(rng)
    for t, fn in hooks:
        world.schedule(t, lambda fn=fn: fn(world))
    return world.run(DURATION_S)


# --------------------------------------------------------------------------------------------------------------
# Scene families. Each builder returns a World ready to run.

RAMP_TOP_X_U = 15.0
RAMP_TOP_Y_U = (150.0, 190.0)
RAMP_FOOT_X_U = (120.0, 160.0)
"""x of the ramp's foot, where the table begins."""
RAMP_TABLE_Y_U = (60.0, 90.0)
RAMP_TABLE_LENGTH_U = (50.0, 90.0)
RAMP_N_ON_RAMP = {1: 0.3, 2: 0.45, 3: 0.25}
RAMP_N_ON_TABLE = {0: 0.3, 1: 0.5, 2: 0.2}
RAMP_ROLLER_SHAPES = {"ball": 1.0, "wheel": 0.6, "cube": 0.7, "brick": 0.4, "can": 0.4, "wedge": 0.3}
"""Shape weights of the objects queued on the ramp."""
RAMP_GATE_AT = (0.5, 0.62)
"""Where the gate stands, as a fraction of the slope's length from its top."""
RAMP_GATE_TOP_U = 34.0
RAMP_QUEUE_GAP_U = 1.0
"""Gap between the gate and the objects queued behind it, and between those objects."""
RAMP_QUEUE_TOP_U = 6.0
"""The queue stops this far (arc length) from the ramp's top."""
RAMP_TABLE_ROW_START_U = (12.0, 30.0)
"""Distance from the ramp's foot to where the row of objects on the table begins."""
RAMP_TABLE_ROW_END_U = 8.0
"""The row on the table ends this far before the table's edge."""
RAMP_TABLE_ROW_GAP_U = (6.0, 30.0)
RAMP_BYSTANDER_CLEARANCE_U = 90.0
"""Bystanders stand at least this far beyond the table's edge."""


@family("ramp", domains={"workshop": Share(0.35, slot=0), "playroom": Share(0.20, slot=3)})
def build_ramp(rng: np.random.Generator) -> World:
    world = World("ramp")
    flip = rng.random() < P_MIRROR
    top_y, ramp_x1, table_y = rng.uniform(*RAMP_TOP_Y_U), rng.uniform(*RAMP_FOOT_X_U), rng.uniform(*RAMP_TABLE_Y_U)
    edge_x = ramp_x1 + rng.uniform(*RAMP_TABLE_LENGTH_U)
    x0 = RAMP_TOP_X_U
    world.add_ramp(x0, top_y, ramp_x1, table_y)
    world.add_table(ramp_x1, edge_x, table_y, edges=(1,))
    n_ramp, n_table = _count(rng, RAMP_N_ON_RAMP), _count(rng, RAMP_N_ON_TABLE)
    n_by = _n_bystanders(rng)
    shapes = _shapes(rng, n_ramp, RAMP_ROLLER_SHAPES) + _shapes(rng, n_table + n_by, ANY_SHAPES)
    specs = pick_objects(rng, shapes)
    slope_len = math.hypot(ramp_x1 - x0, top_y - table_y)
    s_gate = slope_len * rng.uniform(*RAMP_GATE_AT)
    _gate(world, x0, top_y, ramp_x1, table_y, s_gate, RAMP_GATE_TOP_U, until=_t0(rng))
    s = s_gate - RAMP_QUEUE_GAP_U
    for spec in specs[:n_ramp]:
        if s - spec.size[0] - RAMP_QUEUE_GAP_U < RAMP_QUEUE_TOP_U:
            break
        s -= spec.size[0] / 2 + RAMP_QUEUE_GAP_U
        pos, ang = _on_slope(x0, top_y, ramp_x1, table_y, s, spec)
        world.add_object(spec, pos, angle=ang if spec.shape not in ROUND_SHAPES else 0.0)
        s -= spec.size[0] / 2
    table = specs[n_ramp:n_ramp + n_table]
    row = _row(rng, table, ramp_x1 + rng.uniform(*RAMP_TABLE_ROW_START_U), edge_x - RAMP_TABLE_ROW_END_U,
               RAMP_TABLE_ROW_GAP_U)
    for spec, x in zip(table, row, strict=False):
        _place_resting(world, rng, spec, x, table_y)
    _bystanders(world, rng, specs[n_ramp + n_table:],
                [(edge_x + RAMP_BYSTANDER_CLEARANCE_U, WORLD_X[1] - WORLD_MARGIN_U)])
    return world.mirror_if(flip)


PUSH_TABLE_Y_U = (85.0, 115.0)
PUSH_TABLE_X0_U = (25.0, 50.0)
PUSH_TABLE_X1_U = (230.0, 290.0)
PUSH_N_ON_TABLE = {2: 0.3, 3: 0.45, 4: 0.25}
PUSHER_SIZE_U = (10.0, 30.0)
PUSHER_INSET_U = 8.0
"""The pusher's centre starts this far inside the table's left end."""
PUSHER_LIFT_U = 1.0
"""The pusher's bottom floats this far above the table top."""
PUSH_ROW_START_U = (4.0, 30.0)
"""Gap between the pusher's face and the row of objects."""
PUSH_ROW_END_U = 6.0
"""The row ends this far before the table's right end."""
PUSH_ROW_GAP_U = (0.0, 40.0)
PUSHER_SPEED_U_S = (40.0, 110.0)
P_PUSHER_STOPS_EARLY = 0.7
PUSHER_EARLY_STOP_U = (140.0, 20.0)
"""How far before the table's right end an early-stopping pusher stops (range: farthest, nearest)."""
PUSHER_LATE_STOP_U = 4.0
"""How far before the table's right end the other pushers stop."""
PUSH_BYSTANDER_CLEARANCE_U = 70.0
"""Bystanders stand at least this far beyond the table's right end."""


@family("table_push", domains={"kitchen": Share(0.35, slot=0), "warehouse": Share(0.20, slot=2)})
def build_table_push(rng: np.random.Generator) -> World:
    world = World("table_push")
    y_top, x0, x1 = rng.uniform(*PUSH_TABLE_Y_U), rng.uniform(*PUSH_TABLE_X0_U), rng.uniform(*PUSH_TABLE_X1_U)
    world.add_table(x0, x1, y_top)
    n, n_by = _count(rng, PUSH_N_ON_TABLE), _n_bystanders(rng)
    specs = pick_objects(rng, _shapes(rng, n + n_by, ANY_SHAPES))
    pw, ph = PUSHER_SIZE_U
    px = x0 + PUSHER_INSET_U
    row = specs[:n]
    xs = _row(rng, row, px + pw / 2 + rng.uniform(*PUSH_ROW_START_U), x1 - PUSH_ROW_END_U, PUSH_ROW_GAP_U)
    for spec, x in zip(row, xs, strict=False):
        _place_resting(world, rng, spec, x, y_top)
    start, speed = _t0(rng), float(rng.uniform(*PUSHER_SPEED_U_S))
    far, near = PUSHER_EARLY_STOP_U
    stop_x = float(rng.uniform(x1 - far, x1 - near)) if rng.random() < P_PUSHER_STOPS_EARLY else x1 - PUSHER_LATE_STOP_U
    world.add_pusher((px, y_top + ph / 2 + PUSHER_LIFT_U), (pw, ph), start, speed, stop_x)
    _bystanders(world, rng, specs[n:], [(x1 + PUSH_BYSTANDER_CLEARANCE_U, WORLD_X[1] - WORLD_MARGIN_U)])
    return world.mirror_if(rng.random() < P_MIRROR)


P_DOMINOES_ON_TABLE = 0.5
DOMINOES_TABLE_Y_U = (60.0, 80.0)
DOMINOES_TABLE_X0_U = -40.0
"""The table starts under the left wall (only its right edge is open)."""
DOMINOES_TABLE_OVERHANG_U = (10.0, 35.0)
"""How far the table reaches beyond the last domino."""
DOMINOES_N_STANDING = {2: 0.2, 3: 0.3, 4: 0.3, 5: 0.2}
P_BALL_HITTER = 0.6
OTHER_HITTERS = ("cube", "wheel", "can")
STANDING_SHAPES = ("domino", "domino", "plank", "brick")
"""The shape of the standing row, drawn uniformly (dominoes twice as often)."""
DOMINOES_FIRST_X_U = (115.0, 140.0)
DOMINO_SPACING_U = (18.0, 30.0)
P_DOMINO_CLOSE = 0.85
"""Probability that the next piece stands `DOMINO_SPACING_U` away, else `DOMINO_WIDE_SPACING_U` (the chain may
break)."""
DOMINO_WIDE_SPACING_U = (40.0, 50.0)
DOMINOES_RAMP_X_U = (10.0, 80.0)
"""x of the small ramp's top and foot."""
DOMINOES_RAMP_HEIGHT_U = (34.0, 56.0)
DOMINOES_GATE_AT = (0.3, 0.42)
"""Where the gate stands, as a fraction of the slope's length from its top."""
DOMINOES_GATE_TOP_U = 30.0
HITTER_GATE_GAP_U = 1.5
HITTER_NUDGE_U_S = (120.0, 220.0)
"""Speed of the nudge down the slope the hitter gets as the gate opens."""
DOMINOES_BYSTANDER_CLEARANCE_U = 80.0
"""Bystanders stand at least this far beyond the table's edge (or where it would be)."""


@family("dominoes", domains={"workshop": Share(0.30, slot=2), "playroom": Share(0.20, slot=1)})
def build_dominoes(rng: np.random.Generator) -> World:
    world = World("dominoes")
    on_table = rng.random() < P_DOMINOES_ON_TABLE
    y_s = float(rng.uniform(*DOMINOES_TABLE_Y_U)) if on_table else FLOOR_Y
    n_dom, n_by = _count(rng, DOMINOES_N_STANDING), _n_bystanders(rng)
    hitter = "ball" if rng.random() < P_BALL_HITTER else str(rng.choice(OTHER_HITTERS))
    standing = str(rng.choice(STANDING_SHAPES))
    shapes = [hitter] + [standing] * n_dom + _shapes(rng, n_by, ANY_SHAPES)
    specs = pick_objects(rng, shapes)
    x_d = rng.uniform(*DOMINOES_FIRST_X_U)
    xs = []
    for _ in range(n_dom):
        xs.append(x_d)
        x_d += rng.uniform(*DOMINO_SPACING_U) if rng.random() < P_DOMINO_CLOSE else rng.uniform(*DOMINO_WIDE_SPACING_U)
    edge_x = xs[-1] + rng.uniform(*DOMINOES_TABLE_OVERHANG_U)
    if on_table:
        world.add_table(DOMINOES_TABLE_X0_U, edge_x, y_s, edges=(1,))
    h_r = rng.uniform(*DOMINOES_RAMP_HEIGHT_U)
    x0, x1 = DOMINOES_RAMP_X_U
    run = x1 - x0
    world.add_ramp(x0, y_s + h_r, x1, y_s)
    slope_len = math.hypot(run, h_r)
    s_gate = slope_len * rng.uniform(*DOMINOES_GATE_AT)
    t_gate = _t0(rng)
    _gate(world, x0, y_s + h_r, x1, y_s, s_gate, DOMINOES_GATE_TOP_U, until=t_gate)
    hit = specs[0]
    pos, ang = _on_slope(x0, y_s + h_r, x1, y_s, s_gate - HITTER_GATE_GAP_U - hit.size[0] / 2, hit)
    v = float(rng.uniform(*HITTER_NUDGE_U_S))
    world.add_object(hit, pos, angle=ang if hit.shape not in ROUND_SHAPES else 0.0,
                     kick=(t_gate, (v * run / slope_len, -v * h_r / slope_len)))
    for spec, x in zip(specs[1:1 + n_dom], xs, strict=True):
        w, h = spec.size
        stand = math.pi / 2 if spec.shape in ON_END_SHAPES else 0.0  # stood on end
        world.add_object(spec, (x, y_s + (w if stand else h) / 2 + TOWER_GAP_U), angle=stand)
    _bystanders(world, rng, specs[1 + n_dom:], [(edge_x + DOMINOES_BYSTANDER_CLEARANCE_U, WORLD_X[1] - WORLD_MARGIN_U)])
    return world.mirror_if(rng.random() < P_MIRROR)


CONTAINER_X_U = (170.0, 240.0)
CONTAINER_WIDTH_U = (70.0, 100.0)
CONTAINER_WALL_HEIGHT_U = (38.0, 58.0)
CONTAINER_N_DROPPED = {2: 0.3, 3: 0.4, 4: 0.3}
DROP_AIMS = {"inside": 0.6, "rim": 0.2, "outside": 0.2}
"""Where the gripper aims each object, with its probability."""
DROP_INSIDE_SPREAD = (-0.3, 0.3)
"""Aim inside: offset from the container's centre, as a fraction of its inner width."""
P_DROP_LEFT = 0.5
"""Aim at the rim or outside: probability of the left side."""
DROP_RIM_OFFSET_U = 3.0
"""Aim at the rim: this far outside an inner wall face, give or take `DROP_RIM_SPREAD_U`."""
DROP_RIM_SPREAD_U = (-6.0, 6.0)
DROP_OUTSIDE_X_U = (70.0, 330.0)
DROP_OUTSIDE_CLEARANCE_U = 30.0
"""Aim outside: in `DROP_OUTSIDE_X_U`, at least this far from the container's inner walls."""
DROP_HEIGHT_U = (175.0, 235.0)
DROP_STAGGER_U = 8.0
"""Every second object is held this much higher."""
P_DROP_THROWN = 0.4
DROP_THROW_U_S = (-50.0, 50.0)
"""Horizontal speed of a thrown (not just released) object."""
DROP_TILT_RAD = (-0.4, 0.4)
DROP_INTERVAL_S = (0.6, 1.6)
CONTAINER_BYSTANDER_SLOTS_U = ((5.0, 45.0), (360.0, 395.0))
"""The floor intervals at the world's two ends where bystanders may stand."""


@family("container", domains={"kitchen": Share(0.30, slot=2), "playroom": Share(0.20, slot=2)})
def build_container(rng: np.random.Generator) -> World:
    world = World("container")
    cx, w, wall_h = (rng.uniform(*CONTAINER_X_U), rng.uniform(*CONTAINER_WIDTH_U),
                     rng.uniform(*CONTAINER_WALL_HEIGHT_U))
    world.add_container(cx, w, wall_h)
    ix0, ix1, _, _ = world.container
    n, n_by = _count(rng, CONTAINER_N_DROPPED), _n_bystanders(rng)
    specs = pick_objects(rng, _shapes(rng, n + n_by, ANY_SHAPES))
    t = _t0(rng)
    for k, spec in enumerate(specs[:n]):
        aim = rng.choice(list(DROP_AIMS), p=list(DROP_AIMS.values()))
        if aim == "inside":
            x = cx + rng.uniform(*DROP_INSIDE_SPREAD) * w
        elif aim == "rim":
            left = rng.random() < P_DROP_LEFT
            x = (ix0 - DROP_RIM_OFFSET_U if left else ix1 + DROP_RIM_OFFSET_U) + rng.uniform(*DROP_RIM_SPREAD_U)
        elif rng.random() < P_DROP_LEFT:
            x = rng.uniform(DROP_OUTSIDE_X_U[0], ix0 - DROP_OUTSIDE_CLEARANCE_U)
        else:
            x = rng.uniform(ix1 + DROP_OUTSIDE_CLEARANCE_U, DROP_OUTSIDE_X_U[1])
        y = rng.uniform(*DROP_HEIGHT_U) + DROP_STAGGER_U * (k % 2)
        vx = float(rng.uniform(*DROP_THROW_U_S)) if rng.random() < P_DROP_THROWN else 0.0
        angle = float(rng.uniform(*DROP_TILT_RAD)) if spec.shape not in ROUND_SHAPES else 0.0
        world.add_object(spec, (x, y), angle=angle, vel=(vx, 0.0), release=float(t))
        t += rng.uniform(*DROP_INTERVAL_S)
    _bystanders(world, rng, specs[n:], list(CONTAINER_BYSTANDER_SLOTS_U))
    return world


P_STACK_ON_TABLE = 0.4
STACK_X_U = (200.0, 260.0)
STACK_TABLE_Y_U = (60.0, 85.0)
STACK_TABLE_LEFT_U = (60.0, 90.0)
STACK_TABLE_RIGHT_U = (40.0, 80.0)
"""How far the table reaches left and right of the tower."""
STACK_N_TOWER = {2: 0.35, 3: 0.4, 4: 0.25}
P_BALL_STRIKER = 0.6
OTHER_STRIKERS = ("cube", "wheel")
TOWER_SHAPES = {"cube": 1.0, "brick": 1.0, "plank": 0.5, "can": 0.6, "wedge": 0.3, "ball": 0.15}
TOP_ONLY_SHAPES = ("ball", "wedge")
"""Shapes that may only top a tower (lower down they become cubes)."""
TOWER_JITTER_U = (-3.0, 3.0)
"""Horizontal offset of each tower object from the tower's axis."""
STRIKER_DISTANCE_U = (45.0, 120.0)
"""How far left of the tower the striker starts on the floor (on a table: the range's near end)."""
STRIKE_SPEED_U_S = (220.0, 380.0)
STRIKE_LIFT_U_S = (0.0, 60.0)
"""Upward speed of the strike."""
STACK_BYSTANDER_CLEARANCE_U = 90.0
"""Bystanders stand at least this far right of the tower."""


@family("stack", domains={"workshop": Share(0.35, slot=1), "warehouse": Share(0.30, slot=1)})
def build_stack(rng: np.random.Generator) -> World:
    world = World("stack")
    on_table = rng.random() < P_STACK_ON_TABLE
    base = FLOOR_Y
    x_stack = float(rng.uniform(*STACK_X_U))
    if on_table:
        base = float(rng.uniform(*STACK_TABLE_Y_U))
        world.add_table(x_stack - rng.uniform(*STACK_TABLE_LEFT_U), x_stack + rng.uniform(*STACK_TABLE_RIGHT_U), base)
    n_st, n_by = _count(rng, STACK_N_TOWER), _n_bystanders(rng)
    striker = "ball" if rng.random() < P_BALL_STRIKER else str(rng.choice(OTHER_STRIKERS))
    tower = _shapes(rng, n_st, TOWER_SHAPES)
    tower = [s if i == n_st - 1 or s not in TOP_ONLY_SHAPES else "cube" for i, s in enumerate(tower)]
    specs = pick_objects(rng, [striker] + tower + _shapes(rng, n_by, ANY_SHAPES))
    y = base
    for spec in specs[1:1 + n_st]:
        a = _start_angle(rng, spec) if spec.shape == "cube" else 0.0
        h = _rest_height(spec, a) if spec.shape not in ROUND_SHAPES else spec.size[0] / 2
        world.add_object(spec, (x_stack + float(rng.uniform(*TOWER_JITTER_U)), y + h + TOWER_GAP_U), angle=a)
        y += 2 * h + 2 * TOWER_GAP_U
    t0 = _t0(rng)
    hit = specs[0]
    x_hit = x_stack - float(rng.uniform(*STRIKER_DISTANCE_U)) if not on_table else x_stack - STRIKER_DISTANCE_U[0]
    kick = (float(rng.uniform(*STRIKE_SPEED_U_S)), float(rng.uniform(*STRIKE_LIFT_U_S)))
    world.add_object(hit, (x_hit, base + _lift(hit) + SPAWN_GAP_U), kick=(t0, kick))
    _bystanders(world, rng, specs[1 + n_st:], [(x_stack + STACK_BYSTANDER_CLEARANCE_U, WORLD_X[1] - WORLD_MARGIN_U)])
    return world.mirror_if(rng.random() < P_MIRROR)


SHELF_LENGTH_U = (110.0, 160.0)
SHELF_PIVOT_X_U = (60.0, 90.0)
SHELF_PIVOT_Y_U = (140.0, 180.0)
SHELF_BELOW = {"floor": 0.4, "container": 0.35, "table": 0.25}
"""What lies below the shelf's free end, with its probability."""
SHELF_CONTAINER_GAP_U = (20.0, 60.0)
"""Distance from the shelf's free end to the container's centre."""
SHELF_CONTAINER_WALL_HEIGHT_U = (35.0, 50.0)
SHELF_TABLE_START = 0.5
"""The table below starts under this fraction of the shelf's length."""
SHELF_TABLE_REACH_U = (60.0, 110.0)
"""How far the table reaches beyond the shelf's free end."""
SHELF_TABLE_Y_U = (60.0, 85.0)
SHELF_WALL_X_U = (14.0, 6.0)
"""The wall the shelf hangs on spans this far left of the pivot (from, to)."""
SHELF_WALL_BELOW_PIVOT_U = 6.0
SHELF_N_ON = {2: 0.35, 3: 0.4, 4: 0.25}
SHELF_ROW_START_U = 6.0
SHELF_ROW_END_U = 4.0
"""The row of objects starts this far from the pivot and ends this far before the free end."""
SHELF_ROW_GAP_U = (4.0, 24.0)
SHELF_TILT_RAD_S = (0.5, 1.4)
SHELF_MAX_TILT_RAD = (0.35, 0.6)
SHELF_LEFT_SLOT_PIVOT_X_U = 60.0
"""Bystanders may stand left of the wall only when the pivot is further right than this."""
SHELF_BYSTANDER_CLEARANCE_U = 20.0
"""The left slot ends this far left of the pivot."""
SHELF_RIGHT_SLOT_U = 50.0
"""The right slot begins this far from the world's right end."""


@family("shelf", domains={"kitchen": Share(0.35, slot=1), "warehouse": Share(0.30, slot=0)})
def build_shelf(rng: np.random.Generator) -> World:
    world = World("shelf")
    length = float(rng.uniform(*SHELF_LENGTH_U))
    pivot_x, pivot_y = float(rng.uniform(*SHELF_PIVOT_X_U)), float(rng.uniform(*SHELF_PIVOT_Y_U))
    below = str(rng.choice(list(SHELF_BELOW), p=list(SHELF_BELOW.values())))
    if below == "container":
        world.add_container(pivot_x + length + rng.uniform(*SHELF_CONTAINER_GAP_U), rng.uniform(*CONTAINER_WIDTH_U),
                            rng.uniform(*SHELF_CONTAINER_WALL_HEIGHT_U))
    elif below == "table":
        world.add_table(pivot_x + length * SHELF_TABLE_START, pivot_x + length + rng.uniform(*SHELF_TABLE_REACH_U),
                        float(rng.uniform(*SHELF_TABLE_Y_U)), edges=(1,))
    wall_from, wall_to = SHELF_WALL_X_U
    world.add_static("wall", box(pivot_x - wall_from, FLOOR_Y, pivot_x - wall_to, pivot_y - SHELF_WALL_BELOW_PIVOT_U))
    n_on, n_by = _count(rng, SHELF_N_ON), _n_bystanders(rng)
    specs = pick_objects(rng, _shapes(rng, n_on + n_by, ANY_SHAPES))
    row = specs[:n_on]
    xs = _row(rng, row, pivot_x + SHELF_ROW_START_U, pivot_x + length - SHELF_ROW_END_U, SHELF_ROW_GAP_U)
    for spec, x in zip(row, xs, strict=False):
        _place_resting(world, rng, spec, x, pivot_y)
    omega = -float(rng.uniform(*SHELF_TILT_RAD_S))
    world.add_tilting_shelf((pivot_x, pivot_y), length, _t0(rng), omega, float(rng.uniform(*SHELF_MAX_TILT_RAD)))
    left = ([(WORLD_X[0] + WORLD_MARGIN_U, pivot_x - SHELF_BYSTANDER_CLEARANCE_U)]
            if pivot_x > SHELF_LEFT_SLOT_PIVOT_X_U else [])
    _bystanders(world, rng, specs[n_on:], left + [(WORLD_X[1] - SHELF_RIGHT_SLOT_U, WORLD_X[1] - WORLD_MARGIN_U)])
    return world.mirror_if(rng.random() < P_MIRROR)


BILLIARDS_N_TARGETS = {2: 0.3, 3: 0.4, 4: 0.3}
BILLIARDS_MAX_BYSTANDERS = 1
"""Bystanders of a billiards scene: 0 or 1, uniformly (its floor is already crowded)."""
P_ONE_CUE = 0.7
"""Probability of one struck ball (else two)."""
BILLIARDS_TARGETS_X_U = (150.0, 200.0)
BILLIARDS_TARGETS_END_U = 20.0
"""The row of targets ends this far from the world's right end."""
BILLIARDS_TARGET_GAP_U = (2.0, 40.0)
CUE_X_U = (25.0, 70.0)
CUE_SPACING_U = 40.0
"""A second struck ball starts this much further right."""
CUE_SPEED_U_S = (220.0, 420.0)
CUE_INTERVAL_S = 0.8
"""A second struck ball is struck this much later."""
BILLIARDS_BYSTANDER_SLOT_U = (95.0, 140.0)


@family("billiards", domains={"playroom": Share(0.40, slot=0), "warehouse": Share(0.20, slot=3)})
def build_billiards(rng: np.random.Generator) -> World:
    world = World("billiards")
    n_tg, n_by = _count(rng, BILLIARDS_N_TARGETS), int(rng.integers(0, BILLIARDS_MAX_BYSTANDERS + 1))
    n_st = 1 if rng.random() < P_ONE_CUE else 2
    specs = pick_objects(rng, ["ball"] * n_st + _shapes(rng, n_tg + n_by, ANY_SHAPES))
    t0 = _t0(rng)
    targets = specs[n_st:n_st + n_tg]
    xs = _row(rng, targets, float(rng.uniform(*BILLIARDS_TARGETS_X_U)), WORLD_X[1] - BILLIARDS_TARGETS_END_U,
              BILLIARDS_TARGET_GAP_U)
    for spec, x in zip(targets, xs, strict=False):
        _place_resting(world, rng, spec, x, FLOOR_Y)
    for i, spec in enumerate(specs[:n_st]):
        x = float(rng.uniform(*CUE_X_U)) + CUE_SPACING_U * i
        vx = float(rng.uniform(*CUE_SPEED_U_S))
        world.add_object(spec, (x, FLOOR_Y + spec.size[0] / 2 + SPAWN_GAP_U), kick=(t0 + CUE_INTERVAL_S * i, (vx, 0.0)))
    _bystanders(world, rng, specs[n_st + n_tg:], [BILLIARDS_BYSTANDER_SLOT_U])
    return world.mirror_if(rng.random() < P_MIRROR)
