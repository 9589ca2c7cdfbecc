"""Forecasters (phrase sources): what goes into the prompt for a query, how the output is parsed.

A forecaster is one `ForecasterSpec` (`forecasters.spec`) in `FORECASTERS`. Adding one is a registry entry::

    def _state_inputs(query, bench):
        return PromptInput(values={"state": query.target_state})

    register(ForecasterSpec(name="my-paraphrase", prompt="paraphrase", build=_state_inputs,
                            default_model="text-only", description="paraphrase oracle (App. U)"))

``build(query, bench)`` returns the text values of the template's placeholders and, per media placeholder, the image
paths (relative to the benchmark directory) that fill it; ``media_as`` says whether those images go in as separate
images or as one video. The runner renders the template, loads the images (`forecasters.media.FrameCache`), sends
the request and applies ``parse`` to each output.

Built in: ``m3`` (8 prefix frames + question, the paper's M3 prompt), ``text-only`` (timed transcript strictly before
the target time + question, the paper's text-only prompt), ``llava`` (M3 prompt, images), ``llava-video`` (M3 prompt,
the frames as one video), ``student`` (our student prompt; parses the ``Answer:`` line), ``likelihood`` (M3
prompt; scores candidate states instead of generating, `forecasters.likelihood`); and the canonicalization probes
of `forecasters.probes` (``paraphrase``, ``describe``), whose specs that module defines and this one registers.
"""

from __future__ import annotations

from eval.errors import InputError
from forecasters.parsing import parse_answer_line
from forecasters.presets import STUDENT_MAX_PIXELS
from forecasters.probes import PROBES
from forecasters.spec import ForecasterSpec, PromptInput
from prompts import format_transcript

__all__ = ["BUILTIN", "FORECASTERS", "ForecasterSpec", "PromptInput", "get_forecaster", "register"]


# --- built-in forecasters ---
def prefix_frames_inputs(query, bench=None) -> PromptInput:
    """M3-style input: the question, and the prefix frames in the ``frames`` slot."""
    return PromptInput(values={"question": query.question}, media={"frames": tuple(query.prefix_frames)})


def transcript_inputs(query, bench=None) -> PromptInput:
    """Text-only input: subject, the transcript cut strictly before ``target_time``, the question."""
    return PromptInput(values={"subject": query.subject, "question": query.question,
                               "transcript": format_transcript(query.transcript, query.target_time)})


def student_inputs(query, bench=None) -> PromptInput:
    return PromptInput(values={"question": query.question, "subject": query.subject},
                       media={"frames": tuple(query.prefix_frames)})


BUILTIN = (
    ForecasterSpec(
        name="m3", prompt="m3", build=prefix_frames_inputs, default_model="m3",
        description="M3: the 8 prefix frames + the question (paper prompt, verbatim); temperature 0, 24 tokens"),
    ForecasterSpec(
        name="text-only", prompt="text_only", build=transcript_inputs, default_model="text-only", media=(),
        description="text-only predictor: the timed state transcript before the target time + the question"),
    ForecasterSpec(
        name="llava", prompt="m3", build=prefix_frames_inputs, default_model="llava",
        description="LLaVA-1.6 with the M3 prompt, frames as images"),
    ForecasterSpec(
        name="llava-video", prompt="m3", build=prefix_frames_inputs, default_model="llava-video-7b",
        media_as="video", description="LLaVA-NeXT-Video with the M3 prompt, the frames as one video"),
    ForecasterSpec(
        name="student", prompt="student_answer", build=student_inputs, default_model="student-8b",
        parse=parse_answer_line, max_tokens=512, max_pixels=STUDENT_MAX_PIXELS,
        description="distilled student (--adapter PATH): reasons, then 'Answer: <state phrase>'"),
    ForecasterSpec(
        name="likelihood", prompt="m3", build=prefix_frames_inputs, default_model="m3", kind="likelihood",
        description="candidate canonical states (--candidates states|topN:RUN) ranked by their log-likelihood as "
                    "the answer to the M3 prompt (VCF-Lik; BLiM's candidate-prior normalization)"),
)

#: name -> spec: the built-in forecasters and the canonicalization probes (`forecasters.probes.PROBES`);
#: `register` adds to it (the extension point for other phrase sources).
FORECASTERS: dict[str, ForecasterSpec] = {s.name: s for s in (*BUILTIN, *PROBES)}


def register(spec: ForecasterSpec, *, replace: bool = False) -> ForecasterSpec:
    """Add a forecaster to the registry (``replace=True`` to override an existing name)."""
    if spec.name in FORECASTERS and not replace:
        raise InputError(f"forecaster {spec.name!r} is already registered")
    FORECASTERS[spec.name] = spec
    return spec


def get_forecaster(name: str) -> ForecasterSpec:
    if name not in FORECASTERS:
        raise InputError(f"unknown forecaster {name!r}; expected one of {sorted(FORECASTERS)}")
    return FORECASTERS[name]
