"""Where an answer's tokens start: the shared helpers of the backends that score answers (log-likelihood).

An answer ``a`` to a chat prompt is rendered by the model's own chat template as an open assistant answer
(``continue_final_message=True``: the rendered text ends with ``a``, no end-of-turn token). The text before ``a``
is the same for every answer of a prompt (`render_answers` checks it). Its tokens are the *shared prefix*; the
answer's tokens are those of the full rendering after the longest common prefix (`common_prefix`) with the
tokens of the text before ``a`` (`answer_spans`), so a token that merges the answer's first characters with the
template text before it (a SentencePiece ``"▁falling"`` after ``"[/INST] "``) counts as the answer's.

Over HTTP the engine returns the prompt's tokens as decoded strings; `answer_tokens_from_strings` walks back from
the end until the strings cover the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eval.errors import InputError


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def render_answers(apply_chat_template: Callable[..., str], messages: list[dict],
                   answers: Sequence[str]) -> tuple[str, list[str]]:
    """``(prefix_text, full_texts)``: each answer rendered as the open assistant turn after ``messages``, and the
    text before it (identical for every answer; ``ValueError`` otherwise)."""
    prefix, fulls = None, []
    for a in answers:
        full = apply_chat_template(messages + [{"role": "assistant", "content": a}], tokenize=False,
                                   add_generation_prompt=False, continue_final_message=True)
        if not full.endswith(a):
            raise InputError(f"the chat template does not end the open assistant turn with the answer {a!r} "
                             f"(rendered ...{full[-80:]!r})")
        p = full[: len(full) - len(a)]
        if prefix is None:
            prefix = p
        elif p != prefix:
            raise InputError("the chat template renders the prompt differently for different answers")
        fulls.append(full)
    return prefix or "", fulls


@dataclass(frozen=True)
class AnswerSpans:
    """Token ids of a prompt's answers: ``prefix_ids`` (the text before the answers), ``full_ids[j]`` (prompt +
    answer j), ``starts[j]`` (index in ``full_ids[j]`` of answer j's first token), ``shared`` (``min(starts)``:
    tokens every full rendering shares with the prefix, the part computed once)."""

    prefix_ids: list[int]
    full_ids: list[list[int]]
    starts: list[int]

    @property
    def shared(self) -> int:
        return min(self.starts) if self.starts else len(self.prefix_ids)

    def n_tokens(self, j: int) -> int:
        return len(self.full_ids[j]) - self.starts[j]


def answer_spans(tokenize: Callable[[str], list[int]], prefix_text: str, full_texts: Sequence[str]) -> AnswerSpans:
    """Tokenize the prefix and each full rendering (same ``tokenize``, so special-token handling agrees) and find
    each answer's first token (`common_prefix`). ``ValueError`` for an answer without tokens."""
    prefix_ids = list(tokenize(prefix_text))
    full_ids, starts = [], []
    for text in full_texts:
        ids = list(tokenize(text))
        start = common_prefix(prefix_ids, ids)
        if start >= len(ids):
            raise InputError(f"no answer tokens after the prompt in {text[-60:]!r}")
        full_ids.append(ids)
        starts.append(start)
    return AnswerSpans(prefix_ids, full_ids, starts)


def answer_tokens_from_strings(tokens: Sequence[str], answer: str) -> int:
    """How many of the last ``tokens`` (decoded token strings of a prompt that ends with ``answer``) are the
    answer's: the fewest whose concatenation ends with ``answer`` (``ValueError`` when none does)."""
    text = ""
    for m in range(1, len(tokens) + 1):
        text = (tokens[-m] or "") + text
        if len(text) >= len(answer):
            if text.endswith(answer):
                return m
            break
    raise InputError(f"the prompt's last tokens {list(tokens[-8:])!r} do not spell the answer {answer!r}")
