"""Build the simulator-truth benchmark: videos -> corpus with raw descriptions, prefixes, questions, GT, features.

This is step 1 of the construction (the paper's pipeline, `DESIGN.md`): every state is the simulator's exact true
state (`eval.synth.lexicon.TrueState`), every segment carries a free-form ``raw`` description written by the corpus
describer, and ``sim_state`` (the true state's key). Step 2, ``python -m retrieval canon apply`` with the synthetic
recipe (``python -m retrieval synth`` runs both), canonicalizes the raw descriptions by greedy embedding clustering at
0.85, mines budgeted GT pools from the canonical states, emulates their verification and writes the benchmark every
job uses.

Videos are made in a process pool (`eval.synth.video.make_video`, one deterministic seed per video), then assembled
here in video order, so the output is byte-identical for a given configuration whatever the number of workers.

Protocol (the paper's, on simulator ground truth):

- Domains: video ``i`` belongs to ``DOMAINS[i % 4]`` and draws its scene family from the domain's mixture.
- Query videos: every video contributes its segments to the corpus; the first ``query_videos`` of a seeded
  permutation (all by default) also get prefixes and queries (PSR's corpus is far larger than its query videos).
- At most one prefix per (video, object), ending while the scene moves around the object (`eval.synth.prefix`);
  horizon = the 1-based index of the target in the object's future trajectory (1..7).
- Questions: Q1 next state (h = 1, asked for a share `Q1_RATE` of the prefixes); Q2 end state (the last segment,
  2 <= h <= 7, asked for a share `Q2_RATE`); Q3 the state active ``k`` seconds after the prefix ends (k in
  `K_SECONDS`, at least `Q3_MARGIN_S` inside the segment; the horizon drawn with weight `HORIZON_DECAY` ** (h - 1),
  the current segment with weight `PERSIST_WEIGHT`, counted as h = 1); Q4 the state just before a named later state
  (the anchor: a state first reached at horizon h_a >= 2 whose motion differs from the target's, drawn uniformly;
  it is named by an independent corpus-lexicon description); at most `PER_PREFIX` questions of Q3 / Q4 per prefix,
  at distinct horizons; Q5 the end states of 2-3 objects of one video (``group_id``; scored apart from the main
  pool). Query ids: ``<prefix id>.<qtype>``, ``.2`` appended to a second question of a type.
- Transcript: the object's segments that start before the target: (start time, reference text of the true state).
- GT (exact simulator truth): ``in_video`` = segments of the query's video in the target's true state;
  ``in_dataset`` / ``cross_dataset`` = other videos of the same / another domain in that state; ``bge_similar`` =
  other videos' near-duplicate states (same motion and place, another relation, other object or pose); ``consensus`` =
  the main pool's clear segments; ``gt_type1`` = same subject and state; ``gt_sim_exact`` = the main pool.
- Splits: video-disjoint train / val / test (`SPLIT_FRACTIONS`) over the query videos, drawn per domain.
- Files beyond the format: ``sim/<video>.npz`` (the record) and ``sim/phrases.jsonl`` (every raw description and
  question anchor with its denotation: the attribute values it mentions), read by the verification emulation and the
  held-out paraphraser.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymunk
from tqdm.auto import tqdm

from eval.errors import InputError, UnknownName
from eval.features import l2_normalize, write_meta, write_table
from eval.io import atomic_dir, read_json, write_json, write_jsonl
from eval.pools import process_pool
from eval.schema import MAX_HORIZON, SPLITS, GTPools, Manifest, Query, Segment, State, TranscriptEntry
from eval.synth import lexicon, render, scenes, simspace, states, world
from eval.synth import prefix as P
from eval.synth import video as V
from eval.synth.lexicon import CORPUS, TrueState, describe, reference_text
from eval.synth.questions import join_subjects, question_text, seconds_text

NAME = "psr-synth-truth"
VERSION = "2.0.0"
SPACE = "pixels"
SPACE_MODEL = "pixels-16x12"
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)
K_SECONDS = tuple(0.25 * i for i in range(1, 33))
Q3_MARGIN_S = 0.05
Q1_RATE = 0.6
"""Share of prefixes asked the next-state question (with Q3 and Q4 at h = 1, this keeps the h1 share near PSR's
0.56)."""
PER_PREFIX = {"Q3": 2, "Q4": 2}
"""At most this many questions of a type per prefix, at distinct horizons (PSR asks one shared prefix at several
horizons and types)."""
Q2_RATE = 0.8
"""Share of prefixes asked the end-state question (PSR's Q2 is a minority type)."""
HORIZON_DECAY = 1.0
"""Q3 / Q4 draw the target horizon with weight HORIZON_DECAY ** (h - 1): near horizons dominate, as in PSR."""
PERSIST_WEIGHT = 0.5
"""Q3's weight (against HORIZON_DECAY ** (h - 1) for h >= 1) for a time k inside the current segment: the state
seen at the prefix's end persists (as in PSR, a later state may equal the current one)."""
Q5_GROUP_SIZES = (2, 3)
SERIAL_BELOW = 40
_QTYPE_SALT = {"Q1": 1, "Q2": 2, "Q3": 3, "Q4": 4, "Q5": 5}


@dataclass(frozen=True)
class Preset:
    """A build size: ``videos`` simulated, ``query_videos`` of them with queries (None = all), frame size."""

    videos: int
    query_videos: int | None
    image_size: tuple[int, int]
    description: str


PRESETS: dict[str, Preset] = {
    "demo": Preset(1080, None, render.DEFAULT_SIZE, "the embedded default: ~17k segments, every video queried, "
                                                    "~2k fair test queries"),
    "psr": Preset(13700, 1550, (80, 60), "PSR-scale: ~211k segments, ~20k Q1-Q4 queries over 1,550 query videos"),
}


def build_benchmark(out_dir: str | os.PathLike, videos: int | None = None, seed: int = 0, workers: int | None = None,
                    progress: bool = True, image_size: tuple[int, int] | None = None, preset: str = "demo",
                    query_videos: int | None = None, *, overwrite: bool = False) -> Path:
    """Build the simulator-truth benchmark into ``out_dir`` and return its path.

    ``preset`` fixes the defaults of ``videos``, ``query_videos`` and ``image_size`` (`PRESETS`). ``out_dir`` may be
    missing, empty, or a previous synthetic build (replaced); anything else is refused (`eval.outputs`;
    ``overwrite`` forces). The directory is assembled
    beside ``out_dir`` and moved into place at the end. ``workers``: processes for the video pool (default: the CPU
    count, at most 8; small builds run in-process). The output does not depend on ``workers``.
    """
    if preset not in PRESETS:
        raise UnknownName(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    videos = p.videos if videos is None else videos
    query_videos = (p.query_videos if query_videos is None else query_videos) or videos
    image_size = tuple(image_size or p.image_size)
    if videos < len(scenes.DOMAINS):
        raise InputError(f"videos must be at least {len(scenes.DOMAINS)} (one per domain), got {videos}")
    out = Path(out_dir)
    with atomic_dir(out, kind=OUTPUT_KIND, overwrite=overwrite, recognise=_is_synth_build) as stage:
        queried = query_set(videos, min(query_videos, videos), seed)
        results = _make_videos(stage, videos, seed, workers, progress, image_size, queried)
        _assemble(stage, results, seed, image_size, preset, queried)
    return out


#: Output kind of a synthetic build (`eval.outputs`).
OUTPUT_KIND = "eval synth"


def _is_synth_build(out: Path) -> bool:
    """A directory without an output marker (`eval.outputs`) whose manifest names a synthetic build (this builder's
    or the canonicalized one of `retrieval.synth`): safe to replace."""
    with contextlib.suppress(Exception):
        return read_json(out / "manifest.json").get("name") in (NAME, "psr-synth")
    return False


# --- videos ------------------------------------------------------------------------------------------------

def video_domains(videos: int) -> list[str]:
    """The domain of each video index (round-robin, so every domain has ~videos/4 videos)."""
    return [scenes.DOMAINS[i % len(scenes.DOMAINS)] for i in range(videos)]


def query_set(videos: int, query_videos: int, seed: int) -> set[int]:
    """The video indices that get prefixes and queries: the first ``query_videos`` of a seeded permutation."""
    if query_videos >= videos:
        return set(range(videos))
    order = np.random.default_rng([seed, 0x9E71]).permutation(videos)
    return {int(i) for i in order[:query_videos]}


def _make_videos(stage: Path, videos: int, seed: int, workers: int | None, progress: bool,
                 image_size: tuple[int, int], queried: set[int]) -> list[V.VideoResult]:
    args = [(seed, i, d, str(stage), tuple(image_size), i in queried) for i, d in enumerate(video_domains(videos))]
    serial = workers == 1 if workers else videos < SERIAL_BELOW
    workers = workers or min(os.cpu_count() or 1, 8)
    bar = tqdm(total=videos, desc=f"{NAME}: videos", unit="video", disable=not progress)
    try:
        if serial or workers <= 1:
            return [_tick(bar, V.make_video_star(a)) for a in args]
        with process_pool(workers, start="fork") as pool:
            return [_tick(bar, r) for r in pool.map(V.make_video_star, args, chunksize=8)]
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
    state: np.ndarray  # (n,) true-state index (into `keys`)
    near: np.ndarray  # (n,) near-duplicate class index (motion + place)
    clear: np.ndarray  # (n,) bool
    type1: np.ndarray  # (n,) subject + state code
    keys: list[str]  # true-state keys, sorted
    rows: dict[tuple[int, int], list[int]]  # (video index, object index) -> corpus rows in time order


def _t(frame: int, fps: float) -> float:
    return round(frame / fps, 3)


def segment_id(video: str, object_id: str, j: int) -> str:
    """The opaque id of segment ``j`` (time order) of an object: ``s`` + 12 hex digits of a SHA-1."""
    return "s" + hashlib.sha1(f"{video}:{object_id}:{j}".encode()).hexdigest()[:12]


def state_id(key: str) -> str:
    """The id of a true state: ``t`` + 12 hex digits of the SHA-1 of its key (stable across builds)."""
    return "t" + hashlib.sha1(key.encode()).hexdigest()[:12]


def _build_corpus(results: list[V.VideoResult]) -> _Corpus:
    keys = sorted({s.state.key for r in results for s in r.segments})
    index = {k: i for i, k in enumerate(keys)}
    texts = {k: reference_text(TrueState.from_key(k)) for k in keys}
    if len(set(texts.values())) != len(texts):
        raise AssertionError("two true states share a reference text")
    segs, video, domain, state, clear, rows, t1 = [], [], [], [], [], {}, []
    for res in results:
        last = res.n_frames - 1
        per_object: Counter = Counter()
        for s in res.segments:
            j = per_object[s.object_index]
            per_object[s.object_index] += 1
            oid, subject = res.object_ids[s.object_index], res.subjects[s.object_index]
            text = texts[s.state.key]
            rows.setdefault((res.index, s.object_index), []).append(len(segs))
            segs.append(Segment(
                id=segment_id(res.video_id, oid, j), video_id=res.video_id, domain=res.domain, object_id=oid,
                subject=subject, state=text, state_id=state_id(s.state.key), state_type1=f"{subject} {text}",
                start=_t(s.start, res.fps), end=_t(min(s.stop, last), res.fps),
                frame=V.frame_path(res.video_id, s.middle), raw=s.raw, sim_state=s.state.key, box=s.box))
            video.append(res.index)
            domain.append(scenes.DOMAINS.index(res.domain))
            state.append(index[s.state.key])
            clear.append(s.clear)
            t1.append(f"{subject}\x00{s.state.key}")
    near_codes = {}
    near = np.array([near_codes.setdefault(tuple(keys[i].split("|")[:2]), len(near_codes)) for i in state], np.int64)
    _, t1_codes = np.unique(np.asarray(t1, dtype=object).astype(str), return_inverse=True)
    return _Corpus(segs, np.asarray(video, np.int64), np.asarray(domain, np.int64), np.asarray(state, np.int64),
                   near, np.asarray(clear, bool), t1_codes.astype(np.int64), keys, rows)


def assign_splits(results: list[V.VideoResult], seed: int, queried: set[int]) -> dict[int, str]:
    """Query video index -> split; per domain a seeded permutation cut at `SPLIT_FRACTIONS` (video-disjoint)."""
    rng = np.random.default_rng([seed, 0x5B117])
    out: dict[int, str] = {}
    for domain in scenes.DOMAINS:
        idx = np.array([r.index for r in results if r.domain == domain and r.index in queried], np.int64)
        idx = idx[rng.permutation(len(idx))]
        n_val = int(round(SPLIT_FRACTIONS[1] * len(idx)))
        n_test = int(round(SPLIT_FRACTIONS[2] * len(idx)))
        n_train = len(idx) - n_val - n_test
        for pos, i in enumerate(idx):
            out[int(i)] = SPLITS[0] if pos < n_train else SPLITS[1] if pos < n_train + n_val else SPLITS[2]
    return out


@dataclass(frozen=True)
class _Target:
    """One question about one prefix: its target is segment ``index`` of the object (time order), ``horizon`` steps
    after the current one (1 when it is the current state persisting), asked about time ``time``."""

    qtype: str
    index: int
    horizon: int
    time: float
    question: str
    k_seconds: float | None = None
    anchor_state: str | None = None
    group_id: str | None = None


def _decay_choices(rng: np.random.Generator, horizons: list[int], n: int) -> list[int]:
    """Up to ``n`` distinct horizons from ``horizons``, drawn without replacement with weight `HORIZON_DECAY` **
    (h - 1); ``0`` (the current state persisting) with weight `PERSIST_WEIGHT`; in ascending order."""
    if not horizons:
        return []
    w = np.array([PERSIST_WEIGHT if h == 0 else HORIZON_DECAY ** (h - 1) for h in horizons])
    idx = rng.choice(len(horizons), size=min(n, len(horizons)), replace=False, p=w / w.sum())
    return sorted(horizons[int(i)] for i in idx)


def _object_targets(res: V.VideoResult, k: int, segs: list[V.SegmentInfo], seed: int, prefix_end: float,
                    anchors_out: dict[str, dict]) -> list[_Target]:
    """Q1-Q4 targets of one (video, object) prefix; ``segs`` are the object's segments in time order and
    ``res.current[k]`` the one its prefix ends in."""
    subject = res.subjects[k]
    c = res.current[k]
    n_future = len(segs) - 1 - c
    fps = res.fps

    def rng(q: str) -> np.random.Generator:
        return np.random.default_rng([seed, res.index, k, _QTYPE_SALT[q], 0xA5])

    def start(h: int) -> float:
        return _t(segs[c + h].start, fps)

    out = []
    r1 = rng("Q1")
    if n_future >= 1 and r1.random() < Q1_RATE:
        out.append(_Target("Q1", c + 1, 1, start(1), question_text("Q1", r1, subject=subject)))
    r2 = rng("Q2")
    if 2 <= n_future <= MAX_HORIZON and r2.random() < Q2_RATE:
        out.append(_Target("Q2", c + n_future, n_future, start(n_future), question_text("Q2", r2, subject=subject)))
    r3 = rng("Q3")
    options: dict[int, list[float]] = {}
    for h in range(0, min(n_future, MAX_HORIZON) + 1):
        s = segs[c + h]
        for kk in K_SECONDS:
            t = prefix_end + kk
            if (h == 0 or s.start / fps + Q3_MARGIN_S <= t) and t <= s.stop / fps - Q3_MARGIN_S:
                options.setdefault(h, []).append(kk)
    for h in _decay_choices(r3, sorted(options), PER_PREFIX["Q3"]):
        kk = options[h][int(r3.integers(len(options[h])))]
        out.append(_Target("Q3", c + h, max(h, 1), round(prefix_end + kk, 3) if h == 0 else start(h),
                           question_text("Q3", r3, subject=subject, k=seconds_text(kk)), k_seconds=kk))
    r4 = rng("Q4")
    seen: set[str] = {segs[c].state.key}
    anchors = []
    for h in range(1, min(n_future, MAX_HORIZON + 1) + 1):
        st = segs[c + h].state
        if st.key not in seen and h >= 2 and st.motion != segs[c + h - 1].state.motion:
            anchors.append(h)
        seen.add(st.key)
    picked = sorted(int(h) for h in r4.choice(anchors, size=min(len(anchors), PER_PREFIX["Q4"]), replace=False)) \
        if anchors else []
    for h_anchor in picked:
        phrase, den = describe(segs[c + h_anchor].state, r4, CORPUS)
        anchors_out[phrase] = den
        out.append(_Target("Q4", c + h_anchor - 1, h_anchor - 1, start(h_anchor - 1),
                           question_text("Q4", r4, subject=subject, anchor=phrase), anchor_state=phrase))
    return out


def _group_targets(res: V.VideoResult, corpus: _Corpus, seed: int) -> dict[int, _Target]:
    """Q5: one group of 2-3 objects (with prefixes and an end state 1 to `MAX_HORIZON` states ahead) per video."""
    def future(k: int) -> int:
        return len(corpus.rows[(res.index, k)]) - 1 - res.current[k]

    eligible = [k for k in sorted(res.prefixes) if 1 <= future(k) <= MAX_HORIZON]
    if len(eligible) < 2:
        return {}
    rng = np.random.default_rng([seed, res.index, _QTYPE_SALT["Q5"], 0x6E])
    size = min(len(eligible), int(rng.choice(Q5_GROUP_SIZES)))
    members = sorted(int(k) for k in rng.choice(eligible, size=size, replace=False))
    names = join_subjects([res.subjects[k] for k in members])
    gid = f"{res.video_id}.g0"
    out = {}
    for k in members:
        last = len(corpus.rows[(res.index, k)]) - 1
        row = corpus.rows[(res.index, k)][last]
        out[k] = _Target("Q5", last, future(k), corpus.segments[row].start,
                         question_text("Q5", rng, subject=res.subjects[k], objects=names), group_id=gid)
    return out


class _Pools:
    """Exact GT pools on simulator truth (see the module docstring)."""

    def __init__(self, corpus: _Corpus):
        self.c = corpus
        self.ids = np.asarray([s.id for s in corpus.segments], dtype=object)
        self.by_state = self._group(corpus.state)
        self.by_near = self._group(corpus.near)
        self.by_type1 = self._group(corpus.type1)
        self.empty = np.zeros(0, np.int64)

    @staticmethod
    def _group(keys: np.ndarray) -> dict[int, np.ndarray]:
        order = np.argsort(keys, kind="stable")
        uniq, starts = np.unique(keys[order], return_index=True)
        return {int(u): order[a:b] for u, a, b in zip(uniq, starts, [*starts[1:], len(order)], strict=True)}

    def mine(self, row: int, video: int, domain: int) -> tuple[GTPools, tuple[str, ...]]:
        c = self.c
        same = self.by_state.get(int(c.state[row]), self.empty)
        v, d = c.video[same], c.domain[same]
        in_video, in_dataset, cross = same[v == video], same[(v != video) & (d == domain)], same[d != domain]
        near = self.by_near.get(int(c.near[row]), self.empty)
        near = near[(c.video[near] != video) & (c.state[near] != c.state[row])]
        main = np.sort(np.concatenate([in_dataset, cross]))
        t1 = self.by_type1.get(int(c.type1[row]), self.empty)
        t1 = t1[c.video[t1] != video]
        ids = self.ids
        return (GTPools(tuple(ids[in_video]), tuple(ids[in_dataset]), tuple(ids[cross]), tuple(ids[near]),
                        tuple(ids[main[c.clear[main]]])), tuple(ids[t1]))


def _build_queries(results: list[V.VideoResult], corpus: _Corpus, splits: dict[int, str], seed: int,
                   anchors: dict[str, dict]) -> list[Query]:
    pools = _Pools(corpus)
    queries: list[Query] = []
    for res in results:
        if not res.prefixes:
            continue
        group = _group_targets(res, corpus, seed)
        d = scenes.DOMAINS.index(res.domain)
        seg_by_object = defaultdict(list)
        for s in res.segments:
            seg_by_object[s.object_index].append(s)
        for k in sorted(res.prefixes):
            frames = res.prefixes[k]
            seg_rows = corpus.rows[(res.index, k)]
            prefix_id = f"{res.video_id}.{res.object_ids[k]}"
            prefix_start, prefix_end = _t(frames[0], res.fps), _t(frames[-1], res.fps)
            targets = _object_targets(res, k, seg_by_object[k], seed, prefix_end, anchors)
            if k in group:
                targets.append(group[k])
            nth: Counter = Counter()
            for tg in targets:
                nth[tg.qtype] += 1
                row = seg_rows[tg.index]
                seg = corpus.segments[row]
                gt, gt1 = pools.mine(row, res.index, d)
                transcript = tuple(TranscriptEntry(corpus.segments[r].start, corpus.segments[r].state)
                                   for r in seg_rows if corpus.segments[r].start < tg.time)
                queries.append(Query(
                    id=f"{prefix_id}.{tg.qtype}" + (f".{nth[tg.qtype]}" if nth[tg.qtype] > 1 else ""), prefix_id=prefix_id, video_id=res.video_id, domain=res.domain,
                    object_id=res.object_ids[k], subject=res.subjects[k], qtype=tg.qtype, horizon=tg.horizon,
                    question=tg.question, target_state=seg.state, target_state_id=seg.state_id,
                    target_state_type1=seg.state_type1, target_time=tg.time, prefix_start=prefix_start,
                    prefix_end=prefix_end, prefix_frames=tuple(V.frame_path(res.video_id, f) for f in frames),
                    transcript=transcript, split=splits[res.index], gt_pools=gt, gt_type1=gt1,
                    fair=len(gt.main) > 0, group_id=tg.group_id, k_seconds=tg.k_seconds,
                    anchor_state=tg.anchor_state, gt_sim_exact=gt.main,
                    prefix_boxes=tuple(tuple(b) for b in res.prefix_boxes[k])))
    return queries


def _phrase_denotations(results: list[V.VideoResult], anchors: dict[str, dict]) -> list[dict]:
    """Every raw description and question anchor with its denotation (one row a distinct phrase, sorted)."""
    den: dict[str, dict] = {}
    for res in results:
        for s in res.segments:
            den.setdefault(s.raw, s.denotation)
            if den[s.raw] != s.denotation:
                raise AssertionError(f"phrase {s.raw!r} denotes two different partial states")
    for phrase, d in anchors.items():
        if den.setdefault(phrase, d) != d:
            raise AssertionError(f"phrase {phrase!r} denotes two different partial states")
    return [{"phrase": p, "denotes": den[p]} for p in sorted(den)]


def _assemble(stage: Path, results: list[V.VideoResult], seed: int, image_size: tuple[int, int], preset: str,
              queried: set[int]) -> None:
    corpus = _build_corpus(results)
    splits = assign_splits(results, seed, queried)
    anchors: dict[str, dict] = {}
    queries = _build_queries(results, corpus, splits, seed, anchors)
    members: dict[str, Counter] = defaultdict(Counter)
    for s in corpus.segments:
        members[s.sim_state][s.raw] += 1
    n_seg = Counter(corpus.state.tolist())
    state_rows = [State(state_id(k), reference_text(TrueState.from_key(k)),
                        tuple(p for p, _ in sorted(members[k].items(), key=lambda x: (-x[1], x[0]))), n_seg[i])
                  for i, k in enumerate(corpus.keys)]

    write_jsonl(stage / "corpus.jsonl", (s.to_dict() for s in corpus.segments))
    write_jsonl(stage / "queries.jsonl", (q.to_dict() for q in queries))
    write_jsonl(stage / "states.jsonl", (s.to_dict() for s in state_rows))
    write_jsonl(stage / "sim" / "phrases.jsonl", _phrase_denotations(results, anchors))

    dim = render.FEATURE_GRID[0] * render.FEATURE_GRID[1] * 3
    seg_feats = np.concatenate([r.segment_features for r in results]).reshape(-1, dim)
    prefix_ids = [f"{r.video_id}.{r.object_ids[k]}" for r in results for k in sorted(r.prefixes)]
    pre_feats = np.concatenate([r.prefix_features for r in results]).reshape(-1, V.PREFIX_FRAMES, dim)
    write_table(stage, SPACE, "corpus", [s.id for s in corpus.segments], l2_normalize(seg_feats))
    write_table(stage, SPACE, "prefixes", prefix_ids, l2_normalize(pre_feats))
    write_meta(stage, SPACE, kind="visual", dim=dim, model=SPACE_MODEL,
               description="crop of the frame centred on the segment's (prefix's) object (64x48 pixels at 160x120), "
                           "box-downsampled to 16x12 RGB in [0,1], mean-centred, L2-normalised")
    write_sim_space(stage, prefix_ids, np.concatenate([r.prefix_sim for r in results]))

    manifest = Manifest(
        name=NAME, version=VERSION,
        counts={"queries": len(queries), "corpus": len(corpus.segments), "states": len(state_rows),
                "videos": len(results), "prefixes": len(prefix_ids),
                "fair_queries": sum(q.fair for q in queries)},
        spaces={SPACE: {"kind": "visual", "dim": dim, "model": SPACE_MODEL},
                simspace.NAME: {"kind": "prefix", "dim": simspace.DIM, "model": simspace.MODEL}},
        domains=list(scenes.DOMAINS),
        description="Simulator-truth synthetic PSR benchmark (pymunk scenes, Pillow frames): exact compositional "
                    "true states, raw free-form descriptions; canonicalize it with `python -m retrieval canon apply` "
                    "(`python -m retrieval synth` runs both steps).",
        extra=_extra(results, queries, splits, seed, image_size, preset, queried))
    write_json(stage / "manifest.json", manifest.to_dict())


def _extra(results, queries, splits, seed, image_size, preset, queried) -> dict:
    def count(key) -> dict[str, int]:
        c = Counter(key(q) for q in queries)
        return {str(k): c[k] for k in sorted(c)}

    return {
        "seed": seed, "preset": preset, "videos": len(results), "query_videos": len(queried),
        "fps": float(world.FPS), "image_size": list(image_size),
        "generator": {"physics": f"pymunk {pymunk.version}", "physics_hz": world.PHYSICS_HZ,
                      "duration_s": world.DURATION_S, "families": list(scenes.families()),
                      "domain_mixtures": scenes.domain_mixtures(),
                      "lexicon": {"corpus_omit": CORPUS.omit, "held_out": lexicon.HELD_OUT.name}},
        "thresholds": {**states.THRESHOLDS, "PREFIX_GAP_S": list(P.GAP_S), "PREFIX_SPAN_S": P.SPAN_S,
                       "PREFIX_APPROACH_MIN": P.APPROACH_MIN, "PREFIX_COURSE_HORIZON_S": P.COURSE_HORIZON_S,
                       "PERSIST_WEIGHT": PERSIST_WEIGHT,
                       "CONSENSUS_MIN_DURATION_S": V.CONSENSUS_MIN_DURATION_S, "Q3_MARGIN_S": Q3_MARGIN_S,
                       "Q2_RATE": Q2_RATE, "HORIZON_DECAY": HORIZON_DECAY},
        "families": dict(Counter(r.family for r in results)),
        "split_videos": {s: sum(1 for v in splits.values() if v == s) for s in SPLITS},
        "queries_by_qtype": count(lambda q: q.qtype),
        "queries_by_horizon": count(lambda q: q.horizon),
        "queries_by_split": {s: sum(1 for q in queries if q.split == s) for s in SPLITS},
        "queries_by_domain": count(lambda q: q.domain),
        "sim": "sim/<video_id>.npz per video (eval.synth.record); sim/phrases.jsonl: phrase -> denotation",
    }


def write_sim_space(root: Path, prefix_ids: list[str], tokens: np.ndarray) -> None:
    """The ``sim`` prefix space (`eval.synth.simspace`): the raw tokens ``(n_prefixes, 8, D)`` z-scored over the
    build, with the mean and std in its ``meta.json``."""
    tokens, mean, std = simspace.standardize(tokens.reshape(-1, V.PREFIX_FRAMES, simspace.DIM))
    write_table(root, simspace.NAME, "prefixes", prefix_ids, tokens)
    write_meta(root, simspace.NAME, kind="prefix", dim=simspace.DIM, model=simspace.MODEL, normalized=False,
               mean=[round(float(x), 6) for x in mean], std=[round(float(x), 6) for x in std],
               description="the simulator's exact state of the scene at each prefix frame (eval.synth.simspace), "
                           "z-scored over the build's prefixes: perfect perception, nothing after the prefix")


def read_denotations(data_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """``sim/phrases.jsonl`` of a synthetic build (or of a benchmark linking its ``sim/``): phrase -> denotation."""
    path = Path(data_dir) / "sim" / "phrases.jsonl"
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            out[row["phrase"]] = row["denotes"]
    return out
