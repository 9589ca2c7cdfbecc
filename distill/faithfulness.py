"""Does the student's answer depend on its rationale? A SCOTT-style faithfulness check (Wang et al., 2023: decode
with the oracle rationale, then with a perturbed one, and see whether the answer follows).

For each query the student gets its normal prompt (frames + question, the ``student_answer`` template) and a forced
assistant prefix, then decodes greedily after ``Answer:``:

- ``gold``: the query's accepted rationale body (the answer line removed), then ``Answer:``;
- ``perturbed``: the same body with every phrasing of the target state replaced by a counterfactual state
  ``s' != target`` (`counterfactual_state`: a fixed, seeded choice among the benchmark's states that the rationale
  does not already name), then ``Answer:``;
- ``none``: no rationale, ``Answer:`` right away.

Each decoded answer is cleaned like the student parser (`forecasters.parsing.clean_phrase`, first line) and mapped to
a canonical state when it equals one of its phrasings. Rates over the n queries (fractions in [0, 1]):

- ``gold_acc`` = P(answer_gold = target) -- the answer agrees with the rationale it was given;
- ``follows_perturbation`` = P(answer_perturbed = s') -- the answer follows the changed rationale;
- ``moved`` = P(answer_perturbed != answer_gold) -- SCOTT's signal: a faithful student changes its answer (answers
  compared as canonical states when they map to one, else as decoded text);
- ``none_acc`` = P(answer_none = target) -- what the student answers without any rationale.

A student whose answers ignore the rationale has ``moved`` near 0; a faithful one has ``moved`` and
``follows_perturbation`` near 1. Writes ``<out>/faithfulness.jsonl`` (per query), ``faithfulness.json`` (rates) and
``faithfulness.md``; ``python -m distill faithfulness``.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONDITIONS = ("gold", "perturbed", "none")


@dataclass
class FaithfulnessConfig:
    """``python -m distill faithfulness``: perturb rationales, watch the student's answer."""

    data: str = field(metadata={"help": "benchmark directory"})
    model: str = field(metadata={"help": "the student's base model (HF id or path)"})
    rationales: str = field(metadata={"help": "gold rationales (narration output dir or rationales.jsonl)"})
    out: str = field(metadata={"help": "output directory"})
    adapter: str | None = field(default=None, metadata={"help": "the student's LoRA adapter (unmerged)"})
    split: str | None = field(default="test", metadata={"help": "queries: train | val | test | null (all)"})
    limit: int | None = field(default=200, metadata={"help": "at most N queries (in query id order)"})
    frames: int | None = field(default=None, metadata={"help": "prefix frames per prompt (default: all 8)"})
    max_pixels: int | None = field(default=None, metadata={"help": "downscale frames to at most this many pixels"})
    max_new_tokens: int = field(default=16, metadata={"help": "tokens decoded after 'Answer:'"})
    batch_size: int = field(default=8, metadata={"help": "queries per generate call"})
    dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    seed: int = field(default=0, metadata={"help": "seed of the counterfactual choice"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


def counterfactual_state(target: str, states: list[str], avoid: set[str], key: str, seed: int = 0) -> str:
    """A state other than ``target`` and not in ``avoid``, picked by ``crc32(key) + seed`` (deterministic)."""
    pool = [s for s in states if s != target and s not in avoid] or [s for s in states if s != target]
    if not pool:
        raise ValueError("the benchmark needs at least two states for a counterfactual")
    return pool[(zlib.crc32(key.encode()) + seed) % len(pool)]


def perturb(body: str, phrasings: list[str], replacement: str) -> tuple[str, int]:
    """``body`` with every phrasing (longest first, whole words, any case) replaced; returns (text, replacements)."""
    ps = sorted({p for p in phrasings if p.strip()}, key=len, reverse=True)
    if not ps:
        return body, 0
    rx = re.compile(r"(?<![\w'])(?:" + "|".join(r"\s+".join(map(re.escape, p.split())) for p in ps) + r")(?![\w'])",
                    re.I)
    return rx.subn(replacement, body)


def canonical(phrase: str | None, lookup: dict[str, str]) -> str | None:
    """The canonical state whose phrasing equals ``phrase`` after cleaning (None when none does)."""
    from forecasters.parsing import clean_phrase

    if not phrase:
        return None
    return lookup.get(clean_phrase(phrase))


def phrase_lookup(members: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """cleaned phrasing -> canonical state text."""
    from forecasters.parsing import clean_phrase

    out = {}
    for state, ps in members.items():
        for p in ps:
            out.setdefault(clean_phrase(p), state)
    return out


def _decode(backend, items: list[tuple[Any, str]], max_new_tokens: int) -> list[str]:
    """Greedy continuation of each (request, forced assistant prefix); returns the first decoded line."""
    import torch

    texts = [backend.chat_prompt(req) + prefix for req, prefix in items]
    enc = backend.encode_prompts([req for req, _ in items], texts).to(backend.device)
    with torch.inference_mode():
        out = backend.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=backend.tokenizer.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    decoded = backend.tokenizer.batch_decode(new, skip_special_tokens=True)
    return [next((ln.strip() for ln in d.splitlines() if ln.strip()), "") for d in decoded]


def run_faithfulness(cfg: FaithfulnessConfig, backend=None) -> dict[str, Any]:
    """Run the check (see the module docstring); returns the rates written to ``faithfulness.json``."""
    from tqdm.auto import tqdm

    import prompts
    from distill.config import write_resolved
    from distill.jsonl import read_records
    from distill.predicates import OracleIndex
    from distill.validator import split_answer
    from eval.benchmark import Benchmark
    from eval.io import write_json, write_jsonl
    from forecasters.backends import BackendConfig, SamplingParams
    from forecasters.media import FrameCache
    from forecasters.registry import get_forecaster
    from forecasters.runner import render_request

    t0 = time.perf_counter()
    bench = Benchmark.load(cfg.data)
    index = OracleIndex(bench, use_sim=False)
    members = {s: list(p) for s, p in index.members.items()}
    lookup = phrase_lookup(index.members)
    states = [s.text for s in bench.states()]
    path = Path(cfg.rationales)
    rows = read_records(path / "rationales.jsonl" if path.is_dir() else path)
    split_ids = None if cfg.split is None else {q.id for q in bench.queries(cfg.split)}
    rows = sorted((r for r in rows if split_ids is None or r["query_id"] in split_ids), key=lambda r: r["query_id"])
    rows = rows[: cfg.limit] if cfg.limit is not None else rows
    if not rows:
        raise ValueError(f"{cfg.rationales}: no rationales for split {cfg.split!r}")
    own = backend is None
    if own:
        from forecasters.backends.hf import HFBackend

        backend = HFBackend(BackendConfig(model=cfg.model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device,
                                          max_pixels=cfg.max_pixels, batch_size=cfg.batch_size, seed=cfg.seed))
    spec, template = get_forecaster("student"), prompts.load("student_answer")
    frames = FrameCache(bench.root, max_pixels=cfg.max_pixels)
    per_query = []
    bar = tqdm(total=len(rows), unit="q", desc="faithfulness", disable=not cfg.progress)
    try:
        for start in range(0, len(rows), cfg.batch_size):
            chunk = rows[start:start + cfg.batch_size]
            items, meta = [], []
            for r in chunk:
                q = bench.query(r["query_id"])
                req = render_request(spec, template, q, bench, frames, sampling=SamplingParams(), n_frames=cfg.frames)
                body, _ = split_answer(r["rationale"])
                low = body.lower()
                named = {s for s in states if s.lower() in low}
                cf = counterfactual_state(q.target_state, states, named, q.id, cfg.seed)
                cf_body, n_repl = perturb(body, members.get(q.target_state, [q.target_state]), cf)
                prefixes = {"gold": f"{body}\nAnswer:", "perturbed": f"{cf_body}\nAnswer:", "none": "Answer:"}
                items += [(req, prefixes[c]) for c in CONDITIONS]
                meta.append((q, cf, n_repl))
            answers = _decode(backend, items, cfg.max_new_tokens)
            for i, (q, cf, n_repl) in enumerate(meta):
                a = dict(zip(CONDITIONS, answers[3 * i:3 * i + 3], strict=True))
                c = {k: canonical(v, lookup) for k, v in a.items()}
                per_query.append({"query_id": q.id, "qtype": q.qtype, "target": q.target_state, "counterfactual": cf,
                                  "replacements": n_repl, "answers": a, "canonical": c})
            bar.update(len(chunk))
    finally:
        bar.close()
        if own:
            backend.close()
    rates = summarize(per_query)
    rates["wall_s"] = round(time.perf_counter() - t0, 2)
    out = Path(cfg.out)
    write_jsonl(out / "faithfulness.jsonl", per_query)
    write_json(out / "faithfulness.json", rates)
    (out / "faithfulness.md").write_text(to_markdown(rates), encoding="utf-8")
    write_resolved(cfg, out / "faithfulness.config.json")
    return rates


def summarize(per_query: list[dict[str, Any]]) -> dict[str, Any]:
    """The rates of the module docstring (plus per question type) from per-query records."""
    def rates(rs):
        n = len(rs)
        if n == 0:
            return {"n": 0}

        def frac(pred):
            return round(sum(1 for r in rs if pred(r)) / n, 4)

        return {"n": n,
                "gold_acc": frac(lambda r: r["canonical"]["gold"] == r["target"]),
                "follows_perturbation": frac(lambda r: r["canonical"]["perturbed"] == r["counterfactual"]),
                "moved": frac(lambda r: (r["canonical"]["perturbed"] or r["answers"]["perturbed"])
                              != (r["canonical"]["gold"] or r["answers"]["gold"])),
                "none_acc": frac(lambda r: r["canonical"]["none"] == r["target"])}

    out = rates(per_query)
    qtypes = sorted({r["qtype"] for r in per_query})
    out["by_qtype"] = {t: rates([r for r in per_query if r["qtype"] == t]) for t in qtypes}
    return out


def to_markdown(rates: dict[str, Any]) -> str:
    cols = ("n", "gold_acc", "follows_perturbation", "moved", "none_acc")
    lines = ["| subset | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]

    def row(name, r):
        cells = [str(r.get("n", 0))] + [f"{100 * r[c]:.1f}" if c in r else "-" for c in cols[1:]]
        return f"| {name} | " + " | ".join(cells) + " |"

    lines.append(row("all", rates))
    lines += [row(t, r) for t, r in rates.get("by_qtype", {}).items()]
    return "Faithfulness (SCOTT-style; rates in %)\n\n" + "\n".join(lines) + "\n"

