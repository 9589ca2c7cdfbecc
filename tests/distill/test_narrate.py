"""Narration: the template narrator (labelled, resumable job), the teacher's resample loop and failure records through
a real backend (a tiny local model), and the accept path."""

from __future__ import annotations

import json

import pytest

from distill.narrate import (
    FAULTS,
    NOISY_NARRATOR,
    TARGET_VARIANTS,
    TEMPLATE_NARRATOR,
    NarrateConfig,
    TeacherNarrator,
    assistant_target,
    normalise_answer,
    run_narration,
    strip_thinking,
    template_rationale,
    trajectory_target,
)
from distill.validator import split_answer
from eval.resumable import read_records
from forecasters.backends import Backend, BackendConfig, Completion


def test_template_narration_is_labelled_and_complete(synth_bench, template_rationales, pred_sets):
    rows = read_records(template_rationales / "rationales.jsonl")
    failed = read_records(template_rationales / "failures.jsonl")
    # every query narrated or refused; the refusals are the few whose canonical current state is false of what the
    # frames show (the validator rejects the contradiction: the card's label_truth is below 1)
    assert len(rows) + len(failed) == len(synth_bench.queries()) and len(failed) <= 0.02 * len(rows)
    assert all("contradiction" in json.dumps(f) for f in failed)
    assert {r["narrator"] for r in rows} == {TEMPLATE_NARRATOR}
    r = rows[0]
    assert r["rationale"] == template_rationale(pred_sets[r["query_id"]])
    assert r["rationale"].splitlines()[-1] == f"Answer: {r['answer']}"
    assert all(x["trajectory_target"] == trajectory_target(pred_sets[x["query_id"]]) for x in rows)
    cfg = json.loads((template_rationales / "narrate.config.json").read_text())
    assert cfg["identity"]["narrator"] == "template" and cfg["engine"] == "template-v3"


def test_template_states_evidence_first_and_the_answer_once(pred_sets, validator):
    """The body never names the answer unless the evidence itself does (it is the observed current state, an
    intermediate state or a Q5 object's end state); the answer line is the last line; evidence comes first."""
    from distill.rationale_stats import restatements

    restated = 0
    for ps in pred_sets.values():
        text = template_rationale(ps)
        body, answers = split_answer(text)
        assert answers == [ps.answer] and text.splitlines()[-1] == f"Answer: {ps.answer}"
        n = restatements(body, ps.answer, validator)
        own = {ps.current, *ps.intermediate, *(f.value for f in ps.facts if f.kind == "other_end_state")}
        assert n == 0 or ps.answer in own, (ps.query_id, body)
        restated += n > 0
        pos = [body.find(f.text) for f in ps.facts if f.section != "answer" and f.text in body]
        assert pos == sorted(pos), ps.query_id
        assert ps.fact("answer").text not in body
    assert restated < len(pred_sets) / 4


def test_sft_targets_of_the_three_variants(pred_sets):
    ps = next(p for p in pred_sets.values() if p.horizon >= 3)
    row = {"query_id": ps.query_id, "rationale": template_rationale(ps), "answer": ps.answer,
           "trajectory_target": trajectory_target(ps)}
    assert set(TARGET_VARIANTS) == {"cot", "answer", "trajectory"}
    assert assistant_target("cot", row) == row["rationale"]
    assert assistant_target("answer", row) == f"Answer: {ps.answer}"
    traj = assistant_target("trajectory", row).splitlines()
    assert traj[0] == f"Now: {ps.current}" and traj[-1] == f"Answer: {ps.answer}"
    assert [ln.removeprefix("Then: ") for ln in traj if ln.startswith("Then: ")] == ps.intermediate
    # the labels the CoT body names, without its evidence text
    body = split_answer(row["rationale"])[0]
    assert all(s in body for s in ps.intermediate)
    assert not any(f.text in assistant_target("trajectory", row) for f in ps.facts if f.section in ("scene", "motion"))
    from eval.errors import InputError

    with pytest.raises(InputError, match="trajectory_target"):
        assistant_target("trajectory", {"query_id": "q", "rationale": "x", "answer": "y"})
    with pytest.raises(InputError, match="unknown SFT variant"):
        assistant_target("labels", row)


def test_noisy_narrator_exercises_the_validator(synth_dir, pred_file, pred_sets, validator, tmp_path):
    """The CPU stand-in for a sampling teacher: injected faults are rejected, logged and resampled; what is accepted
    is the clean template rationale; the run is deterministic for a seed."""
    cfg = NarrateConfig(data=str(synth_dir), predicates=str(pred_file), out=str(tmp_path / "a"),
                        narrator=NOISY_NARRATOR, split="train", limit=60, fault_rate=0.5, max_tries=6, seed=3,
                        progress=False)
    s = run_narration(cfg)
    assert s.rejected_tries > 10 and s.accepted + s.failed == 60
    # a fault can trip more than its own code: an announced answer restates it, a degenerate body states no evidence
    assert set(s.reject_codes) <= {*FAULTS, "contradiction", "answer_restated", "no_evidence"}
    assert len(set(s.reject_codes) & set(FAULTS)) >= 4
    rejects = read_records(tmp_path / "a" / "rejects.jsonl")
    assert len(rejects) == s.rejected_tries
    for r in rejects:
        assert not validator.check(r["text"], pred_sets[r["query_id"]]).ok
    for r in read_records(tmp_path / "a" / "rationales.jsonl"):
        assert r["narrator"] == NOISY_NARRATOR and r["rationale"] == template_rationale(pred_sets[r["query_id"]])
    s2 = run_narration(NarrateConfig(**{**cfg.__dict__, "out": str(tmp_path / "b")}))
    assert (s2.rejected_tries, s2.reject_codes) == (s.rejected_tries, s.reject_codes)


def test_narration_job_resumes_and_refuses_another_config(synth_dir, pred_file, tmp_path):
    base = dict(data=str(synth_dir), predicates=str(pred_file), out=str(tmp_path), narrator="template",
                split="train", progress=False)
    s1 = run_narration(NarrateConfig(**base, limit=5))
    assert (s1.accepted, s1.skipped_done) == (5, 0)
    # a crash left a torn line: it is cut off, and the rerun narrates the rest
    with open(tmp_path / "rationales.jsonl", "a") as f:
        f.write('{"query_id": "torn')
    s2 = run_narration(NarrateConfig(**base, limit=8))
    assert (s2.accepted, s2.skipped_done) == (3, 5)
    ids = [r["query_id"] for r in read_records(tmp_path / "rationales.jsonl")]
    assert len(ids) == len(set(ids)) == 8
    with pytest.raises(ValueError, match="another config"):
        run_narration(NarrateConfig(**{**base, "min_words": 90}, limit=8))


def test_teacher_failures_are_resampled_and_recorded(synth_dir, pred_file, tiny_lm, tmp_path):
    """A tiny random model never writes a valid rationale: every try is rejected, logged, and the query fails."""
    cfg = NarrateConfig(data=str(synth_dir), predicates=str(pred_file), out=str(tmp_path), narrator="teacher",
                        backend="hf", model=str(tiny_lm), dtype="float32", limit=2, max_tries=3, max_tokens=24,
                        seed=7, progress=False)
    s = run_narration(cfg)
    assert (s.accepted, s.failed, s.tries, s.rejected_tries) == (0, 2, 6, 6)
    fails = read_records(tmp_path / "failures.jsonl")
    assert [f["tries"] for f in fails] == [3, 3]
    assert all(f["seeds"] == [7, 8, 9] and len(f["reasons"]) == 3 for f in fails)
    assert all("length" in reason for f in fails for reason in f["reasons"])
    rejects = read_records(tmp_path / "rejects.jsonl")
    assert len(rejects) == 6 and {r["try"] for r in rejects} == {0, 1, 2}
    assert all(isinstance(r["text"], str) and r["reasons"] for r in rejects)
    conf = json.loads((tmp_path / "narrate.config.json").read_text())
    assert conf["identity"]["prompt_id"] == "teacher_narration" and len(conf["identity"]["prompt_hash"]) == 16
    # rerun: the failures are done; --redo_failed tries them again
    assert run_narration(cfg).skipped_done == 2
    s3 = run_narration(NarrateConfig(**{**cfg.__dict__, "redo_failed": True}))
    assert s3.failed == 2 and len(read_records(tmp_path / "failures.jsonl")) == 2


class ScriptedTeacher(Backend):
    """A backend that answers each request with the next text of a script (per query id). A tiny model cannot
    write a valid 80-word rationale, so the accept path is driven by scripted outputs."""

    name = "scripted"

    def __init__(self, script: dict[str, list[str]]):
        super().__init__(BackendConfig(model="scripted"))
        self.script = {k: list(v) for k, v in script.items()}
        self.requests = []

    def _generate_one(self, request):
        self.requests.append(request)
        return Completion(request_id=request.id, texts=[self.script[request.id].pop(0)])


def test_teacher_accepts_after_a_rejection_and_normalises_the_answer(pred_sets, validator):
    ps = next(p for p in pred_sets.values() if p.qtype == "Q2")
    synonym = validator.phrasings(ps.answer)[-1]
    body = template_rationale(ps).rsplit("\nAnswer:", 1)[0]
    good = f"<think>scratch work</think>\n{body}\nAnswer: {synonym}"
    backend = ScriptedTeacher({ps.query_id: ["too short\nAnswer: x", good]})
    logged = []
    teacher = TeacherNarrator(backend, validator, max_tries=3, seed=5,
                              on_reject=lambda *a: logged.append(a))
    [res] = teacher.narrate([ps])
    assert res.ok and res.tries == 2 and res.seeds == [5, 6]
    assert res.rationale == f"{body}\nAnswer: {ps.answer}"  # canonical answer line, thinking dropped
    assert len(logged) == 1 and "length" in logged[0][3] and "answer_line" in logged[0][3]
    first = backend.requests[0]
    assert first.sampling.temperature == 0.7 and first.parts[-1] == "/no_think"
    assert all(f.text in first.parts[0] for f in ps.facts if f.section != "answer") and ps.answer in first.parts[0]
    assert ps.fact("answer").text not in first.parts[0]


def test_helpers():
    assert strip_thinking("<think>a\nb</think>\nHello") == "Hello"
    assert strip_thinking("<think>never closed") == ""
    assert normalise_answer("Body.\nAnswer: rolling downhill", "rolling down the ramp") == \
        "Body.\nAnswer: rolling down the ramp"
