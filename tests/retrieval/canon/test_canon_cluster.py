"""Greedy clustering: the rule on hand-made cases, exact equality with the straightforward loop, helpers."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.canon.cluster import (
    assign,
    greedy_cluster,
    greedy_cluster_loop,
    similar_pairs,
    to_grid,
    visit_order,
)
from retrieval.canon.metrics import partition_scores
from retrieval.canon.speed import clustered_embeddings

GRID = 2.0**20


def both(emb, t, order=None, **kw):
    """The fast path with both screens, checked against the exact loop."""
    ref = greedy_cluster_loop(emb, t, order)
    for screen in ("int8", "float32"):
        fast = greedy_cluster(emb, t, order, screen=screen, **kw)
        assert np.array_equal(fast.labels, ref.labels), screen
        assert np.array_equal(fast.seeds, ref.seeds), screen
        assert np.array_equal(fast.seed_sim, ref.seed_sim), screen
    return fast


def test_threshold_is_inclusive_on_the_grid():
    x = np.array([[1.0, 0.0], [0.85, np.sqrt(1 - 0.85**2)]])
    g = to_grid(x)
    exact = float(np.rint(g[0].astype(np.float64) * GRID) @ np.rint(g[1].astype(np.float64) * GRID)) / GRID**2
    assert both(x, exact).labels.tolist() == [0, 0]  # sim == t joins
    assert both(x, np.nextafter(exact, 2.0)).labels.tolist() == [0, 1]  # just above: a new seed


def test_joins_the_most_similar_seed_and_ties_go_to_the_earliest():
    s0, s1 = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
    tie = [1.0, 1.0, 0.0]  # equally close to both seeds (exactly, on the grid)
    closer_to_s1 = [0.6, 1.0, 0.0]
    cl = both(np.array([s0, s1, tie, closer_to_s1]), 0.5)
    assert cl.labels.tolist() == [0, 1, 0, 1]
    assert cl.seeds.tolist() == [0, 1]
    # the same phrases visited in another order: the earliest seed is now s1
    cl = both(np.array([s0, s1, tie, closer_to_s1]), 0.5, order=np.array([1, 0, 2, 3]))
    assert cl.labels.tolist() == [1, 0, 0, 0] and cl.seeds.tolist() == [1, 0]


def test_a_phrase_never_joins_a_later_seed():
    # b is below the threshold from a, so it seeds; c is close to b only; within one block c must see b
    a, b, c = [1.0, 0.0], [0.0, 1.0], [0.1, 1.0]
    cl = both(np.array([c, a, b]), 0.9, order=np.array([1, 2, 0]))
    assert cl.labels.tolist() == [1, 0, 1]


@pytest.mark.parametrize("dim,n,clusters,block,chunk,thresholds", [(64, 3000, 700, 301, 400, (0.75, 0.9)),
                                                                    (384, 1500, 400, 256, 128, (0.85,))])
def test_fast_equals_the_exact_loop_on_thousands_of_phrases(dim, n, clusters, block, chunk, thresholds):
    emb, truth, counts = clustered_embeddings(n, clusters, dim, sigma_lo=0.2, sigma_hi=0.6, seed=dim)
    rng = np.random.default_rng(1)
    emb[rng.integers(0, n, 50)] = emb[rng.integers(0, n, 50)]  # exact duplicates: exact ties, sims of 1
    order = visit_order(counts, [f"p{i}" for i in range(n)])
    for t in thresholds:
        cl = both(emb, t, order, block=block, seed_chunk=chunk)
        assert 1 < cl.n_clusters < n
        assert (cl.seed_sim >= t).all()
        assert np.array_equal(np.sort(cl.labels[cl.seeds]), np.arange(cl.n_clusters))
        if t == min(thresholds):  # the data is clustered, and the rule recovers most of it
            assert partition_scores(cl.labels, truth)["ari"] > 0.5


def test_block_size_does_not_change_the_result():
    emb, _, _ = clustered_embeddings(300, 80, 32, seed=3)
    ref = greedy_cluster(emb, 0.8, block=5)
    for block in (64, 5000):
        assert np.array_equal(greedy_cluster(emb, 0.8, block=block).labels, ref.labels)


def test_visit_order_is_count_desc_then_text():
    order = visit_order([2, 5, 2, 5, 1], ["b", "z", "a", "y", "c"])
    assert order.tolist() == [3, 1, 2, 0, 4]


def test_members_list_the_seed_first():
    emb, _, counts = clustered_embeddings(300, 40, 16, seed=5)
    order = visit_order(counts, [str(i) for i in range(300)])
    cl = greedy_cluster(emb, 0.8, order)
    pos = np.empty(300, int)
    pos[order] = np.arange(300)
    for c, rows in enumerate(cl.members()):
        assert rows[0] == cl.seeds[c] and (cl.labels[rows] == c).all() and (np.diff(pos[rows]) > 0).all()
    assert sum(len(m) for m in cl.members()) == 300


def test_bad_embeddings_are_refused_with_the_row():
    x = np.ones((4, 3))
    x[2, 1] = np.nan
    with pytest.raises(ValueError, match="row 2"):
        greedy_cluster(x, 0.8)
    x[2] = 0
    with pytest.raises(ValueError, match="row 2 is zero"):
        greedy_cluster(x, 0.8)
    with pytest.raises(ValueError, match="permutation"):
        greedy_cluster(np.eye(3), 0.8, order=np.array([0, 0, 1]))
    with pytest.raises(ValueError, match="threshold"):
        greedy_cluster(np.eye(3), 1.5)
    with pytest.raises(ValueError, match="screen"):
        greedy_cluster(np.eye(3), 0.5, screen="int4")


def test_assign_and_similar_pairs_match_brute_force():
    emb, _, _ = clustered_embeddings(400, 60, 24, seed=7)
    g = to_grid(emb).astype(np.float64)
    sims = g @ g.T
    i, j = similar_pairs(emb, 0.8)
    want = np.argwhere((sims >= 0.8 + 1e-4) & ~np.eye(400, dtype=bool))  # clear of the threshold by far
    got = set(zip(i.tolist(), j.tolist(), strict=True))
    assert {tuple(p) for p in want} <= got
    assert all(sims[a, b] >= 0.8 - 1e-4 for a, b in got)
    seeds = emb[:50]
    idx, sim = assign(emb[50:], seeds, 0.8)
    s = g[50:] @ g[:50].T
    best = s.argmax(1)
    sure = s.max(1) >= 0.8 + 1e-4
    assert (idx[sure] == best[sure]).all()
    assert (idx[s.max(1) < 0.8 - 1e-4] == -1).all()
    assert np.allclose(sim[sure], s.max(1)[sure], atol=1e-5)


def test_auto_screen_falls_back_to_float32_without_int8_matmul(monkeypatch):
    import torch

    from retrieval.canon import cluster

    cluster.int8_screen_available.cache_clear()
    monkeypatch.delattr(torch, "_int_mm")
    try:
        assert not cluster.int8_screen_available() and cluster.resolve_screen("auto") == "float32"
        emb = np.random.default_rng(1).normal(size=(200, 16)).astype(np.float32)
        ref = cluster.greedy_cluster_loop(emb, 0.5)
        assert np.array_equal(cluster.greedy_cluster(emb, 0.5).labels, ref.labels)
    finally:
        cluster.int8_screen_available.cache_clear()
