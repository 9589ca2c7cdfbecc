"""The rationale validator: honest rationales pass; every leak kind is caught with its reason."""

from __future__ import annotations

import json

import pytest

from distill.narrate import template_rationale
from distill.validator import count_words, split_answer


def _with_body(text: str, extra: str) -> str:
    body, answers = split_answer(text)
    return f"{body} {extra}\nAnswer: {answers[-1]}"


@pytest.fixture(scope="module")
def leaky(pred_sets):
    """A Q1 query whose object enters states after the target (so a future leak is possible)."""
    return next(ps for ps in pred_sets.values() if ps.qtype == "Q1" and ps.after_horizon_states)


def test_honest_template_rationales_pass(pred_sets, validator):
    for ps in pred_sets.values():
        v = validator.check(template_rationale(ps), ps)
        assert v.ok, (ps.query_id, v.summary())
        assert 80 <= v.words <= 250


@pytest.mark.parametrize("extra, code", [
    ("It will take 1.5 seconds to get there.", "number"),
    ("Its speed is about 40 units per second.", "number"),
    ("This takes two seconds.", "number"),
    ("It moves for half a second.", "number"),
    ("That happens after one point five of the clip.", "number"),
    ("About twelve frames later it changes.", "number"),
    ("At x = right edge it turns.", "coordinate"),
    ("Its position (x, y) changes.", "coordinate"),
    ("It changes when t: later.", "coordinate"),
])
def test_numbers_and_coordinates_are_rejected(leaky, validator, extra, code):
    text = _with_body(template_rationale(leaky), extra)
    v = validator.check(text, leaky)
    assert not v.ok and code in {r.code for r in v.reasons}, v.summary()


def test_future_leak_is_rejected_for_every_phrasing(leaky, validator):
    later = leaky.after_horizon_states[0]
    for phrase in validator.phrasings(later):
        text = _with_body(template_rationale(leaky), f"Much later it will be {phrase.upper()}.")
        v = validator.check(text, leaky)
        assert [r.code for r in v.reasons] == ["future_leak"], (phrase, v.summary())
        assert phrase.lower() in v.reasons[0].detail


def test_allowed_phrasings_are_masked_before_the_leak_check(validator):
    """'falling over' (a phrasing of tipping over) must not count as 'falling' when only falling is forbidden."""
    from distill.predicates import PredicateSet

    ps = PredicateSet(query_id="q", qtype="Q1", horizon=1, domain="dominoes", subject="red domino", question="?",
                      answer="tipping over", current="standing upright", upcoming=["tipping over"], facts=[],
                      allowed_states=["standing upright", "tipping over"], after_horizon_states=["falling"])
    assert validator.leaks("It is falling over now.", ps) == []
    assert validator.leaks("It is falling now.", ps) == ["falling"]


def test_length_bounds(leaky, validator):
    short = f"It moves.\nAnswer: {leaky.answer}"
    v = validator.check(short, leaky)
    assert [r.code for r in v.reasons] == ["length"]
    long_text = _with_body(template_rationale(leaky), " ".join(["It keeps moving along."] * 60))
    v = validator.check(long_text, leaky)
    assert "length" in {r.code for r in v.reasons} and v.words > 250


def test_answer_line_checks(leaky, validator):
    body, _ = split_answer(template_rationale(leaky))
    wrong = next(s for s in validator.members if s != leaky.answer and s not in leaky.after_horizon_states)
    cases = {
        "missing": body,
        "wrong state": f"{body}\nAnswer: {wrong}",
        "two lines": f"{body}\nAnswer: {leaky.answer}\nAnswer: {leaky.answer}",
        "not last": f"Answer: {leaky.answer}\n{body}",
    }
    for name, text in cases.items():
        v = validator.check(text, leaky)
        assert "answer_line" in {r.code for r in v.reasons}, name
    synonym = validator.phrasings(leaky.answer)[-1]
    v = validator.check(f"{body}\n**Answer:** {synonym}.", leaky)
    assert v.ok, v.summary()
    assert validator.check("", leaky).reasons[0].code == "empty"


def test_count_words_ignores_punctuation():
    assert count_words("It's moving -- to the left, fast!") == 6


def test_validate_cli_reports_rejections_and_exits_1(synth_dir, pred_file, pred_sets, leaky, tmp_path, capsys):
    from distill.cli import main

    good = [{"query_id": q, "rationale": template_rationale(ps)} for q, ps in list(pred_sets.items())[:3]]
    bad = {"query_id": leaky.query_id, "rationale": _with_body(template_rationale(leaky), "It takes 3 s.")}
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*good, bad]))
    report = tmp_path / "report.json"
    rc = main(["validate", "--data", str(synth_dir), "--predicates", str(pred_file), "--rationales", str(path),
               "--out", str(report)])
    assert rc == 1
    rep = json.loads(report.read_text())
    assert rep["checked"] == 4 and rep["rejected"] == 1 and rep["by_code"] == {"number": 1}
    assert rep["rejections"][0]["query_id"] == leaky.query_id and rep["rejections"][0]["line"] == 4
    assert leaky.query_id in capsys.readouterr().out
    path.write_text(json.dumps({"query_id": "nope", "rationale": "x"}) + "\n")
    assert main(["validate", "--data", str(synth_dir), "--predicates", str(pred_file), "--rationales", str(path)]) == 2
    assert "r.jsonl:1" in capsys.readouterr().err
