"""The held-out phrasing distribution: paraphrases of state texts that the benchmark's corpus never uses.

A canonical state's text is a raw corpus description (its cluster's seed), and the synthetic build records what every
such description says (``sim/phrases.jsonl``: its *denotation*, the attribute values it mentions). `paraphrase`
re-says exactly those values with the held-out lexicon (`eval.synth.lexicon.HELD_OUT`: other verbs, prepositions,
shape nouns and word orders, nothing omitted), so the paraphrase means the same as the text while sharing as little
surface form with the corpus as the attribute names allow. The paraphrase oracle, the synonym paraphraser and the
robust-read probes draw from it, so the canonicalization probes are not circular.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from eval.synth.lexicon import HELD_OUT, Denotation, TrueState, describe

#: The held-out lexicon with nothing left out: a paraphrase says everything its source says, no more.
_FULL = replace(HELD_OUT, omit={})


def paraphrase(denotation: Denotation, rng: np.random.Generator) -> str:
    """A held-out-lexicon phrase saying exactly the values of ``denotation``."""
    state = TrueState(motion=denotation["motion"], place=denotation.get("place", ""),
                      relation=denotation.get("relation", ""), other=denotation.get("other", ""),
                      pose=denotation.get("pose", ""))
    phrase, _ = describe(state, rng, _FULL)
    return phrase


def paraphrase_for(query_id: str, denotation: Denotation, seed: int = 0) -> str:
    """The paraphrase of one query's target (deterministic per ``(seed, query_id)``)."""
    import hashlib

    key = int(hashlib.sha1(f"{seed}:{query_id}".encode()).hexdigest()[:12], 16)
    return paraphrase(denotation, np.random.default_rng([seed, key]))
