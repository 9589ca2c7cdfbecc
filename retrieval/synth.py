"""The synthetic benchmark's two-step construction in one call (`DESIGN.md`, "Data flow").

``python -m retrieval synth --out DIR [--preset demo|psr] [--seed S]`` runs

1. ``python -m eval synth --out DIR-truth``: the simulator-truth benchmark (exact true states, raw descriptions);
2. the canonicalization encoder (``DIR-encoder/``, `canonicalization_encoder`): the embedder (default the packaged
   MiniLM) fine-tuned on describer triples of a *disjoint* world -- `ENCODER_VIDEOS` videos simulated with seed
   ``S + ENCODER_SEED_OFFSET``, never the benchmark's -- so that the describer's synonyms reach the clustering
   threshold and its minimal pairs (one value apart) stay below it (`eval.synth.pairs`, `retrieval.canon.finetune`);
   ``--no-tune-encoder`` clusters with the embedder as it is;
3. ``python -m retrieval canon apply --data DIR-truth --out DIR``: the paper's canonicalization of the raw
   descriptions (greedy embedding clustering at `THRESHOLD`, visited most frequent first), budgeted GT mining
   (`MINE_BUDGET` candidates per tier) and the verification emulation (`retrieval.canon.mining`), written as the
   benchmark every job uses (name ``psr-synth``).

Each step is skipped when its output already holds the same build (same configuration), so a rerun is cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from eval.io import read_json
from eval.outputs import release_dependent
from retrieval.encoders import PACKAGED_MINILM

NAME = "psr-synth"
THRESHOLD = 0.85
ENCODER_VIDEOS = 150
"""Videos of the disjoint world whose true states the canonicalization encoder's triples describe."""
ENCODER_SEED_OFFSET = 100_003
"""The disjoint world's seed is the build's seed plus this (so it never equals a build's seed of the same range)."""
ENCODER_EPOCHS = 1
MINE_BUDGET = 3
"""GT candidates mined per tier and query before verification (`retrieval.canon.mining`)."""


def encoder_dir(out: str | os.PathLike) -> Path:
    """Where step 2 writes the canonicalization encoder: ``<out>-encoder`` beside the benchmark."""
    out = Path(out)
    return out.with_name(out.name + "-encoder")


def canonicalization_encoder(out: str | os.PathLike, *, base_model: str, seed: int, videos: int = ENCODER_VIDEOS,
                             epochs: int = ENCODER_EPOCHS, progress: bool = True,
                             log: Callable[[str], None] = print) -> Path:
    """Fine-tune ``base_model`` on describer triples of the disjoint world ``seed`` (module docstring, step 2) into
    ``out`` (reused when it holds the same fine-tune); returns the model directory ``out/model``."""
    import tempfile

    from eval.io import write_jsonl
    from eval.synth import pairs
    from retrieval.canon.finetune import FinetuneConfig, finetune

    out = Path(out)
    source = {"seed": seed, "videos": videos, "generator": "eval.synth.pairs"}
    done = out / "finetune_config.json"
    if done.exists():
        have = read_json(done)
        if (have.get("base_model"), have.get("epochs"), have.get("source")) == (base_model, epochs, source):
            log(f"reusing the canonicalization encoder {out}")
            return out / "model"
    log(f"step 2: the canonicalization encoder: describer triples of {videos} disjoint videos (seed {seed}), "
        f"fine-tuning {base_model} -> {out}")
    triples = pairs.triples(pairs.true_states(seed, videos), seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "triples.jsonl"
        write_jsonl(path, ({"anchor": a, "positive": p, "negative": n} for a, p, n in triples))
        cfg = FinetuneConfig(data="", out=str(out), base_model=base_model, triples=str(path), epochs=epochs,
                             matryoshka_dims=[384], overwrite=True, source=source)
        finetune(cfg, progress=progress, log=log)
    return out / "model"


def truth_dir(out: str | os.PathLike) -> Path:
    """Where step 1 writes: ``<out>-truth`` beside the benchmark."""
    out = Path(out)
    return out.with_name(out.name + "-truth")


def _same(manifest: Path, **want) -> bool:
    if not manifest.exists():
        return False
    try:
        m = read_json(manifest)
    except Exception:  # noqa: BLE001 (an unreadable manifest is simply not the same build)
        return False
    extra = m.get("extra", {})
    canon = extra.get("canonicalization", {})
    have = {"preset": extra.get("preset"), "seed": extra.get("seed"), "videos": extra.get("videos"),
            "model": canon.get("model"), "threshold": canon.get("threshold"),
            "budget": (canon.get("mining") or {}).get("budget")}
    return all(have.get(k) == v for k, v in want.items())


def build_synth(out: str | os.PathLike, *, preset: str = "demo", seed: int = 0, videos: int | None = None,
                model: str = PACKAGED_MINILM, threshold: float = THRESHOLD, mine_budget: int = MINE_BUDGET,
                tune_encoder: bool = True, workers: int | None = None, progress: bool = True,
                log: Callable[[str], None] = print) -> Path:
    """Build (or reuse) the simulator-truth benchmark, the canonicalization encoder (``tune_encoder``) and the
    canonicalized benchmark ``out``; returns ``out``."""
    from eval.synth import build_benchmark
    from eval.synth.build import PRESETS
    from eval.validate import link_problems
    from retrieval.canon.apply import ApplyConfig, apply_canonicalization

    videos = videos or PRESETS[preset].videos
    truth = truth_dir(out)
    if _same(truth / "manifest.json", preset=preset, seed=seed, videos=videos):
        log(f"reusing the simulator-truth build {truth}")
    else:
        log(f"step 1: simulating {videos:,} videos ({preset} preset, seed {seed}) -> {truth}")
        release_dependent(truth, out)  # `out` links into the old truth build and is rebuilt from the new one below
        build_benchmark(truth, videos=videos, seed=seed, workers=workers, progress=progress, preset=preset)
    if tune_encoder:
        model = str(canonicalization_encoder(encoder_dir(out), base_model=model, seed=seed + ENCODER_SEED_OFFSET,
                                             progress=progress, log=log).resolve())
    if _same(Path(out) / "manifest.json", preset=preset, seed=seed, videos=videos, model=model, threshold=threshold,
             budget=mine_budget) and not link_problems(out):  # (a rebuilt truth leaves `out` stale: rebuild it)
        log(f"reusing the canonicalized benchmark {out}")
        return Path(out)
    log(f"step 3: canonicalizing at {threshold:g} with {model}, mining {mine_budget} candidates a tier -> {out}")
    cfg = ApplyConfig(data=str(truth), out=str(out), threshold=threshold, model=model, mine_budget=mine_budget,
                      verify=True, name=NAME)
    return apply_canonicalization(cfg, progress=progress, log=log)
