"""SFT datasets in TRL's vision-language format, in two variants over the same queries, written as Parquet.

Each example (one query with an accepted rationale) is::

    {"query_id": "v00012.o1.Q2", "qtype": "Q2", "answer": "<canonical state>",
     "images": [<PIL.Image>, ... K prefix frames],
     "messages": [{"role": "user", "content": [{"type": "image"}, ... K times, {"type": "text", "text": "<question + instruction>"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "<rationale>\\nAnswer: <state>"}]}]}

- The user turn is built by the same code that serves the student (`forecasters.runner.render_request` with the
  ``student`` forecaster and its ``student_answer`` prompt), so training and inference prompts are identical; frames
  are the query's prefix frames, ``frames`` of them evenly spaced (`forecasters.media.subsample`, the last always
  kept), each downscaled to at most ``max_pixels`` pixels with its aspect ratio kept (`forecasters.media.FrameCache`:
  the serving path). DynaPix used 12 frames at 336 x 336; the default here is 8 frames at <= 336 * 336 pixels.
- ``--student-input evidence`` (the perception-solved student, `distill.evidence`): the user turn is the evidence
  block at the prefix end with the ``student_evidence`` prompt, text only; the set has no ``images`` column, so TRL
  trains it as a text dataset and any causal LM can learn it.
- ``cot``: the assistant turn is the rationale ending in ``Answer: <canonical state>``.
  ``answer``: the control, the answer line alone. ``trajectory``: the state labels the CoT names, then the answer
  line, with no evidence or reasoning text (the control separating extra labels from reasoning). The targets are
  `distill.narrate.assistant_target`; every variant holds exactly the same queries and prompts.
- Loss on the assistant turn only is the trainer's job (`distill.train`: ``assistant_only_loss``).

Layout (the Hugging Face Hub's Parquet layout, so ``datasets.load_dataset(<out>/cot)``, ``trl sft --dataset_name
<out>/cot`` and ``push_to_hub`` read it as is; the images are embedded in the Parquet files as PNG bytes)::

    <out>/cot/data/train-00000-of-0000N.parquet        the training split (``split``, default train)
    <out>/cot/data/validation-00000-of-00001.parquet   the eval split (``eval_split``: val), when ``eval_rationales``
    <out>/cot/psr_sft.json                             preprocessing (frames, max_pixels, prompt id + hash), rows
                                                       per split, sha256 of the Parquet files
    <out>/answer/..., <out>/trajectory/...             the same for the two controls
    <out>/sft.config.json, <out>/sft.summary.json

Each variant is built in a temporary directory beside it and moved into place; an existing variant directory is
replaced only when it is one this command wrote (it holds ``psr_sft.json``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.errors import InputError
from eval.fingerprint import sha256_files

VARIANTS = ("cot", "answer", "trajectory")  # = distill.narrate.TARGET_VARIANTS
DEFAULT_MAX_PIXELS = 336 * 336
#: Split names of the written sets (the Hub's names: ``datasets`` infers them from the file names).
TRAIN_SPLIT, EVAL_SPLIT = "train", "validation"
SET_INFO = "psr_sft.json"


@dataclass
class SFTBuildConfig:
    """``python -m distill sft``: accepted rationales -> the CoT and answer-only SFT datasets (Parquet)."""

    data: str = field(metadata={"help": "benchmark directory"})
    rationales: str = field(metadata={"help": "narration output directory (or its rationales.jsonl)"})
    out: str = field(metadata={"help": "output directory (<out>/cot, <out>/answer)"})
    split: str = field(default="train", metadata={"help": "queries to train on: train | val | test"})
    eval_rationales: str | None = field(default=None, metadata={
        "help": "narration output of the eval split (its rationales.jsonl or directory): the validation split"})
    eval_split: str = field(default="val", metadata={"help": "benchmark split of the validation examples"})
    frames: int = field(default=8, metadata={"help": "prefix frames per example (evenly spaced, last kept)"})
    max_pixels: int | None = field(default=DEFAULT_MAX_PIXELS,
                                   metadata={"help": "downscale each frame to at most this many pixels (aspect kept)"})
    prompt: str = field(default="student_answer", metadata={"help": "student prompt template (id or .txt path) of "
                                                                     "the frames input"})
    student_input: str = field(default="frames", metadata={
        "help": "frames (the prefix frames, student_answer prompt) | evidence (the perception-solved student: the "
                "simulator's evidence at the prefix end as a text block, distill.evidence; a text-only set)"})
    variants: list[str] = field(default_factory=lambda: list(VARIANTS),
                                metadata={"help": "any of cot, answer, trajectory"})
    limit: int | None = field(default=None, metadata={"help": "only the first N accepted rationales (train split)"})
    eval_limit: int | None = field(default=None, metadata={"help": "only the first N of the validation split"})
    shard_size: int = field(default=500, metadata={"help": "examples per Parquet file"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self):
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise InputError(f"variants must be a non-empty subset of {VARIANTS}, got {self.variants}")
        from distill.evidence import check_input

        check_input(self.student_input)
        if self.frames < 1 or self.shard_size < 1:
            raise InputError(f"frames and shard_size must be >= 1, got {self.frames} and {self.shard_size}")


def features(images: bool = True):
    """The Arrow schema of an SFT dataset (explicit, so image placeholders with no text never confuse inference); a
    text-only set (the evidence input) has no ``images`` column, so TRL trains it as text."""
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    cols = {"query_id": datasets.Value("string"), "qtype": datasets.Value("string"),
            "answer": datasets.Value("string")}
    if images:
        cols["images"] = datasets.List(datasets.Image())
    cols["messages"] = datasets.List({"role": datasets.Value("string"), "content": datasets.List(part)})
    return datasets.Features(cols)


def user_turn(query, bench, frame_cache, *, template, frames: int, student_input: str = "frames",
              index=None) -> tuple[list[dict[str, Any]], list]:
    """(user content parts, PIL images) of the student prompt for one query, built as the student is served
    (`distill.evidence.student_request`)."""
    from distill.evidence import student_request
    from forecasters.backends import ImagePart

    req = student_request(query, bench, student_input=student_input, template=template, frame_cache=frame_cache,
                          frames=frames, index=index)
    content, images = [], []
    for p in req.parts:
        if isinstance(p, ImagePart):
            content.append({"type": "image", "text": None})
            images.append(p.image)
        else:
            content.append({"type": "text", "text": p})
    return content, images


def _examples(data: str, rows: list[dict], variant: str, prompt: str, frames: int, max_pixels: int | None,
              student_input: str = "frames"):
    """Generator of one variant's examples (module-level so `datasets` can fingerprint its arguments)."""
    from distill.evidence import EvidenceIndex, student_template
    from distill.narrate import assistant_target
    from eval.benchmark import Benchmark
    from forecasters.media import FrameCache

    bench = Benchmark.load(data)
    template = student_template(student_input, prompt)
    cache = FrameCache(bench.root, max_pixels=max_pixels, size=64)
    index = EvidenceIndex(bench) if student_input == "evidence" else None
    for r in rows:
        q = bench.query(r["query_id"])
        content, images = user_turn(q, bench, cache, template=template, frames=frames, student_input=student_input,
                                    index=index)
        text = assistant_target(variant, {"answer": q.target_state, **r})
        ex = {"query_id": q.id, "qtype": q.qtype, "answer": q.target_state,
              "messages": [{"role": "user", "content": content},
                           {"role": "assistant", "content": [{"type": "text", "text": text}]}]}
        if student_input != "evidence":
            ex["images"] = images
        yield ex


def _rationale_rows(path: str, bench, split: str, limit: int | None) -> list[dict]:
    """Accepted rationales of ``split``'s queries, sorted by query id (the first ``limit``)."""
    from eval.io import FormatError
    from eval.resumable import read_records

    path = Path(path)
    if path.is_dir():
        path = path / "rationales.jsonl"
    if not path.exists():
        raise FormatError(path, "rationales file does not exist (run `python -m distill narrate` first)")
    split_ids = set(bench.query_field("id", split))
    rows = []
    for i, d in enumerate(read_records(path), start=1):
        for key in ("query_id", "rationale"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise FormatError(path, "missing or not a string", line=i, field=key)
        if d["query_id"] not in bench.query_index:
            raise FormatError(path, f"unknown query id {d['query_id']!r}", line=i, field="query_id")
        if d.get("ok", True) and d["query_id"] in split_ids:
            rows.append(d)
    rows.sort(key=lambda d: d["query_id"])
    return rows[:limit] if limit is not None else rows


def _write_split(cfg: SFTBuildConfig, rows: list[dict], variant: str, split_name: str, data_dir: Path,
                 cache_dir: Path) -> list[Path]:
    """One split of one variant as ``data_dir/<split_name>-0000i-of-0000n.parquet`` (images embedded)."""
    import datasets

    ds = datasets.Dataset.from_generator(
        _examples, features=features(images=cfg.student_input != "evidence"), cache_dir=str(cache_dir),
        # rows as a tuple: `datasets` splits list arguments into one generator call per item (one benchmark load
        # per example)
        gen_kwargs=dict(data=str(cfg.data), rows=tuple(rows), variant=variant, prompt=cfg.prompt, frames=cfg.frames,
                        max_pixels=cfg.max_pixels, student_input=cfg.student_input))
    n = max(1, -(-len(ds) // cfg.shard_size))
    files = []
    for i in range(n):
        f = data_dir / f"{split_name}-{i:05d}-of-{n:05d}.parquet"
        ds.shard(n, i, contiguous=True).to_parquet(str(f))
        files.append(f)
    return files


def _replaceable(target: Path) -> None:
    from eval.errors import OutputRefused

    if target.exists() and not (target / SET_INFO).exists():
        raise OutputRefused(f"{target} exists and was not written by `python -m distill sft` (no {SET_INFO})",
                            fix="choose another --out or move it away")


def build_variant(cfg: SFTBuildConfig, variant: str, splits: dict[str, list[dict]], template) -> dict[str, Any]:
    """Write one variant (all its splits) atomically; returns its ``psr_sft.json`` record."""
    from eval.io import atomic_dir, write_json

    target = Path(cfg.out) / variant
    _replaceable(target)
    with atomic_dir(target, kind=f"distill sft {variant}", recognise=(SET_INFO,)) as stage:
        cache = stage / ".datasets-cache"  # inside the stage: an interrupt anywhere removes it with the stage
        (stage / "data").mkdir()
        files = []
        for name, rows in splits.items():
            files += _write_split(cfg, rows, variant, name, stage / "data", cache)
        shutil.rmtree(cache, ignore_errors=True)
        info = {"variant": variant, "preprocessing": preprocessing(cfg, template),
                "splits": {name: len(rows) for name, rows in splits.items()},
                "files": [f"data/{f.name}" for f in files], "sha256": sha256_files(files, name=lambda f: f.name)}
        write_json(stage / SET_INFO, info)
    return info


def preprocessing(cfg: SFTBuildConfig, template) -> dict[str, Any]:
    """What the served student must reproduce: its input (frames or evidence), frames per prefix and the pixel cap
    (None for the evidence input), the prompt (id + hash)."""
    frames = cfg.student_input == "frames"
    return {"student_input": cfg.student_input, "frames": cfg.frames if frames else None,
            "max_pixels": cfg.max_pixels if frames else None, "prompt_id": template.id,
            "prompt_hash": template.hash}


def build_sft(cfg: SFTBuildConfig) -> dict[str, Any]:
    """Build the requested variants (see the module docstring); returns the summary."""
    import datasets

    from distill.config import write_resolved
    from distill.evidence import student_template
    from distill.narrate import assistant_target
    from eval.benchmark import Benchmark
    from eval.io import write_json

    t0 = time.perf_counter()
    bench = Benchmark.load(cfg.data)
    template = student_template(cfg.student_input, cfg.prompt)
    rows = _rationale_rows(cfg.rationales, bench, cfg.split, cfg.limit)
    if not rows:
        raise InputError(f"{cfg.rationales}: no accepted rationales for split {cfg.split!r}")
    splits = {TRAIN_SPLIT: rows}
    if cfg.eval_rationales:
        eval_rows = _rationale_rows(cfg.eval_rationales, bench, cfg.eval_split, cfg.eval_limit)
        if not eval_rows:
            raise InputError(f"{cfg.eval_rationales}: no accepted rationales for split {cfg.eval_split!r}")
        splits[EVAL_SPLIT] = eval_rows
    for variant in cfg.variants:  # every target can be built (e.g. trajectory_target present) before writing any
        for r in (r for split_rows in splits.values() for r in split_rows):
            assistant_target(variant, r)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for variant in cfg.variants:
        _replaceable(out / variant)
    summary: dict[str, Any] = {"examples": {k: len(v) for k, v in splits.items()}, "split": cfg.split,
                               "eval_split": cfg.eval_split if cfg.eval_rationales else None,
                               "preprocessing": preprocessing(cfg, template),
                               "qtypes": dict(Counter(r.get("qtype") for r in rows)),
                               "narrators": dict(Counter(r.get("narrator", "?") for r in rows)), "variants": {}}
    was_enabled = datasets.is_progress_bar_enabled()
    if not cfg.progress:
        datasets.disable_progress_bars()
    try:
        for variant in cfg.variants:
            info = build_variant(cfg, variant, splits, template)
            words = [len(assistant_target(variant, {"answer": "", **r}).split()) for r in rows]
            summary["variants"][variant] = {"path": str(out / variant), "sha256": info["sha256"],
                                            "mean_assistant_words": round(sum(words) / len(words), 1)}
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    write_resolved(cfg, out / "sft.config.json")
    write_json(out / "sft.summary.json", summary)
    return summary


def read_set_info(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``psr_sft.json`` of a set written by `build_sft` (None for any other dataset: a Hub id, foreign files)."""
    from eval.io import read_json

    f = Path(path) / SET_INFO
    return read_json(f) if f.is_file() else None


def load_sft(path: str | os.PathLike, split: str | None = None):
    """Load a set written by `build_sft` (``<out>/cot`` or ``<out>/answer``) with ``datasets.load_dataset``: a
    ``DatasetDict`` (train, and validation when built), or one split."""
    import datasets

    from eval.io import FormatError

    p = Path(path)
    if read_set_info(p) is None:
        raise FormatError(p, f"not an SFT set directory (no {SET_INFO}; run `python -m distill sft`)")
    ds = datasets.load_dataset(str(p))
    if split is None:
        return ds
    if split not in ds:
        raise FormatError(p, f"has no split {split!r} (splits: {sorted(ds)})")
    return ds[split]
