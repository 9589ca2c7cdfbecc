"""Narration: the template narrator (labelled, resumable job), the teacher's resample loop and failure records through
a real backend (a tiny local model), and the accept path."""

from __future__ import annotations

import json

import pytest

from distill.jsonl import read_records
from distill.narrate import (
    TEMPLATE_NARRATOR,
    NarrateConfig,
    TeacherNarrator,
    normalise_answer,
    run_narration,
    strip_thinking,
    template_rationale,
)
from forecasters.backends import Backend, BackendConfig, Completion


def test_template_narration_is_labelled_and_complete(synth_bench, template_rationales, pred_sets):
    rows = read_records(template_rationales / "rationales.jsonl")
    assert len(rows) == len(synth_bench.queries())  # every query narrated, none failed
    assert read_records(template_rationales / "failures.jsonl") == []
    assert {r["narrator"] for r in rows} == {TEMPLATE_NARRATOR}
    r = rows[0]
    assert r["rationale"] == template_rationale(pred_sets[r["query_id"]])
    assert r["rationale"].splitlines()[-1] == f"Answer: {r['answer']}"
    cfg = json.loads((template_rationales / "narrate.config.json").read_text())
    assert cfg["identity"]["narrator"] == "template" and cfg["engine"] == "template-v1"


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
    assert all(f.text in first.parts[0] for f in ps.facts) and ps.answer in first.parts[0]


def test_helpers():
    assert strip_thinking("<think>a\nb</think>\nHello") == "Hello"
    assert strip_thinking("<think>never closed") == ""
    assert normalise_answer("Body.\nAnswer: rolling downhill", "rolling down the ramp") == \
        "Body.\nAnswer: rolling down the ramp"
