"""The simulator record of one synthetic video, and its compact ``sim/<video_id>.npz`` file.

The record is the ground truth everything else is derived from: `eval.synth.states` labels states from it,
`eval.synth.render` draws frames from it, and the distillation module turns it into qualitative predicates
(direction, relative speed, collision course, support reached). World units: a 2D world roughly 400 x 300
units, y pointing up, gravity -900 units/s^2; times in seconds from the start of the video.

Arrays of ``sim/<video_id>.npz`` (F frames at `fps`, N objects, S static pieces, E table edges); no pickles:

==================  ==================  ==========================================================================
key                 shape / dtype       meaning
==================  ==================  ==========================================================================
``t``               (F,) float64        frame times, ``t[f] = f / fps``
``fps``             () float64          frames per second of the record (and of the frame indices in paths)
``domain``          () str              the source domain of the video (`eval.synth.scenes.DOMAINS`)
``family``          () str              the scene family (`eval.synth.scenes.families`)
``mirrored``        () bool             the scene was built left-to-right and mirrored (body-frame x flipped)
``object_ids``      (N,) str            ``o0``, ``o1``, ... (as in the benchmark's ``object_id``)
``subjects``        (N,) str            ``"red ball"``, ...
``colors``          (N,) str            palette colour name
``shapes``          (N,) str            `eval.synth.lexicon.SHAPES` (ball, wheel, cube, brick, domino, plank, wedge, can)
``sizes``           (N, 2) float32      width, height (a round shape's diameter twice)
``textures``        (N,) str            ``solid`` | ``striped`` | ``dotted`` | ``two_tone`` (rendering only)
``pos``             (F, N, 2) float32   centre of mass
``vel``             (F, N, 2) float32   linear velocity (units/s)
``angle``           (F, N) float32      rotation (radians, counter-clockwise; 0 = as spawned, dominoes upright)
``angvel``          (F, N) float32      angular velocity (radians/s)
``contacts``        (F, N) uint8        bitmask of what the object touched during the frame (``CONTACT_*``)
``support``         (F, N) int8         what holds it up at the frame (``SUPPORT_*``; 0 = nothing)
``support_other``   (F, N) int8         index of the supporting object when ``support`` is ``SUPPORT_OBJECT`` (-1 otherwise)
``impact_speed``    (F, N) float32      largest pre-impact speed of a contact that began during the frame
                                        (relative speed for objects, normal speed for surfaces; 0 = none)
``impact_kind``     (F, N) int8         ``SUPPORT_*`` code of the surface / object of that impact
``impact_other``    (F, N) int8         index of the other object of an object-object impact (-1 otherwise)
``touch``           (F, N, N) bool      object-object contact during the frame (symmetric)
``held``            (F, N) bool         held by the gripper (not yet released; not simulated)
``pusher_pos``      (F, 2) float32      position of the kinematic pusher (NaN when the scene has none)
``static_kind``     (S,) str            a surface kind (`eval.synth.surfaces`): ``floor``, ``wall``, ``table``, ...
``static_vertices`` (S, 4, 2) float32   convex quad of each static piece (world units)
``static_until``    (S,) float64        time the piece disappears (a released gate), +inf otherwise
``edges``           (E, 3) float32      table edges objects can go over: x, top y, direction (+1 right, -1 left)
``container``       (4,) float32        inner x0, inner x1, floor y, rim y of the container (NaN when none)
``ramps``           (A, 4) float32      each ramp's slope: x, y of its top end, x, y of its bottom end
``kin_kind``        (M,) str            kinematic pieces' surface kinds: ``pusher`` | ``shelf``
``kin_shape``       (M, 4) float32      each piece's box in its body frame: centre offset x, y, width, height
``kin_pose``        (F, M, 3) float32   each piece's body position x, y and angle (radians) per frame
``pusher_size``     (2,) float32        width, height of the pusher (NaN when none)
``camera``          (3,) float32        render camera: world x, world y at the image centre, pixels per unit
                                        (set by the renderer; zeros in a record straight from the simulator)
==================  ==================  ==========================================================================
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from eval.io import atomic_path

# Contact bits (``contacts``) and support / impact codes (``support``, ``impact_kind``).
CONTACT_FLOOR, CONTACT_TABLE, CONTACT_RAMP, CONTACT_CONTAINER = 1, 2, 4, 8
CONTACT_WALL, CONTACT_PUSHER, CONTACT_OBJECT, CONTACT_GATE = 16, 32, 64, 128
SUPPORT_NONE, SUPPORT_FLOOR, SUPPORT_TABLE, SUPPORT_RAMP, SUPPORT_CONTAINER = 0, 1, 2, 3, 4
SUPPORT_OBJECT, SUPPORT_PUSHER, SUPPORT_WALL, SUPPORT_GATE, SUPPORT_SHELF = 5, 6, 7, 8, 9
# Which surface kind sets which code and bit: `eval.synth.surfaces` (a registered kind may add a support code).


@dataclass
class SimRecord:
    """The per-frame record of one simulated video (see the module docstring for every field)."""

    domain: str
    fps: float
    t: np.ndarray
    object_ids: np.ndarray
    subjects: np.ndarray
    colors: np.ndarray
    shapes: np.ndarray
    sizes: np.ndarray
    pos: np.ndarray
    vel: np.ndarray
    angle: np.ndarray
    angvel: np.ndarray
    contacts: np.ndarray
    support: np.ndarray
    impact_speed: np.ndarray
    impact_kind: np.ndarray
    impact_other: np.ndarray
    touch: np.ndarray
    held: np.ndarray
    pusher_pos: np.ndarray
    static_kind: np.ndarray
    static_vertices: np.ndarray
    static_until: np.ndarray
    edges: np.ndarray
    container: np.ndarray
    pusher_size: np.ndarray
    camera: np.ndarray
    family: str = ""
    mirrored: bool = False
    textures: np.ndarray | None = None
    support_other: np.ndarray | None = None
    ramps: np.ndarray | None = None
    kin_kind: np.ndarray | None = None
    kin_shape: np.ndarray | None = None
    kin_pose: np.ndarray | None = None

    @property
    def n_frames(self) -> int:
        return int(self.t.shape[0])

    @property
    def n_objects(self) -> int:
        return int(self.object_ids.shape[0])

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {f.name: np.asarray(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_arrays(cls, arrays) -> SimRecord:
        names = set(getattr(arrays, "files", None) or arrays.keys())
        kw = {f.name: np.asarray(arrays[f.name]) for f in fields(cls) if f.name in names}
        for key in ("domain", "family"):
            if key in kw:
                kw[key] = str(kw[key].reshape(-1)[0])
        kw["fps"] = float(kw["fps"].reshape(-1)[0])
        if "mirrored" in kw:
            kw["mirrored"] = bool(kw["mirrored"].reshape(-1)[0])
        return cls(**kw)


def mirror(rec: SimRecord, width: float) -> SimRecord:
    """The record of the same scene mirrored left-right about ``x = width / 2`` (x -> width - x)."""
    def mx(a: np.ndarray) -> np.ndarray:
        a = np.array(a, copy=True)
        a[..., 0] = width - a[..., 0]
        return a

    out = replace(rec, pos=mx(rec.pos), vel=rec.vel * np.array([-1.0, 1.0], np.float32), angle=-rec.angle,
                  angvel=-rec.angvel, static_vertices=mx(rec.static_vertices)[:, ::-1].copy(), mirrored=True,
                  pusher_pos=mx(rec.pusher_pos))
    edges = np.array(rec.edges, copy=True)
    edges[:, 0], edges[:, 2] = width - edges[:, 0], -edges[:, 2]
    c = np.array(rec.container, copy=True)
    if not np.isnan(c[0]):
        c[0], c[1] = width - rec.container[1], width - rec.container[0]
    ramps = np.array(rec.ramps, copy=True)
    ramps[:, 0], ramps[:, 2] = width - ramps[:, 0], width - ramps[:, 2]
    kin_pose = np.array(rec.kin_pose, copy=True)
    kin_pose[..., 0], kin_pose[..., 2] = width - kin_pose[..., 0], -kin_pose[..., 2]
    kin_shape = np.array(rec.kin_shape, copy=True)
    kin_shape[:, 0] = -kin_shape[:, 0]
    return replace(out, edges=edges, container=c, ramps=ramps, kin_pose=kin_pose, kin_shape=kin_shape)


#: Fixed zip member timestamp: `numpy.savez` stamps members with the wall clock, which breaks byte-identity.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def save_npz(path: str | os.PathLike, record: SimRecord) -> None:
    """Write ``record`` as a compressed ``.npz`` that is byte-identical for identical records (atomic)."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in record.to_arrays().items():
            buf = io.BytesIO()
            arr = np.asarray(arr)  # not ascontiguousarray: it turns 0-d scalars (fps, domain) into 1-d arrays
            np.lib.format.write_array(buf, arr if arr.flags.c_contiguous else arr.copy(), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def load_npz(path: str | os.PathLike) -> SimRecord:
    """Read a record written by `save_npz`."""
    with np.load(Path(path), allow_pickle=False) as z:
        return SimRecord.from_arrays(z)
