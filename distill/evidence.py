"""The perception-solved student's input: the observed evidence as a fixed-format text block instead of the frames.

``--student-input evidence`` asks what reasoning adds when perception is perfect. The student reads, in place of the
prefix frames, what the simulator says about the scene at the end of the prefix, and nothing after it:

- the state the prefix shows (the last transcript entry at or before ``prefix_end``) and that segment's simulator
  detail (``sim_state``, rendered by `eval.synth.lexicon.reference_text`): both describe the observed segment;
- the simulator facts frames up to ``prefix_end`` decide (`distill.motion.prefix_facts`): layout, the other objects,
  table edge, container opening, support and contact at the last prefix frame, direction, speed trend and relative
  speed over the last `distill.motion.COURSE_FRAMES` frames, and the objects it is approaching over those frames.

No trajectory label (intermediate states, timing buckets, a Q5 object's end state), no collision course (it reads the
contacts after the prefix) and nothing that depends on the answer enters the block: the rationale's
``observed_detail`` fact is left out when it names the answer, the evidence block always states the detail, so that
whether it appears cannot tell the answer. `EVIDENCE_FIELDS` are always present, in this order, one ``field: value``
line each (``none`` when the simulator has nothing to say)::

    scene: a table and a ramp
    other objects: the blue cube, the red ball
    state now: resting on the table
    ...

The prompt (`EVIDENCE_PROMPT`, id ``student_evidence``) is the ``student_answer`` prompt with the evidence block in
place of the frames, so the three SFT targets (`distill.narrate.assistant_target`), the validator, the faithfulness
test and the answers table are the ones of the frames track. `student_request` renders either input for one query;
the SFT sets (`distill.sft`), the faithfulness check and the students' evaluation (`distill.study`) all call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from distill.facts import Fact
from eval.errors import InputError

STUDENT_INPUTS = ("frames", "evidence")
EVIDENCE_PROMPT_ID = "student_evidence"
EVIDENCE_PROMPT = """# Ours: the perception-solved student's prompt (distill.evidence): the student_answer prompt with the observed
# evidence at the end of the prefix, a fixed-format text block from the simulator, in place of the frames.
---
Evidence at the end of the clip:
{evidence}
{question} Think step by step about how the {subject} is moving and how its state will change. Then give your final answer on its own last line as "Answer: <predicted future state in 2–5 words>"."""

EVIDENCE_FIELDS = ("scene", "other objects", "state now", "detail", "support", "touching", "above container",
                   "table edge", "direction", "speed trend", "relative speed", "approaching")
"""The block's lines, in order; each is present for every query."""

#: fact kind -> (field, how its value is written); see `evidence_fields`
_FROM_FACT = {"support_now": "support", "contact_now": "touching", "container": "above container",
              "edge": "table edge", "direction": "direction", "speed_trend": "speed trend",
              "relative_speed": "relative speed", "approaching": "approaching"}


def _names(value: str | None) -> str:
    parts = [p for p in (value or "").split("|") if p]
    return ", ".join(f"the {p}" for p in parts) if parts else "none"


def _value(f: Fact) -> str:
    """A fact's value as the block writes it."""
    from distill.motion import DIRECTION_TEXT, LAYOUT_NAMES

    v = f.value or ""
    if f.kind == "layout":
        pieces = [LAYOUT_NAMES[p] for p in v.split("|") if p in LAYOUT_NAMES]
        return ", ".join(pieces) if pieces else "an open floor between two walls"
    if f.kind in ("scene_objects", "contact_now", "approaching"):
        return _names(v)
    if f.kind == "direction":
        return "not moving" if v == "still" else f"moving {DIRECTION_TEXT.get(v, v)}"
    if f.kind == "speed_trend":
        return {"faster": "speeding up", "slower": "getting slower"}.get(v, v)
    if f.kind == "relative_speed":
        return f.text.rstrip(".")
    if f.kind == "container":
        return "yes, above the opening"
    if f.kind == "edge":
        return "moving toward the edge of the table"
    if f.kind == "support_now":
        return {"gripper": "held by the gripper", "nothing": "nothing"}.get(v, v)
    return v or f.text.rstrip(".")


@dataclass
class EvidenceIndex:
    """The benchmark's lookups (`distill.predicates.OracleIndex`, simulator records cached) for evidence blocks."""

    bench: Any

    @cached_property
    def oracle(self):
        from distill.predicates import OracleIndex

        return OracleIndex(self.bench)

    def fields(self, query) -> dict[str, str]:
        """`EVIDENCE_FIELDS` -> value for ``query`` (module docstring); reads nothing after ``prefix_end``."""
        from distill.motion import prefix_facts
        from distill.predicates import TIME_EPS

        seen = sorted((float(e.t), e.state) for e in query.transcript if float(e.t) <= query.prefix_end + TIME_EPS)
        out = dict.fromkeys(EVIDENCE_FIELDS, "none")
        out["state now"] = seen[-1][1] if seen else "unknown"
        detail = self.oracle.current_sim_state(query)
        from eval.synth.lexicon import TrueState, reference_text

        if TrueState.is_key(detail):
            out["detail"] = reference_text(TrueState.from_key(detail))
        rec = self.oracle.sim(query.video_id)
        facts = prefix_facts(rec, query) if rec is not None else []
        for f in facts:
            if f.kind == "layout":
                out["scene"] = _value(f)
            elif f.kind == "scene_objects":
                out["other objects"] = _value(f)
            elif f.kind in _FROM_FACT:
                out[_FROM_FACT[f.kind]] = _value(f)
        if any(f.kind == "direction" for f in facts) and out["speed trend"] == "none":
            out["speed trend"] = "steady" if out["direction"] != "not moving" else "none"
        if rec is not None and out["direction"] == "none" and out["support"] == "held by the gripper":
            out["direction"] = "held still"
        return out

    def block(self, query) -> str:
        """The evidence block of ``query``: one ``field: value`` line per `EVIDENCE_FIELDS` entry."""
        return "\n".join(f"{k}: {v}" for k, v in self.fields(query).items())


def evidence_template():
    """The ``student_evidence`` prompt (`EVIDENCE_PROMPT`) as a `prompts.Template` (id and hash like a shipped one)."""
    import prompts

    return prompts.parse_template(EVIDENCE_PROMPT, id=EVIDENCE_PROMPT_ID, path=f"{__name__}.EVIDENCE_PROMPT")


def student_template(student_input: str, prompt: str = "student_answer"):
    """The student's prompt template for ``student_input`` (frames: ``prompt``; evidence: `evidence_template`)."""
    import prompts

    check_input(student_input)
    return evidence_template() if student_input == "evidence" else prompts.load(prompt)


def check_input(student_input: str) -> str:
    if student_input not in STUDENT_INPUTS:
        raise InputError(f"student_input must be one of {list(STUDENT_INPUTS)}, got {student_input!r}")
    return student_input


def evidence_spec(index: EvidenceIndex):
    """A `forecasters.spec.ForecasterSpec` (not registered) that fills the evidence prompt from ``index``."""
    from forecasters.parsing import parse_answer_line
    from forecasters.spec import ForecasterSpec, PromptInput

    def build(query, bench=None):
        return PromptInput(values={"evidence": index.block(query), "question": query.question,
                                   "subject": query.subject})

    return ForecasterSpec(name="student-evidence", prompt=EVIDENCE_PROMPT_ID, build=build, default_model="student-8b",
                          parse=parse_answer_line, max_tokens=512,
                          description="perception-solved student: the evidence block instead of the frames")


def student_request(query, bench, *, student_input: str, template, frame_cache=None, frames: int | None = None,
                    index: EvidenceIndex | None = None, sampling=None):
    """The student's user turn for ``query`` as a backend `Request`: the prefix frames (``frames`` evenly spaced,
    from ``frame_cache``) with the ``student_answer`` prompt, or the evidence block with the evidence prompt."""
    from forecasters.backends import SamplingParams
    from forecasters.registry import get_forecaster
    from forecasters.runner import render_request

    sampling = sampling or SamplingParams()
    if check_input(student_input) == "evidence":
        spec = evidence_spec(index or EvidenceIndex(bench))
        return render_request(spec, template, query, bench, frame_cache, sampling=sampling)
    return render_request(get_forecaster("student"), template, query, bench, frame_cache, sampling=sampling,
                          n_frames=frames)
