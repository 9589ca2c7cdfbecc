r"""Triplet hard-negative diagnostics in the style of GenState-AI (§4.3 / §5 of ``002_*.txt``), derived from PSR.

Per query a triplet ``(v_main, v_temp, v_sem)`` of corpus segments:

- ``main`` (the positive): a segment of another video showing the target state *on the same kind of subject*
  (the ``type1-all`` pool: subject + predicate match);
- ``temp`` (temporal negative): a segment of the queried object's own trajectory (same video and object) in a
  state other than the target (its past, present or another future state: right object, wrong time);
- ``sem`` (semantic negative): a segment of another video in the target (type2, predicate) state whose
  subject + predicate (type1) state differs (right state, wrong subject: GenState's semantic substitution).

Multi-positive rule. PSR has several candidates per class; each class is represented by its best-scoring member
(``s_main = max_{j in main} s_j`` etc.: the member a ranker shows first). The scores come from the run
(`eval.scoring.score_benchmark` records them in ``stats["type1-all"]["best"]``, ``stats["triplet_temporal"]["best"]``,
``stats["triplet_semantic"]["best"]``). A triplet is *complete* when all three classes are non-empty; only complete
triplets are scored (GenState likewise drops incomplete groups); reports give their number.

Metrics over the N complete triplets, with ``r`` the rank (1 = best) inside the triplet and ties broken uniformly
at random (so a tie counts 1/2 in a pairwise accuracy, and each order consistent with the scores is equally likely):

``Acc_temp = (1/N) sum_i P(r_main < r_temp)``, ``Acc_sem = (1/N) sum_i P(r_main < r_sem)``,
``Acc_tri = (1/N) sum_i P(r_main < r_temp and r_main < r_sem)``, and the relative-order histogram: the expected
share of each of the 6 orders (e.g. ``main > temp > sem``).

Missed queries (the method gave no answer: `eval.runs.Run.missed`) count as failures: a complete triplet of a
missed query scores 0 on every accuracy, whatever scores the source gave it, and takes no order; the histogram
holds a ``missed`` share beside the six orders, so the shares of every complete triplet sum to 1.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from eval.errors import UnknownName

POSITIVE_POOL = "type1-all"
TEMPORAL_PROBE = "triplet_temporal"
SEMANTIC_PROBE = "triplet_semantic"
CLASSES = ("main", "temp", "sem")
ORDERS = tuple(itertools.permutations(CLASSES))


def order_name(order: tuple[str, ...]) -> str:
    return " > ".join(order)


@dataclass(frozen=True)
class TripletScores:
    """Best score per class, float (n,) each; NaN where the class is empty. ``missed`` bool (n,): queries the
    method gave no answer for (failures; None = none)."""

    main: np.ndarray
    temp: np.ndarray
    sem: np.ndarray
    missed: np.ndarray | None = None

    @classmethod
    def from_run(cls, run) -> TripletScores:
        missing = [p for p in (POSITIVE_POOL, TEMPORAL_PROBE, SEMANTIC_PROBE) if p not in run.stats]
        if missing:
            raise UnknownName(f"run {run.name!r} has no triplet scores ({missing} missing); score it with "
                           "eval.scoring.score_benchmark")
        get = lambda p: np.asarray(run.stats[p]["best"], dtype=np.float64)  # noqa: E731
        return cls(get(POSITIVE_POOL), get(TEMPORAL_PROBE), get(SEMANTIC_PROBE), np.asarray(run.missed, bool))

    @property
    def complete(self) -> np.ndarray:
        return np.isfinite(self.main) & np.isfinite(self.temp) & np.isfinite(self.sem)

    @property
    def failed(self) -> np.ndarray:
        """Complete triplets of missed queries."""
        return self.complete & (np.zeros(len(self.main), bool) if self.missed is None else self.missed)


def _beats(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(x ranks before y) under random tie-breaking: 1, 1/2 or 0."""
    return (x > y) + 0.5 * (x == y)


def order_probabilities(ts: TripletScores) -> np.ndarray:
    """(n, 6) float: per query, the probability of each order in `ORDERS` (uniform over the orders consistent with
    the scores, i.e. non-increasing along the order); NaN rows for incomplete triplets, 0 rows for missed ones."""
    s = {"main": ts.main, "temp": ts.temp, "sem": ts.sem}
    consistent = np.stack([(s[o[0]] >= s[o[1]]) & (s[o[1]] >= s[o[2]]) for o in ORDERS], axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        probs = consistent / consistent.sum(axis=1, keepdims=True)
    probs[ts.failed] = 0.0
    probs[~ts.complete] = np.nan
    return probs


def per_query_triplets(ts: TripletScores) -> dict[str, np.ndarray]:
    """Per-query expected ``acc_temp``, ``acc_sem``, ``acc_tri`` (float; NaN for incomplete triplets, 0 for missed
    queries)."""
    probs = order_probabilities(ts)
    first_main = [i for i, o in enumerate(ORDERS) if o[0] == "main"]
    out = {"acc_temp": _beats(ts.main, ts.temp).astype(np.float64), "acc_sem": _beats(ts.main, ts.sem).astype(np.float64),
           "acc_tri": probs[:, first_main].sum(axis=1)}
    for v in out.values():
        v[ts.failed] = 0.0
        v[~ts.complete] = np.nan
    return out


def triplet_summary(ts: TripletScores, mask: np.ndarray | None = None) -> dict:
    """Acc_temp, Acc_sem, Acc_tri, the order histogram (expected count and share per order, plus ``missed``), ``n``
    complete triplets (missed queries included, as failures), ``n_missed`` and ``n_incomplete``, over the queries in
    ``mask`` (all when None)."""
    sel = np.ones(len(ts.main), bool) if mask is None else np.asarray(mask, bool)
    comp = ts.complete & sel
    n = int(comp.sum())
    per = per_query_triplets(ts)
    probs = order_probabilities(ts)[comp]
    counts = probs.sum(axis=0) if n else np.zeros(len(ORDERS))
    n_missed = int((ts.failed & sel).sum())
    out = {"n": n, "n_missed": n_missed, "n_incomplete": int(sel.sum()) - n}
    for key, v in per.items():
        out[key] = float(v[comp].mean()) if n else float("nan")
    out["orders"] = {order_name(o): {"count": float(c), "share": float(c / n) if n else float("nan")}
                     for o, c in zip(ORDERS, counts, strict=True)}
    out["orders"]["missed"] = {"count": float(n_missed), "share": n_missed / n if n else float("nan")}
    return out
