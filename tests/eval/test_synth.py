"""The simulator-backed synthetic benchmark (eval.synth): determinism, protocol, GT pools, files, difficulty."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from eval.features import load_table
from eval.io import read_json, read_jsonl
from eval.schema import MAX_HORIZON, PREFIX_FRAMES, QUESTION_TYPES, SPLITS
from eval.synth import build_benchmark
from eval.synth.record import load_npz
from eval.synth.states import MIN_SEGMENT_S, StateSegment, smooth
from eval.synth.vocab import STATE_BY_TEXT, STATES, neighbours, validate_vocab

_FRAME = re.compile(r"frames/(v\d+)/f(\d{4})\.png$")


@pytest.fixture(scope="module")
def data(synth_dir):
    """The session's synthetic build, parsed once: manifest, queries, corpus, states and handy indexes."""
    root = Path(synth_dir)
    queries = read_jsonl(root / "queries.jsonl")
    corpus = read_jsonl(root / "corpus.jsonl")
    by_id = {s["id"]: s for s in corpus}
    trajectories = defaultdict(list)  # (video, object) -> segments in time order
    for s in corpus:
        trajectories[(s["video_id"], s["object_id"])].append(s)
    return {"root": root, "manifest": read_json(root / "manifest.json"), "queries": queries, "corpus": corpus,
            "states": read_jsonl(root / "states.jsonl"), "by_id": by_id, "traj": trajectories}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.parts}


def _frame_time(path: str, fps: float) -> float:
    return int(_FRAME.search(path).group(2)) / fps


# --- vocabulary and smoothing ------------------------------------------------------------------------------

def test_vocabulary():
    validate_vocab()
    assert 20 <= len(STATES) <= 35
    for s in STATES:
        assert 3 <= len(s.synonyms) <= 6 and s.synonyms[0] == s.text
        near = neighbours(s.text)
        assert s.text not in near
        assert all(s.text in neighbours(n) for n in near)  # symmetric


def test_smoothing_merges_flicker_and_short_runs():
    a, b, c = 0, 1, 2
    flicker = np.array([a] * 10 + [b] * 2 + [a] * 10 + [c] * 1 + [b] * 8)
    segs = smooth(flicker, 4)
    assert [s.state for s in segs] == [a, b]
    assert segs[0] == StateSegment(a, 0, 23) and segs[-1].stop == len(flicker)
    assert smooth(np.array([a] * 6 + [b] * 6), 4) == [StateSegment(a, 0, 6), StateSegment(b, 6, 12)]
    assert all(s.stop - s.start >= 4 for s in smooth(np.arange(40) % 3, 4))


# --- determinism and files ---------------------------------------------------------------------------------

def test_build_is_byte_identical_and_worker_independent(tmp_path):
    a = build_benchmark(tmp_path / "a", videos=8, seed=5, workers=1, progress=False)
    b = build_benchmark(tmp_path / "b", videos=8, seed=5, workers=2, progress=False)
    fa, fb = _files(a), _files(b)
    assert fa.keys() == fb.keys()
    assert [k for k in fa if fa[k] != fb[k]] == []
    assert any(k.startswith("frames/") for k in fa) and any(k.startswith("sim/") for k in fa)
    c = build_benchmark(tmp_path / "c", videos=8, seed=6, workers=1, progress=False)
    assert _files(c)["corpus.jsonl"] != fa["corpus.jsonl"]
    # rebuilding over a previous build replaces it; a foreign non-empty directory is refused
    assert _files(build_benchmark(a, videos=8, seed=5, workers=1, progress=False)) == fa
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_benchmark(tmp_path / "foreign", videos=8, progress=False)
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging leftovers


def test_loads_and_counts_match(data, synth_bench):
    m = data["manifest"]
    assert m["name"] == "psr-synth" and set(m["domains"]) == {"ramp", "table_push", "dominoes", "container"}
    counts = m["counts"]
    assert counts["queries"] == len(data["queries"]) == len(synth_bench.queries_ds)
    assert counts["corpus"] == len(data["corpus"]) == len(synth_bench.corpus_ds)
    assert counts["states"] == len(data["states"]) == len(STATES)
    assert counts["videos"] == len({s["video_id"] for s in data["corpus"]})
    assert counts["prefixes"] == len({q["prefix_id"] for q in data["queries"]})
    assert "pixels" in synth_bench.spaces and m["spaces"]["pixels"]["kind"] == "visual"
    q = synth_bench.query(0)
    assert len(q.prefix_frames) == PREFIX_FRAMES and q.gt_pools.main


def test_pixels_feature_space(data):
    root, m = data["root"], data["manifest"]
    dim = m["spaces"]["pixels"]["dim"]
    corpus = load_table(root, "pixels", "corpus")
    prefixes = load_table(root, "pixels", "prefixes")
    assert corpus.ids == [s["id"] for s in data["corpus"]]
    assert corpus.array.shape == (len(data["corpus"]), dim) and corpus.array.dtype == np.float32
    assert prefixes.array.shape == (m["counts"]["prefixes"], PREFIX_FRAMES, dim)
    assert set(prefixes.ids) == {q["prefix_id"] for q in data["queries"]}
    assert np.allclose(np.linalg.norm(corpus.array, axis=-1), 1, atol=1e-4)
    assert np.allclose(np.linalg.norm(prefixes.array, axis=-1), 1, atol=1e-4)


def test_sim_records_are_consistent(data):
    root = data["root"]
    videos = sorted({s["video_id"] for s in data["corpus"]})
    for vid in videos[:8]:
        rec = load_npz(root / "sim" / f"{vid}.npz")
        f, n = rec.n_frames, rec.n_objects
        assert rec.t.shape == (f,) and np.allclose(np.diff(rec.t), 1 / rec.fps)
        for name, shape in [("pos", (f, n, 2)), ("vel", (f, n, 2)), ("angle", (f, n)), ("angvel", (f, n)),
                            ("contacts", (f, n)), ("support", (f, n)), ("impact_speed", (f, n)),
                            ("impact_kind", (f, n)), ("impact_other", (f, n)), ("held", (f, n)),
                            ("touch", (f, n, n)), ("pusher_pos", (f, 2)), ("sizes", (n, 2))]:
            assert getattr(rec, name).shape == shape, name
        objects = {(s["object_id"], s["subject"]) for s in data["corpus"] if s["video_id"] == vid}
        assert objects == set(zip(rec.object_ids.tolist(), rec.subjects.tolist(), strict=True))
        assert rec.domain == data["traj"][(vid, "o0")][0]["domain"]
        assert np.isfinite(rec.pos).all() and np.isfinite(rec.vel).all()


def test_states_file(data):
    counts = Counter(s["state_id"] for s in data["corpus"])
    assert [s["text"] for s in data["states"]] == [s.text for s in STATES]
    for row in data["states"]:
        assert 3 <= len(row["members"]) <= 6 and row["text"] in row["members"]
        assert row["n_segments"] == counts.get(row["id"], 0)
    for seg in data["corpus"]:
        state = STATE_BY_TEXT[seg["state"]]
        assert seg["state_id"] == state.id and seg["raw"] in state.synonyms
        assert seg["state_type1"] == f"{seg['subject']} {seg['state']}"
    used = {s["state"] for s in data["corpus"]}
    assert len(used) >= 20
    # states shared across domains (cross-dataset tier) and family-specific ones both exist
    domains_of = defaultdict(set)
    for s in data["corpus"]:
        domains_of[s["state"]].add(s["domain"])
    assert sum(len(d) >= 2 for d in domains_of.values()) >= 8 and any(len(d) == 1 for d in domains_of.values())


def test_segments_tile_each_trajectory(data):
    fps = data["manifest"]["extra"]["fps"]
    for segs in data["traj"].values():
        assert segs[0]["start"] == 0.0
        for prev, nxt in zip(segs, segs[1:], strict=False):
            assert prev["end"] == nxt["start"] and prev["state"] != nxt["state"]
        for s in segs:
            assert s["end"] - s["start"] >= MIN_SEGMENT_S - 1 / fps - 1e-9
            assert s["start"] <= _frame_time(s["frame"], fps) <= s["end"]
            assert (data["root"] / s["frame"]).is_file()


# --- protocol ----------------------------------------------------------------------------------------------

def test_no_leakage(data):
    fps = data["manifest"]["extra"]["fps"]
    for q in data["queries"]:
        segs = data["traj"][(q["video_id"], q["object_id"])]
        assert q["prefix_end"] < segs[1]["start"]  # the prefix ends strictly before the first state change
        assert q["target_time"] > q["prefix_end"]
        times = [_frame_time(p, fps) for p in q["prefix_frames"]]
        assert len(times) == PREFIX_FRAMES and times == sorted(set(times))
        assert times[0] == q["prefix_start"] and times[-1] == q["prefix_end"]
        assert all(_frame_time(p, fps) <= q["prefix_end"] for p in q["prefix_frames"])
        assert all(_FRAME.search(p).group(1) == q["video_id"] for p in q["prefix_frames"])
        assert all(e["t"] < q["target_time"] for e in q["transcript"])
        assert [e["state"] for e in q["transcript"]] == [s["state"] for s in segs if s["start"] < q["target_time"]]


def test_single_prefix_per_object(data):
    by_prefix = defaultdict(set)
    for q in data["queries"]:
        by_prefix[q["prefix_id"]].add((q["video_id"], q["object_id"], q["prefix_start"], q["prefix_end"],
                                       tuple(q["prefix_frames"])))
    assert all(len(v) == 1 for v in by_prefix.values())
    assert len({q["id"] for q in data["queries"]}) == len(data["queries"])


def test_horizons_and_targets(data):
    hs = Counter()
    for q in data["queries"]:
        segs = data["traj"][(q["video_id"], q["object_id"])]
        assert 1 <= q["horizon"] <= MAX_HORIZON
        target = segs[q["horizon"]]  # the horizon-th segment after the prefix's
        assert (target["start"], target["state"], target["state_id"], target["state_type1"]) == (
            q["target_time"], q["target_state"], q["target_state_id"], q["target_state_type1"])
        hs[q["horizon"]] += 1
    assert hs.most_common(1)[0][0] == 1  # many next-state queries ...
    assert sum(v for h, v in hs.items() if h >= 5) >= 0.03 * sum(hs.values())  # ... and a far tail
    assert len(hs) == MAX_HORIZON


def test_question_types(data):
    qs = data["queries"]
    assert {q["qtype"] for q in qs} == set(QUESTION_TYPES)
    groups = defaultdict(list)
    for q in qs:
        segs = data["traj"][(q["video_id"], q["object_id"])]
        assert q["subject"] in q["question"]
        if q["qtype"] == "Q1":
            assert q["horizon"] == 1
        elif q["qtype"] in ("Q2", "Q5"):
            assert q["horizon"] == len(segs) - 1
        elif q["qtype"] == "Q3":
            t = q["prefix_end"] + q["k_seconds"]
            active = [s for s in segs if s["start"] <= t < s["end"] or (s is segs[-1] and t <= s["end"])]
            assert active[0]["start"] == q["target_time"]
        elif q["qtype"] == "Q4":
            anchor = segs[q["horizon"] + 1]
            assert q["anchor_state"] == anchor["state"] and anchor["state"] in q["question"]
            assert anchor["state"] not in [s["state"] for s in segs[1: q["horizon"] + 1]]
        if q["qtype"] == "Q5":
            groups[q["group_id"]].append(q)
        else:
            assert q["group_id"] is None
        assert (q["k_seconds"] is not None) == (q["qtype"] == "Q3")
        assert (q["anchor_state"] is not None) == (q["qtype"] == "Q4")
    assert groups
    for members in groups.values():
        assert 2 <= len(members) <= 3 and len({q["video_id"] for q in members}) == 1
        for q in members:
            assert all(m["subject"] in q["question"] for m in members)


def test_splits_are_video_disjoint(data):
    split_of = defaultdict(set)
    for q in data["queries"]:
        split_of[q["video_id"]].add(q["split"])
    assert all(len(s) == 1 for s in split_of.values())
    n = Counter(next(iter(s)) for s in split_of.values())
    assert set(n) == set(SPLITS) and n["train"] > n["val"] and n["train"] > n["test"]


def test_gt_pools_match_the_corpus(data):
    by_id, corpus = data["by_id"], data["corpus"]
    by_state = defaultdict(list)
    for s in corpus:
        by_state[s["state"]].append(s["id"])
    for q in data["queries"]:
        pools, vid, dom, state = q["gt_pools"], q["video_id"], q["domain"], q["target_state"]
        segs = [by_id[i] for i in pools["in_video"]]
        assert all(s["video_id"] == vid and s["state"] == state for s in segs)
        own = data["traj"][(vid, q["object_id"])][q["horizon"]]["id"]
        assert own in pools["in_video"]
        assert all(by_id[i]["video_id"] != vid and by_id[i]["domain"] == dom and by_id[i]["state"] == state
                   for i in pools["in_dataset"])
        assert all(by_id[i]["domain"] != dom and by_id[i]["state"] == state for i in pools["cross_dataset"])
        # the tiers partition every segment of the target state
        assert sorted(pools["in_video"] + pools["in_dataset"] + pools["cross_dataset"]) == sorted(by_state[state])
        near = set(neighbours(state))
        assert all(by_id[i]["state"] in near and by_id[i]["video_id"] != vid for i in pools["bge_similar"])
        main = set(pools["in_dataset"] + pools["cross_dataset"])
        assert set(pools["consensus"]) <= main
        assert all(by_id[i]["state_type1"] == q["target_state_type1"] and by_id[i]["video_id"] != vid
                   for i in q["gt_type1"])
        assert q["fair"] == bool(main)
    assert sum(q["fair"] for q in data["queries"]) >= 0.8 * len(data["queries"])
    assert any(q["gt_pools"]["cross_dataset"] for q in data["queries"])
    assert any(q["gt_type1"] for q in data["queries"])


# --- difficulty --------------------------------------------------------------------------------------------

def test_domains_look_different(data):
    """The same state looks different across families: a nearest-centroid domain classifier on the `pixels`
    features of segments is far above chance (25 %)."""
    table = load_table(data["root"], "pixels", "corpus")
    x = np.asarray(table.array)
    dom = np.array([s["domain"] for s in data["corpus"]])
    names = sorted(set(dom))
    centroids = np.stack([x[dom == d].mean(0) for d in names])
    pred = np.array(names)[np.argmax(x @ centroids.T, axis=1)]
    assert (pred == dom).mean() > 0.8


def _recall_at_5(scores: np.ndarray, exclude: np.ndarray, hits: np.ndarray) -> bool:
    scores = np.where(exclude, -np.inf, scores)
    top = np.argsort(-scores, kind="stable")[:5]
    return bool(hits[top].any())


def test_persistence_does_not_solve_it(data):
    """Copy-the-present (the last prefix frame's `pixels` feature retrieves over the corpus, own video excluded)
    rarely hits the main GT pool, against a visual oracle (the target state's mean feature) and the state-text
    oracle (pick segments of the true state), over the fair queries."""
    root = data["root"]
    corpus = load_table(root, "pixels", "corpus")
    prefixes = load_table(root, "pixels", "prefixes")
    x, p = np.asarray(corpus.array), np.asarray(prefixes.array)
    row = prefixes.index()
    video = np.array([s["video_id"] for s in data["corpus"]])
    state = np.array([s["state"] for s in data["corpus"]])
    ids = np.array(corpus.ids)
    rng = np.random.default_rng(0)
    r = Counter()
    fair = [q for q in data["queries"] if q["fair"]]
    for q in fair:
        own = video == q["video_id"]
        hits = np.isin(ids, q["gt_pools"]["in_dataset"] + q["gt_pools"]["cross_dataset"])
        r["persistence"] += _recall_at_5(x @ p[row[q["prefix_id"]], -1], own, hits)
        proto = x[(state == q["target_state"]) & ~own].mean(0)
        r["visual_oracle"] += _recall_at_5(x @ proto, own, hits)
        r["text_oracle"] += _recall_at_5((state == q["target_state"]).astype(np.float32), own, hits)
        r["random"] += _recall_at_5(rng.random(len(ids)), own, hits)
    rec = {k: v / len(fair) for k, v in r.items()}
    assert rec["text_oracle"] == 1.0
    assert rec["persistence"] < 0.5
    assert rec["visual_oracle"] - rec["persistence"] > 0.3
    # closer to chance than to the visual oracle
    assert rec["persistence"] - rec["random"] < 0.5 * (rec["visual_oracle"] - rec["random"])
