"""One synthetic video end to end: simulate, label, describe, choose prefixes, render the needed frames, featurize.

`make_video` is the unit of work of the build's process pool. It writes the video's frames
(``frames/<video_id>/fNNNN.jpg``, each frame once, shared by prefixes and segments) and its simulator record
(``sim/<video_id>.npz``) under the build directory, and returns a picklable `VideoResult` with everything the
benchmark files need. Its output depends only on its arguments.

**Early prefix.** Each (video, object) with at least two segments gets one prefix: 8 evenly spaced frames spanning
at most `PREFIX_SPAN_S`, ending a *gap* before the object's first state change. The gap is drawn uniformly from
`PREFIX_GAP_S` and shortened (never below one frame) when the first segment is too short, so the prefix shows the
scene before the event, not the event's onset.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from eval.schema import PREFIX_FRAMES
from eval.synth import record as R
from eval.synth import render, scenes, states
from eval.synth.lexicon import CORPUS, Denotation, TrueState, describe

PREFIX_GAP_S = (0.9, 2.6)
"""Range of the gap (seconds) between the prefix's last frame and the object's first state change."""
PREFIX_SPAN_S = 1.5
"""At most this long (seconds) between the first and the last prefix frame."""
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
    #: (n_segments, D) float32 features of the segments' middle frames (unnormalised)
    segment_features: np.ndarray
    #: (n_prefixes, 8, D) float32, rows in ``sorted(prefixes)`` order
    prefix_features: np.ndarray
    #: object index -> the object's box in each of its 8 prefix frames
    prefix_boxes: dict[int, list[tuple[float, float, float, float]]]


def video_id(index: int) -> str:
    return f"v{index:05d}"


def frame_path(vid: str, frame: int) -> str:
    """Relative path of one frame inside the benchmark directory."""
    return f"frames/{vid}/f{frame:04d}.{FRAME_FORMAT}"


def choose_prefix(first_stop: int, fps: float, rng: np.random.Generator) -> list[int] | None:
    """The 8 prefix frames of an object whose first segment is frames [0, ``first_stop``), or None when the segment
    holds fewer than 8 frames before its last one."""
    gap = int(round(rng.uniform(*PREFIX_GAP_S) * fps))
    end = first_stop - 1 - gap
    if end < PREFIX_FRAMES - 1:
        end = min(first_stop - 2, PREFIX_FRAMES - 1)
    if end < PREFIX_FRAMES - 1:
        return None
    start = max(0, end - int(round(PREFIX_SPAN_S * fps)))
    return [int(f) for f in np.round(np.linspace(start, end, PREFIX_FRAMES)).astype(int)]


def make_video(seed: int, index: int, domain: str, root: str, image_size: tuple[int, int],
               with_queries: bool = True) -> VideoResult:
    """Simulate, label, describe, render and featurize video ``index`` of ``domain`` into ``root``.
    ``with_queries``: choose prefixes (a corpus-only video renders only its segments' middle frames)."""
    scene_ss, look_ss, text_ss, prefix_ss = np.random.SeedSequence([seed, index, 0x5EED]).spawn(4)
    scene_rng = np.random.default_rng(scene_ss)
    family = scenes.family_of(domain, scene_rng)
    rec = scenes.simulate(family, scene_rng)
    look_rng = np.random.default_rng(look_ss)
    rec = replace(rec, domain=domain, family=family,
                  camera=np.array(render.camera_for(rec, look_rng), np.float32))
    trajectories = states.trajectories(rec)
    vid = video_id(index)
    renderer = render.Renderer(rec, render.look_for(look_rng), int(look_rng.integers(2**31)), image_size)

    text_rng, prefix_rng = np.random.default_rng(text_ss), np.random.default_rng(prefix_ss)
    segments: list[SegmentInfo] = []
    prefixes: dict[int, list[int]] = {}
    for k, traj in enumerate(trajectories):
        if with_queries and len(traj) >= 2:
            frames = choose_prefix(traj[0].stop, rec.fps, prefix_rng)
            if frames is not None:
                prefixes[k] = frames
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
    boxes = {k: [renderer.object_box(f, k) for f in fr] for k, fr in prefixes.items()}
    return VideoResult(index, vid, domain, family, rec.n_frames, rec.fps, [str(x) for x in rec.object_ids],
                       [str(x) for x in rec.subjects], segments, prefixes, seg_feats.astype(np.float32),
                       pre_feats.astype(np.float32), boxes)


def make_video_star(args: tuple) -> VideoResult:
    """`make_video` over one argument tuple (for `Executor.map`)."""
    return make_video(*args)
