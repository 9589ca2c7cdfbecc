"""Build the synthetic PSR benchmark directory: videos -> corpus, prefixes, questions, GT pools, splits, features.

Videos are made in a process pool (`eval.synth.video.make_video`, one deterministic seed per video), then
assembled here in video order, so the output is byte-identical for a given ``(videos, seed, image_size)``
whatever the number of workers.

Protocol (the paper's, on simulator ground truth):

- Single prefix: each (video, object) whose first state lasts at least 8 frames gets one prefix of 8 evenly
  spaced frames ending strictly before the object's first state change; every query of that object shares it.
- Horizon: the 1-based index of the target in the object's future trajectory (the segments after the first);
  targets lie within horizons 1..7 (`eval.schema.MAX_HORIZON`), longer ones are skipped.
- Questions: Q1 next state (h = 1); Q2 end state (the last segment, h >= 2); Q3 the state active ``k`` seconds
  after the prefix ends (k a multiple of 0.5 s, at least `Q3_MARGIN_S` inside the segment); Q4 the state just
  before a named later state (``anchor_state``, the first occurrence of its state in the future); Q5 the end
  state of each of 2-3 objects of one video (``group_id``; one query per object; h >= 1).
- Transcript: the object's segments that start before the target, as (start time, canonical state).
- GT pools (corpus segment ids, in corpus order) for target canonical state ``s`` of video ``V``, domain ``D``:
  ``in_video`` = segments of ``V`` in ``s`` (the object's own target included); ``in_dataset`` = other videos of
  ``D`` in ``s``; ``cross_dataset`` = other domains in ``s``; ``bge_similar`` = other videos' segments whose state
  is a declared neighbour of ``s`` (`eval.synth.vocab.neighbours`; exact matches excluded); ``consensus`` = the
  main pool's "clear" segments (`eval.synth.video.CONSENSUS_MIN_DURATION_S`, object fully in view);
  ``gt_type1`` = other videos' segments with the same subject + state. ``fair`` = main pool non-empty.
- Splits: video-disjoint train / val / test (`SPLIT_FRACTIONS`), drawn per domain with the build seed.
- Features: the ``pixels`` visual space (`eval.synth.render.pixel_feature`, L2-normalised): ``corpus`` (segment
  middle frames) and ``prefixes`` (n_prefixes, 8, 576).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymunk
from tqdm.auto import tqdm

from eval.features import l2_normalize, write_meta, write_table
from eval.io import atomic_dir, read_json, write_json, write_jsonl
from eval.schema import MAX_HORIZON, SPLITS, GTPools, Manifest, Query, Segment, State, TranscriptEntry
from eval.synth import render, scenes, states
from eval.synth import video as V
from eval.synth.questions import join_subjects, question_text, seconds_text
from eval.synth.vocab import STATES, neighbours, validate_vocab

NAME = "psr-synth"
VERSION = "1.0.0"
SPACE = "pixels"
SPACE_MODEL = "pixels-16x12"
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)
"""Video-disjoint train / val / test fractions (per domain)."""
K_SECONDS = tuple(0.5 * i for i in range(1, 13))
"""Candidate ``k`` of Q3 (seconds after the prefix ends)."""
Q3_MARGIN_S = 0.1
"""The time prefix_end + k must lie at least this far inside the target segment (no boundary ambiguity)."""
Q5_GROUP_SIZES = (2, 3)
SERIAL_BELOW = 40
"""Without an explicit ``workers``, builds with fewer videos run in-process (a pool costs more than it saves)."""
_QTYPE_SALT = {"Q1": 1, "Q2": 2, "Q3": 3, "Q4": 4, "Q5": 5}


def build_benchmark(out_dir: str | os.PathLike, videos: int = 300, seed: int = 0, workers: int | None = None,
                    progress: bool = True, image_size: tuple[int, int] = render.DEFAULT_SIZE, *,
                    overwrite: bool = False) -> Path:
    """Build the synthetic benchmark into ``out_dir`` and return its path.

    ``out_dir`` may be missing, empty, or a previous synthetic build (replaced); anything else is refused
    (`eval.outputs`; ``overwrite`` forces).
    The directory is assembled beside ``out_dir`` and moved into place at the end, so a failed build leaves
    nothing half-written. ``workers``: processes for the video pool (default: the CPU count, at most 8; small
    builds run in-process). The output does not depend on ``workers``.
    """
    if videos < len(scenes.FAMILIES):
        raise ValueError(f"videos must be at least {len(scenes.FAMILIES)} (one per scene family), got {videos}")
    validate_vocab()
    out = Path(out_dir)
    with atomic_dir(out, kind=OUTPUT_KIND, overwrite=overwrite, legacy=_is_synth_build) as stage:
        results = _make_videos(stage, videos, seed, workers, progress, image_size)
        _assemble(stage, results, seed, image_size)
    return out


# --- output directory handling -----------------------------------------------------------------------------

#: Output kind of a synthetic build (`eval.outputs`).
OUTPUT_KIND = "eval synth"


def _is_synth_build(out: Path) -> bool:
    """An unmarked directory written before output markers existed: its manifest names this benchmark."""
    with contextlib.suppress(Exception):
        return read_json(out / "manifest.json").get("name") == NAME
    return False


# --- videos ------------------------------------------------------------------------------------------------

def video_domains(videos: int) -> list[str]:
    """The scene family of each video index (round-robin, so every domain has ~videos/4 videos)."""
    return [scenes.FAMILIES[i % len(scenes.FAMILIES)] for i in range(videos)]


def _make_videos(stage: Path, videos: int, seed: int, workers: int | None, progress: bool,
                 image_size: tuple[int, int]) -> list[V.VideoResult]:
    args = [(seed, i, d, str(stage), tuple(image_size)) for i, d in enumerate(video_domains(videos))]
    serial = workers == 1 if workers else videos < SERIAL_BELOW
    workers = workers or min(os.cpu_count() or 1, 8)
    bar = tqdm(total=videos, desc=f"{NAME}: videos", unit="video", disable=not progress)
    try:
        if serial or workers <= 1:
            return [_tick(bar, V.make_video_star(a)) for a in args]
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
            return [_tick(bar, r) for r in pool.map(V.make_video_star, args, chunksize=4)]
    finally:
        bar.close()


def _tick(bar, result):
    bar.update(1)
    return result


# --- assembly ----------------------------------------------------------------------------------------------

@dataclass
class _Corpus:
    """The corpus as records plus the per-row arrays GT mining needs."""

    segments: list[Segment]
    video: np.ndarray  # (n,) video index
    domain: np.ndarray  # (n,) domain index
    state: np.ndarray  # (n,) state index
    clear: np.ndarray  # (n,) bool
    type1: list[str]
    rows: dict[tuple[int, int], list[int]]  # (video index, object index) -> corpus rows in time order

    def rows_by(self, keys: Iterable) -> dict:
        out: dict = {}
        for r, key in enumerate(keys):
            out.setdefault(key, []).append(r)
        return {k: np.asarray(v, np.int64) for k, v in out.items()}


def _t(frame: int, fps: float) -> float:
    return round(frame / fps, 3)


def _build_corpus(results: list[V.VideoResult]) -> _Corpus:
    segs, video, domain, state, clear, rows = [], [], [], [], [], {}
    for res in results:
        last = res.n_frames - 1
        per_object = Counter()
        for s in res.segments:
            j = per_object[s.object_index]
            per_object[s.object_index] += 1
            oid, subject = res.object_ids[s.object_index], res.subjects[s.object_index]
            st = STATES[s.state]
            rows.setdefault((res.index, s.object_index), []).append(len(segs))
            segs.append(Segment(
                id=f"{res.video_id}.{oid}.s{j}", video_id=res.video_id, domain=res.domain, object_id=oid,
                subject=subject, state=st.text, state_id=st.id, state_type1=f"{subject} {st.text}",
                start=_t(s.start, res.fps), end=_t(min(s.stop, last), res.fps),
                frame=V.frame_path(res.video_id, s.middle), raw=s.raw))
            video.append(res.index)
            domain.append(scenes.FAMILIES.index(res.domain))
            state.append(s.state)
            clear.append(s.clear)
    return _Corpus(segs, np.asarray(video, np.int64), np.asarray(domain, np.int64), np.asarray(state, np.int64),
                   np.asarray(clear, bool), [s.state_type1 for s in segs], rows)


def assign_splits(results: list[V.VideoResult], seed: int) -> dict[int, str]:
    """Video index -> split; per domain a seeded permutation cut at `SPLIT_FRACTIONS` (video-disjoint)."""
    rng = np.random.default_rng([seed, 0x5B117])
    out: dict[int, str] = {}
    for domain in scenes.FAMILIES:
        idx = np.array([r.index for r in results if r.domain == domain], np.int64)
        idx = idx[rng.permutation(len(idx))]
        n_val = int(round(SPLIT_FRACTIONS[1] * len(idx)))
        n_test = int(round(SPLIT_FRACTIONS[2] * len(idx)))
        n_train = len(idx) - n_val - n_test
        for pos, i in enumerate(idx):
            out[int(i)] = SPLITS[0] if pos < n_train else SPLITS[1] if pos < n_train + n_val else SPLITS[2]
    return out


@dataclass(frozen=True)
class _Target:
    qtype: str
    horizon: int
    question: str
    k_seconds: float | None = None
    anchor_state: str | None = None
    group_id: str | None = None


def _object_targets(res: V.VideoResult, k: int, seg_rows: list[int], corpus: _Corpus, seed: int,
                    prefix_end: float) -> list[_Target]:
    """Q1-Q4 targets of one (video, object) prefix; ``seg_rows`` are the object's corpus rows in time order."""
    subject = res.subjects[k]
    n_future = len(seg_rows) - 1
    segs = [corpus.segments[r] for r in seg_rows]

    def rng(q: str) -> np.random.Generator:
        return np.random.default_rng([seed, res.index, k, _QTYPE_SALT[q], 0xA5])

    out = [_Target("Q1", 1, question_text("Q1", rng("Q1"), subject=subject))]
    if 2 <= n_future <= MAX_HORIZON:
        out.append(_Target("Q2", n_future, question_text("Q2", rng("Q2"), subject=subject)))
    # Q3: pick a reachable horizon uniformly, then a k that lands well inside that segment
    r3 = rng("Q3")
    options: dict[int, list[float]] = {}
    for h in range(1, min(n_future, MAX_HORIZON) + 1):
        s = segs[h]
        for kk in K_SECONDS:
            t = prefix_end + kk
            if s.start + Q3_MARGIN_S <= t <= s.end - Q3_MARGIN_S:
                options.setdefault(h, []).append(kk)
    if options:
        hs = sorted(options)
        h = hs[int(r3.integers(len(hs)))]
        kk = options[h][int(r3.integers(len(options[h])))]
        out.append(_Target("Q3", h, question_text("Q3", r3, subject=subject, k=seconds_text(kk)), k_seconds=kk))
    # Q4: anchor = the first future occurrence of a state, at h >= 2; target = the segment just before it
    r4 = rng("Q4")
    seen: set[str] = set()
    anchors = []
    for h in range(1, min(n_future, MAX_HORIZON + 1) + 1):
        if segs[h].state not in seen and h >= 2:
            anchors.append(h)
        seen.add(segs[h].state)
    if anchors:
        h_anchor = anchors[int(r4.integers(len(anchors)))]
        anchor = segs[h_anchor].state
        out.append(_Target("Q4", h_anchor - 1, question_text("Q4", r4, subject=subject, anchor=anchor),
                           anchor_state=anchor))
    return out


def _group_targets(res: V.VideoResult, corpus: _Corpus, seed: int) -> dict[int, _Target]:
    """Q5: one group of 2-3 objects (with prefixes and an end state within `MAX_HORIZON`) per video."""
    eligible = [k for k in sorted(res.prefixes) if len(corpus.rows[(res.index, k)]) - 1 <= MAX_HORIZON]
    if len(eligible) < 2:
        return {}
    rng = np.random.default_rng([seed, res.index, _QTYPE_SALT["Q5"], 0x6E])
    size = min(len(eligible), int(rng.choice(Q5_GROUP_SIZES)))
    members = sorted(int(k) for k in rng.choice(eligible, size=size, replace=False))
    names = join_subjects([res.subjects[k] for k in members])
    gid = f"{res.video_id}.g0"
    return {k: _Target("Q5", len(corpus.rows[(res.index, k)]) - 1,
                       question_text("Q5", rng, subject=res.subjects[k], objects=names), group_id=gid)
            for k in members}


class _Pools:
    """GT pool mining over the corpus arrays (see the module docstring for the tiers)."""

    def __init__(self, corpus: _Corpus):
        self.c = corpus
        self.ids = np.asarray([s.id for s in corpus.segments], dtype=object)
        self.by_state = corpus.rows_by(corpus.state.tolist())
        self.by_type1 = corpus.rows_by(corpus.type1)
        self.empty = np.zeros(0, np.int64)

    def mine(self, state: int, type1: str, video: int, domain: int) -> tuple[GTPools, tuple[str, ...]]:
        c = self.c
        same = self.by_state.get(state, self.empty)
        v, d = c.video[same], c.domain[same]
        in_video = same[v == video]
        in_dataset = same[(v != video) & (d == domain)]
        cross = same[d != domain]
        near_states = [states.STATE_INDEX[t] for t in neighbours(STATES[state].text)]
        near = np.sort(np.concatenate([self.by_state.get(s, self.empty) for s in near_states] or [self.empty]))
        near = near[c.video[near] != video]
        main = np.concatenate([in_dataset, cross])
        consensus = main[c.clear[main]]
        t1 = self.by_type1.get(type1, self.empty)
        t1 = t1[c.video[t1] != video]
        ids = self.ids
        pools = GTPools(tuple(ids[in_video]), tuple(ids[in_dataset]), tuple(ids[cross]), tuple(ids[near]),
                        tuple(ids[consensus]))
        return pools, tuple(ids[t1])


def _build_queries(results: list[V.VideoResult], corpus: _Corpus, splits: dict[int, str], seed: int) -> list[Query]:
    pools = _Pools(corpus)
    queries: list[Query] = []
    for res in results:
        group = _group_targets(res, corpus, seed)
        d = scenes.FAMILIES.index(res.domain)
        for k in sorted(res.prefixes):
            frames = res.prefixes[k]
            seg_rows = corpus.rows[(res.index, k)]
            prefix_id = f"{res.video_id}.{res.object_ids[k]}"
            prefix_start, prefix_end = _t(frames[0], res.fps), _t(frames[-1], res.fps)
            targets = _object_targets(res, k, seg_rows, corpus, seed, prefix_end)
            if k in group:
                targets.append(group[k])
            for tg in targets:
                row = seg_rows[tg.horizon]
                seg = corpus.segments[row]
                gt, gt1 = pools.mine(int(corpus.state[row]), seg.state_type1, res.index, d)
                transcript = tuple(TranscriptEntry(corpus.segments[r].start, corpus.segments[r].state)
                                   for r in seg_rows if corpus.segments[r].start < seg.start)
                queries.append(Query(
                    id=f"{prefix_id}.{tg.qtype}", prefix_id=prefix_id, video_id=res.video_id, domain=res.domain,
                    object_id=res.object_ids[k], subject=res.subjects[k], qtype=tg.qtype, horizon=tg.horizon,
                    question=tg.question, target_state=seg.state, target_state_id=seg.state_id,
                    target_state_type1=seg.state_type1, target_time=seg.start, prefix_start=prefix_start,
                    prefix_end=prefix_end, prefix_frames=tuple(V.frame_path(res.video_id, f) for f in frames),
                    transcript=transcript, split=splits[res.index], gt_pools=gt, gt_type1=gt1,
                    fair=len(gt.main) > 0, group_id=tg.group_id, k_seconds=tg.k_seconds,
                    anchor_state=tg.anchor_state))
    return queries


def _assemble(stage: Path, results: list[V.VideoResult], seed: int, image_size: tuple[int, int]) -> None:
    corpus = _build_corpus(results)
    splits = assign_splits(results, seed)
    queries = _build_queries(results, corpus, splits, seed)
    counts_by_state = Counter(int(s) for s in corpus.state)
    state_rows = [State(s.id, s.text, s.synonyms, counts_by_state.get(i, 0)) for i, s in enumerate(STATES)]

    write_jsonl(stage / "corpus.jsonl", (s.to_dict() for s in corpus.segments))
    write_jsonl(stage / "queries.jsonl", (q.to_dict() for q in queries))
    write_jsonl(stage / "states.jsonl", (s.to_dict() for s in state_rows))

    dim = render.FEATURE_GRID[0] * render.FEATURE_GRID[1] * 3
    seg_feats = np.concatenate([r.segment_features for r in results]).reshape(-1, dim)
    prefix_ids = [f"{r.video_id}.{r.object_ids[k]}" for r in results for k in sorted(r.prefixes)]
    pre_feats = np.concatenate([r.prefix_features for r in results]).reshape(-1, V.PREFIX_FRAMES, dim)
    write_table(stage, SPACE, "corpus", [s.id for s in corpus.segments], l2_normalize(seg_feats))
    write_table(stage, SPACE, "prefixes", prefix_ids, l2_normalize(pre_feats))
    write_meta(stage, SPACE, kind="visual", dim=dim, model=SPACE_MODEL,
               description="64x48-pixel crop of the frame centred on the segment's (prefix's) object, "
                           "box-downsampled to 16x12 RGB in [0,1], mean-centred, L2-normalised")

    manifest = Manifest(
        name=NAME, version=VERSION,
        counts={"queries": len(queries), "corpus": len(corpus.segments), "states": len(state_rows),
                "videos": len(results), "prefixes": len(prefix_ids),
                "fair_queries": sum(q.fair for q in queries)},
        spaces={SPACE: {"kind": "visual", "dim": dim, "model": SPACE_MODEL}},
        domains=list(scenes.FAMILIES),
        description="Simulator-backed synthetic PSR benchmark (pymunk scenes, Pillow frames): four scene families "
                    "as source domains, states labelled from the simulator record.",
        extra=_extra(results, queries, splits, seed, image_size))
    write_json(stage / "manifest.json", manifest.to_dict())


def _extra(results, queries, splits, seed, image_size) -> dict:
    def count(key) -> dict[str, int]:
        c = Counter(key(q) for q in queries)
        return {str(k): c[k] for k in sorted(c)}

    return {
        "seed": seed, "videos": len(results), "fps": float(scenes.FPS), "image_size": list(image_size),
        "generator": {"physics": f"pymunk {pymunk.version}", "physics_hz": scenes.PHYSICS_HZ,
                      "durations_s": dict(scenes.DURATIONS)},
        "thresholds": {**states.THRESHOLDS, "PREFIX_GAP_FRAMES": V.PREFIX_GAP_FRAMES,
                       "PREFIX_SPAN_FRAMES": V.PREFIX_SPAN_FRAMES,
                       "CONSENSUS_MIN_DURATION_S": V.CONSENSUS_MIN_DURATION_S, "Q3_MARGIN_S": Q3_MARGIN_S},
        "split_videos": {s: sum(1 for v in splits.values() if v == s) for s in SPLITS},
        "queries_by_qtype": count(lambda q: q.qtype),
        "queries_by_horizon": count(lambda q: q.horizon),
        "queries_by_split": {s: sum(1 for q in queries if q.split == s) for s in SPLITS},
        "queries_by_domain": count(lambda q: q.domain),
        "sim": "sim/<video_id>.npz per video (see eval.synth.record)",
    }
