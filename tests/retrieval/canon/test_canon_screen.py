"""The screen interface of the fast clustering path: every implementation keeps every pair at exact ``sim >= t``."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.canon.cluster import SCREENS, Screen, exact_dots, make_screen, unit_rows
from retrieval.canon.speed import clustered_embeddings


@pytest.mark.parametrize("kind", SCREENS)
def test_a_screen_never_loses_a_pair_at_the_threshold(kind):
    emb, _, _ = clustered_embeddings(400, 60, 48, sigma_lo=0.2, sigma_hi=0.5, seed=4)
    x = unit_rows(emb)
    a, b = np.divmod(np.arange(len(x) ** 2), len(x))
    sims = exact_dots(x, a, b)
    # thresholds: a round one, and the exact similarity of a pair whose float32 product lies below it (a screen
    # comparing float32 products with t itself would lose that pair)
    f32, exact = (x[:150] @ x.T).ravel(), sims[: 150 * len(x)]
    near = np.flatnonzero((f32 < exact.astype(np.float32)) & (exact > 0.8) & (a[: f32.size] != b[: f32.size]))
    for t in (0.8, float(sims[near[0]])):
        screen = make_screen(kind, [x], t)
        assert isinstance(screen, Screen) and screen.kind == kind
        rows, cols = screen.pairs(screen.encode(x[:150]), screen.encode(x).codes, chunk=len(x))
        got = set(zip(rows.tolist(), cols.tolist(), strict=True))
        must = sims.reshape(len(x), len(x))[:150] >= t
        assert {tuple(p) for p in np.argwhere(must).tolist()} <= got
        assert len(got) < 150 * len(x) / 4  # and it does screen


def test_auto_is_one_of_the_screens():
    assert make_screen("auto", [np.eye(3, dtype=np.float32)], 0.5).kind in SCREENS
    with pytest.raises(ValueError, match="screen"):
        make_screen("int4", [np.eye(3, dtype=np.float32)], 0.5)
