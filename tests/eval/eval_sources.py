"""Score sources on the session's synthetic benchmark shared by the evaluator tests."""

from __future__ import annotations

import numpy as np

from eval.scoring import DenseSource


def oracle_and_pixels(bench, rows=None):
    """Query rows (default: the fair test rows), the true-state oracle (one-hot states, expanded to segments: exact
    ties) and persistence in the pixels space (the 8 prefix tokens of each query, scored by their max)."""
    rows = bench.query_rows("test", fair_only=True) if rows is None else np.asarray(rows)
    qs = bench.queries_ds.select(rows)
    eye = np.eye(len(bench.state_ids), dtype=np.float32)
    oracle = DenseSource(eye[[bench.state_index[s] for s in qs["target_state_id"]]], eye,
                         item_rows=bench.segment_state_rows)
    pre, corp = bench.features("pixels", "prefixes"), bench.features("pixels", "corpus")
    pidx = pre.index()
    pixels = DenseSource(np.asarray(pre.array)[[pidx[p] for p in qs["prefix_id"]]], corp.array)
    return rows, oracle, pixels
