"""The names of the baselines and oracles (`retrieval.methods` dispatches them), importable without their code."""

from __future__ import annotations

BASELINES = ("random", "question-only", "lookup", "transition-table", "knn-future", "state-classifier", "persistence",
             "zero-shot")
ORACLES = ("semantic-text", "paraphrase", "state-prototype", "independent-appearance")
#: The space kind each method needs ("any": semantic or visual).
NEEDS = {"random": "any", "question-only": "text", "lookup": "any", "transition-table": "any", "knn-future": "any",
         "state-classifier": "any",
         "persistence": "visual", "zero-shot": "visual", "semantic-text": "text", "paraphrase": "text",
         "state-prototype": "any", "independent-appearance": "any"}
#: The prefix of an oracle's run name: an oracle reads the true future, so its runs say so.
ORACLE_PREFIX = "oracle-"


def run_label(name: str, space: str | None) -> str:
    """The method name a baseline's or oracle's run stores: ``<name>[<space>]`` (``random``: no space), an oracle's
    prefixed by ``oracle-`` (``oracle-semantic-text[minilm]``)."""
    if name not in BASELINES + ORACLES:
        raise ValueError(f"unknown method {name!r}; baselines: {BASELINES}; oracles: {ORACLES}")
    label = name if space is None or name == "random" else f"{name}[{space}]"
    return ORACLE_PREFIX + label if name in ORACLES else label
