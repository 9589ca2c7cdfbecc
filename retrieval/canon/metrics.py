r"""Scores of a clustering: vocabulary statistics, and agreement with a true partition when one exists.

With ``n`` items, predicted clusters ``K`` and true classes ``C``, contingency ``n_{kc} = |k \cap c|``,
row sums ``a_k`` and column sums ``b_c``:

- purity ``= (1/n) sum_k max_c n_{kc}`` (do predicted clusters hold one true class?);
- inverse purity ``= (1/n) sum_c max_k n_{kc}`` (is each true class kept in one cluster?);
- adjusted Rand index (Hubert & Arabie 1985)::

      ARI = (sum_{kc} C(n_kc, 2) - E) / (((sum_k C(a_k, 2) + sum_c C(b_c, 2)) / 2) - E),
      E   = sum_k C(a_k, 2) sum_c C(b_c, 2) / C(n, 2)

  (1 for identical partitions, about 0 for independent ones; defined as 1 when both partitions are trivial
  in the same way, i.e. the denominator is 0).

The contingency table is sparse (``scipy.sparse``): nothing here is quadratic in ``n``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from eval.errors import InputError

#: The paper's rule of thumb for the threshold: keep the mean canonical cluster size at most this.
MAX_MEAN_CLUSTER_SIZE = 5.0


def _codes(labels) -> np.ndarray:
    return np.unique(np.asarray(labels), return_inverse=True)[1].astype(np.int64)


def contingency(pred, truth) -> sp.csr_matrix:
    """``(n_pred_clusters, n_true_classes)`` sparse counts ``n_{kc}``."""
    p, t = _codes(pred), _codes(truth)
    if len(p) != len(t):
        raise InputError(f"{len(p)} predicted labels but {len(t)} true labels")
    return sp.csr_matrix((np.ones(len(p), np.int64), (p, t)), shape=(p.max(initial=-1) + 1, t.max(initial=-1) + 1))


def _pairs(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    return float((x * (x - 1) / 2).sum())


def partition_scores(pred, truth) -> dict[str, float]:
    """``{"purity", "inverse_purity", "ari"}`` of a predicted partition against the truth (see the module docstring)."""
    m = contingency(pred, truth)
    n = int(m.sum())
    if n == 0:
        return {"purity": float("nan"), "inverse_purity": float("nan"), "ari": float("nan")}
    purity = float(m.max(axis=1).sum()) / n
    inverse = float(m.max(axis=0).sum()) / n
    index = _pairs(m.data)
    a, b = _pairs(np.asarray(m.sum(axis=1)).ravel()), _pairs(np.asarray(m.sum(axis=0)).ravel())
    expected = a * b / (n * (n - 1) / 2) if n > 1 else 0.0
    denom = (a + b) / 2 - expected
    ari = 1.0 if denom == 0 else (index - expected) / denom
    return {"purity": purity, "inverse_purity": inverse, "ari": float(ari)}


def vocabulary_stats(labels, n_phrases: int | None = None) -> dict[str, float]:
    """Vocabulary size and cluster sizes of a clustering of ``n`` phrases.

    ``merge_rate = 1 - clusters / n`` (the fraction of raw phrases folded into another phrase's cluster),
    ``mean_size = n / clusters``, ``max_size``, ``singletons`` (clusters of one phrase), and whether the paper's
    rule ``mean_size <= 5`` holds."""
    sizes = np.bincount(_codes(labels))
    n = int(sizes.sum()) if n_phrases is None else int(n_phrases)
    k = int(len(sizes))
    mean = n / k if k else float("nan")
    return {"phrases": n, "clusters": k, "merge_rate": 1 - k / n if n else float("nan"), "mean_size": mean,
            "max_size": int(sizes.max(initial=0)), "singletons": int((sizes == 1).sum()),
            "mean_size_ok": bool(mean <= MAX_MEAN_CLUSTER_SIZE)}
