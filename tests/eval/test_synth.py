"""The synthetic benchmark (eval.synth + its canonicalization): states, describers, determinism, protocol, leakage,
GT mining and verification, the canonicalization record, the card."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from eval.card import (
    SLOTS,
    canonicalization_errors,
    chance_recall,
    label_scores,
    make_card,
    present_table_shares,
    tail_exponent,
)
from eval.features import load_table, read_meta
from eval.io import read_json, read_jsonl
from eval.schema import MAX_HORIZON, PREFIX_FRAMES, QUESTION_TYPES, SPLITS
from eval.segments import SegmentTimeline
from eval.synth import build_benchmark, scenes, simspace
from eval.synth import prefix as P
from eval.synth.build import read_denotations
from eval.synth.lexicon import CORPUS, HELD_OUT, SHAPES, TrueState, corpus_words, describe, reference_text, satisfies
from eval.synth.paraphrase import paraphrase
from eval.synth.record import load_npz
from eval.synth.states import MIN_SEGMENT_S, frame_attributes, smooth, trajectories
from eval.synth.video import frame_path

ROOT = Path(__file__).resolve().parents[2]
_OPAQUE = re.compile(r"^frames/(v[0-9a-f]{10})/[0-9a-f]{12}\.jpg$")


def _load(root: Path) -> dict:
    queries = read_jsonl(root / "queries.jsonl")
    corpus = read_jsonl(root / "corpus.jsonl")
    traj = defaultdict(list)  # (video, object) -> segments in time order
    for s in corpus:
        traj[(s["video_id"], s["object_id"])].append(s)
    timeline = SegmentTimeline([s["video_id"] for s in corpus], [s["object_id"] for s in corpus],
                               [s["start"] for s in corpus], [s["end"] for s in corpus])
    return {"root": root, "manifest": read_json(root / "manifest.json"), "queries": queries, "corpus": corpus,
            "states": read_jsonl(root / "states.jsonl"), "by_id": {s["id"]: s for s in corpus}, "traj": traj,
            "timeline": timeline}


def _target(data: dict, q: dict) -> dict:
    """The query's target segment: its object's segment active at ``target_time``."""
    return data["corpus"][data["timeline"].active(q["video_id"], q["object_id"], q["target_time"])]


def _current(data: dict, q: dict) -> dict:
    """The segment the query's prefix ends in (its object's current state)."""
    return data["corpus"][data["timeline"].active(q["video_id"], q["object_id"], q["prefix_end"])]


@pytest.fixture(scope="module")
def truth(synth_truth_dir):
    return _load(Path(synth_truth_dir))


@pytest.fixture(scope="module")
def final(synth_dir):
    return _load(Path(synth_dir))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.parts}


# --- words ---------------------------------------------------------------------------------------------------

STATES = [TrueState("rolling", "floor", "next_to", "ball"),
          TrueState("at_rest", "on_object", "", "cube", "upside_down"),
          TrueState("crashing", "table", "", "domino"), TrueState("falling", "over_container"),
          TrueState("at_rest", "floor", "leaning", "plank", "tilted")]


@pytest.mark.parametrize("state", STATES, ids=lambda s: s.key)
def test_describers_denote_what_they_say(state):
    rng = np.random.default_rng(0)
    for lex in (CORPUS, HELD_OUT):
        forms = set()
        for _ in range(40):
            phrase, den = describe(state, rng, lex)
            forms.add(phrase)
            assert den["motion"] == state.motion and satisfies(state, den)
            assert phrase and phrase == phrase.strip() and "{" not in phrase
            if lex is CORPUS:  # a paraphrase says the same values in other words
                assert paraphrase(den, rng) != phrase
        assert len(forms) >= 4  # many surface forms per state
    assert TrueState.from_key(state.key) == state
    assert reference_text(state).split()[0] in " ".join(CORPUS.motion[state.motion])


def test_held_out_lexicon_is_disjoint_from_the_corpus():
    held = set()
    for table in (HELD_OUT.motion, HELD_OUT.place, HELD_OUT.relation, HELD_OUT.pose):
        for forms in table.values():
            for f in forms:
                held |= set(f.replace("{o}", "").replace("'s", "").split())
    function_words = {"the", "a", "of", "in", "into", "on", "to", "at", "by", "up", "with", "down", "its", "and",
                      "from"}
    assert not (held & corpus_words()) - function_words
    for shape, nouns in HELD_OUT.shape_nouns.items():
        assert not set(nouns) & set(CORPUS.shape_nouns[shape])


def test_satisfies_reads_the_other_object_by_its_kind():
    s = TrueState("at_rest", "floor", "next_to", "ball")
    assert satisfies(s, {"relation": "next_to", "other": "ball"})
    assert not satisfies(s, {"other": "cube"})
    assert not satisfies(s, {"relation": "touching", "other": "ball"})
    assert not satisfies(s, {"motion": "rolling"})
    # a description names the other object by its kind only: never a size or a colour
    rng = np.random.default_rng(0)
    for _ in range(20):
        phrase, den = describe(s, rng, CORPUS)
        assert den.get("other", "ball") == "ball" and not {"red", "small", "large"} & set(phrase.split())
    # a place is true of its parts: "on the floor" of an object on the floor by the table, not the reverse
    by_table = TrueState("at_rest", "floor_table")
    assert satisfies(by_table, {"place": "floor"}) and not satisfies(s, {"place": "floor_table"})
    assert satisfies(TrueState("sliding", "table_edge"), {"place": "table"})


# --- states from the simulator -----------------------------------------------------------------------------

def test_smoothing_merges_flicker_and_short_runs():
    a, b, c = 0, 1, 2
    flicker = np.array([a] * 10 + [b] * 2 + [a] * 10 + [c] * 1 + [b] * 8)
    runs = smooth(flicker, 4)
    assert [r[0] for r in runs] == [a, b] and runs[0] == (a, 0, 23) and runs[-1][2] == len(flicker)
    assert smooth(np.array([a] * 6 + [b] * 6), 4) == [(a, 0, 6), (b, 6, 12)]
    assert all(r[2] - r[1] >= 4 for r in smooth(np.arange(40) % 3, 4))


def test_a_dropped_ball_falls_bounces_and_rests():
    """Real physics through the labeller: a ball released above the floor falls, bounces, ends at rest."""
    world = scenes.World("container")
    spec = scenes.ObjectSpec("o0", "red", "ball", (24.0, 24.0))
    world.add_object(spec, (200.0, 220.0), release=0.5)
    world.add_object(scenes.ObjectSpec("o1", "blue", "cube", (20.0, 20.0)), (320.0, scenes.FLOOR_Y + 10.5))
    rec = world.run(5.0)
    motions = [s.state.motion for s in trajectories(rec)[0]]
    assert motions[0] == "hanging" and "falling" in motions and motions[-1] == "at_rest"
    assert motions.index("falling") < len(motions) - 1
    attrs = frame_attributes(rec)
    assert attrs["place"][-1, 0] == "floor" and attrs["motion"][-1, 1] == "at_rest"
    assert attrs["pose"][-1, 1] == "upright" and attrs["pose"][-1, 0] == ""  # round shapes have no pose


def test_every_family_runs_and_moves_things():
    for family in scenes.families():
        moved = 0
        for seed in range(3):
            rec = scenes.simulate(family, np.random.default_rng(seed))
            assert np.isfinite(rec.pos).all() and rec.n_objects >= 2
            moved += sum(len(t) >= 2 for t in trajectories(rec))
        assert moved >= 2, family
    mixtures = scenes.domain_mixtures()
    assert set(scenes.families()) == {f for mix in mixtures.values() for f in mix}
    for family in scenes.families():  # every family in at least two domains: states cross domains
        assert sum(family in mix for mix in mixtures.values()) >= 2


# --- determinism and files -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_build_is_byte_identical_and_worker_independent(tmp_path):
    a = build_benchmark(tmp_path / "a", videos=8, seed=5, workers=1, progress=False)
    b = build_benchmark(tmp_path / "b", videos=8, seed=5, workers=2, progress=False)
    fa, fb = _files(a), _files(b)
    assert fa.keys() == fb.keys()
    assert [k for k in fa if fa[k] != fb[k]] == []
    assert any(k.startswith("frames/") for k in fa) and "sim/phrases.jsonl" in fa
    c = build_benchmark(tmp_path / "c", videos=8, seed=6, workers=1, progress=False)
    assert _files(c)["corpus.jsonl"] != fa["corpus.jsonl"]
    assert _files(build_benchmark(a, videos=8, seed=5, workers=1, progress=False)) == fa
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_benchmark(tmp_path / "foreign", videos=8, progress=False)
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_build_stops_its_workers_and_leaves_nothing(tmp_path, sig):
    """A Ctrl-C (or a ``pkill``) reaches the command and its pool workers at once: the command ends at once with
    128 + the signal, no worker is left, and neither the benchmark nor its staging folder remains."""
    out = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, "-m", "eval", "synth", "--out", str(out), "--videos", "300", "--workers",
                             "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while not any(p.is_dir() and any(p.iterdir()) for p in tmp_path.glob(".b.building-*/frames")):
        assert proc.poll() is None and time.monotonic() - t0 < 300, "the build never started its videos"
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    try:
        text = proc.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig and f"interrupted by {signal.Signals(sig).name}" in text, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    with pytest.raises(ProcessLookupError):  # no worker left in the command's process group
        os.killpg(proc.pid, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_query_videos_keep_the_corpus_whole(tmp_path):
    d = build_benchmark(tmp_path / "q", videos=12, query_videos=4, seed=1, workers=1, progress=False)
    data = _load(d)
    assert len({s["video_id"] for s in data["corpus"]}) == 12
    assert len({q["video_id"] for q in data["queries"]}) <= 4
    assert data["manifest"]["extra"]["query_videos"] == 4


def test_truth_build_files(truth, synth_truth_dir):
    m, root = truth["manifest"], truth["root"]
    assert m["name"] == "psr-synth-truth" and m["domains"] == list(scenes.DOMAINS)
    assert m["counts"]["corpus"] == len(truth["corpus"]) and m["counts"]["queries"] == len(truth["queries"])
    assert m["counts"]["states"] == len(truth["states"]) == len({s["sim_state"] for s in truth["corpus"]})
    # one state a true state; its text is the reference rendering; members are the raw descriptions used
    members = defaultdict(set)
    for s in truth["corpus"]:
        members[s["sim_state"]].add(s["raw"])
        assert s["state"] == reference_text(TrueState.from_key(s["sim_state"]))
    by_text = {st["text"]: st for st in truth["states"]}
    for key, raws in members.items():
        st = by_text[reference_text(TrueState.from_key(key))]
        assert set(st["members"]) == raws
    # every raw description's recorded denotation is true of its segment
    den = read_denotations(root)
    for s in truth["corpus"]:
        assert satisfies(TrueState.from_key(s["sim_state"]), den[s["raw"]])
    corpus = load_table(root, "pixels", "corpus")
    assert corpus.ids == [s["id"] for s in truth["corpus"]]
    # every segment and prefix frame knows where its object is (the visual spaces' object windows)
    w, h = truth["manifest"]["extra"]["image_size"]
    assert all(0 <= s["box"][0] <= s["box"][2] <= w and 0 <= s["box"][1] <= s["box"][3] <= h for s in truth["corpus"])
    assert all(len(q["prefix_boxes"]) == PREFIX_FRAMES for q in truth["queries"])
    assert np.allclose(np.linalg.norm(corpus.array, axis=-1), 1, atol=1e-4)
    rec = load_npz(root / "sim" / f"{truth['corpus'][0]['video_id']}.npz")
    assert rec.domain in scenes.DOMAINS and rec.family in scenes.families()
    assert rec.support_other.shape == rec.support.shape and rec.kin_pose.shape[0] == rec.n_frames


def test_segments_tile_each_trajectory(truth):
    fps = truth["manifest"]["extra"]["fps"]
    for segs in truth["traj"].values():
        assert segs[0]["start"] == 0.0
        for prev, nxt in zip(segs, segs[1:], strict=False):
            assert prev["end"] == nxt["start"] and prev["sim_state"] != nxt["sim_state"]
        for s in segs:
            assert s["end"] - s["start"] >= MIN_SEGMENT_S - 1 / fps - 1e-9
            assert (truth["root"] / s["frame"]).is_file() and _OPAQUE.match(s["frame"])


def test_ids_and_paths_are_opaque(truth):
    """Video ids, segment ids and frame names are hashes, and object ids a per-video permutation: none carries a
    video's index, a segment's position in its trajectory or an object's role in its scene."""
    assert all(re.fullmatch(r"v[0-9a-f]{10}", s["video_id"]) for s in truth["corpus"])
    assert all(re.fullmatch(r"s[0-9a-f]{12}", s["id"]) for s in truth["corpus"])
    assert all(_OPAQUE.match(p).group(1) == q["video_id"] for q in truth["queries"] for p in q["prefix_frames"])
    # o0 is not always the same role (the striker, the first object placed): its first state varies with the scene
    first = Counter(segs[0]["sim_state"].split("|")[0] for (v, o), segs in truth["traj"].items() if o == "o0")
    assert len(first) >= 3


# --- protocol ------------------------------------------------------------------------------------------------

def _prefix_frame_indices(q: dict, fps: float) -> tuple[int, ...]:
    return P.prefix_frames(int(round(q["prefix_end"] * fps)), fps)


@pytest.mark.parametrize("which", ["truth", "final"])
def test_no_leakage(which, request):
    data = request.getfixturevalue(which)
    fps = data["manifest"]["extra"]["fps"]
    members = {st["text"]: st["members"] for st in data["states"]}
    for q in data["queries"]:
        target, current = _target(data, q), _current(data, q)
        assert q["target_time"] > q["prefix_end"] and target["start"] <= q["target_time"] <= target["end"]
        if target["id"] != current["id"]:  # a state after the prefix: it starts after the prefix ends
            assert target["start"] > q["prefix_end"]
        frames = _prefix_frame_indices(q, fps)
        assert [frame_path(q["video_id"], f) for f in frames] == q["prefix_frames"]
        assert len(set(frames)) == PREFIX_FRAMES and frames[0] / fps == pytest.approx(q["prefix_start"], abs=1e-3)
        assert all(e["t"] < q["target_time"] for e in q["transcript"])
        words = f" {' '.join(re.sub(r'[?,.]', ' ', q['question'].lower()).split())} "
        assert not [m for m in members[q["target_state"]] if f" {m.lower()} " in words], q["id"]
    split_of = defaultdict(set)
    for q in data["queries"]:
        split_of[q["video_id"]].add(q["split"])
    assert all(len(s) == 1 for s in split_of.values())
    assert set(Counter(next(iter(s)) for s in split_of.values())) == set(SPLITS)


def test_prefixes_end_in_motion_and_the_future_may_persist(truth, synth_truth_dir):
    """The prefix ends while the object, or a body touching it or heading for it, moves (`eval.synth.prefix`), a
    gap of `GAP_S` before its next change; some targets are the current state persisting (a Q3 asked inside it)."""
    fps = truth["manifest"]["extra"]["fps"]
    engaged, persist, gaps = [], 0, []
    records = {}
    for q in truth["queries"]:
        rec = records.get(q["video_id"]) or load_npz(Path(synth_truth_dir) / "sim" / f"{q['video_id']}.npz")
        records = {q["video_id"]: rec}
        k = [str(x) for x in rec.object_ids].index(q["object_id"])
        engaged.append(bool(P.engaged(rec)[int(round(q["prefix_end"] * fps)), k]))
        target, current = _target(truth, q), _current(truth, q)
        persist += target["id"] == current["id"]
        if target["id"] == current["id"]:
            assert q["qtype"] == "Q3" and q["horizon"] == 1
        if q["qtype"] == "Q1":
            gaps.append(target["start"] - q["prefix_end"])
    assert np.mean(engaged) >= 0.8
    assert 0.03 <= persist / len(truth["queries"]) <= 0.3
    assert P.GAP_S[0] - 1 / fps - 1e-9 <= min(gaps) and max(gaps) <= P.GAP_S[1] + 1 / fps + 1e-9
    assert np.median(gaps) >= 0.6
    main = [q for q in truth["queries"] if q["qtype"] != "Q5"]
    h = Counter(min(q["horizon"], 5) for q in main)
    assert 0.45 <= h[1] / len(main) <= 0.68
    assert h[5] > 0 and h[5] < h[4] + h[5] + h[3]


def test_question_types(truth):
    den = read_denotations(truth["root"])
    groups = defaultdict(list)
    assert {q["qtype"] for q in truth["queries"]} == set(QUESTION_TYPES)
    for q in truth["queries"]:
        segs = truth["traj"][(q["video_id"], q["object_id"])]
        target, current = _target(truth, q), _current(truth, q)
        ti, ci = segs.index(target), segs.index(current)
        assert target["state"] == q["target_state"] and q["horizon"] == max(ti - ci, 1)
        assert 1 <= q["horizon"] <= MAX_HORIZON and q["subject"] in q["question"]
        if q["qtype"] == "Q1":
            assert ti == ci + 1 and q["target_time"] == target["start"]
        elif q["qtype"] in ("Q2", "Q5"):
            assert ti == len(segs) - 1 and ti > ci
        elif q["qtype"] == "Q3":
            t = q["prefix_end"] + q["k_seconds"]
            assert target["start"] <= t <= target["end"]
        elif q["qtype"] == "Q4":
            anchor = segs[ti + 1]
            assert q["anchor_state"] in q["question"]
            a_state = TrueState.from_key(anchor["sim_state"])
            assert satisfies(a_state, den[q["anchor_state"]])
            assert a_state.motion != TrueState.from_key(target["sim_state"]).motion
        if q["qtype"] == "Q5":
            groups[q["group_id"]].append(q)
    assert groups and all(2 <= len(m) <= 3 for m in groups.values())
    ids = [q["id"] for q in truth["queries"]]
    assert len(ids) == len(set(ids))


def test_truth_gt_is_exact(truth):
    by_id = truth["by_id"]
    by_state = defaultdict(list)
    for s in truth["corpus"]:
        by_state[s["sim_state"]].append(s["id"])
    for q in truth["queries"]:
        p = q["gt_pools"]
        target = _target(truth, q)
        assert sorted(p["in_video"] + p["in_dataset"] + p["cross_dataset"]) == sorted(by_state[target["sim_state"]])
        assert sorted(q["gt_sim_exact"]) == sorted(p["in_dataset"] + p["cross_dataset"])
        assert all(by_id[i]["domain"] == q["domain"] for i in p["in_dataset"])
        assert all(by_id[i]["domain"] != q["domain"] for i in p["cross_dataset"])


def test_sim_space_is_the_prefix_state_and_nothing_after(truth, synth_truth_dir):
    """The ``sim`` prefix space: one token per prefix frame, the object's exact state at that frame (recomputed from
    the record), z-scored; a record whose future is scrambled gives the same tokens."""
    root = Path(synth_truth_dir)
    meta = read_meta(root, simspace.NAME)
    assert meta["kind"] == "prefix" and meta["normalized"] is False and meta["dim"] == simspace.DIM
    table = load_table(root, simspace.NAME, "prefixes")
    assert table.array.shape[1:] == (PREFIX_FRAMES, simspace.DIM)
    assert set(table.ids) == {q["prefix_id"] for q in truth["queries"]}
    mean, std = np.asarray(meta["mean"]), np.asarray(meta["std"])
    fps = truth["manifest"]["extra"]["fps"]
    q = truth["queries"][0]
    rec = load_npz(root / "sim" / f"{q['video_id']}.npz")
    k = [str(x) for x in rec.object_ids].index(q["object_id"])
    frames = _prefix_frame_indices(q, fps)
    raw = simspace.prefix_tokens(rec, frames, k)
    got = table.array[table.ids.index(q["prefix_id"])] * std + mean
    assert np.allclose(got, raw, atol=1e-3)
    end = frames[-1]
    future = {n: getattr(rec, n).copy() for n in ("pos", "vel", "angle", "angvel", "touch", "contacts", "support")}
    for a in future.values():
        a[end + 1:] = np.roll(a[end + 1:], 7, axis=0) if len(a) > end + 8 else a[end + 1:]
    from dataclasses import replace
    assert np.array_equal(simspace.prefix_tokens(replace(rec, **future), frames, k), raw)


# --- the canonicalized benchmark -----------------------------------------------------------------------------

def test_canonicalized_benchmark(final, truth):
    from retrieval.synth import MINE_BUDGET

    assert final["manifest"]["name"] == "psr-synth"
    canon = final["manifest"]["extra"]["canonicalization"]
    mining = canon["mining"]
    assert mining["budget"] == MINE_BUDGET and mining["verify"] is True
    assert 0.6 <= mining["precision"]["main"] <= 1.0
    errors = canon["canonicalization_errors"]
    assert errors["true_states"] == len({s["sim_state"] for s in final["corpus"]})
    assert errors == pytest.approx(canonicalization_errors([s["state_id"] for s in final["corpus"]],
                                                           [s["sim_state"] for s in final["corpus"]]))
    by_id = final["by_id"]
    truth_by_id = truth["by_id"]
    for q in final["queries"]:
        p = q["gt_pools"]
        for tier in ("in_dataset", "cross_dataset", "bge_similar"):
            assert len(p[tier]) <= MINE_BUDGET
        assert all(by_id[i]["state_id"] == q["target_state_id"] and by_id[i]["video_id"] != q["video_id"]
                   for i in p["in_dataset"] + p["cross_dataset"])
        assert set(p["consensus"]) <= set(p["in_dataset"] + p["cross_dataset"])
        target = _target(final, q)
        assert sorted(q["gt_sim_exact"]) == sorted(
            i for i, s in by_id.items() if s["sim_state"] == target["sim_state"] and s["video_id"] != q["video_id"])
        assert q["fair"] == bool(p["in_dataset"] or p["cross_dataset"])
    # segments keep their truth and their raw description; only the canonical state changed
    assert all(by_id[i]["sim_state"] == truth_by_id[i]["sim_state"] and by_id[i]["raw"] == truth_by_id[i]["raw"]
               for i in by_id)
    assert len({s["state_id"] for s in final["corpus"]}) < len({s["sim_state"] for s in final["corpus"]}) * 1.5


def test_mining_keeps_the_most_similar_and_verification_is_seeded():
    from retrieval.canon.mining import Judge, Verifier, mine_verified

    vec = np.eye(6, dtype=np.float32)
    vec[1] = vec[0] * 0.9 + vec[1] * 0.1
    vec[2] = vec[0] * 0.5 + vec[2] * 0.5
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    pools = [{"in_video": np.array([0]), "in_dataset": np.array([5, 2, 1]), "cross_dataset": np.array([4, 3]),
              "bge_similar": np.array([], np.int64), "consensus": np.array([], np.int64), "gt_type1": np.array([])}]
    seg_state = np.zeros(6, np.int64)
    out, stats = mine_verified(pools, np.array([0]), seg_state, vec, np.ones(6, bool), 2, None, Verifier())
    assert out[0]["in_dataset"].tolist() == [1, 2]  # the two most similar to the target row 0
    assert stats["mined"]["in_dataset"] == 2
    keys = ["at_rest|floor|||"] * 3 + ["rolling|floor|||"] * 3
    judge = Judge(keys, [{"motion": "at_rest", "place": "floor"}])
    runs = [mine_verified(pools, np.array([0]), seg_state, vec, np.ones(6, bool), None, judge, Verifier(seed=s))
            for s in (0, 0, 1)]
    assert [r[0][0]["in_dataset"].tolist() for r in runs[:2]] == [runs[0][0][0]["in_dataset"].tolist()] * 2
    ok, share = judge.agreement(0, np.array([1, 4]))
    assert ok.tolist() == [True, False] and share.tolist() == [1.0, 0.5]
    strict = Verifier(tpr=1.0, fpr=0.0)
    out, stats = mine_verified(pools, np.array([0]), seg_state, vec, np.ones(6, bool), None, judge, strict)
    assert out[0]["in_dataset"].tolist() == [1, 2] and out[0]["cross_dataset"].tolist() == []
    assert stats["precision"]["main"] == 1.0


# --- the card ------------------------------------------------------------------------------------------------

def test_chance_recall_is_exact():
    n, g, k = 9, 2, 3
    hits = sum(bool(set(c) & {0, 1}) for c in combinations(range(n), k))
    assert chance_recall(np.array([n]), np.array([g]), k=k)[0] == pytest.approx(hits / math.comb(n, k))
    assert np.isnan(chance_recall(np.array([10]), np.array([0]))[0])


def test_tail_exponent_of_an_exact_zipf():
    sizes = np.round(1000.0 / np.arange(1, 200) ** 1.2)
    assert tail_exponent(sizes) == pytest.approx(1.2, abs=0.05)


def test_card(synth_dir, final):
    card = make_card(synth_dir)
    v = card.rows
    assert v["segments"] == len(final["corpus"])
    assert v["states"] == len({s["state_id"] for s in final["corpus"]})
    assert 0 < v["top_state_share"] <= 1 and v["segments_per_state_median"] >= 1
    assert sum(v[f"h{h}_share"] for h in range(1, 6)) == pytest.approx(1.0)
    assert v["gap_median_s"] > 0 and 0 <= v["chance_r5_pct"] <= 100
    assert "true states split across canonical states" in v
    assert 0 < v["label_truth"] <= 1 and 0 < v["same_state_agreement"] <= 1 and 0.8 <= v["prefix_motion_share"] <= 1
    shares = [v[f"{a}_from_present_share"] for a in ("motion", "place", "relation", "other", "pose", "state")]
    assert all(0 <= x <= 1 for x in shares) and shares[-1] <= max(shares[:-1])
    assert v["fair_test_queries"] == sum(q["fair"] and q["split"] == "test" and q["qtype"] != "Q5"
                                         for q in final["queries"])
    assert "| segments |" in card.markdown() and card.paper["segments"] == 218_276


def test_domain_is_not_readable_from_the_background(final):
    """Looks, cameras and palettes are drawn independently of the domain: a nearest-centroid domain classifier on
    the `pixels` features of segments stays near chance (25 %)."""
    x = np.asarray(load_table(final["root"], "pixels", "corpus").array)
    dom = np.array([s["domain"] for s in final["corpus"]])
    names = sorted(set(dom))
    order = {v: i for i, v in enumerate(sorted({s["video_id"] for s in final["corpus"]}))}
    train = np.array([order[s["video_id"]] % 2 == 0 for s in final["corpus"]])  # video-disjoint halves
    centroids = np.stack([x[train & (dom == d)].mean(0) for d in names])
    pred = np.array(names)[np.argmax(x[~train] @ centroids.T, axis=1)]
    assert (pred == dom[~train]).mean() < 0.45


def test_label_scores_count_true_labels_and_shared_pairs():
    """Three segments of one true state: two share a canonical state whose text says what they are, one sits in a
    state whose text is false of it; a fourth segment's text has no recorded denotation (not counted)."""
    key = TrueState("rolling", "floor").key
    den = {"rolling on the floor": {"motion": "rolling", "place": "floor"},
           "resting on the floor": {"motion": "at_rest", "place": "floor"}}
    q = label_scores([key, key, key, TrueState("at_rest", "table").key],
                     ["rolling on the floor", "rolling on the floor", "resting on the floor", "unknown text"],
                     ["c0", "c0", "c1", "c2"], den)
    assert q["label_truth"] == pytest.approx(2 / 3)
    assert q["same_state_agreement"] == pytest.approx(1 / 3)  # 3 pairs in the true state, 1 shares a label


def test_present_table_shares_count_what_the_present_decides():
    """Targets decided by the current state score 1; a current state unseen in training falls back to the
    (question type, horizon) table; a count tie goes to the lexically first value; attributes are scored apart."""
    a, b = TrueState("rolling", "floor").key, TrueState("at_rest", "floor").key
    c, d = TrueState("crashing", "table", other="ball").key, TrueState("at_rest", "table").key
    train = [(a, "Q1", 1, b), (a, "Q1", 1, b), (c, "Q1", 1, d), (c, "Q1", 1, a)]
    shares = present_table_shares(train, [(a, "Q1", 1, b)])
    assert set(shares) == {f"{x}_from_present_share" for x in (*SLOTS, "state")} and set(shares.values()) == {1.0}
    tie = present_table_shares(train, [(c, "Q1", 1, d)])  # 1 vs 1: "at_rest|table..." < "rolling|floor..."
    assert tie["state_from_present_share"] == 1.0
    unseen = present_table_shares(train, [(TrueState("sliding", "ramp_upper").key, "Q1", 1, b)])
    assert unseen["state_from_present_share"] == 1.0  # (Q1, h1): b twice, d once, a once
    wrong = present_table_shares(train, [(a, "Q1", 1, TrueState("at_rest", "table").key)])
    assert wrong["state_from_present_share"] == 0 and wrong["motion_from_present_share"] == 1
    assert wrong["place_from_present_share"] == 0


def test_shapes_cover_the_lexicon():
    assert set(SHAPES) == set(CORPUS.shape_nouns) == set(HELD_OUT.shape_nouns)


# --- side channels -------------------------------------------------------------------------------------------

def _numbers(text: str) -> float:
    """A string read as a number: its decimal digits, else its hex digits (0 when it has none)."""
    digits = re.sub(r"\D", "", text)
    if digits:
        return float(int(digits[:15]))
    hexd = re.sub(r"[^0-9a-f]", "", text.lower())
    return float(int(hexd[:15], 16)) if hexd else 0.0


def _ranker_vectors(q_values: list[str], c_values: list[str], how: str) -> tuple[np.ndarray, np.ndarray]:
    """Query and item vectors whose dot product ranks corpus items by one field against the query's field:
    ``equal`` (same value), ``near`` (numbers read from the strings, nearest first) or ``order`` (nearest in
    sorted order)."""
    if how == "equal":
        cats = {v: i for i, v in enumerate(sorted(set(q_values) | set(c_values)))}
        qv, cv = np.zeros((len(q_values), len(cats)), np.float32), np.zeros((len(c_values), len(cats)), np.float32)
        qv[np.arange(len(q_values)), [cats[v] for v in q_values]] = 1
        cv[np.arange(len(c_values)), [cats[v] for v in c_values]] = 1
        return qv, cv
    if how == "near":
        a, b = np.array([_numbers(v) for v in q_values]), np.array([_numbers(v) for v in c_values])
    else:
        order = {v: i for i, v in enumerate(sorted(set(q_values) | set(c_values)))}
        a, b = np.array([order[v] for v in q_values], float), np.array([order[v] for v in c_values], float)
    scale = max(float(np.abs(np.concatenate([a, b])).max()), 1.0)
    a, b = a / scale, b / scale
    # -(b - a)^2 = 2ab - b^2 - a^2: query [2a, -1, -a^2] . item [b, b^2, 1]
    return (np.stack([2 * a, -np.ones_like(a), -a * a], 1).astype(np.float32),
            np.stack([b, b * b, np.ones_like(b)], 1).astype(np.float32))


def _r5(bench, rows, qv, cv) -> np.ndarray:
    from eval.metrics import RankStats, recall_at_k
    from eval.scoring import DenseSource, score_benchmark

    run = score_benchmark(bench, DenseSource(qv, cv), rows, method="side-channel", progress=False)
    return recall_at_k(RankStats.from_run(run, "type2-all"), 5), run


def _fixed_ranking_null(bench, rows, draws: int = 4000, seed: int = 0) -> np.ndarray:
    """R@5 of rankings that put the same 5 random corpus items first for every query (a field whose values carry
    nothing about the query, read as one order): ``draws`` samples of that null distribution."""
    cd, qd = bench.corpus_ds, bench.queries_ds.select(rows)
    index = {s: i for i, s in enumerate(cd["id"][:])}
    hit = np.zeros((len(cd), len(rows)), bool)
    for j, p in enumerate(qd["gt_pools"][:]):
        hit[[index[s] for s in p["in_dataset"] + p["cross_dataset"]], j] = True
    rng = np.random.default_rng(seed)
    return np.array([hit[rng.choice(len(cd), 5, replace=False)].any(0).mean() for _ in range(draws)])


def test_no_id_name_or_path_ranks_better_than_chance(synth_dir, final):
    """Rank the corpus by every id, name or path field a forecaster sees (the query's id, prefix id, video id, object
    id and prefix frame paths against each segment's id, video id, object id and frame path), equal, nearest as
    numbers and nearest in sorted order: R@5 stays at the exact chance level (binomial bound; a field read as one order
    for every query is judged against fixed random orders instead). A field that does leak (the target's
    state id against the segments') is caught by the same harness."""
    from eval.benchmark import Benchmark
    from eval.schema import MAIN_QTYPES

    bench = Benchmark.load(synth_dir)
    rows = bench.query_rows("test", fair_only=True, qtypes=MAIN_QTYPES)
    qd, cd = bench.queries_ds.select(rows), bench.corpus_ds
    sizes = Counter(cd["video_id"][:])
    pools = qd["gt_pools"][:]
    chance = float(np.mean(chance_recall(np.array([len(cd) - sizes[v] for v in qd["video_id"][:]]),
                                         np.array([len(p["in_dataset"]) + len(p["cross_dataset"]) for p in pools]))))
    bound = chance + 3 * math.sqrt(chance * (1 - chance) / len(rows)) + 0.005
    query_fields = {"id": qd["id"][:], "prefix_id": qd["prefix_id"][:], "video_id": qd["video_id"][:],
                    "object_id": qd["object_id"][:], "last prefix frame": [f[-1] for f in qd["prefix_frames"][:]]}
    corpus_fields = {"id": cd["id"][:], "video_id": cd["video_id"][:], "object_id": cd["object_id"][:],
                     "frame": cd["frame"][:]}
    seen, null = {}, None
    for qf, qvals in query_fields.items():
        for cf, cvals in corpus_fields.items():
            for how in ("equal", "near", "order"):
                if how == "equal" and (qf == "object_id") != (cf == "object_id"):
                    continue  # only values of one kind can be equal
                hits, run = _r5(bench, rows, *_ranker_vectors(qvals, cvals, how))
                seen[(qf, cf, how)] = r5 = float(np.nanmean(hits))
                top = Counter(tuple(t[:5]) for t in run.topk_ids).most_common(1)[0][1] / len(rows)
                if top >= 0.9:  # one order for (nearly) every query: not binomial; the null of fixed random orders
                    if null is None:
                        null = _fixed_ranking_null(bench, rows)
                    assert r5 <= np.quantile(null, 0.999), (qf, cf, how, r5, chance)
                else:
                    assert r5 <= bound, (qf, cf, how, r5, chance)
    assert len(seen) >= 30
    leak = float(np.nanmean(_r5(bench, rows, *_ranker_vectors(qd["target_state_id"][:], cd["state_id"][:],
                                                               "equal"))[0]))
    assert leak > 10 * bound
