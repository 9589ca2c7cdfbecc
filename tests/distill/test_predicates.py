"""Oracle -> predicates on the synthetic benchmark: trajectory facts agree with the query's truth, motion facts agree
with the simulator record, nothing numeric, nothing past the horizon."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from distill import motion
from distill.predicates import MAX_BUCKET_SHARE, OracleIndex, TimingBuckets, build_predicates, trajectory_states
from eval.synth import record as R


def test_every_query_has_the_core_facts(synth_bench, pred_sets):
    queries = synth_bench.queries()
    assert len(pred_sets) == len(queries)
    for q in queries:
        ps = pred_sets[q.id]
        kinds = [f.kind for f in ps.facts]
        assert {"current_state", "answer"} <= set(kinds), q.id
        assert kinds[-1] == "answer" and kinds.count("answer") == 1 and q.target_state in ps.facts[-1].text
        assert ps.answer == q.target_state and ps.video_id == q.video_id
        # the upcoming states end in the target, and (synthetic transcripts hold every state) number `horizon`
        assert ps.upcoming[-1] == q.target_state
        assert len(ps.upcoming) == q.horizon, q.id
        if q.horizon >= 2:
            assert all(s in ps.fact("intermediate").text for s in ps.intermediate)
        # sections in order: evidence first, the answer last
        order = [("scene", "motion", "trajectory", "answer").index(f.section) for f in ps.facts]
        assert order == sorted(order), q.id


def test_only_the_answer_fact_names_the_answer(pred_sets, validator):
    """No fact restates the target, except where the target is also a state the evidence names on its own
    (the current state, an intermediate state, the Q4 anchor, a Q5 object's end state). A fact names a state as
    the validator reads text: longest phrasing first over every state's phrasings, so an open-vocabulary state
    whose wording merely starts with the answer's ("sitting still on the floor beside the purple cube" vs
    "sitting still on the floor") names that other state, not the answer."""
    from distill.rationale_stats import restatements

    restated = 0
    for ps in pred_sets.values():
        own = {ps.current, *ps.intermediate, ps.anchor, *(f.value for f in ps.facts if f.kind == "other_end_state")}
        assert restatements(ps.facts[-1].text, ps.answer, validator) >= 1, ps.query_id
        for f in ps.facts[:-1]:
            if restatements(f.text, ps.answer, validator):
                assert ps.answer in own, (ps.query_id, f.text)
                restated += 1
    assert restated < len(pred_sets) / 4


def test_facts_carry_no_numbers(pred_sets):
    for ps in pred_sets.values():
        for f in ps.facts:
            assert not re.search(r"\d", f.text), (ps.query_id, f.text)


def test_question_type_facts(synth_bench, pred_sets):
    seen = set()
    queries = synth_bench.queries()
    for q in queries:
        ps = pred_sets[q.id]
        if q.qtype == "Q4":
            assert q.anchor_state in ps.fact("heading_toward").text and ps.anchor == q.anchor_state
        if q.qtype == "Q2":
            assert ps.after_horizon_states == []  # nothing comes after the end state
        if q.qtype == "Q3":
            assert ps.fact("time_to_target") is not None  # the asked moment, bucketed
        if q.qtype == "Q5":
            others = [o for o in queries if o.group_id == q.group_id and o.id != q.id]
            texts = [f.text for f in ps.facts if f.kind == "other_end_state"]
            assert len(texts) == len(others)
            for o in others:
                assert any(o.subject in t and o.target_state in t for t in texts)
        seen.add(q.qtype)
    assert seen == {"Q1", "Q2", "Q3", "Q4", "Q5"}


def test_after_horizon_states_come_from_the_object_trajectory(synth_bench, oracle, pred_sets):
    n_nonempty = 0
    for q in synth_bench.queries():
        ps = pred_sets[q.id]
        later = {st for s, _, st in oracle.segments[(q.video_id, q.object_id)] if s > q.target_time}
        assert set(ps.after_horizon_states) == later - set(ps.allowed_states)
        assert q.target_state in ps.allowed_states and q.target_state not in ps.after_horizon_states
        if q.anchor_state:
            assert q.anchor_state in ps.allowed_states
        n_nonempty += bool(ps.after_horizon_states)
    assert n_nonempty > 0


def test_timing_buckets_come_from_the_data():
    tb = TimingBuckets.fit("t", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert tb.informative and tb.edges == pytest.approx((0.3667, 0.6333), abs=1e-3)
    assert (tb.bucket(0.2), tb.bucket(0.5), tb.bucket(0.9)) == ("early", "middle", "late")
    # a constant gap (every prefix ends the same time before the change; float noise included) says nothing
    const = TimingBuckets.fit("t", [0.15, 0.15 + 1e-12, 0.15 - 1e-12] * 10)
    assert not const.informative and const.shares[0] == 1.0
    shifted = TimingBuckets.fit("t", [1.5, 2.0, 2.5, 3.0, 3.5, 4.0])
    assert shifted.informative and shifted.bucket(1.6) == "early"
    assert not TimingBuckets.fit("t", []).informative


def test_timing_facts_follow_the_fitted_buckets(synth_bench, oracle, pred_sets):
    timing = oracle.timing
    assert {"time_to_change", "time_to_target"} == set(timing)
    for q in synth_bench.queries():
        ps = pred_sets[q.id]
        assert all("imminent" not in f.text for f in ps.facts)
        _, upcoming = trajectory_states(q)
        f = ps.fact("time_to_change")
        assert (f is not None) == timing["time_to_change"].informative
        if f is not None:
            assert f.value == timing["time_to_change"].bucket(upcoming[0][0] - q.prefix_end)
        f = ps.fact("time_to_target")
        if f is not None:
            assert f.value == timing["time_to_target"].bucket(upcoming[-1][0] - q.prefix_end)
    # the synthetic benchmark ends prefixes at varying times before the next change (its tertiles are distinct),
    # so both timing statements carry evidence; a near-constant gap would be dropped (test above)
    for name in ("time_to_change", "time_to_target"):
        tb = timing[name]
        assert tb.informative and max(tb.shares) <= MAX_BUCKET_SHARE and tb.edges[0] < tb.edges[1], tb
    assert all(ps.fact("time_to_change") is not None for ps in pred_sets.values())


def test_motion_facts_agree_with_the_simulator(synth_bench, oracle, pred_sets):
    checked = {"direction": 0, "collision_course": 0, "support_now": 0}
    for q in synth_bench.queries():
        ps = pred_sets[q.id]
        rec = oracle.sim(q.video_id)
        k = [str(x) for x in rec.object_ids].index(q.object_id)
        f_end = motion.frame_of(rec, q.prefix_end)
        w = slice(max(0, f_end - motion.COURSE_FRAMES + 1), f_end + 1)
        v = rec.vel[w, k].mean(axis=0)
        d = ps.fact("direction")
        if d is not None:
            moving = np.hypot(*v) >= motion.STATIONARY_SPEED
            assert ("not moving" in d.text) == (not moving)
            if moving and abs(v[0]) >= motion.DIAGONAL_RATIO * abs(v[1]):
                assert ("to the right" if v[0] > 0 else "to the left") in d.text
            checked["direction"] += 1
        assert ps.fact("direction") is None or ps.fact("direction").value == motion.direction_value(v)
        f_t = max(motion.frame_of(rec, motion.target_moment(q, oracle.target_segment(q))), f_end)
        for f in ps.facts:
            if f.kind == "collision_course" and "on a collision course:" in f.text:
                j = next(j for j, s in enumerate(rec.subjects) if j != k and f"the {s}" in f.text)
                assert rec.touch[f_end + 1:f_t + 1, k, j].any()  # they do touch before the asked moment
                checked["collision_course"] += 1
        s = ps.fact("support_now")
        assert ps.fact("support_reached") is None  # the support at the asked moment is the answer reworded
        if not rec.held[f_end, k]:
            code = int(rec.support[f_end, k])
            if code == R.SUPPORT_OBJECT and rec.support_other[f_end, k] >= 0:
                below = f"the {rec.subjects[rec.support_other[f_end, k]]}"  # the record names the supporting object
                assert s.value == below and below in s.text, (q.id, s.text)
            elif code == R.SUPPORT_WALL and motion.on_rim(rec, f_end, k):
                assert s.value == "the rim of the container", (q.id, s.text)
            elif code in motion.SUPPORT_NAMES:
                assert motion.SUPPORT_NAMES[code] in s.text and s.value == motion.SUPPORT_NAMES[code]
            elif code == 0:
                assert "Nothing is holding" in s.text and s.value == "nothing"
            checked["support_now"] += 1
    assert all(n > 0 for n in checked.values()), checked


def test_without_simulator_only_trajectory_facts(synth_bench):
    qs = synth_bench.queries()[:20]
    for ps in build_predicates(synth_bench, qs, use_sim=False):
        assert ps.sources == ["trajectory"]
        assert {f.kind for f in ps.facts} <= {"current_state", "intermediate", "time_to_change", "time_to_target",
                                               "heading_toward", "other_end_state", "answer"}


def test_motion_imports_without_predicates():
    """distill.motion and distill.predicates no longer import each other in a cycle."""
    import subprocess
    import sys

    for mod in ("distill.motion", "distill.predicates"):
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_sim_state_of_the_observed_segment_becomes_evidence():
    """Where corpus segments carry the simulator's compositional state, the one the prefix shows is stated."""
    import datasets

    from distill.predicates import observed_detail_text

    class Bench:
        corpus_ds = datasets.Dataset.from_list([
            {"video_id": "v", "object_id": "o0", "subject": "red ball", "start": 0.0, "end": 1.0, "state": "a",
             "sim_state": {"motion": "rolling", "support": "on the ramp's lower half", "manner": "slowly"}},
            {"video_id": "v", "object_id": "o0", "subject": "red ball", "start": 1.0, "end": 2.0, "state": "b",
             "sim_state": {"motion": "falling", "support": None, "manner": "quickly"}}])

    class Q:
        video_id, object_id, prefix_end = "v", "o0", 0.8

    index = OracleIndex(Bench())
    text = observed_detail_text("red ball", index.current_sim_state(Q()))
    assert text == "What the frames show of the red ball: motion rolling; support on the ramp's lower half; manner slowly."
    assert observed_detail_text("x", {"speed": "12 units"}) is None and observed_detail_text("x", None) is None


def test_predicates_cli_writes_jsonl_and_config(synth_dir, oracle, tmp_path):
    from distill.cli import main
    from distill.predicates import PredicateSet
    from eval.resumable import read_records

    out = tmp_path / "p.jsonl"
    assert main(["predicates", "--data", str(synth_dir), "--out", str(out), "--split", "test", "--limit", "5",
                 "--no-progress"]) == 0
    rows = read_records(out)
    assert len(rows) == 5 and all(PredicateSet.from_dict(r).facts for r in rows)
    conf = json.loads((tmp_path / "p.config.json").read_text())
    timing = oracle.timing
    for name in ("time_to_change", "time_to_target"):  # the buckets the sets were written with, fitted on train
        assert conf["timing"][name]["informative"] is timing[name].informative
        assert conf["timing"][name]["edges"] == pytest.approx(list(timing[name].edges))


@pytest.mark.parametrize("argv, needle", [
    (["--data", "DIR", "--out", "o.jsonl", "--limit", "many"], "limit"),
    (["--out", "o.jsonl"], "data"),
])
def test_predicates_cli_bad_input_is_named(argv, needle, capsys):
    from distill.cli import main

    assert main(["predicates", *argv]) == 2
    assert needle in capsys.readouterr().err
