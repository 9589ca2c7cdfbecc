"""Answer accuracy on the eval split during training (`distill.train`): the student generates for each eval example
from its user turn (frames + question, the served prompt), its output is parsed as the student forecaster parses it
(`forecasters.parsing.parse_answer_line`: the last ``Answer:`` line) and compared with the target phrase.

``accuracy = #{parsed phrase == target} / n`` and ``parsed = #{an Answer: line was found} / n`` over ``n`` examples
(a seeded sample of at most ``eval_answer_samples`` eval examples). Both are logged next to ``eval_loss`` at every
evaluation (``eval_answer_accuracy``, ``eval_answer_parsed``). Under several processes each rank generates a strided
share (padded to equal counts so sharded engines stay in step) and the counts are summed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass
class AnswerExample:
    """One eval example: the user turn (TRL message parts), its images, the target phrase (cleaned)."""

    user: list[dict[str, Any]]
    images: list
    target: str


def answer_examples(dataset, n: int | None, seed: int) -> list[AnswerExample]:
    """The eval examples of the answer accuracy (a seeded sample of ``n``; all when ``n`` is None)."""
    from forecasters.parsing import clean_phrase, parse_answer_line

    rows = list(range(len(dataset)))
    if n is not None and n < len(rows):
        rows = sorted(random.Random(seed).sample(rows, n))
    out = []
    for i in rows:
        ex = dataset[i]
        msgs = ex["messages"]
        if "answer" in ex and ex["answer"]:
            target = clean_phrase(ex["answer"])
        else:
            target = parse_answer_line(msgs[-1]["content"][-1]["text"]).phrase or ""
        out.append(AnswerExample(user=[m for m in msgs if m["role"] != "assistant"], images=list(ex["images"]),
                                 target=target))
    return out


def _encode(processor, batch: list[AnswerExample]):
    """Left-padded prompts (chat template up to the assistant turn) with their images, as the hf backend builds them."""
    from trl.data_utils import prepare_multimodal_messages

    texts = [processor.apply_chat_template(prepare_multimodal_messages(ex.user, images=ex.images),
                                           add_generation_prompt=True, tokenize=False) for ex in batch]
    images = [im for ex in batch for im in ex.images]
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    try:
        return processor(text=texts, images=images or None, padding=True, return_tensors="pt")
    finally:
        tok.padding_side = side


def generate_answers(model, processor, batch: list[AnswerExample], *, max_new_tokens: int,
                     synced_gpus: bool = False) -> list[str]:
    """Greedy outputs (decoded, special tokens dropped) of ``batch``."""
    import torch

    inputs = _encode(processor, batch).to(model.device)
    tok = processor.tokenizer
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                             synced_gpus=synced_gpus)
    new = out[:, inputs["input_ids"].shape[1]:]
    return tok.batch_decode(new, skip_special_tokens=True)


def score_answer(text: str, target: str) -> tuple[bool, bool]:
    """(parsed: an ``Answer:`` line with a phrase, hit: that phrase equals the target)."""
    from forecasters.parsing import parse_answer_line

    p = parse_answer_line(text)
    parsed = p.ok and "no_answer_line" not in p.flags
    return parsed, parsed and p.phrase == target


def answer_accuracy(model, processor, examples: list[AnswerExample], *, rank: int = 0, world_size: int = 1,
                    batch_size: int = 1, max_new_tokens: int = 512, synced_gpus: bool = False) -> tuple[int, int, int]:
    """(hits, parsed, n) of this rank's strided share of ``examples`` (padded with example 0, not counted)."""
    share = list(range(rank, len(examples), world_size))
    per_rank = -(-len(examples) // world_size)
    share += [-1] * (per_rank - len(share))
    hits = parsed = n = 0
    was_training = model.training
    model.eval()
    try:
        for a in range(0, len(share), batch_size):
            idx = share[a:a + batch_size]
            batch = [examples[max(i, 0)] for i in idx]
            texts = generate_answers(model, processor, batch, max_new_tokens=max_new_tokens, synced_gpus=synced_gpus)
            for i, text, ex in zip(idx, texts, batch, strict=True):
                if i < 0:
                    continue
                p, h = score_answer(text, ex.target)
                parsed, hits, n = parsed + p, hits + h, n + 1
    finally:
        model.train(was_training)
    return hits, parsed, n


def student_trainer_class():
    """`trl.SFTTrainer` whose `evaluate` adds the answer accuracy to the eval loss (built lazily: TRL is heavy)."""
    import torch
    from trl import SFTTrainer

    class StudentTrainer(SFTTrainer):
        def __init__(self, *args, answer_eval: list[AnswerExample] | None = None, answer_max_new_tokens: int = 512,
                     **kwargs):
            super().__init__(*args, **kwargs)
            self.answer_eval = answer_eval
            self.answer_max_new_tokens = answer_max_new_tokens

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            if not self.answer_eval or eval_dataset is not None:
                return metrics
            acc = self.accelerator
            sharded = self.is_fsdp_enabled or self.is_deepspeed_enabled
            with acc.autocast():
                counts = answer_accuracy(acc.unwrap_model(self.model), self.processing_class, self.answer_eval,
                                         rank=acc.process_index, world_size=acc.num_processes,
                                         batch_size=self.args.per_device_eval_batch_size,
                                         max_new_tokens=self.answer_max_new_tokens,
                                         synced_gpus=sharded and acc.num_processes > 1)
            hits, parsed, n = (int(x) for x in acc.reduce(torch.tensor(counts, device=acc.device), "sum").tolist())
            extra = {f"{metric_key_prefix}_answer_accuracy": hits / n, f"{metric_key_prefix}_answer_parsed": parsed / n,
                     f"{metric_key_prefix}_answer_n": n}
            self.log(extra)
            metrics.update(extra)
            return metrics

    return StudentTrainer
