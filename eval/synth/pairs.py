"""Training triples for the canonicalization encoder: what the describer means by its words, from a disjoint world.

The paper canonicalizes free-form state descriptions by greedy embedding clustering at cosine 0.85 (BGE). A packaged
sentence encoder (MiniLM) places synonyms of this world's describer below that threshold ("resting" / "lying still",
0.81) and some opposites above it ("smashing into" / "being hit by", 0.87), so its clusters would carry labels that are
false of their members. The toolkit's contrastive fine-tune (`retrieval.canon.finetune`) fixes the geometry with
triples made here, never from the benchmark it will canonicalize:

- the *states* come from a disjoint simulated world (another seed, `true_states`: simulation and labelling only, no
  frames);
- per state, an *anchor* and a *positive* are two corpus-lexicon descriptions of it with the same denotation (they
  say the same attribute values, in other words or another order), and the *negative* says the same attributes of a
  state that differs in exactly one value (`one_value_apart`: a minimal pair, the hardest confusion).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from eval.synth.lexicon import (
    CORPUS,
    EVENT_MOTIONS,
    MOTIONS,
    PLACES,
    POSES,
    RELATIONS,
    SHAPES,
    Denotation,
    Lexicon,
    TrueState,
    describe,
    satisfies,
)

#: Values an attribute may be swapped to in a minimal pair.
_VALUES = {"motion": MOTIONS, "place": PLACES, "relation": RELATIONS, "other": tuple(SHAPES), "pose": POSES}
MAX_TRIES = 40
"""Draws of a description before a state is skipped (its denotations never matched)."""


def true_states(seed: int, videos: int, workers: int | None = None) -> list[TrueState]:
    """The true states of every segment of ``videos`` simulated videos (seed ``seed``; no frames rendered)."""
    from eval.synth import scenes, states

    out: list[TrueState] = []
    for i in range(videos):
        rng = np.random.default_rng(np.random.SeedSequence([seed, i, 0x5EED]).spawn(1)[0])
        family = scenes.family_of(scenes.DOMAINS[i % len(scenes.DOMAINS)], rng)
        rec = scenes.simulate(family, rng)
        out.extend(seg.state for traj in states.trajectories(rec) for seg in traj)
    return out


def _describe_as(state: TrueState, denotation: Denotation, rng: np.random.Generator, lex: Lexicon) -> str | None:
    """A description of ``state`` whose denotation is exactly ``denotation`` (None after `MAX_TRIES` draws)."""
    full = replace(lex, omit={k: (0.0 if k in denotation else 1.0) for k in ("pose", "relation", "place")})
    for _ in range(MAX_TRIES):
        phrase, den = describe(state, rng, full)
        if den == denotation:
            return phrase
    return None


def one_value_apart(state: TrueState, denotation: Denotation, rng: np.random.Generator) -> TrueState | None:
    """A state that agrees with ``state`` everywhere except one value the denotation mentions (None when no
    attribute can change)."""
    keys = [k for k in denotation if len(_VALUES[k]) > 1]
    if not keys:
        return None
    k = keys[int(rng.integers(len(keys)))]
    others = [v for v in _VALUES[k] if v != getattr(state, k)]
    new = replace(state, **{k: others[int(rng.integers(len(others)))]})
    needs_other = new.motion in EVENT_MOTIONS or new.place == "on_object" or bool(new.relation)
    if satisfies(new, denotation) or (needs_other and not new.other):
        return None
    return new


def triples(states: Iterable[TrueState], seed: int, per_state: int = 1,
            lex: Lexicon = CORPUS) -> list[tuple[str, str, str]]:
    """``(anchor, positive, negative)`` phrase triples (module docstring), deduplicated and sorted."""
    rng = np.random.default_rng([seed, 0x7A1F])
    out: set[tuple[str, str, str]] = set()
    for state in states:
        for _ in range(per_state):
            anchor, den = describe(state, rng, lex)
            positive = _describe_as(state, den, rng, lex)
            neg_state = one_value_apart(state, den, rng)
            negative = _describe_as(neg_state, {k: getattr(neg_state, k) for k in den}, rng, lex) if neg_state else None
            if positive is not None and negative is not None and anchor != negative:
                out.add((anchor, positive, negative))
    return sorted(out)
