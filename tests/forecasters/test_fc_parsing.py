"""Parsing model outputs into state phrases."""

from __future__ import annotations

import pytest

from forecasters.parsing import parse_answer_line, parse_phrase


@pytest.mark.parametrize("raw, phrase, flags", [
    ("falling off the edge", "falling off the edge", []),
    ("The ball will be falling off the edge.", "falling off the edge", ["preamble"]),
    ('"Rolling down the ramp."', "rolling down the ramp", []),
    ("‘tipping over’", "tipping over", []),
    ("Answer: **knocked over**", "knocked over", []),
    ("It will likely be lying on its side.", "lying on its side", ["preamble"]),
    ("The predicted future state is: broken into pieces", "broken into pieces", ["preamble"]),
    ("The red ball is going to roll off the table!", "roll off the table", ["preamble"]),
    ("The state of the red ball will be stopped at the wall", "stopped at the wall", ["preamble"]),
    ("- sliding to the left", "sliding to the left", []),
    ("sliding to the left\nBecause the ramp is steep.", "sliding to the left", ["multiline"]),
    ("<think>the ramp is steep</think>\nrolling down the slope", "rolling down the slope", []),
    ("falling", "falling", ["length"]),
    ("rolling down the slope, then stopping at the far wall", "rolling down the slope then stopping at the far wall",
     ["length"]),
    ("the lid's hinge-side opens", "the lid's hinge-side opens", []),
])
def test_parse_phrase(raw, phrase, flags):
    p = parse_phrase(raw)
    assert p.ok and p.phrase == phrase and p.flags == flags


@pytest.mark.parametrize("raw", ["", "   \n  ", "...", "“”", None, "<think>only thoughts</think>"])
def test_empty_or_unparseable_is_a_parse_failure(raw):
    p = parse_phrase(raw)
    assert not p.ok and p.phrase is None and "empty" in p.flags


def test_a_phrase_that_merely_starts_like_a_preamble_is_kept():
    assert parse_phrase("the ball falls").phrase == "the ball falls"  # no modal verb: not a preamble
    assert parse_phrase("state").phrase == "state"  # nothing after the label: kept as is


def test_student_answer_line_from_a_chain_of_thought():
    raw = ("The ball sits at the top of the ramp.\nGravity pulls it down the slope.\n"
           "It will roll until it hits the wall.\nAnswer: stopped at the wall")
    p = parse_answer_line(raw)
    assert p.ok and p.phrase == "stopped at the wall" and p.flags == []
    # the last Answer line wins; "Final answer:" works too
    assert parse_answer_line("Answer: rolling\nthinking more...\nFinal answer: falling off the edge").phrase == \
        "falling off the edge"


def test_student_direct_answer_and_truncated_chain():
    direct = parse_answer_line("falling off the edge")
    assert direct.ok and direct.phrase == "falling off the edge" and direct.flags == ["no_answer_line"]
    cut = parse_answer_line("The ball is on the ramp and gravity pulls it down so it will roll further and")
    assert not cut.ok and cut.phrase is None and cut.flags == ["no_answer_line"]
    assert not parse_answer_line("Answer:").ok
