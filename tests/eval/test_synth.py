"""The synthetic benchmark (eval.synth + its canonicalization): states, describers, determinism, protocol, leakage,
GT mining and verification, the canonicalization record, the card."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from eval.card import canonicalization_errors, chance_recall, make_card, tail_exponent
from eval.features import load_table
from eval.io import read_json, read_jsonl
from eval.schema import MAX_HORIZON, PREFIX_FRAMES, QUESTION_TYPES, SPLITS
from eval.synth import build_benchmark, scenes
from eval.synth.build import read_denotations
from eval.synth.lexicon import CORPUS, HELD_OUT, SHAPES, TrueState, corpus_words, describe, reference_text, satisfies
from eval.synth.paraphrase import paraphrase
from eval.synth.record import load_npz
from eval.synth.states import MIN_SEGMENT_S, frame_attributes, smooth, trajectories
from eval.synth.video import PREFIX_GAP_S

_FRAME = re.compile(r"frames/(v\d+)/f(\d{4})\.jpg$")


def _load(root: Path) -> dict:
    queries = read_jsonl(root / "queries.jsonl")
    corpus = read_jsonl(root / "corpus.jsonl")
    traj = defaultdict(list)  # (video, object) -> segments in time order
    for s in corpus:
        traj[(s["video_id"], s["object_id"])].append(s)
    return {"root": root, "manifest": read_json(root / "manifest.json"), "queries": queries, "corpus": corpus,
            "states": read_jsonl(root / "states.jsonl"), "by_id": {s["id"]: s for s in corpus}, "traj": traj}


@pytest.fixture(scope="module")
def truth(synth_truth_dir):
    return _load(Path(synth_truth_dir))


@pytest.fixture(scope="module")
def final(synth_dir):
    return _load(Path(synth_dir))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.parts}


def _frame_time(path: str, fps: float) -> float:
    return int(_FRAME.search(path).group(2)) / fps


# --- words ---------------------------------------------------------------------------------------------------

STATES = [TrueState("rolling", "floor", "next_to", "small red ball", "", "quickly"),
          TrueState("at_rest", "on_object", "", "large blue cube", "upside_down"),
          TrueState("crashing", "table", "", "teal domino"), TrueState("falling", "over_container"),
          TrueState("at_rest", "floor", "leaning", "green plank", "tilted")]


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
    for table in (HELD_OUT.motion, HELD_OUT.place, HELD_OUT.relation, HELD_OUT.pose, HELD_OUT.manner):
        for forms in table.values():
            for f in forms:
                held |= set(f.replace("{o}", "").replace("'s", "").split())
    function_words = {"the", "a", "of", "in", "into", "on", "to", "at", "by", "up", "with", "down", "its", "and",
                      "from"}
    assert not (held & corpus_words()) - function_words
    for shape, nouns in HELD_OUT.shape_nouns.items():
        assert not set(nouns) & set(CORPUS.shape_nouns[shape])


def test_satisfies_reads_the_other_object_by_its_said_name():
    s = TrueState("at_rest", "floor", "next_to", "small red ball")
    assert satisfies(s, {"relation": "next_to", "other": "red ball"})
    assert satisfies(s, {"other": "small red ball"})
    assert not satisfies(s, {"other": "large red ball"})
    assert not satisfies(s, {"other": "blue ball"})
    assert not satisfies(s, {"motion": "rolling"})
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
    for family in scenes.FAMILIES:
        moved = 0
        for seed in range(3):
            rec = scenes.simulate(family, np.random.default_rng(seed))
            assert np.isfinite(rec.pos).all() and rec.n_objects >= 2
            moved += sum(len(t) >= 2 for t in trajectories(rec))
        assert moved >= 2, family
    assert set(scenes.FAMILIES) == {f for mix in scenes.DOMAIN_MIXTURES.values() for f in mix}
    for family in scenes.FAMILIES:  # every family in at least two domains: states cross domains
        assert sum(family in mix for mix in scenes.DOMAIN_MIXTURES.values()) >= 2


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
    assert rec.domain in scenes.DOMAINS and rec.family in scenes.FAMILIES
    assert rec.support_other.shape == rec.support.shape and rec.kin_pose.shape[0] == rec.n_frames


def test_segments_tile_each_trajectory(truth):
    fps = truth["manifest"]["extra"]["fps"]
    for segs in truth["traj"].values():
        assert segs[0]["start"] == 0.0
        for prev, nxt in zip(segs, segs[1:], strict=False):
            assert prev["end"] == nxt["start"] and prev["sim_state"] != nxt["sim_state"]
        for s in segs:
            assert s["end"] - s["start"] >= MIN_SEGMENT_S - 1 / fps - 1e-9
            assert s["start"] <= _frame_time(s["frame"], fps) <= s["end"]
            assert (truth["root"] / s["frame"]).is_file()


# --- protocol ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["truth", "final"])
def test_no_leakage(which, request):
    data = request.getfixturevalue(which)
    fps = data["manifest"]["extra"]["fps"]
    members = {st["text"]: st["members"] for st in data["states"]}
    for q in data["queries"]:
        segs = data["traj"][(q["video_id"], q["object_id"])]
        assert q["prefix_end"] < segs[1]["start"] and q["target_time"] > q["prefix_end"]
        times = [_frame_time(p, fps) for p in q["prefix_frames"]]
        assert len(times) == PREFIX_FRAMES and times == sorted(set(times))
        assert times[0] == q["prefix_start"] and times[-1] == q["prefix_end"]
        assert all(_FRAME.search(p).group(1) == q["video_id"] for p in q["prefix_frames"])
        assert all(e["t"] < q["target_time"] for e in q["transcript"])
        words = f" {' '.join(re.sub(r'[?,.]', ' ', q['question'].lower()).split())} "
        assert not [m for m in members[q["target_state"]] if f" {m.lower()} " in words], q["id"]
    split_of = defaultdict(set)
    for q in data["queries"]:
        split_of[q["video_id"]].add(q["split"])
    assert all(len(s) == 1 for s in split_of.values())
    assert set(Counter(next(iter(s)) for s in split_of.values())) == set(SPLITS)


def test_early_prefix_and_horizon_mix(truth):
    fps = truth["manifest"]["extra"]["fps"]
    gaps = []
    for q in truth["queries"]:
        segs = truth["traj"][(q["video_id"], q["object_id"])]
        first_change = segs[1]["start"]
        if q["qtype"] == "Q1":
            gaps.append(first_change - q["prefix_end"])
            assert first_change - q["prefix_end"] <= PREFIX_GAP_S[1] + 1 / fps + 1e-9 or q["prefix_start"] == 0
    assert np.median(gaps) >= 1.2
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
        target = segs[q["horizon"]]
        assert (target["start"], target["state"]) == (q["target_time"], q["target_state"])
        assert 1 <= q["horizon"] <= MAX_HORIZON and q["subject"] in q["question"]
        if q["qtype"] == "Q1":
            assert q["horizon"] == 1
        elif q["qtype"] in ("Q2", "Q5"):
            assert q["horizon"] == len(segs) - 1
        elif q["qtype"] == "Q3":
            t = q["prefix_end"] + q["k_seconds"]
            assert target["start"] <= t <= target["end"]
        elif q["qtype"] == "Q4":
            anchor = segs[q["horizon"] + 1]
            assert q["anchor_state"] in q["question"]
            a_state = TrueState.from_key(anchor["sim_state"])
            assert satisfies(a_state, den[q["anchor_state"]])
            assert a_state.motion != TrueState.from_key(target["sim_state"]).motion
        if q["qtype"] == "Q5":
            groups[q["group_id"]].append(q)
    assert groups and all(2 <= len(m) <= 3 for m in groups.values())


def test_truth_gt_is_exact(truth):
    by_id = truth["by_id"]
    by_state = defaultdict(list)
    for s in truth["corpus"]:
        by_state[s["sim_state"]].append(s["id"])
    for q in truth["queries"]:
        p = q["gt_pools"]
        target = truth["traj"][(q["video_id"], q["object_id"])][q["horizon"]]
        assert sorted(p["in_video"] + p["in_dataset"] + p["cross_dataset"]) == sorted(by_state[target["sim_state"]])
        assert sorted(q["gt_sim_exact"]) == sorted(p["in_dataset"] + p["cross_dataset"])
        assert all(by_id[i]["domain"] == q["domain"] for i in p["in_dataset"])
        assert all(by_id[i]["domain"] != q["domain"] for i in p["cross_dataset"])


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
        target = final["traj"][(q["video_id"], q["object_id"])][q["horizon"]]
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
    keys = ["at_rest|floor||||"] * 3 + ["rolling|floor||||"] * 3
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
    assert v["gap_median_s"] > 0 and 0 <= v["chance_r5"] <= 100
    assert "true states split across canonical states" in v
    assert "| segments |" in card.markdown() and card.paper["segments"] == 218_276


def test_domain_is_not_readable_from_the_background(final):
    """Looks, cameras and palettes are drawn independently of the domain: a nearest-centroid domain classifier on
    the `pixels` features of segments stays near chance (25 %)."""
    x = np.asarray(load_table(final["root"], "pixels", "corpus").array)
    dom = np.array([s["domain"] for s in final["corpus"]])
    names = sorted(set(dom))
    video = np.array([int(s["video_id"][1:]) for s in final["corpus"]])
    train = (video // len(names)) % 2 == 0  # video-disjoint halves, every domain in both
    centroids = np.stack([x[train & (dom == d)].mean(0) for d in names])
    pred = np.array(names)[np.argmax(x[~train] @ centroids.T, axis=1)]
    assert (pred == dom[~train]).mean() < 0.45


def test_shapes_cover_the_lexicon():
    assert set(SHAPES) == set(CORPUS.shape_nouns) == set(HELD_OUT.shape_nouns)
