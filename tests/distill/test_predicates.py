"""Oracle -> predicates on the synthetic benchmark: trajectory facts agree with the query's truth, motion facts agree
with the simulator record, nothing numeric, nothing past the horizon."""

from __future__ import annotations

import re

import numpy as np
import pytest

from distill import motion
from distill.predicates import IMMINENT_S, SOON_S, build_predicates, time_bucket, trajectory_states


def test_every_query_has_the_core_facts(synth_bench, pred_sets):
    queries = synth_bench.queries()
    assert len(pred_sets) == len(queries)
    for q in queries:
        ps = pred_sets[q.id]
        kinds = [f.kind for f in ps.facts]
        assert {"current_state", "upcoming_order", "time_to_change", "answer"} <= set(kinds), q.id
        assert kinds[-1] == "answer" and q.target_state in ps.facts[-1].text
        assert ps.answer == q.target_state
        # the upcoming states end in the target, and (synthetic transcripts hold every state) number `horizon`
        assert ps.upcoming[-1] == q.target_state
        assert len(ps.upcoming) == q.horizon, q.id
        assert all(s in ps.fact("upcoming_order").text for s in ps.upcoming)


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
            assert q.anchor_state in ps.fact("heading_toward").text
        if q.qtype == "Q2":
            assert q.target_state in ps.fact("end_state").text
            assert ps.after_horizon_states == []  # nothing comes after the end state
        if q.qtype == "Q3":
            assert q.target_state in ps.fact("state_at_time").text
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


def test_time_buckets(synth_bench, pred_sets):
    assert time_bucket(IMMINENT_S) == "imminent" and time_bucket(SOON_S) == "soon"
    assert time_bucket(SOON_S + 0.01) == "later"
    for q in synth_bench.queries():
        _, upcoming = trajectory_states(q)
        bucket = time_bucket(upcoming[0][0] - q.prefix_end)
        assert bucket in pred_sets[q.id].fact("time_to_change").text


def test_motion_facts_agree_with_the_simulator(synth_bench, oracle, pred_sets):
    checked = {"direction": 0, "collision_course": 0, "support_reached": 0}
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
        f_t = max(motion.frame_of(rec, motion.target_moment(q, oracle.target_segment(q))), f_end)
        for f in ps.facts:
            if f.kind == "collision_course" and "on a collision course:" in f.text:
                j = next(j for j, s in enumerate(rec.subjects) if j != k and f"the {s}" in f.text)
                assert rec.touch[f_end + 1:f_t + 1, k, j].any()  # they do touch before the asked moment
                checked["collision_course"] += 1
        s = ps.fact("support_reached")
        if s is not None and not rec.held[f_t, k]:
            code = int(rec.support[f_t, k])
            if code in motion._SUPPORT_NAMES:
                assert motion._SUPPORT_NAMES[code] in s.text
            elif code == 0:
                assert "nothing holds" in s.text
            checked["support_reached"] += 1
    assert all(n > 0 for n in checked.values()), checked


def test_without_simulator_only_trajectory_facts(synth_bench):
    qs = synth_bench.queries()[:20]
    for ps in build_predicates(synth_bench, qs, use_sim=False):
        assert ps.sources == ["trajectory"]
        assert {f.kind for f in ps.facts} <= {"current_state", "upcoming_order", "time_to_change", "time_to_target",
                                               "heading_toward", "end_state", "state_at_time", "other_end_state",
                                               "answer"}


def test_predicates_cli_writes_jsonl_and_config(synth_dir, tmp_path):
    from distill.cli import main
    from distill.jsonl import read_records
    from distill.predicates import PredicateSet

    out = tmp_path / "p.jsonl"
    assert main(["predicates", "--data", str(synth_dir), "--out", str(out), "--split", "test", "--limit", "5",
                 "--progress", "false"]) == 0
    rows = read_records(out)
    assert len(rows) == 5 and all(PredicateSet.from_dict(r).facts for r in rows)
    assert (tmp_path / "p.config.json").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--data", "DIR", "--out", "o.jsonl", "--limit", "many"], "limit"),
    (["--out", "o.jsonl"], "data"),
])
def test_predicates_cli_bad_input_is_named(argv, needle, capsys):
    from distill.cli import main

    assert main(["predicates", *argv]) == 2
    assert needle in capsys.readouterr().err
