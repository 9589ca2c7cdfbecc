"""Fit a tiny model for a few steps so it answers with state phrases (plumbing checks, not a baseline).

A random tiny model (`forecasters.tiny_models`) emits noise, which parses to nothing; for an end-to-end check of
forecaster -> phrase file -> retrieval -> report it helps when the tiny model says something state-like. This fits it
on the benchmark's train split with the forecaster's own prompt: input = the rendered prompt (through the ``hf``
backend's chat template and processor, images included), target = the query's canonical target state (the student
prompt: ``"Answer: <state>"``) + end of turn; loss = cross-entropy on the target tokens only; AdamW, ``batch_size``
examples a step. A progress bar (tqdm; ``progress=False`` turns it off) shows the steps and the running loss.
"""

from __future__ import annotations

import os
import random
from pathlib import Path


def fit_on_benchmark(model_dir: str | os.PathLike, data: str | os.PathLike, *, forecaster: str = "text-only",
                     steps: int = 60, batch_size: int = 8, lr: float = 3e-3, seed: int = 0,
                     split: str = "train", progress: bool = True) -> float:
    """Fit the model in ``model_dir`` in place; returns the mean loss of the last 10 steps (nats per target token).

    Each step: ``batch_size`` random queries of ``split``, left-padded, so every target sits at the right end of its
    row; the label mask keeps the last ``len(target tokens)`` positions of each row.
    """
    import torch
    from tqdm.auto import tqdm

    import prompts
    from eval.benchmark import Benchmark
    from forecasters.backends import SamplingParams
    from forecasters.backends.hf import HFBackend, HFConfig
    from forecasters.media import FrameCache
    from forecasters.prompting import render_request
    from forecasters.registry import get_forecaster

    bench = Benchmark.load(data)
    spec = get_forecaster(forecaster)
    template = prompts.load(spec.prompt)
    queries = bench.queries(split) or bench.queries()
    backend = HFBackend(HFConfig(model=str(model_dir), device="cpu", dtype="float32"))
    model, tok = backend.model, backend.tokenizer
    end = tok.eos_token or ""
    frames = FrameCache(bench.root)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    bar = tqdm(range(steps), desc="fit tiny model", unit="step", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        batch = [rng.choice(queries) for _ in range(batch_size)]
        reqs = [render_request(spec, template, q, bench, frames, sampling=SamplingParams()) for q in batch]
        targets = [(f"Answer: {q.target_state}" if spec.name == "student" else q.target_state) + end for q in batch]
        enc = backend.encode_prompts(reqs, [backend.chat_prompt(r) + t for r, t in zip(reqs, targets, strict=True)])
        labels = torch.full_like(enc["input_ids"], -100)
        for i, t in enumerate(targets):
            n = len(tok(t, add_special_tokens=False)["input_ids"])
            labels[i, -n:] = enc["input_ids"][i, -n:]
        loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    model.eval()
    model.save_pretrained(Path(model_dir))
    tail = losses[-10:]
    return sum(tail) / len(tail)
