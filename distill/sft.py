"""SFT datasets in TRL's vision-language format, in two variants over the same queries.

Each example (one training query with an accepted rationale) is::

    {"query_id": "v00012.o1.Q2", "qtype": "Q2",
     "images": [<PIL.Image>, ... K prefix frames],
     "messages": [{"role": "user", "content": [{"type": "image"}, ... K times, {"type": "text", "text": "<question + instruction>"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "<rationale>\\nAnswer: <state>"}]}]}

- The user turn is built by the same code that serves the student (`forecasters.runner.render_request` with the
  ``student`` forecaster and its ``student_answer`` prompt), so training and inference prompts are identical; frames
  are the query's prefix frames, ``frames`` of them evenly spaced (`forecasters.media.subsample`, the last always
  kept), each downscaled to at most ``max_pixels`` pixels with its aspect ratio kept (`forecasters.media.FrameCache`:
  the serving path; pass the same ``--frames`` / ``--max-pixels`` to ``python -m forecasters run``). DynaPix used
  12 frames at 336 x 336; the default here is 8 frames at <= 336 * 336 pixels.
- ``cot``: the assistant turn is the rationale ending in ``Answer: <canonical state>``.
  ``answer``: the control, the answer line alone. Both variants hold exactly the same queries and prompts.
- Loss on the assistant turn only is the trainer's job (`distill.train`: ``assistant_only_loss``).

Written with ``datasets.save_to_disk`` to ``<out>/cot`` and ``<out>/answer`` (each built in a temporary directory and
moved into place), plus ``<out>/sft.config.json`` and ``<out>/sft.summary.json``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VARIANTS = ("cot", "answer")
DEFAULT_MAX_PIXELS = 336 * 336


@dataclass
class SFTBuildConfig:
    """``python -m distill sft``: accepted rationales -> the CoT and answer-only SFT datasets."""

    data: str = field(metadata={"help": "benchmark directory"})
    rationales: str = field(metadata={"help": "narration output directory (or its rationales.jsonl)"})
    out: str = field(metadata={"help": "output directory (<out>/cot, <out>/answer)"})
    split: str = field(default="train", metadata={"help": "queries to train on: train | val | test"})
    frames: int = field(default=8, metadata={"help": "prefix frames per example (evenly spaced, last kept)"})
    max_pixels: int | None = field(default=DEFAULT_MAX_PIXELS,
                                   metadata={"help": "downscale each frame to at most this many pixels (aspect kept)"})
    prompt: str = field(default="student_answer", metadata={"help": "student prompt template (id or .txt path)"})
    variants: list[str] = field(default_factory=lambda: list(VARIANTS), metadata={"help": "cot and/or answer"})
    limit: int | None = field(default=None, metadata={"help": "only the first N accepted rationales"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self):
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise ValueError(f"variants must be a non-empty subset of {VARIANTS}, got {self.variants}")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")


def features():
    """The Arrow schema of an SFT dataset (explicit, so image placeholders with no text never confuse inference)."""
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    return datasets.Features({
        "query_id": datasets.Value("string"),
        "qtype": datasets.Value("string"),
        "images": datasets.List(datasets.Image()),
        "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.List(part)}),
    })


def user_turn(query, bench, frame_cache, *, template, frames: int) -> tuple[list[dict[str, Any]], list]:
    """(user content parts, PIL images) of the student prompt for one query, built as the student is served."""
    from forecasters.backends import ImagePart, SamplingParams
    from forecasters.registry import get_forecaster
    from forecasters.runner import render_request

    req = render_request(get_forecaster("student"), template, query, bench, frame_cache, sampling=SamplingParams(),
                         n_frames=frames)
    content, images = [], []
    for p in req.parts:
        if isinstance(p, ImagePart):
            content.append({"type": "image", "text": None})
            images.append(p.image)
        else:
            content.append({"type": "text", "text": p})
    return content, images


def assistant_text(variant: str, rationale: str, answer: str) -> str:
    return rationale if variant == "cot" else f"Answer: {answer}"


def _examples(data: str, rows: list[dict], variant: str, prompt: str, frames: int, max_pixels: int | None):
    """Generator of one variant's examples (module-level so `datasets` can fingerprint its arguments)."""
    import prompts
    from eval.benchmark import Benchmark
    from forecasters.media import FrameCache

    bench = Benchmark.load(data)
    template = prompts.load(prompt)
    cache = FrameCache(bench.root, max_pixels=max_pixels, size=64)
    for r in rows:
        q = bench.query(r["query_id"])
        content, images = user_turn(q, bench, cache, template=template, frames=frames)
        yield {"query_id": q.id, "qtype": q.qtype, "images": images,
               "messages": [{"role": "user", "content": content},
                            {"role": "assistant", "content": [{"type": "text",
                                                               "text": assistant_text(variant, r["rationale"],
                                                                                      q.target_state)}]}]}


def _rationale_rows(cfg: SFTBuildConfig, bench) -> list[dict]:
    from distill.jsonl import read_records
    from eval.io import FormatError

    path = Path(cfg.rationales)
    if path.is_dir():
        path = path / "rationales.jsonl"
    if not path.exists():
        raise FormatError(path, "rationales file does not exist (run `python -m distill narrate` first)")
    split_ids = {q.id for q in bench.queries(cfg.split)}
    rows = []
    for i, d in enumerate(read_records(path), start=1):
        for key in ("query_id", "rationale"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise FormatError(path, "missing or not a string", line=i, field=key)
        if d.get("ok", True) and d["query_id"] in split_ids:
            if d["query_id"] not in bench.query_index:
                raise FormatError(path, f"unknown query id {d['query_id']!r}", line=i, field="query_id")
            rows.append(d)
    rows.sort(key=lambda d: d["query_id"])
    return rows[: cfg.limit] if cfg.limit is not None else rows


def build_sft(cfg: SFTBuildConfig) -> dict[str, Any]:
    """Build the requested variants (see the module docstring); returns the summary."""
    import datasets

    from distill.config import write_resolved
    from eval.benchmark import Benchmark
    from eval.io import write_json

    t0 = time.perf_counter()
    bench = Benchmark.load(cfg.data)
    rows = _rationale_rows(cfg, bench)
    if not rows:
        raise ValueError(f"{cfg.rationales}: no accepted rationales for split {cfg.split!r}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"examples": len(rows), "split": cfg.split, "frames": cfg.frames,
                               "max_pixels": cfg.max_pixels, "qtypes": dict(Counter(r.get("qtype") for r in rows)),
                               "narrators": dict(Counter(r.get("narrator", "?") for r in rows)), "variants": {}}
    was_enabled = datasets.is_progress_bar_enabled()
    if not cfg.progress:
        datasets.disable_progress_bars()
    try:
        for variant in cfg.variants:
            stage = Path(tempfile.mkdtemp(prefix=f".{variant}.building-", dir=out))
            try:
                ds = datasets.Dataset.from_generator(
                    _examples, features=features(), cache_dir=str(stage / "cache"),
                    gen_kwargs=dict(data=str(cfg.data), rows=rows, variant=variant, prompt=cfg.prompt,
                                    frames=cfg.frames, max_pixels=cfg.max_pixels))
                ds.save_to_disk(str(stage / "dataset"))
                del ds
                target = out / variant
                if target.exists():
                    shutil.rmtree(target)
                os.replace(stage / "dataset", target)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
            words = [len(assistant_text(variant, r["rationale"], r.get("answer", "")).split()) for r in rows]
            summary["variants"][variant] = {"path": str(out / variant), "mean_assistant_words":
                                            round(sum(words) / len(words), 1)}
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    write_resolved(cfg, out / "sft.config.json")
    write_json(out / "sft.summary.json", summary)
    return summary


def load_sft(path: str | os.PathLike):
    """Load a dataset written by `build_sft` (``<out>/cot`` or ``<out>/answer``)."""
    import datasets

    from eval.io import FormatError

    p = Path(path)
    if not (p / "dataset_info.json").exists():
        raise FormatError(p, "not an SFT dataset directory (expected datasets.save_to_disk output; run "
                             "`python -m distill sft`)")
    return datasets.load_from_disk(str(p))

