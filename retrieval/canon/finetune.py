r"""A paraphrase-robust semantic index: fine-tune the text encoder so that every phrasing of a canonical state lands
on that state (``python -m retrieval canon finetune``).

Training data: the (member phrase -> canonical state text) pairs of the *training split's* clusters: every
train-split corpus segment gives the pair (its raw description, its canonical state text) when the two differ;
pairs are deduplicated. States are split into *seen* and *held-out*: a state is held out when it never occurs in
the training split, or when ``u(state) < holdout_fraction`` with ``u = int(sha1("<seed>:<state id>")[:12], 16) /
16^12`` (a seeded, order-free draw, so the synthetic benchmark, whose 32 states all occur in training, gets held-out
states too). Held-out states contribute no pair; the gain on their queries measures generalisation to states the
encoder never saw.

Objective (as DynaPix's contrastive retriever): `MultipleNegativesRankingLoss` (in-batch negatives) wrapped in
`MatryoshkaLoss` over nested
widths ``(d, 2^j < d ..., 64)`` (DynaPix: seven widths from 4,096 down to 64), so the one fine-tune also gives
truncated embeddings. For anchor ``a_i`` (member) and positives ``p_j`` (canonical texts) of a batch of ``B``,
``L = (1/B) sum_i -log softmax_j(scale * cos(a_i, p_j))_i`` at each width, summed with equal weights. Batches hold no
duplicate text (`BatchSamplers.NO_DUPLICATES`), so two members of one state never meet as each other's negatives.
A batch larger than memory holds (``mini_batch_size`` between 1 and ``batch_size - 1``) trains with
`CachedMultipleNegativesRankingLoss` instead: the same loss and gradients, computed chunk by chunk through a gradient
cache, at the price of one more forward pass per batch (`uses_gradient_cache`).

**Describer triples** (``triples``: a JSONL of ``{"anchor", "positive", "negative"}`` rows, e.g. written by
`eval.synth.pairs`): instead of a benchmark's clusters, the training data are phrase triples of a disjoint world --
two descriptions that mean the same state, and a description of a state one value apart. The loss is then
`MultipleNegativesRankingLoss` over (anchor, positive, negative) with in-batch negatives (the hard negative sharpens
the minimal pairs), and no state is held out. This is how the synthetic benchmark's canonicalization encoder is made
(`retrieval.synth`): it moves the describer's synonyms above the clustering threshold and its minimal pairs below it.

Output directory::

    model/                   the fine-tuned sentence-transformers model (load it like any: --model OUT/model)
    holdout.json             train_states, heldout_states (ids), the rule and its parameters (benchmark data only)
    pairs.jsonl              the training pairs (or triples)
    finetune_config.json     the resolved config
    train_log.json           loss per logging step, wall time
    runs/                    with --report-to tensorboard: transformers' TensorBoard logs (runs/<date>_<host>/)
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from eval.errors import InputError
from eval.io import write_json, write_jsonl
from eval.tracking import TENSORBOARD_DIR, parse_report_to
from retrieval.canon._files import check_out_dir, staged_dir
from retrieval.canon.vocab import segment_phrases


@dataclass
class FinetuneConfig:
    """Resolved config of one fine-tune (written to ``finetune_config.json``)."""

    data: str
    out: str
    base_model: str = "BAAI/bge-small-en-v1.5"
    #: a JSONL of {"anchor", "positive", "negative"} triples to train on instead of ``data``'s clusters
    triples: str = ""
    #: where the triples came from (recorded in finetune_config.json; e.g. the disjoint world of `retrieval.synth`)
    source: dict = field(default_factory=dict)
    split: str = "train"
    holdout_fraction: float = 0.3
    seed: int = 0
    epochs: int = 4
    batch_size: int = 64
    mini_batch_size: int = 0  # gradient-cache chunk (CachedMNRL) for batches larger than memory; 0: no cache
    learning_rate: float = 1e-4
    warmup_ratio: float = 0.1
    scale: float = 20.0
    matryoshka_dims: list[int] = field(default_factory=list)  # empty: (d, powers of two below d, down to 64)
    device: str | None = None
    overwrite: bool = False  # replace an --out that is not an earlier fine-tune (eval.outputs)
    report_to: str = "none"  # transformers' report_to: none | tensorboard | wandb | all (`eval.tracking`)


def holdout_draw(state_id: str, seed: int) -> float:
    """``u(state) in [0, 1)`` of the module docstring."""
    return int(hashlib.sha1(f"{seed}:{state_id}".encode()).hexdigest()[:12], 16) / 16**12


def split_states(bench, split: str = "train", fraction: float = 0.3, seed: int = 0) -> tuple[list[str], list[str]]:
    """``(seen, held_out)`` state ids (benchmark order); see the module docstring."""
    if not 0.0 <= fraction < 1.0:
        raise InputError(f"holdout fraction must lie in [0, 1), got {fraction}")
    in_split = set(np.unique(np.asarray(bench.corpus_ds["state_id"][:], dtype=object)[_split_rows(bench, split)]))
    seen = [s for s in bench.state_ids if s in in_split and holdout_draw(s, seed) >= fraction]
    seen_set = set(seen)
    return seen, [s for s in bench.state_ids if s not in seen_set]


def _split_rows(bench, split: str) -> np.ndarray:
    """Corpus rows of the videos of ``split`` (a video's split is that of its queries)."""
    qv = np.asarray(bench.queries_ds["video_id"][:], dtype=object)
    vids = np.unique(qv[np.asarray(bench.queries_ds["split"][:], dtype=object) == split])
    return np.flatnonzero(np.isin(np.asarray(bench.corpus_ds["video_id"][:], dtype=object), vids))


def training_pairs(bench, seen_states: list[str], split: str = "train") -> list[tuple[str, str]]:
    """Unique (member phrase, canonical text) pairs of the split's segments whose state is in ``seen_states``
    (sorted, so the data does not depend on corpus order)."""
    import pandas as pd

    ds = bench.corpus_ds
    df = pd.DataFrame({"raw": segment_phrases(ds["raw"][:], ds["state"][:]), "state": ds["state"][:],
                       "sid": ds["state_id"][:]}).iloc[_split_rows(bench, split)]
    df = df[df["sid"].isin(list(seen_states)) & (df["raw"] != df["state"])].drop_duplicates(["raw", "state"])
    return sorted(zip(df["raw"], df["state"], strict=True))


def read_triples(path: str | Path) -> list[dict[str, str]]:
    """The rows of a triples file (JSONL ``{"anchor", "positive", "negative"}``); a row missing a field or with a
    non-string value is a `FormatError` naming its line."""
    from eval.io import FormatError, iter_jsonl

    rows = []
    for ln, row in iter_jsonl(path):
        for k in ("anchor", "positive", "negative"):
            if not isinstance(row.get(k), str) or not row[k]:
                raise FormatError(path, f"expected a non-empty string {k!r}", line=ln, field=k)
        rows.append(row)
    if len(rows) < 2:
        raise FormatError(path, f"{len(rows)} triple(s): nothing to fine-tune on")
    return rows


def matryoshka_dims(dim: int, dims: list[int] | None = None) -> list[int]:
    """``dims`` if given (each <= dim), else ``[dim] + [2^j for 64 <= 2^j < dim]`` descending."""
    if dims:
        bad = [x for x in dims if not 1 <= x <= dim]
        if bad:
            raise InputError(f"matryoshka dims {bad} outside 1..{dim}")
        return sorted(set(dims), reverse=True)
    out = [dim]
    p = 1 << (dim.bit_length() - 1)
    p = p if p < dim else p >> 1
    while p >= 64:
        out.append(p)
        p >>= 1
    return out


def uses_gradient_cache(cfg: FinetuneConfig) -> bool:
    """Pairs train through the gradient cache (`CachedMultipleNegativesRankingLoss`) only when ``mini_batch_size``
    splits the batch: a chunk as large as the batch would compute the same gradients with an extra forward pass."""
    return 0 < cfg.mini_batch_size < cfg.batch_size


def finetune(cfg: FinetuneConfig, *, progress: bool = True, log=print) -> Path:
    """Fine-tune ``cfg.base_model`` on the training pairs and write the output directory (module docstring)."""
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MatryoshkaLoss,
        MultipleNegativesRankingLoss,
    )
    from sentence_transformers.sentence_transformer.training_args import (
        BatchSamplers,
        SentenceTransformerTrainingArguments,
    )
    from transformers import TrainerCallback

    from eval.benchmark import Benchmark
    from eval.errors import loading_model
    from retrieval.encoders import PACKAGED_MINILM, pick_device, resolve_model

    report_to = list(parse_report_to(cfg.report_to)) or "none"  # a tracker not installed: stop before any work
    inputs = [p for p in (cfg.data, cfg.triples) if p]
    check_out_dir(cfg.out, "finetune", inputs=inputs, overwrite=cfg.overwrite)
    device = pick_device(cfg.device)
    with loading_model(cfg.base_model, flag="--base-model", packaged=PACKAGED_MINILM):
        model = SentenceTransformer(resolve_model(cfg.base_model), device=device)
    dim = int(model.get_sentence_embedding_dimension())
    dims = matryoshka_dims(dim, cfg.matryoshka_dims)
    seen: list[str] = []
    held: list[str] = []
    if cfg.triples:
        rows = read_triples(cfg.triples)
        pairs = [(r["anchor"], r["positive"], r["negative"]) for r in rows]
        log(f"{len(pairs):,} (anchor, positive, negative) triples from {cfg.triples}")
        train = datasets.Dataset.from_dict({"anchor": [a for a, _, _ in pairs], "positive": [p for _, p, _ in pairs],
                                            "negative": [n for _, _, n in pairs]})
        inner = MultipleNegativesRankingLoss(model, scale=cfg.scale)
    else:
        bench = Benchmark.load(cfg.data)
        seen, held = split_states(bench, cfg.split, cfg.holdout_fraction, cfg.seed)
        pairs = training_pairs(bench, seen, cfg.split)
        if len(pairs) < 2:
            raise InputError(f"{cfg.data}: only {len(pairs)} training pair(s) (member phrase != canonical text) in "
                             f"the {cfg.split} split's seen states: nothing to fine-tune on")
        log(f"{len(pairs):,} (member -> canonical) pairs from {len(seen)} seen states; {len(held)} states held out")
        train = datasets.Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
        inner = (CachedMultipleNegativesRankingLoss(model, scale=cfg.scale, mini_batch_size=cfg.mini_batch_size)
                 if uses_gradient_cache(cfg) else MultipleNegativesRankingLoss(model, scale=cfg.scale))
    loss = MatryoshkaLoss(model, inner, dims)
    losses: list[dict] = []

    class _Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append({"step": state.global_step, "loss": float(logs["loss"])})

    with staged_dir(cfg.out, "finetune", inputs=inputs, overwrite=cfg.overwrite) as d:
        args = SentenceTransformerTrainingArguments(
            output_dir=str(d / "trainer"), num_train_epochs=cfg.epochs, per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.learning_rate, warmup_ratio=cfg.warmup_ratio, seed=cfg.seed, data_seed=cfg.seed,
            batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to=report_to, logging_steps=1,
            run_name=Path(cfg.out).name, use_cpu=device == "cpu", disable_tqdm=not progress,
            dataloader_drop_last=False)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss,
                                             callbacks=[_Log()])
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        model.save(str(d / "model"))
        import shutil

        if (d / "trainer" / TENSORBOARD_DIR).is_dir():  # transformers' TensorBoard logs outlive the trainer folder
            shutil.move(d / "trainer" / TENSORBOARD_DIR, d / TENSORBOARD_DIR)
        shutil.rmtree(d / "trainer", ignore_errors=True)
        write_jsonl(d / "pairs.jsonl", (dict(zip(("anchor", "positive", "negative"), p, strict=False)) for p in pairs))
        if not cfg.triples:
            write_json(d / "holdout.json", {"train_states": seen, "heldout_states": held, "split": cfg.split,
                                            "holdout_fraction": cfg.holdout_fraction, "seed": cfg.seed,
                                            "rule": "held out: not in the split, or sha1('<seed>:<id>') draw < "
                                                    "fraction"})
        write_json(d / "train_log.json", {"losses": losses, "wall_s": wall, "pairs": len(pairs),
                                          "matryoshka_dims": dims, "device": device, "loss": type(inner).__name__})
        write_json(d / "finetune_config.json", {**asdict(cfg), "matryoshka_dims": dims})
    log(f"fine-tuned {cfg.base_model} for {cfg.epochs} epoch(s) in {wall:.0f} s -> {cfg.out}/model")
    return Path(cfg.out)
