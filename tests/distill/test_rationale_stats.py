"""Rationale statistics: restatement counts, the string-match and classifier leakage probes, validator rejects."""

from __future__ import annotations

import json

import pytest

from distill.facts import PredicateSet
from distill.rationale_stats import classifier_probe, last_named_state, restatements
from distill.validator import RationaleValidator

STATES = {"falling": ["falling", "dropping"], "dropping into the container": ["dropping into the container"],
          "resting on the floor": ["resting on the floor", "settled on the ground"]}


def test_restatements_count_inflections_and_skip_longer_phrasings():
    v = RationaleValidator(STATES)
    body = "It is dropping. It fell fast. Then it keeps falling. Later it is dropping into the container."
    assert restatements(body, "falling", v) == 3  # 'dropping into the container' is another state
    assert restatements(body, "dropping into the container", v) == 1
    assert last_named_state(body, v) == "dropping into the container"
    assert last_named_state("It settles on the ground.", v) == "resting on the floor"
    assert last_named_state("Nothing happens.", v) is None


def test_classifier_probe():
    x = [f"the ball {w} now" for w in ("rolls", "falls")] * 10
    y = ["rolling", "falling"] * 10
    assert classifier_probe(x, y, ["a ball rolls", "it falls"], ["rolling", "falling"]) == 1.0
    assert classifier_probe(x, ["a"] * 20, ["x"], ["a"]) is None and classifier_probe([], [], ["x"], ["a"]) is None


@pytest.mark.slow
def test_rationale_stats_cli_separates_reasoning_from_restating(synth_dir, pred_file, pred_sets, template_rationales,
                                                              tmp_path):
    from distill.cli import main
    from distill.narrate import NarrateConfig, run_narration
    from eval.resumable import read_records

    noisy = tmp_path / "noisy"
    run_narration(NarrateConfig(data=str(synth_dir), predicates=str(pred_file), out=str(noisy),
                                narrator="template-noisy", split="train", limit=40, fault_rate=0.5, progress=False))
    out = tmp_path / "stats"
    assert main(["rationale-stats", "--data", str(synth_dir), "--rationales", str(template_rationales), str(noisy),
                 "--out", str(out), "--predicates", str(pred_file)]) == 0
    s = json.loads((out / "rationale_stats.json").read_text())
    assert s["all"]["restatements_median"] == 0 and s["all"]["restated_share"] < 0.25
    assert s["all"]["string_probe_acc"] < 0.2 and s["all"]["imminent_share"] == 0
    p = s["classifier_probe"]
    assert p["train"] > 0 and p["test"] > 0 and 0 <= p["classifier_acc"] <= 1 and p["majority_acc"] is not None
    # honest templates are refused only where a canonical label is false of the frames (label_truth < 1)
    assert s["rejects"][str(noisy)]["rejected_tries"] > 0 and s["rejects"][str(template_rationales)][
        "rejected_tries"] <= 0.02 * len(pred_sets)
    md = (out / "rationale_stats.md").read_text()
    assert "Validator rejects in" in md and "Leakage probe" in md and "Honest paraphrases" in md
    # true states described in free words are not rejected; the same describer's words for the state after the
    # target, true of nothing up to the horizon, are caught where they are worded as the benchmark's phrasings
    h = s["honest_paraphrases"]
    assert h["n"] > 0 and h["rejected_share"] <= 0.02, h["examples"]
    c = h["leak_control"]
    assert c["n"] > 0 and 0 < c["caught"] <= c["n"]
    # the same rationales with the answer restated in the body: every probe sees it
    restating = tmp_path / "restating.jsonl"
    rows = read_records(template_rationales / "rationales.jsonl")
    with open(restating, "w") as f:
        for r in rows:
            ps: PredicateSet = pred_sets[r["query_id"]]
            body, answer = r["rationale"].rsplit("\n", 1)
            r = {**r, "rationale": f"{body} So the {ps.subject} will be {ps.answer}.\n{answer}"}
            f.write(json.dumps(r) + "\n")
    assert main(["rationale-stats", "--data", str(synth_dir), "--rationales", str(restating),
                 "--out", str(tmp_path / "s2")]) == 0
    s2 = json.loads((tmp_path / "s2" / "rationale_stats.json").read_text())
    assert s2["all"]["restated_share"] == 1.0 and s2["all"]["string_probe_acc"] == 1.0
    assert s2["classifier_probe"]["classifier_acc"] > p["classifier_acc"]
