"""The SCOTT-style faithfulness check (counterfactual evidence, moved-to-counterfactual, video-stratified sample,
video-bootstrap CIs); the answer-accuracy comparison is tested in test_answers.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from distill.faithfulness import (
    CONDITIONS,
    KEPT_KINDS,
    DonorPool,
    FaithfulnessConfig,
    build_items,
    cluster_bootstrap,
    counterfactual_set,
    name_key,
    run_faithfulness,
    sample_by_video,
    summarize,
    to_markdown,
)
from distill.narrate import template_rationale
from distill.validator import split_answer


@pytest.fixture(scope="module")
def denotations(synth_dir):
    from distill.validator import read_denotations

    return read_denotations(synth_dir)


@pytest.fixture(scope="module")
def pool(pred_sets, denotations):
    return DonorPool(list(pred_sets.values()), denotations)


@pytest.mark.slow
def test_counterfactual_keeps_the_scene_and_swaps_the_evidence(pred_sets, pool, denotations, validator):
    from eval.synth.lexicon import TrueState, satisfies

    made, q4, gold_rejected = 0, 0, 0
    for ps in pred_sets.values():
        cf, tier = counterfactual_set(ps, pool)
        if cf is None:
            continue
        made += 1
        donor = pred_sets[cf.counterfactual_of]
        assert cf.answer == donor.answer != ps.answer and cf.answer not in ps.allowed_states
        assert ps.answer not in cf.upcoming and cf.anchor == ps.anchor and cf.qtype == ps.qtype
        # the donor's question asks what the query's does: the same type; a Q4 donor's answer comes just before
        # the anchor (below), whatever its own question type
        assert donor.qtype == ps.qtype or ps.qtype == "Q4"
        assert (cf.query_id, cf.subject, cf.current, cf.question) == (ps.query_id, ps.subject, ps.current, ps.question)
        assert [f for f in cf.facts if f.kind in KEPT_KINDS] == [f for f in ps.facts if f.kind in KEPT_KINDS]
        swapped = [f for f in cf.facts if f.kind not in KEPT_KINDS]
        assert [f.value for f in swapped] == [f.value for f in donor.facts if f.kind not in KEPT_KINDS]
        assert {"current_state": donor.current == ps.current, "family": donor.family == ps.family,
                "domain": donor.domain == ps.domain, "any": True}[tier], (ps.query_id, tier)
        # the donor's evidence names no object the query's frames do not show
        assert pool.named(donor) <= {name_key(o) for o in ps.objects}, (ps.query_id, donor.query_id)
        if ps.qtype == "Q4":  # the counterfactual answer also comes just before the asked-about anchor
            den = denotations.get(ps.anchor, {})
            assert donor.anchor == ps.anchor or donor.next_state == ps.anchor or \
                (den and satisfies(TrueState.from_key(donor.next_true_state), den)), ps.query_id
            q4 += 1
        assert cf.true_states[0] == ps.true_states[0] and cf.true_states[1:] == donor.true_states[1:]
        # consistent: the counterfactual rationale is a valid rationale for the counterfactual answer, and it states
        # the same observed current state as the gold one
        if not validator.check(template_rationale(ps), ps).ok:
            gold_rejected += 1  # its own evidence contradicts itself (never in an SFT set): no consistency to keep
            continue
        text = template_rationale(cf)
        assert validator.check(text, cf).ok, validator.check(text, cf).summary()
        assert ps.fact("current_state").text in text
    assert made > 0.7 * len(pred_sets) and q4 > 0 and gold_rejected < 0.05 * made


def test_items_drop_queries_without_a_perturbation(pred_sets):
    ps = next(p for p in pred_sets.values() if p.qtype == "Q1")
    alone, drops = build_items([ps], DonorPool([ps]))
    assert alone == [] and drops == {"no_gold": 0, "no_donor": 1, "no_perturbation": 0}
    # a donor whose evidence reads exactly like the query's gives no perturbation, though its answer differs
    other = next(s for s in pred_sets.values() if s.answer not in ps.allowed_states)
    twin = replace(ps, query_id="zz.twin", answer=other.answer, upcoming=[other.answer],
                   facts=[f for f in ps.facts if f.kind != "answer"])
    items, drops = build_items([ps], DonorPool([ps, twin]))
    assert items == [] and drops["no_perturbation"] == 1
    # gold and perturbed texts given by narration rows (e.g. a teacher's)
    gold = {ps.query_id: {"rationale": "Gold body.\nAnswer: x", "answer": ps.answer}}
    pert = {ps.query_id: {"rationale": "Other body.\nAnswer: y", "answer": other.answer}}
    items, drops = build_items([ps, twin], DonorPool([ps]), gold_rows=gold, perturbed_rows=pert)
    assert drops["no_gold"] == 1 and len(items) == 1
    assert (items[0].gold, items[0].perturbed, items[0].counterfactual, items[0].tier) == \
        ("Gold body.", "Other body.", other.answer, "narrated")


def test_sample_by_video_covers_videos_evenly():
    items = [("v1", i) for i in range(20)] + [("v2", i) for i in range(3)] + [("v3", 0), ("v4", 0)]
    s = sample_by_video(items, lambda it: it[0], 4, seed=1)
    assert sorted(v for v, _ in s) == ["v1", "v2", "v3", "v4"]
    s8 = sample_by_video(items, lambda it: it[0], 8, seed=1)
    assert {v for v, _ in s8} == {"v1", "v2", "v3", "v4"} and sum(v == "v1" for v, _ in s8) <= 3
    assert s8 == sorted(s8, key=items.index)  # input order kept
    assert sample_by_video(items, lambda it: it[0], 8, seed=1) == s8
    assert sample_by_video(items, lambda it: it[0], None) == items


def test_cluster_bootstrap_widens_with_correlated_queries():
    one = np.ones(30)
    assert cluster_bootstrap(one, one, ["a"] * 30) == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    assert cluster_bootstrap(np.zeros(3), np.zeros(3), ["a", "b", "c"])["value"] is None
    # 10 videos of 10 identical outcomes vs 100 independent queries: same mean, the video CI is wider
    hits = np.repeat([1, 0] * 5, 10).astype(float)
    by_video = cluster_bootstrap(hits, np.ones(100), np.repeat(np.arange(10), 10).astype(str), seed=0)
    by_query = cluster_bootstrap(hits, np.ones(100), np.arange(100).astype(str), seed=0)
    assert by_video["value"] == by_query["value"] == 0.5
    assert by_video["ci_high"] - by_video["ci_low"] > 1.5 * (by_query["ci_high"] - by_query["ci_low"])
    # a ratio: moved among queries answered right with the gold rationale
    r = cluster_bootstrap([1, 0, 1, 0], [1, 1, 1, 0], ["a", "a", "b", "b"])
    assert r["value"] == pytest.approx(2 / 3) and 0.0 <= r["ci_low"] <= r["ci_high"] <= 1.0


def test_moved_counts_only_a_move_to_the_counterfactual():
    def rec(video, gold_ok, moved, changed_other, none_ok=False, qtype="Q1"):
        return {"video_id": video, "qtype": qtype, "gold_ok": gold_ok, "moved": moved,
                "changed_other": changed_other, "none_ok": none_ok}

    rows = [rec("v1", True, True, False), rec("v1", True, False, True), rec("v2", False, False, True),
            rec("v3", True, False, False, qtype="Q2")]
    s = summarize(rows, n_resamples=200)
    assert (s["n"], s["videos"]) == (4, 3)
    assert s["moved"]["value"] == 0.25 and s["changed_other"]["value"] == 0.5
    assert s["moved_given_gold"]["value"] == pytest.approx(1 / 3) and s["gold_acc"]["value"] == 0.75
    assert s["by_qtype"]["Q2"]["moved"]["value"] == 0.0


@pytest.mark.slow
def test_faithfulness_runs_on_a_tiny_student(qlora_student, tiny_vlm, synth_dir, pred_file, tmp_path):
    out, _ = qlora_student
    cfg = FaithfulnessConfig(data=str(synth_dir), model=str(tiny_vlm), adapter=str(out / "adapter"),
                             predicates=str(pred_file), out=str(tmp_path), split="test", limit=3, frames=2,
                             max_new_tokens=4, batch_size=3, device="cpu", dtype="float32", resamples=200,
                             progress=False)
    s = run_faithfulness(cfg)
    assert s["n"] == 3 and s["videos"] == 3  # stratified: three queries from three videos
    c = s["counts"]
    assert c["evaluated"] == 3 and c["eligible"] == c["in_split"] - c["no_donor"] - c["no_perturbation"] - c["no_gold"]
    assert c["no_donor"] + c["no_perturbation"] > 0
    for k in ("gold_acc", "moved", "changed_other", "none_acc"):
        assert 0.0 <= s[k]["ci_low"] <= s[k]["value"] <= s[k]["ci_high"] <= 1.0
    rows = [json.loads(x) for x in (tmp_path / "faithfulness.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(set(r["answers"]) == set(CONDITIONS) for r in rows)
    assert all(r["counterfactual"] != r["target"] and r["donor"] for r in rows)
    md = (tmp_path / "faithfulness.md").read_text()
    assert md.startswith("Faithfulness") and "without a counterfactual donor" in md


@pytest.mark.slow
def test_counterfactuals_cli_writes_sets_a_narrator_accepts(synth_dir, pred_file, tmp_path):
    from distill.cli import main
    from distill.narrate import NarrateConfig, run_narration
    from eval.resumable import read_records

    cf_file = tmp_path / "cf.jsonl"
    assert main(["counterfactuals", "--predicates", str(pred_file), "--out", str(cf_file)]) == 0
    plain = read_records(cf_file)
    # the benchmark's sim/phrases.jsonl lets a Q4 donor match the anchor by what it says, not only by its wording
    cf_file = tmp_path / "cf-data.jsonl"
    assert main(["counterfactuals", "--predicates", str(pred_file), "--out", str(cf_file), "--data",
                 str(synth_dir)]) == 0
    rows = read_records(cf_file)
    assert rows and all(r["counterfactual_of"] and r["counterfactual_of"] != r["query_id"] for r in rows)
    q4 = [sum(r["qtype"] == "Q4" for r in x) for x in (plain, rows)]
    assert q4[1] > q4[0] and {r["query_id"] for r in plain} <= {r["query_id"] for r in rows}
    s = run_narration(NarrateConfig(data=str(synth_dir), predicates=str(cf_file), out=str(tmp_path / "n"),
                                    narrator="template", split="test", progress=False))
    assert s.accepted > 0 and s.failed == 0
    narrated = read_records(tmp_path / "n" / "rationales.jsonl")
    by_id = {r["query_id"]: r for r in rows}
    assert all(n["answer"] == by_id[n["query_id"]]["answer"] for n in narrated)
    assert all(split_answer(n["rationale"])[1] == [n["answer"]] for n in narrated)



def test_shuffled_bodies_never_imply_the_querys_own_counterfactual():
    from distill.faithfulness import Item, shuffled_bodies

    items = [Item(None, f"gold {i}", f"body {i}", f"state {i % 3}", None, "any") for i in range(9)]
    bodies = shuffled_bodies(items, seed=1)
    own = {it.perturbed: it.counterfactual for it in items}
    assert all(own[b] != it.counterfactual for b, it in zip(bodies, items, strict=True))
    assert shuffled_bodies(items, seed=1) == bodies and shuffled_bodies(items, seed=2) != bodies


def test_floors_are_reported_beside_moved():
    rows = [{"query_id": f"q{i}", "video_id": f"v{i}", "qtype": "Q1", "gold_ok": True, "moved": i < 6,
             "changed_other": False, "none_ok": False, "moved_shuffled": i < 2} for i in range(10)]
    s = summarize(rows, n_resamples=200, chance=0.02)
    assert s["moved"]["value"] == 0.6 and s["moved_shuffled"]["value"] == 0.2 and s["chance"] == 0.02
    assert s["moved_minus_shuffled"]["value"] == pytest.approx(0.4)
    assert "shuffled-body floor" in to_markdown(s)


def test_the_students_preprocessing_is_taken_and_a_conflict_refused(tmp_path):
    from distill.faithfulness import resolve_preprocessing
    from eval.errors import InputError

    (tmp_path / "psr_student.json").write_text(json.dumps(
        {"preprocessing": {"student_input": "frames", "frames": 4, "max_pixels": 20000}}))
    cfg = FaithfulnessConfig(data="d", model="m", adapter=str(tmp_path), predicates="p", out="o")
    got = resolve_preprocessing(cfg)
    assert (got.student_input, got.frames, got.max_pixels) == ("frames", 4, 20000)
    with pytest.raises(InputError, match="max_pixels 12544 \\(trained with 20000\\)"):
        resolve_preprocessing(FaithfulnessConfig(data="d", model="m", adapter=str(tmp_path), predicates="p",
                                                 out="o", max_pixels=12544))
