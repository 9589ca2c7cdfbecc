"""The rationale validator: honest rationales pass; every leak kind is caught with its reason; an adversarial file of
crafted rationales gets exactly its expected verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.facts import PredicateSet
from distill.narrate import template_rationale
from distill.validator import RationaleValidator, count_words, lexical_problem, numbers_in, split_answer

ADVERSARIAL = Path(__file__).parent / "data" / "adversarial_rationales.json"
_ADV = json.loads(ADVERSARIAL.read_text())


def _with_body(text: str, extra: str) -> str:
    body, answers = split_answer(text)
    return f"{body} {extra}\nAnswer: {answers[-1]}"


@pytest.fixture(scope="module")
def leaky(pred_sets):
    """A Q1 query whose object enters states after the target (so a future leak is possible)."""
    return next(ps for ps in pred_sets.values() if ps.qtype == "Q1" and ps.after_horizon_states)


@pytest.fixture(scope="module")
def adv_validator():
    return RationaleValidator(_ADV["states"])


def test_adversarial_file_is_big_enough_and_covers_every_code():
    cases = _ADV["cases"]
    assert len(cases) >= 50
    codes = {c for case in cases for c in case["expect"]}
    assert {"ok", "number", "frame_index", "coordinate", "future_leak", "answer_statement", "contradiction",
            "lexical_diversity", "length", "answer_line"} <= codes


@pytest.mark.parametrize("case", _ADV["cases"], ids=[c["id"] for c in _ADV["cases"]])
def test_adversarial_rationales(case, adv_validator):
    ps = PredicateSet.from_dict(_ADV["predicate_sets"][case["ps"]])
    body = case["body"].replace("{base}", _ADV["bases"][case["ps"]])
    answer = case.get("answer", ps.answer)
    verdict = adv_validator.check(body + (f"\nAnswer: {answer}" if answer else ""), ps)
    assert (sorted(verdict.codes) or ["ok"]) == case["expect"], verdict.summary()


def test_honest_template_rationales_pass(pred_sets, validator):
    """Template rationales pass, but for the few whose canonical current state is false of what the frames show
    (the label is below 100% true, card `label_truth`): those are contradictions, never another rejection."""
    rejected = []
    for ps in pred_sets.values():
        v = validator.check(template_rationale(ps), ps)
        assert 80 <= v.words <= 250
        if not v.ok:
            assert {r.code for r in v.reasons} == {"contradiction"}, (ps.query_id, v.summary())
            rejected.append(ps.query_id)
    assert len(rejected) <= 0.02 * len(pred_sets), rejected


def test_future_leak_is_rejected_for_every_phrasing(leaky, validator):
    later = leaky.after_horizon_states[0]
    for phrase in validator.phrasings(later):
        text = _with_body(template_rationale(leaky), f"Much later it will be {phrase.upper()}.")
        v = validator.check(text, leaky)
        assert [r.code for r in v.reasons] == ["future_leak"], (phrase, v.summary())


#: A vocabulary of nested phrasings (the mechanism does not depend on which states a benchmark mines).
NESTED = {"standing upright": ["standing upright"], "tipping over": ["tipping over", "falling over"],
          "falling": ["falling", "dropping"], "hanging in the air": ["hanging in the air"],
          "dropping into the container": ["dropping into the container"],
          "resting on the ramp": ["resting on the ramp"], "rolling down the ramp": ["rolling down the ramp"],
          "going over the edge": ["going over the edge", "reaching the edge"]}


def test_longest_match_first_both_ways():
    """An allowed phrasing inside a forbidden one does not hide it; a forbidden one inside an allowed one is not
    counted ('falling over' is tipping over, allowed; 'falling' alone is forbidden). In a present-tense sentence a
    forbidden phrasing whose words are all words of an allowed one is read as a partial description of what is
    true (the open-vocabulary rule, `distill.validator`), so the leak is asserted where the sentence is about the
    future."""
    validator = RationaleValidator(NESTED)
    ps = PredicateSet(query_id="q", qtype="Q1", horizon=1, domain="dominoes", subject="red domino", question="?",
                      answer="tipping over", current="standing upright", upcoming=["tipping over"], facts=[],
                      allowed_states=["standing upright", "tipping over"], after_horizon_states=["falling"])
    assert validator.leaks("Later it will be falling over.", ps) == []
    assert validator.leaks("Later it will be falling.", ps) == ["falling"]
    assert validator.leaks("It is falling over now.", ps) == validator.leaks("It is falling now.", ps) == []
    assert validator.leaks("It ends up falling.", ps) == ["falling"]
    ps2 = PredicateSet(query_id="q", qtype="Q1", horizon=1, domain="container", subject="red box", question="?",
                       answer="falling", current="hanging in the air", upcoming=["falling"], facts=[],
                       allowed_states=["hanging in the air", "falling"],
                       after_horizon_states=["dropping into the container"])
    assert validator.leaks("It is dropping.", ps2) == []
    assert validator.leaks("It is dropping into the container.", ps2) == ["dropping into the container"]
    assert validator.leaks("It has dropped into the bin.", ps2) == ["dropped into the bin"]


def _nested_pair(validator):
    """The first (by text) pair of the benchmark's phrasings ``inner`` (state A) and ``outer`` (state B != A) where
    ``outer`` is ``inner`` with words added at the end and is worded as B only."""
    from distill.lexicon import keys

    by_keys = {}
    for st, phrases in sorted(validator.members.items()):
        for p in phrases:
            by_keys.setdefault(keys(p), set()).add(st)
    for st, phrases in sorted(validator.members.items()):
        for p in phrases:
            k = keys(p)
            for other, ops in sorted(validator.members.items()):
                for op in ops:
                    ok = keys(op)
                    if other != st and len(ok) > len(k) and ok[:len(k)] == k and by_keys[ok] == {other} \
                            and by_keys[k] == {st} and op.lower().startswith(p.lower() + " "):
                        return st, p, other, op
    raise AssertionError("the benchmark has no nested phrasings")


def test_longest_match_first_on_the_benchmark_vocabulary(validator):
    """The same both ways on the open vocabulary the benchmark mined (compositional phrasings nest: "rolling on the
    shelf" inside "rolling on the shelf next to the orange cube")."""
    inner_state, inner, outer_state, outer = _nested_pair(validator)

    def ps(allowed: str, after: str) -> PredicateSet:
        return PredicateSet(query_id="q", qtype="Q1", horizon=1, domain="workshop", subject="teal plank",
                            question="?", answer=allowed, current=allowed, upcoming=[allowed], facts=[],
                            allowed_states=[allowed], after_horizon_states=[after])

    future = "Later on it will be {}."
    assert validator.leaks(future.format(outer), ps(inner_state, outer_state)) == [outer.lower()]
    assert validator.leaks(future.format(outer), ps(outer_state, inner_state)) == []
    assert validator.leaks(future.format(inner), ps(outer_state, inner_state)) == [inner.lower()]


def test_number_detectors():
    for text in ("a couple of seconds", "three quarters of a second", "fifteen hundredths", "five-tenths of a second",
                 "½", "half a second", "a second and a half", "one point five", "x²"):
        assert numbers_in(f"It takes {text} to happen."), text
    for text in ("two dominoes", "the lower half of the ramp", "a second ball", "twice as fast", "the first object"):
        assert not numbers_in(f"It sees {text} now."), text


def test_lexical_diversity_rule():
    assert lexical_problem(" ".join(["the"] * 80)) is not None
    assert lexical_problem(" ".join(["It rolls down the ramp."] * 5)) is not None
    assert lexical_problem("It rolls down the ramp toward the table, where a box waits near the edge and a ball "
                           "sits still beside a wall; nothing else in the scene moves at all right now.") is None


def test_length_bounds(leaky, validator):
    short = f"It moves.\nAnswer: {leaky.answer}"
    v = validator.check(short, leaky)
    assert [r.code for r in v.reasons] == ["no_evidence", "length"]  # three words state none of its evidence


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
        assert "answer_line" in v.codes, name
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


def test_a_quoted_predicate_is_never_a_leak_or_contradiction():
    """On an open vocabulary a predicate's wording may coincide with some state's phrasing; quoted verbatim it is
    true up to the horizon, paraphrased outside the quote it is still checked."""
    from distill.facts import Fact

    validator = RationaleValidator(NESTED)
    ps = PredicateSet(query_id="q", qtype="Q1", horizon=1, domain="ramp", subject="red ball", question="?",
                      answer="rolling down the ramp", current="resting on the ramp", upcoming=["rolling down the ramp"],
                      facts=[Fact("edge", "The red ball is moving toward the wall, reaching the edge.", "motion", "edge")],
                      allowed_states=["resting on the ramp", "rolling down the ramp"],
                      after_horizon_states=["going over the edge"])
    assert validator.leaks("The red ball is moving toward the wall, reaching the edge.", ps) == []
    assert validator.leaks("Later the red ball is reaching the edge.", ps) == ["reaching the edge"]
