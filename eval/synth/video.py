"""One synthetic video end to end: simulate, label, choose prefixes, render the needed frames, featurize.

`make_video` is the unit of work of the build's process pool. It writes the video's frames
(``frames/<video_id>/fNNNN.png``, each frame once, shared by prefixes and segments) and its simulator record
(``sim/<video_id>.npz``) under the build directory, and returns a picklable `VideoResult` with everything the
benchmark files need. Its output depends only on ``(seed, index, domain, image_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.schema import PREFIX_FRAMES
from eval.synth import record as R
from eval.synth import render, scenes, states
from eval.synth.vocab import STATES

PREFIX_GAP_FRAMES = 2
"""The prefix ends this many frames before the object's first state change when the first segment is long enough
(never less than one frame before it: the prefix ends strictly before the change)."""
PREFIX_SPAN_FRAMES = 30
"""At most this many frames (1.5 s) between the first and the last prefix frame."""
CONSENSUS_MIN_DURATION_S = 0.4
"""A segment is "clear" (eligible for the consensus GT pool) when it lasts at least this long and the object is
fully inside the image at its middle frame."""


@dataclass(frozen=True)
class SegmentInfo:
    """One smoothed segment of one object (frames [start, stop)), as the build needs it."""

    object_index: int
    state: int
    start: int
    stop: int
    middle: int
    raw: str
    clear: bool


@dataclass
class VideoResult:
    """What one video contributes: its objects, segments, prefixes and `pixels` features."""

    index: int
    video_id: str
    domain: str
    n_frames: int
    fps: float
    object_ids: list[str]
    subjects: list[str]
    segments: list[SegmentInfo]
    #: object index -> the 8 prefix frame indices (only objects with a valid prefix)
    prefixes: dict[int, list[int]]
    #: (n_segments, D) float32 features of the segments' middle frames (unnormalised)
    segment_features: np.ndarray
    #: (n_prefixes, 8, D) float32, rows in ``sorted(prefixes)`` order
    prefix_features: np.ndarray


def video_id(index: int) -> str:
    return f"v{index:05d}"


def frame_path(vid: str, frame: int) -> str:
    """Relative path of one frame inside the benchmark directory."""
    return f"frames/{vid}/f{frame:04d}.png"


def choose_prefix(first_stop: int) -> list[int] | None:
    """The 8 evenly spaced prefix frames inside an object's first segment [0, ``first_stop``), or None when the
    segment is too short (fewer than 8 frames)."""
    end = first_stop - 1 - PREFIX_GAP_FRAMES
    if end < PREFIX_FRAMES - 1:
        end = first_stop - 1
    if end < PREFIX_FRAMES - 1:
        return None
    start = max(0, end - PREFIX_SPAN_FRAMES)
    frames = np.round(np.linspace(start, end, PREFIX_FRAMES)).astype(int)
    return [int(f) for f in frames]


def make_video(seed: int, index: int, domain: str, root: str, image_size: tuple[int, int]) -> VideoResult:
    """Simulate, label, render and featurize video ``index`` of family ``domain`` into ``root``."""
    scene_ss, look_ss, text_ss = np.random.SeedSequence([seed, index, 0x5EED]).spawn(3)
    look_rng = np.random.default_rng(look_ss)
    camera = render.camera_for(domain, look_rng)
    rec = scenes.simulate(domain, np.random.default_rng(scene_ss), camera)
    trajectories = states.trajectories(rec)
    vid = video_id(index)
    renderer = render.Renderer(rec, render.LOOKS[domain], int(look_rng.integers(2**31)), image_size)

    text_rng = np.random.default_rng(text_ss)
    segments: list[SegmentInfo] = []
    prefixes: dict[int, list[int]] = {}
    for k, traj in enumerate(trajectories):
        if len(traj) >= 2:
            frames = choose_prefix(traj[0].stop)
            if frames is not None:
                prefixes[k] = frames
        for seg in traj:
            synonyms = STATES[seg.state].synonyms
            raw = synonyms[int(text_rng.integers(len(synonyms)))]
            clear = (seg.stop - seg.start) / rec.fps >= CONSENSUS_MIN_DURATION_S and renderer.in_view(seg.middle, k)
            segments.append(SegmentInfo(k, seg.state, seg.start, seg.stop, seg.middle, raw, bool(clear)))

    needed = sorted({s.middle for s in segments} | {f for fr in prefixes.values() for f in fr})
    out = Path(root)
    (out / "frames" / vid).mkdir(parents=True, exist_ok=True)
    images = {}
    for f in needed:
        images[f] = img = renderer.render(f)
        # a plain write: the build runs in a staging directory that is moved into place only when complete
        img.save(out / frame_path(vid, f), format="PNG", optimize=False, compress_level=6)
    R.save_npz(out / "sim" / f"{vid}.npz", rec)

    def feature(f: int, k: int) -> np.ndarray:
        return render.pixel_feature(images[f], renderer.object_px(f, k))

    dim = render.FEATURE_GRID[0] * render.FEATURE_GRID[1] * 3
    seg_feats = (np.stack([feature(s.middle, s.object_index) for s in segments]) if segments
                 else np.zeros((0, dim), np.float32))
    pre_feats = (np.stack([np.stack([feature(f, k) for f in prefixes[k]]) for k in sorted(prefixes)]) if prefixes
                 else np.zeros((0, PREFIX_FRAMES, dim), np.float32))
    return VideoResult(index, vid, domain, rec.n_frames, rec.fps, [str(x) for x in rec.object_ids],
                       [str(x) for x in rec.subjects], segments, prefixes, seg_feats.astype(np.float32),
                       pre_feats.astype(np.float32))


def make_video_star(args: tuple) -> VideoResult:
    """`make_video` over one argument tuple (for `Executor.map`)."""
    return make_video(*args)
