"""The ``sim`` prefix space: the simulator's exact state of the scene at each prefix frame (perfect perception).

LFTR reading this space instead of frames is the forecaster with perfect perception: it sees every object's exact
position, velocity, rotation and contacts, and the furniture, in each of the 8 prefix frames -- nothing after the
prefix. The gap between it and the semantic oracle is forecasting (and label) uncertainty; the gap between it and
LFTR from frames is perception.

One token per prefix frame ``f``, for the queried object ``k`` (world units of `eval.synth.record`; positions
relative to the object, scaled by `POS_SCALE`, velocities by `VEL_SCALE`):

=========  =====  =========================================================================================
block      dims   content
=========  =====  =========================================================================================
subject    39     x, y (scene position / `POS_SCALE`), vx, vy, sin/cos angle, omega / `OMEGA_SCALE`, held,
                  width, height (/ `POS_SCALE`), shape one-hot (8), support one-hot (10), contact bits (8),
                  speed, 2 spare zeros
others     5 x 20 the `N_OTHERS` nearest other objects (centre distance at ``f``; zero rows when fewer):
                  present, dx, dy, dvx, dvy, distance, sin/cos angle, omega, touching, is-held,
                  shape one-hot (8), approach rate (distance change per second / `VEL_SCALE`)
furniture  16     nearest table edge (present, dx, dy, direction), container (present, dx to its centre,
                  dy to its rim, half width), nearest ramp (present, dx, dy to its slope's middle), pusher (present,
                  dx, dy, vx), shelf angle
labels     46     the labeller's per-frame attributes of the object at ``f`` (`eval.synth.states.frame_attributes`,
                  before smoothing, so decided from frames ``<= f`` only): one-hots of motion (14), place (16),
                  relation (4), the other object's kind (8), pose (4) -- the present, perceived exactly
=========  =====  =========================================================================================

``D = 201``. Values are raw (unnormalised) features; `standardize` z-scores them over every prefix of a build, so the
table is standardized, not L2-normalised (``meta.json``: ``kind: prefix``, ``normalized: false``).
"""

from __future__ import annotations

import math

import numpy as np

from eval.synth import record as R
from eval.synth.lexicon import MOTIONS, PLACES, POSES, RELATIONS, SHAPES

POS_SCALE = 100.0
VEL_SCALE = 200.0
OMEGA_SCALE = 5.0
N_OTHERS = 5
SHAPE_NAMES = tuple(SHAPES)
N_SUPPORT = 10
SUBJECT_DIM, OTHER_DIM, FURNITURE_DIM = 39, 20, 16
LABEL_VALUES = {"motion": MOTIONS, "place": PLACES, "relation": RELATIONS, "other": tuple(SHAPES), "pose": POSES}
LABEL_DIM = sum(len(v) for v in LABEL_VALUES.values())
DIM = SUBJECT_DIM + N_OTHERS * OTHER_DIM + FURNITURE_DIM + LABEL_DIM
NAME = "sim"
MODEL = "simulator-state-v1"


def _one_hot(i: int, n: int) -> np.ndarray:
    v = np.zeros(n, np.float32)
    if 0 <= i < n:
        v[i] = 1.0
    return v


def _bits(x: int, n: int = 8) -> np.ndarray:
    return np.array([(x >> b) & 1 for b in range(n)], np.float32)


def frame_token(rec: R.SimRecord, f: int, k: int, attrs: dict[str, np.ndarray]) -> np.ndarray:
    """``(DIM,)`` float32 token of object ``k`` at frame ``f`` (module docstring); ``attrs``: the record's
    `eval.synth.states.frame_attributes`."""
    shapes = [str(s) for s in rec.shapes]
    pos, vel = rec.pos[f].astype(np.float64), rec.vel[f].astype(np.float64)
    x, y = pos[k]
    w, h = (float(v) for v in rec.sizes[k])
    speed = float(np.hypot(*vel[k]))
    subj = np.concatenate([
        [x / POS_SCALE, y / POS_SCALE, vel[k, 0] / VEL_SCALE, vel[k, 1] / VEL_SCALE, math.sin(rec.angle[f, k]),
         math.cos(rec.angle[f, k]), rec.angvel[f, k] / OMEGA_SCALE, float(rec.held[f, k]), w / POS_SCALE,
         h / POS_SCALE],
        _one_hot(SHAPE_NAMES.index(shapes[k]), len(SHAPE_NAMES)), _one_hot(int(rec.support[f, k]), N_SUPPORT),
        _bits(int(rec.contacts[f, k])), [speed / VEL_SCALE, 0.0, 0.0]]).astype(np.float32)
    others = np.zeros((N_OTHERS, OTHER_DIM), np.float32)
    order = [j for j in np.argsort(np.linalg.norm(pos - pos[k], axis=1)) if j != k][:N_OTHERS]
    prev = max(f - 1, 0)
    for slot, j in enumerate(order):
        d = float(np.linalg.norm(pos[j] - pos[k]))
        d_prev = float(np.linalg.norm(rec.pos[prev, j] - rec.pos[prev, k]))
        rate = (d - d_prev) * rec.fps / VEL_SCALE if f > 0 else 0.0
        others[slot] = np.concatenate([
            [1.0, (pos[j, 0] - x) / POS_SCALE, (pos[j, 1] - y) / POS_SCALE, (vel[j, 0] - vel[k, 0]) / VEL_SCALE,
             (vel[j, 1] - vel[k, 1]) / VEL_SCALE, d / POS_SCALE, math.sin(rec.angle[f, j]), math.cos(rec.angle[f, j]),
             rec.angvel[f, j] / OMEGA_SCALE, float(rec.touch[f, k, j]), float(rec.held[f, j])],
            _one_hot(SHAPE_NAMES.index(shapes[j]), len(SHAPE_NAMES)), [rate]])
    return np.concatenate([subj, others.reshape(-1), _furniture(rec, f, x, y), _labels(attrs, f, k, shapes)]
                          ).astype(np.float32)


def _labels(attrs: dict[str, np.ndarray], f: int, k: int, shapes: list[str]) -> np.ndarray:
    parts = []
    for name, values in LABEL_VALUES.items():
        v = attrs[name][f, k]
        if name == "other":
            v = shapes[int(v)] if int(v) >= 0 else ""
        parts.append(_one_hot(values.index(str(v)) if str(v) in values else -1, len(values)))
    return np.concatenate(parts)


def _furniture(rec: R.SimRecord, f: int, x: float, y: float) -> np.ndarray:
    out = np.zeros(FURNITURE_DIM, np.float32)
    if len(rec.edges):
        e = rec.edges[np.argmin(np.abs(rec.edges[:, 0] - x))]
        out[0:4] = (1.0, (e[0] - x) / POS_SCALE, (e[1] - y) / POS_SCALE, e[2])
    c = rec.container
    if not math.isnan(float(c[0])):
        out[4:8] = (1.0, ((c[0] + c[1]) / 2 - x) / POS_SCALE, (c[3] - y) / POS_SCALE, (c[1] - c[0]) / 2 / POS_SCALE)
    ramps = rec.ramps if rec.ramps is not None else np.zeros((0, 4), np.float32)
    if len(ramps):
        mid = np.stack([(ramps[:, 0] + ramps[:, 2]) / 2, (ramps[:, 1] + ramps[:, 3]) / 2], 1)
        r = mid[np.argmin(np.abs(mid[:, 0] - x))]
        out[8:11] = (1.0, (r[0] - x) / POS_SCALE, (r[1] - y) / POS_SCALE)
    if not math.isnan(float(rec.pusher_pos[f, 0])):
        vx = (rec.pusher_pos[f, 0] - rec.pusher_pos[max(f - 1, 0), 0]) * rec.fps
        out[11:15] = (1.0, (rec.pusher_pos[f, 0] - x) / POS_SCALE, (rec.pusher_pos[f, 1] - y) / POS_SCALE,
                      vx / VEL_SCALE)
    kinds = [] if rec.kin_kind is None else [str(s) for s in rec.kin_kind]
    if "shelf" in kinds:
        out[15] = rec.kin_pose[f, kinds.index("shelf"), 2]
    return out


def prefix_tokens(rec: R.SimRecord, frames: list[int] | tuple[int, ...], k: int,
                  attrs: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """``(len(frames), DIM)`` float32 tokens of object ``k`` at its prefix frames (``attrs``: the record's frame
    attributes, computed when not given)."""
    if attrs is None:
        from eval.synth.states import frame_attributes

        attrs = frame_attributes(rec)
    return np.stack([frame_token(rec, f, k, attrs) for f in frames])


def standardize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x - mean) / std`` over every token of ``x`` ``(n, 8, D)`` (std 1 where a dimension is constant); returns
    the standardized array, the mean and the std ``(D,)``."""
    flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
    mean = flat.mean(axis=0) if len(flat) else np.zeros(x.shape[-1])
    std = flat.std(axis=0) if len(flat) else np.ones(x.shape[-1])
    std = np.where(std > 1e-8, std, 1.0)
    return ((x - mean) / std).astype(np.float32), mean.astype(np.float32), std.astype(np.float32)
