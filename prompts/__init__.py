"""Prompt templates (verbatim from the papers where marked) and a tiny loader/renderer. Depends on nothing.

Shipped templates (``prompts/templates/<id>.txt``): ``text_only``, ``m3`` and ``benchmark_construction`` (verbatim,
PSR paper appendix, as the paper's reader sees them: the source's ``2--5`` is sent as ``2–5``, see `paper_text`),
and ours: ``student_answer``, ``teacher_narration``, ``paraphrase``, ``frame_description``.
See `prompts.templates` for the file format, the hash and the rendering rules::

    from prompts import load, format_transcript
    t = load("text_only")
    t.render(subject="red ball", transcript=format_transcript(q.transcript, q.target_time), question=q.question)
"""

from prompts.templates import (
    MediaSlot,
    PromptError,
    Template,
    format_transcript,
    list_templates,
    load,
    load_file,
    paper_text,
    parse_template,
    transcript_before,
)

__all__ = ["MediaSlot", "PromptError", "Template", "format_transcript", "list_templates", "load", "load_file",
           "paper_text", "parse_template", "transcript_before"]
