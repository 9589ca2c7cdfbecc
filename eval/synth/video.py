"""One synthetic video end to end: simulate, label, describe, choose prefixes, render the needed frames, featurize.

`make_video` is the unit of work of the build's process pool. It writes the video's frames
(``frames/<video_id>/<frame hash>.jpg``, each frame once, shared by prefixes and segments) and its simulator record
(``sim/<video_id>.npz``) under the build directory, and returns a picklable `VideoResult` with everything the
benchmark files need. Its output depends only on its arguments.

**Prefixes** (`eval.synth.prefix`): each (video, object) gets at most one prefix, 8 frames ending while the scene is
in motion around the object (it moves, or a moving body touches it or is on a collision course with it), a gap of
`eval.synth.prefix.GAP_S` before its next state change; the segment the prefix ends in is the object's *current*
state. An object that stays put gets a prefix only when something moves near it.

**Opaque names.** Video ids, frame file names and segment ids are hashes (`video_id`, `frame_path`,
`eval.synth.build.segment_id`), and object ids are a seeded permutation of ``o0 ... o{n-1}``, so no id, name or path
carries a video's index, an object's role in its scene or a segment's position in a trajectory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from eval.schema import PREFIX_FRAMES
from eval.synth import prefix as P
from eval.synth import record as R
from eval.synth import render, scenes, simspace, states
from eval.synth.lexicon import CORPUS, Denotation, TrueState, describe
from eval.synth.world import World

CONSENSUS_MIN_DURATION_S = 0.4
"""A segment is "clear" when it lasts at least this long and the object is fully inside the image at its middle
frame (eligible for the consensus pool)."""
FRAME_FORMAT = "jpg"
JPEG_QUALITY = 90


@dataclass(frozen=True)
class SegmentInfo:
    """One smoothed segment of one object (frames [start, stop)), as the build needs it."""

    object_index: int
    state: TrueState
    start: int
    stop: int
    middle: int
    raw: str
    denotation: Denotation
    clear: bool
    box: tuple[float, float, float, float]


@dataclass
class VideoResult:
    """What one video contributes: its objects, segments, prefixes and `pixels` features."""

    index: int
    video_id: str
    domain: str
    family: str
    n_frames: int
    fps: float
    object_ids: list[str]
    subjects: list[str]
    segments: list[SegmentInfo]
    #: object index -> the 8 prefix frame indices (only objects with a valid prefix, in videos with queries)
    prefixes: dict[int, list[int]]
    #: object index -> index (in the object's segments) of the segment its prefix ends in (its current state)
    current: dict[int, int]
    #: object index -> engaged at the prefix's end (it, or a body touching / heading for it, moves; `prefix.engaged`)
    engaged: dict[int, bool]
    #: (n_segments, D) float32 features of the segments' middle frames (unnormalised)
    segment_features: np.ndarray
    #: (n_prefixes, 8, D) float32, rows in ``sorted(prefixes)`` order
    prefix_features: np.ndarray
    #: object index -> the object's box in each of its 8 prefix frames
    prefix_boxes: dict[int, list[tuple[float, float, float, float]]]
    #: (n_prefixes, 8, simspace.DIM) float32 raw simulator-state tokens, rows in ``sorted(prefixes)`` order
    prefix_sim: np.ndarray


def video_id(seed: int, index: int) -> str:
    """The opaque id of video ``index`` of a build with ``seed``: ``v`` + 10 hex digits of a SHA-1."""
    return "v" + hashlib.sha1(f"psr-synth:{seed}:{index}".encode()).hexdigest()[:10]


def frame_path(vid: str, frame: int) -> str:
    """Relative path of one frame inside the benchmark directory (an opaque name: a hash of the video and frame)."""
    return f"frames/{vid}/{hashlib.sha1(f'{vid}:{frame}'.encode()).hexdigest()[:12]}.{FRAME_FORMAT}"


def permute_objects(rec: R.SimRecord, rng: np.random.Generator) -> R.SimRecord:
    """The record with its object ids relabelled by a seeded permutation (an id says nothing of the object's role)."""
    perm = rng.permutation(rec.n_objects)
    return replace(rec, object_ids=np.array([f"o{int(p)}" for p in perm]))


@dataclass
class SimulatedVideo:
    """Video ``index``'s record (camera set, objects relabelled) and the random streams its build goes on with."""

    record: R.SimRecord
    family: str
    look_rng: np.random.Generator
    text_rng: np.random.Generator
    prefix_rng: np.random.Generator


def simulate_video(seed: int, index: int, domain: str,
                   hooks: tuple[tuple[float, Callable[[World], None]], ...] = ()) -> SimulatedVideo:
    """Draw video ``index``'s scene family from ``domain``, simulate it, frame it and relabel its objects, exactly as
    `make_video` does (``hooks``: `eval.synth.scenes.simulate`'s; none in a build)."""
    scene_ss, look_ss, text_ss, prefix_ss = np.random.SeedSequence([seed, index, 0x5EED]).spawn(4)
    scene_rng = np.random.default_rng(scene_ss)
    family = scenes.family_of(domain, scene_rng)
    rec = scenes.simulate(family, scene_rng, hooks)
    look_rng = np.random.default_rng(look_ss)
    rec = replace(rec, domain=domain, family=family,
                  camera=np.array(render.camera_for(rec, look_rng), np.float32))
    text_rng, prefix_rng = np.random.default_rng(text_ss), np.random.default_rng(prefix_ss)
    return SimulatedVideo(permute_objects(rec, prefix_rng), family, look_rng, text_rng, prefix_rng)


def make_video(seed: int, index: int, domain: str, root: str, image_size: tuple[int, int],
               with_queries: bool = True) -> VideoResult:
    """Simulate, label, describe, render and featurize video ``index`` of ``domain`` into ``root``.
    ``with_queries``: choose prefixes (a corpus-only video renders only its segments' middle frames)."""
    sim = simulate_video(seed, index, domain)
    rec, family, look_rng, text_rng, prefix_rng = sim.record, sim.family, sim.look_rng, sim.text_rng, sim.prefix_rng
    trajectories = states.trajectories(rec)
    vid = video_id(seed, index)
    renderer = render.Renderer(rec, render.look_for(look_rng), int(look_rng.integers(2**31)), image_size)

    segments: list[SegmentInfo] = []
    prefixes: dict[int, list[int]] = {}
    current: dict[int, int] = {}
    engaged: dict[int, bool] = {}
    eng = P.engaged(rec) if with_queries else None
    near = P.near_motion(rec) if with_queries else None
    for k, traj in enumerate(trajectories):
        if with_queries:
            holds = P.label_holds(rec, k, [(s.start, s.stop, s.state.motion) for s in traj])
            choice = P.choose_prefix([(s.start, s.stop) for s in traj], eng[:, k], near[:, k], rec.fps, prefix_rng,
                                     holds)
            if choice is not None:
                prefixes[k], current[k], engaged[k] = list(choice.frames), choice.current, choice.engaged
        for seg in traj:
            raw, den = describe(seg.state, text_rng, CORPUS)
            clear = (seg.stop - seg.start) / rec.fps >= CONSENSUS_MIN_DURATION_S and renderer.in_view(seg.middle, k)
            segments.append(SegmentInfo(k, seg.state, seg.start, seg.stop, seg.middle, raw, den, bool(clear),
                                        renderer.object_box(seg.middle, k)))

    needed = sorted({s.middle for s in segments} | {f for fr in prefixes.values() for f in fr})
    out = Path(root)
    (out / "frames" / vid).mkdir(parents=True, exist_ok=True)
    images = {}
    for f in needed:
        images[f] = img = renderer.render(f)
        # a plain write: the build runs in a staging directory that is moved into place only when complete
        img.save(out / frame_path(vid, f), format="JPEG", quality=JPEG_QUALITY)
    R.save_npz(out / "sim" / f"{vid}.npz", rec)

    def feature(f: int, k: int) -> np.ndarray:
        return render.pixel_feature(images[f], renderer.object_px(f, k))

    dim = render.FEATURE_GRID[0] * render.FEATURE_GRID[1] * 3
    seg_feats = (np.stack([feature(s.middle, s.object_index) for s in segments]) if segments
                 else np.zeros((0, dim), np.float32))
    pre_feats = (np.stack([np.stack([feature(f, k) for f in prefixes[k]]) for k in sorted(prefixes)]) if prefixes
                 else np.zeros((0, PREFIX_FRAMES, dim), np.float32))
    attrs = states.frame_attributes(rec) if prefixes else None
    pre_sim = (np.stack([simspace.prefix_tokens(rec, prefixes[k], k, attrs) for k in sorted(prefixes)]) if prefixes
               else np.zeros((0, PREFIX_FRAMES, simspace.DIM), np.float32))
    boxes = {k: [renderer.object_box(f, k) for f in fr] for k, fr in prefixes.items()}
    return VideoResult(index, vid, domain, family, rec.n_frames, rec.fps, [str(x) for x in rec.object_ids],
                       [str(x) for x in rec.subjects], segments, prefixes, current, engaged,
                       seg_feats.astype(np.float32), pre_feats.astype(np.float32), boxes, pre_sim)


def make_video_star(args: tuple) -> VideoResult:
    """`make_video` over one argument tuple (for `Executor.map`)."""
    return make_video(*args)
