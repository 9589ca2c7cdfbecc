"""Templated question text for the five question types (several templates each; one is drawn per query, seeded).

Placeholders: ``{subject}`` (``small red ball``), ``{k}`` (``1.5 seconds``), ``{anchor}`` (a corpus-lexicon
description of a later state, read after "it is": ``falling``, ``resting on the floor next to the blue cube``) and
``{objects}`` (``red ball, blue cube and green brick``).
"""

from __future__ import annotations

import numpy as np

TEMPLATES: dict[str, tuple[str, ...]] = {
    "Q1": (
        "What will the {subject} do next?",
        "What happens to the {subject} right after this clip?",
        "What is the next state of the {subject}?",
        "Right after the clip ends, what will the {subject} be doing?",
        "Predict the {subject}'s next state.",
    ),
    "Q2": (
        "How will the {subject} end up?",
        "What is the final state of the {subject}?",
        "By the end of the video, what state will the {subject} be in?",
        "What state will the {subject} finish in?",
    ),
    "Q3": (
        "What will the {subject} be doing {k} after the clip ends?",
        "In {k}, what state will the {subject} be in?",
        "Predict the state of the {subject} {k} from now.",
        "{k} later, what is the {subject} doing?",
    ),
    "Q4": (
        "What will the {subject} be doing just before it is {anchor}?",
        "Before the {subject} is {anchor}, what state is it in?",
        "Just before the {subject} is {anchor}, what will it be doing?",
    ),
    "Q5": (
        "The {objects} are in this scene. How will each of them end up? Answer for the {subject}.",
        "Consider the {objects}. What final state will each one reach? Give the {subject}'s.",
        "What is the end state of each of the {objects}? Answer for the {subject}.",
    ),
}


def seconds_text(k: float) -> str:
    """``1 second``, ``1.5 seconds``."""
    return f"{k:g} second" + ("" if k == 1 else "s")


def join_subjects(subjects: list[str]) -> str:
    """``red ball and blue box``; ``red ball, blue box and green block``."""
    return subjects[0] if len(subjects) == 1 else ", ".join(subjects[:-1]) + " and " + subjects[-1]


def question_text(qtype: str, rng: np.random.Generator, **fields: str) -> str:
    """One template of ``qtype``, drawn with ``rng``, filled with ``fields`` (first letter capitalised)."""
    templates = TEMPLATES[qtype]
    text = templates[int(rng.integers(len(templates)))].format(**fields)
    return text[0].upper() + text[1:]
