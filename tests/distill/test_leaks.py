"""`python -m distill leaks`: catch rates on the narrator's injected leaks and on held-out ones worded differently;
the semantic check catches a free-worded post-horizon state that the patterns miss and passes honest sentences."""

from __future__ import annotations

import json

import pytest

from distill.facts import PredicateSet


@pytest.fixture(scope="module")
def leaks(synth_dir, pred_file, tmp_path_factory):
    from distill.leaks import LeaksConfig, run_leaks

    out = tmp_path_factory.mktemp("leaks")
    return out, run_leaks(LeaksConfig(data=str(synth_dir), predicates=str(pred_file), out=str(out), limit=30,
                                      semantic=False, resamples=200))


def test_injected_wordings_are_all_caught_and_held_out_ones_are_measured(leaks):
    out, r = leaks
    assert r["sets"] == 30 and r["injected_all"]["value"] == 1.0  # the patterns were written for these wordings
    held = r["heldout"]
    assert {"number", "frame_index", "answer_statement", "no_evidence"} <= set(held)
    assert all(0.0 <= v["value"] <= 1.0 and v["n"] > 0 for v in held.values())
    assert held["no_evidence"]["value"] == 1.0  # the padding body: the minimum-evidence rule
    assert r["honest"]["n"] > 0 and r["honest"]["rejected_share"] is not None
    assert json.loads((out / "leaks.json").read_text())["sets"] == 30
    assert "held-out (other wordings)" in (out / "leaks.md").read_text()


def test_heldout_wordings_differ_from_the_narrators():
    from distill.leaks import HELDOUT
    from distill.narrate import _SPELLED

    assert not set(_SPELLED) & set(HELDOUT["number"])


@pytest.mark.slow
def test_semantic_check_catches_a_free_worded_future_state():
    """A sentence describing the after-horizon state in words of no phrasing: missed by the patterns, caught in the
    text space; an honest future sentence about an allowed state passes (packaged MiniLM)."""
    from distill.semantic import SemanticLeaks
    from distill.validator import RationaleValidator

    states = {"rolling down the ramp": ["rolling down the ramp"], "resting on the floor": ["resting on the floor"],
              "crashing into the wall": ["crashing into the wall", "slamming into the wall"]}
    ps = PredicateSet(query_id="q", qtype="Q1", horizon=1, domain="d", subject="red ball",
                      question="What happens next?", answer="crashing into the wall", current="rolling down the ramp",
                      upcoming=["crashing into the wall"], facts=[], allowed_states=["rolling down the ramp",
                                                                                      "crashing into the wall"],
                      after_horizon_states=["resting on the floor"])
    plain = RationaleValidator(states)
    sem = RationaleValidator(states, semantic=SemanticLeaks())
    leak = "Eventually the red ball will be lying still on the ground."
    assert not plain.leaks(leak, ps) and not plain.semantic_leaks(leak, ps)
    assert sem.semantic_leaks(leak, ps) == [leak.rstrip(".")]
    assert sem.semantic_leaks("Soon the red ball will be rolling down the slope.", ps) == []
