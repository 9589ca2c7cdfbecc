"""The prompt templates: verbatim against the paper, loud rendering errors, the transcript cut before the target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import prompts
from prompts import MediaSlot, PromptError, format_transcript, load, parse_template, transcript_before


def _papers_dir() -> Path | None:
    """``shared/papers`` beside the checkout or a folder above it (worktrees live deeper than the main checkout)."""
    for d in Path(__file__).resolve().parents:
        if (d / "shared" / "papers").is_dir():
            return d / "shared" / "papers"
    return None


PAPERS = _papers_dir()

# The paper's prompts (appendix "we reproduce the generation prompts verbatim below"), copied character for character
# from the paper's LaTeX source (the lines of shared/papers/001_*.txt).
SOURCE_TEXT_ONLY = ("An object (’{subject}’) was observed with these states over time: {t₁s: state₁; t₂s: state₂; …}. "
                    "{question} Answer with ONLY the object’s predicted future state as a short phrase (2--5 words), "
                    "no explanation.")
SOURCE_M3 = ("[8 prefix frames] {question} Answer with ONLY the object’s predicted future state as a short phrase "
             "(2--5 words), no explanation.")
SOURCE_CONSTRUCTION = ("Watch this video segment. List each visible object and its state trajectory as (state, time) "
                       "pairs. Then, for the object ’{subject}’, write a {Q-type} question whose answer is its "
                       "{next / end / after-$k$s / intermediate} state, and give that ground-truth state as a short "
                       "predicate phrase.")
SOURCE = {"text_only": SOURCE_TEXT_ONLY, "m3": SOURCE_M3, "benchmark_construction": SOURCE_CONSTRUCTION}
# What the paper's reader sees (the typeset PDF), written out by hand: this is what the model is sent.
RENDERED_M3 = ("[8 prefix frames] {question} Answer with ONLY the object’s predicted future state as a short phrase "
               "(2\u20135 words), no explanation.")


def as_paper_text(t: prompts.Template) -> str:
    """The template body with our placeholder names put back to the paper's spelling (header ``paper-placeholders``: ``ours = paper | ...``)."""
    body = t.body
    for item in t.meta.get("paper-placeholders", "").split("|"):
        if item.strip():
            ours, paper = (s.strip() for s in item.split("=", 1))
            assert "{" + ours + "}" in body, f"{t.id}: paper-placeholder {ours} not in the body"
            body = body.replace("{" + ours + "}", paper)
    return body


@pytest.mark.parametrize("tid", sorted(SOURCE))
def test_verbatim_templates_match_the_rendered_paper_character_for_character(tid):
    t = load(tid)
    assert t.verbatim
    assert as_paper_text(t) == prompts.paper_text(SOURCE[tid])
    assert "--" not in t.body and "$" not in t.body  # no LaTeX source reaches the model


def test_the_paper_dash_is_sent_as_an_en_dash():
    assert as_paper_text(load("m3")) == RENDERED_M3
    text = load("m3").render_parts({"question": "What next?"}, media=["frames"])[1]
    assert "(2\u20135 words)" in text and "2-5" not in text and "2--5" not in text
    assert prompts.paper_text("a---b, 2--5, after-$k$s, plain - hyphen") == "a\u2014b, 2\u20135, after-ks, plain - hyphen"
    for ours in ("paraphrase", "frame_description"):  # our templates write the range the same way
        assert "(2\u20135 words)" in load(ours).body


@pytest.mark.skipif(PAPERS is None or not list(PAPERS.glob("001_*.txt")), reason="paper text not present")
@pytest.mark.parametrize("tid", sorted(SOURCE))
def test_verbatim_sources_are_lines_of_the_paper_file(tid):
    paper_lines = next(PAPERS.glob("001_*.txt")).read_text(encoding="utf-8").split("\n")
    assert SOURCE[tid] in paper_lines
    assert as_paper_text(load(tid)) in [prompts.paper_text(line) for line in paper_lines]


def test_every_shipped_template_loads_with_a_stable_id_and_hash():
    ids = prompts.list_templates()
    assert {"text_only", "m3", "benchmark_construction", "student_answer", "teacher_narration", "paraphrase",
            "frame_description"} <= set(ids)
    hashes = {load(i).hash for i in ids}
    assert len(hashes) == len(ids)  # distinct bodies, distinct hashes
    for i in ids:
        t = load(i)
        assert t.id == i and re.fullmatch(r"[0-9a-f]{16}", t.hash)
        assert parse_template(Path(t.path).read_text(encoding="utf-8"), id=i).hash == t.hash


def test_hash_covers_the_body_only():
    a = parse_template("# one header\n---\nSay {x}.\n", id="a")
    b = parse_template("# another header\n# more: meta\n---\nSay {x}.", id="b")
    c = parse_template("---\nSay {x}!\n", id="c")
    assert a.hash == b.hash != c.hash
    assert b.meta == {"more": "meta"}


def test_render_fills_placeholders_and_keeps_literal_braces():
    t = parse_template("---\n{{literal}} {a} and {b}, {a} again", id="t")
    assert t.placeholders == ("a", "b")
    assert t.render(a="x", b="y") == "{literal} x and y, x again"


@pytest.mark.parametrize("values, needle", [
    ({"a": "x"}, "missing value(s) for ['b']"),
    ({"a": "x", "b": "y", "c": "z"}, "unknown placeholder(s) ['c']"),
    ({"a": "x", "b": 3}, "not strings"),
])
def test_render_fails_loudly(values, needle):
    t = parse_template("---\n{a} and {b}", id="t2", path="some/t2.txt")
    with pytest.raises(PromptError) as e:
        t.render(**values)
    assert needle in str(e.value) and "t2" in str(e.value) and "some/t2.txt" in str(e.value)


@pytest.mark.parametrize("body", ["a { b", "a {b c} d", "{1x}", "stray }"])
def test_stray_braces_are_rejected_at_load(body):
    with pytest.raises(PromptError, match="stray"):
        parse_template("---\n" + body, id="bad")


def test_header_must_end_with_a_separator():
    with pytest.raises(PromptError, match="no '---' line"):
        parse_template("# only a header\n", id="h")
    with pytest.raises(PromptError, match="header lines start with"):
        parse_template("text before header\n---\nbody", id="h")


def test_unknown_template_id_lists_the_shipped_ones():
    with pytest.raises(PromptError, match="m3"):
        load("no_such_prompt")


def test_media_slots_render_as_parts_without_surrounding_whitespace():
    parts = load("m3").render_parts({"question": "What will the red ball do next?"}, media=["frames"])
    assert parts[0] == MediaSlot("frames")
    assert parts[1].startswith("What will the red ball do next? Answer with ONLY")
    assert len(parts) == 2
    with pytest.raises(PromptError, match="missing"):
        load("m3").render(question="q")  # frames is neither text nor media here
    with pytest.raises(PromptError, match="unknown placeholder"):
        load("text_only").render_parts({"subject": "s", "transcript": "t", "question": "q"}, media=["frames"])


def test_transcript_is_cut_strictly_before_the_target_time():
    entries = [{"t": 1.25, "state": "falling off the edge"}, {"t": 0.0, "state": "resting on the table"},
               {"t": 0.5, "state": "rolling"}, {"t": 2.0, "state": "lying on the floor"}]
    assert format_transcript(entries, 1.25) == "0s: resting on the table; 0.5s: rolling"
    assert format_transcript(entries, 1.2501) == "0s: resting on the table; 0.5s: rolling; 1.25s: falling off the edge"
    assert format_transcript(entries, 0.0) == ""
    assert transcript_before([(0.333, "a"), (3, "b")], 10) == [(0.333, "a"), (3.0, "b")]
    assert format_transcript([(0.333, "a"), (3, "b")], 10) == "0.33s: a; 3s: b"


def test_text_only_prompt_never_contains_a_state_at_or_after_the_target():
    class E:  # objects with .t / .state, like eval.schema.TranscriptEntry
        def __init__(self, t, state):
            self.t, self.state = t, state

    text = load("text_only").render(subject="red ball", question="What will the red ball do next?",
                                    transcript=format_transcript([E(0.0, "resting"), E(0.9, "rolling"),
                                                                  E(1.0, "THE ANSWER")], 1.0))
    assert "THE ANSWER" not in text
    assert text.startswith("An object (’red ball’) was observed with these states over time: 0s: resting; 0.9s: rolling. ")
