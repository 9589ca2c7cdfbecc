"""``state-classifier``: a learner built for the task, beside LFTR -- prefix tokens -> the future canonical state.

A small MLP reads the prefix tokens of a prefix space and the question's metadata and predicts the target's canonical
state as a class; the prediction is that state's vector in the target space (its embedding in a semantic space, its
segment-mean prototype in a visual one), as for the transition table (`retrieval.baselines`). It is not a method of
the paper. Read from the ``sim`` prefix space (the simulator's exact state at each prefix frame,
`eval.synth.simspace`) it is a second forecaster with perfect perception: where it and ``lftr-sim`` score alike, what
limits perfect-perception forecasting is what the training queries teach about the world, not LFTR
(`scripts/ceiling_curve.py` trains both on shares of the training videos).

Inputs per query, standardised over the training queries: the last prefix token, its change from the token before,
the mean of the prefix tokens; the question type (one-hot), the horizon (one-hot, 6 and beyond as one) and the
question's ``k_seconds`` (0 with a flag when absent). The prefix tokens of a frame space describe the whole frame,
not the object the question names (as for ``knn-future``); the ``sim`` tokens are the queried object's.

Training (`ClassifierConfig`): the training split's Q1-Q4 queries whose target state is a state of the benchmark
(``train_fraction`` < 1: the queries of that share of the training videos, `retrieval.lftr.train.fraction_videos`),
cross-entropy with label smoothing, AdamW, mini-batches in a seeded order; after each epoch the top-1 state accuracy
on the validation split's fair Q1-Q4 queries, and the weights of the best epoch are kept (without validation
queries, the last epoch's). The test split is never read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.schema import MAIN_QTYPES
from eval.schema import QUESTION_TYPES as QTYPES
from eval.segments import target_states
from retrieval.queries import QueryVectors
from retrieval.spaces import Space

#: horizons from this one on (the schema allows up to 7) share one input
MAX_HORIZON = 6


@dataclass(frozen=True)
class ClassifierConfig:
    """The classifier's recipe (module docstring); ``threads``: torch CPU threads (0: the CPUs this process may use)."""

    hidden: int = 512
    dropout: float = 0.3
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    train_fraction: float = 1.0
    threads: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.train_fraction <= 1:
            raise InputError(f"state-classifier: train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.epochs < 1 or self.hidden < 1 or self.batch_size < 1:
            raise InputError(f"state-classifier: epochs, hidden and batch_size must be positive ({asdict(self)})")


def query_features(bench: Benchmark, prefix_space: Space) -> np.ndarray:
    """``(n_queries, 3 d + 13)`` float32 inputs of every query of the benchmark (module docstring), unstandardised."""
    qd = bench.queries_ds
    tokens = np.asarray(prefix_space.prefixes.array[prefix_space.prefix_rows(qd["prefix_id"][:])], np.float32)
    if tokens.ndim != 3 or tokens.shape[1] < 1:
        raise InputError(f"state-classifier: the prefix space {prefix_space.name!r} has no prefix tokens "
                         f"(shape {tokens.shape})")
    if not np.isfinite(tokens).all():
        bad = int(np.flatnonzero(~np.isfinite(tokens).reshape(len(tokens), -1).all(1))[0])
        raise InputError(f"state-classifier: non-finite prefix tokens in space {prefix_space.name!r} for query "
                         f"{bench.query_ids[bad]!r}")
    last = tokens[:, -1]
    before = tokens[:, -2] if tokens.shape[1] > 1 else last
    meta = np.zeros((len(qd), len(QTYPES) + MAX_HORIZON + 2), np.float32)
    for i, (qt, h, k) in enumerate(zip(qd["qtype"][:], qd["horizon"][:], qd["k_seconds"][:], strict=True)):
        if qt in QTYPES:
            meta[i, QTYPES.index(qt)] = 1.0
        meta[i, len(QTYPES) + min(max(int(h), 1), MAX_HORIZON) - 1] = 1.0
        if k is not None:
            meta[i, -2:] = (float(k) / 5.0, 1.0)
    return np.concatenate([last, last - before, tokens.mean(1), meta], 1)


def _labelled(bench: Benchmark, rows: np.ndarray, state: np.ndarray) -> np.ndarray:
    qtype = np.asarray(bench.queries_ds["qtype"][:])
    return rows[(state[rows] >= 0) & np.isin(qtype[rows], MAIN_QTYPES)]


def fit_predict_states(bench: Benchmark, rows: np.ndarray, prefix_space: Space, *, seed: int = 0,
                       cfg: ClassifierConfig | None = None, train_split: str = "train", val_split: str = "val",
                       progress: bool = True) -> tuple[np.ndarray, dict]:
    """Train the classifier (module docstring) and return the predicted state row of each query of ``rows`` and a
    record of the training (queries, epochs, the validation accuracy of each epoch, the epoch kept)."""
    import torch
    from torch import nn
    from tqdm.auto import tqdm

    from retrieval.lftr.train import fraction_rows, torch_threads
    from retrieval.seeding import seed_everything

    cfg = cfg or ClassifierConfig()
    state = target_states(bench)
    train = _labelled(bench, bench.query_rows(train_split), state)
    if cfg.train_fraction < 1:
        train = fraction_rows(bench, train, cfg.train_fraction)
    if len(train) == 0:
        raise InputError(f"state-classifier: no {train_split!r} Q1-Q4 query with a target state of the benchmark "
                         f"in {bench.root}")
    val = _labelled(bench, bench.query_rows(val_split, fair_only=True), state)
    feats = query_features(bench, prefix_space)
    mean, std = feats[train].mean(0), feats[train].std(0)
    feats = (feats - mean) / np.where(std > 1e-6, std, 1.0)
    n_states = len(bench.state_ids)
    with torch_threads(cfg.threads):
        seed_everything(seed)
        model = nn.Sequential(nn.Linear(feats.shape[1], cfg.hidden), nn.GELU(), nn.Dropout(cfg.dropout),
                              nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.Dropout(cfg.dropout),
                              nn.Linear(cfg.hidden, n_states))
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        x, y = torch.from_numpy(feats[train]), torch.from_numpy(state[train])
        xv, yv = torch.from_numpy(feats[val]), torch.from_numpy(state[val])
        gen = torch.Generator().manual_seed(seed)
        val_acc: list[float] = []
        best, best_state = -1.0, None
        bar = tqdm(range(cfg.epochs), desc="state-classifier", unit="epoch", disable=not progress)
        for _ in bar:
            model.train()
            order = torch.randperm(len(x), generator=gen)
            for s in range(0, len(x), cfg.batch_size):
                b = order[s:s + cfg.batch_size]
                loss = nn.functional.cross_entropy(model(x[b]), y[b], label_smoothing=cfg.label_smoothing)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if len(val):
                model.eval()
                with torch.no_grad():
                    acc = float((model(xv).argmax(1) == yv).float().mean())
                val_acc.append(acc)
                if acc > best:
                    best, best_state = acc, {k: v.clone() for k, v in model.state_dict().items()}
                bar.set_postfix(val_top1=f"{acc:.4f}", best=f"{best:.4f}")
        if best_state is not None:
            model.load_state_dict(best_state)
        model.eval()
        with torch.no_grad():
            pred = model(torch.from_numpy(feats[rows])).argmax(1).numpy().astype(np.int64) if len(rows) else \
                np.zeros(0, np.int64)
    record = dict(config=asdict(cfg), seed=seed, prefix_space=prefix_space.name, train_queries=int(len(train)),
                  val_queries=int(len(val)), val_top1=val_acc,
                  kept_epoch=(int(np.argmax(val_acc)) + 1) if val_acc else cfg.epochs)
    return pred, record


def state_classifier(bench: Benchmark, rows: np.ndarray, prefix_space: Space, target: Space, *, seed: int = 0,
                     cfg: ClassifierConfig | None = None, train_split: str = "train",
                     progress: bool = True) -> QueryVectors:
    """The predicted state's vector in ``target`` -> ``(n, 1, d)`` (module docstring); ``info`` holds the training
    record of `fit_predict_states`."""
    pred, record = fit_predict_states(bench, rows, prefix_space, seed=seed, cfg=cfg, train_split=train_split,
                                      progress=progress)
    vec = np.asarray(target.state_prototypes()[pred], np.float32) if len(pred) else \
        np.zeros((0, target.dim), np.float32)
    ids = bench.query_ids
    return QueryVectors([ids[int(r)] for r in rows], vec[:, None], target.name, info=record)
