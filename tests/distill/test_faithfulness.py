"""The SCOTT-style faithfulness check and the answer-accuracy comparison."""

from __future__ import annotations

import json

from distill.faithfulness import (
    CONDITIONS,
    FaithfulnessConfig,
    counterfactual_state,
    perturb,
    run_faithfulness,
    summarize,
)


def test_perturb_replaces_every_phrasing(validator):
    state = "rolling down the ramp"
    phr = list(validator.phrasings(state))
    body = f"It is {phr[1].upper()} now. Then it keeps {phr[0]}, {phr[2]}!"
    out, n = perturb(body, phr, "falling")
    assert n == 3 and out == "It is falling now. Then it keeps falling, falling!"
    assert perturb("unrelated text", phr, "x") == ("unrelated text", 0)


def test_counterfactual_is_another_state_and_deterministic(synth_bench):
    states = [s.text for s in synth_bench.states()]
    picks = {counterfactual_state("falling", states, {"bouncing"}, f"q{i}") for i in range(40)}
    assert "falling" not in picks and "bouncing" not in picks and len(picks) > 5
    assert counterfactual_state("falling", states, set(), "q1") == counterfactual_state("falling", states, set(), "q1")


def test_summarize_rates():
    def rec(qt, gold, pert, none, cf="b"):
        return {"qtype": qt, "target": "a", "counterfactual": cf, "answers": {"gold": gold, "perturbed": pert,
                "none": none}, "canonical": {"gold": gold, "perturbed": pert, "none": none}}

    rows = [rec("Q1", "a", "b", "a"), rec("Q1", "a", "a", None), rec("Q2", "a", "c", None), rec("Q2", None, None, "a")]
    r = summarize(rows)
    assert (r["n"], r["gold_acc"], r["follows_perturbation"], r["moved"], r["none_acc"]) == (4, 0.75, 0.25, 0.5, 0.5)
    assert r["by_qtype"]["Q1"]["moved"] == 0.5 and r["by_qtype"]["Q2"]["gold_acc"] == 0.5


def test_faithfulness_runs_on_a_tiny_student(qlora_student, tiny_vlm, synth_dir, template_rationales, tmp_path):
    out, _ = qlora_student
    cfg = FaithfulnessConfig(data=str(synth_dir), model=str(tiny_vlm), adapter=str(out / "adapter"),
                             rationales=str(template_rationales), out=str(tmp_path), split="test", limit=3, frames=2,
                             max_new_tokens=4, batch_size=3, device="cpu", dtype="float32", progress=False)
    rates = run_faithfulness(cfg)
    assert rates["n"] == 3 and all(0.0 <= rates[k] <= 1.0 for k in ("gold_acc", "follows_perturbation", "moved"))
    rows = [json.loads(x) for x in (tmp_path / "faithfulness.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(set(r["answers"]) == set(CONDITIONS) for r in rows)
    assert all(r["counterfactual"] != r["target"] and r["replacements"] >= 1 for r in rows)
    assert (tmp_path / "faithfulness.md").read_text().startswith("Faithfulness")
