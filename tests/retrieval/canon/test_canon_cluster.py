"""Greedy clustering: the rule on hand-made cases, exactness against float64 at the threshold, exact equality with
the straightforward loop, the visiting order, helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from retrieval.canon.cluster import (
    UNIT_TOL,
    assign,
    exact_dots,
    extend_clustering,
    greedy_cluster,
    greedy_cluster_loop,
    similar_pairs,
    unit_rows,
    visit_order,
)
from retrieval.canon.metrics import partition_scores
from retrieval.canon.speed import clustered_embeddings


def fsum_sim(x: np.ndarray, y: np.ndarray) -> float:
    """The definition: the exact dot product of two float32 vectors, correctly rounded to float64."""
    return math.fsum((np.asarray(x, np.float32).astype(np.float64) * np.asarray(y, np.float32).astype(np.float64))
                     .tolist())


def both(emb, t, order=None, **kw):
    """The fast path with both screens, checked against the exact loop."""
    ref = greedy_cluster_loop(emb, t, order)
    for screen in ("int8", "float32"):
        fast = greedy_cluster(emb, t, order, screen=screen, **kw)
        assert np.array_equal(fast.labels, ref.labels), screen
        assert np.array_equal(fast.seeds, ref.seeds), screen
        assert np.array_equal(fast.seed_sim, ref.seed_sim), screen
    return fast


def test_threshold_is_inclusive_on_the_float64_cosine():
    x = np.array([[1.0, 0.0], [0.85, np.sqrt(1 - 0.85**2)]], np.float32)
    exact = fsum_sim(x[0], x[1])
    assert both(x, exact).labels.tolist() == [0, 0]  # sim == t joins
    assert both(x, np.nextafter(exact, 2.0)).labels.tolist() == [0, 1]  # just above: a new seed


def _pair_just_below(target: float, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 unit vectors whose exact cosine lies within 1e-7 below ``target``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(dim)
    x = (x / np.linalg.norm(x)).astype(np.float32)
    z = rng.standard_normal(dim)
    z -= (z @ x) * x
    z /= np.linalg.norm(z)
    lo, hi = target - 1e-5, target
    for _ in range(60):  # bisection on the mixing cosine
        c = (lo + hi) / 2
        y = (c * x.astype(np.float64) + np.sqrt(1 - c * c) * z).astype(np.float32)
        lo, hi = (c, hi) if fsum_sim(x, y) < target else (lo, c)
    y = (lo * x.astype(np.float64) + np.sqrt(1 - lo * lo) * z).astype(np.float32)
    return x, y


def test_a_pair_at_0_79999958_does_not_join_at_0_8():
    # a pair of 384-d float32 unit embeddings at cosine 0.79999958 (the value reported on real labels) whose
    # cosine on a 2^-20 grid (rounding each component to a multiple of 2^-20) is >= 0.8: exact means below 0.8
    grid = 2.0**20
    for seed in range(200):
        x, y = _pair_just_below(0.79999958, 384, seed)
        sim = fsum_sim(x, y)
        on_grid = float(np.rint(x.astype(np.float64) * grid) @ np.rint(y.astype(np.float64) * grid)) / grid**2
        if round(sim, 8) == 0.79999958 and on_grid >= 0.8:
            break
    else:
        pytest.fail("no crafted pair found")
    assert abs(float(x @ x) - 1) <= UNIT_TOL and abs(float(y @ y) - 1) <= UNIT_TOL  # taken as given
    pair = np.stack([x, y])
    cl = both(pair, 0.8)
    assert cl.labels.tolist() == [0, 1] and cl.seed_sim[1] == fsum_sim(y, y)  # founds its own (exactly rounded)
    assert both(pair, sim).labels.tolist() == [0, 0] and both(pair, sim).seed_sim[1] == sim
    assert both(pair, np.nextafter(sim, 1.0)).labels.tolist() == [0, 1]
    idx, s = assign(y[None], x[None], 0.8)
    assert idx.tolist() == [-1] and np.isnan(s[0])
    assert assign(y[None], x[None], sim)[1].tolist() == [sim]
    assert similar_pairs(pair, 0.8)[0].size == 0 and similar_pairs(pair, sim)[0].tolist() == [0, 1]


def test_exact_dots_are_the_correctly_rounded_sum():
    rng = np.random.default_rng(0)
    for dim in (1, 3, 64, 385):
        x = unit_rows(rng.standard_normal((300, dim)))
        x[5] = x[4]  # duplicates: sims of 1
        x[7, ::2] = 1e-30  # tiny and subnormal components
        x[8, 1::3] = -3e-39
        x[9] = -x[10]
        a, b = rng.integers(0, 300, 3000), rng.integers(0, 300, 3000)
        a[:3], b[:3] = [4, 7, 9], [5, 8, 10]
        got = exact_dots(x, a, b)
        want = np.array([fsum_sim(x[i], x[k]) for i, k in zip(a, b, strict=True)])
        assert np.array_equal(got, want), dim
        assert np.array_equal(got, exact_dots(x, b, a))  # symmetric
    # an exact sum on a rounding midpoint: 1 + 2^-53 rounds to 1 (ties to even), 1 + 3 * 2^-53 to 1 + 2^-51
    for tail, want in ((2.0**-53, 1.0), (3 * 2.0**-53, 1 + 2.0**-51)):
        x = np.array([[1.0, 2.0**-27, 2.0**-26 if tail > 2.0**-53 else 0.0]], np.float32)
        y = np.array([[1.0, 2.0**-26, 2.0**-26]], np.float32)
        assert exact_dots(x, [0], [0], y)[0] == want == fsum_sim(x[0], y[0])


def test_unit_rows_keep_unit_rows_bit_for_bit():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert np.array_equal(unit_rows(x), x)  # float32-normalised rows are used as given
    far = 3 * x
    far[0] *= 2
    u = unit_rows(far)
    assert np.allclose(np.linalg.norm(u.astype(np.float64), axis=1), 1, atol=1e-6)
    assert not np.array_equal(u, far)


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


def test_visit_order_count_ties_by_first_occurrence_or_text():
    counts, phrases = [2, 5, 2, 5, 1], ["b", "z", "a", "y", "c"]
    assert visit_order(counts).tolist() == [1, 3, 0, 2, 4]  # default: input order among equal counts
    assert visit_order(counts, phrases).tolist() == [1, 3, 0, 2, 4]
    assert visit_order(counts, phrases, ties="first").tolist() == [1, 3, 0, 2, 4]
    assert visit_order(counts, phrases, ties="text").tolist() == [3, 1, 2, 0, 4]
    with pytest.raises(ValueError, match="ties"):
        visit_order(counts, phrases, ties="random")
    with pytest.raises(ValueError, match="needs one phrase"):
        visit_order(counts, ties="text")


def test_the_tie_rule_changes_who_seeds():
    # "b" and "a" have equal counts and are mutually similar: the one visited first seeds the cluster
    emb = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    counts, phrases = [3, 3, 1], ["b", "a", "c"]
    first = greedy_cluster(emb, 0.9, visit_order(counts, phrases, "first"))
    text = greedy_cluster(emb, 0.9, visit_order(counts, phrases, "text"))
    assert first.seeds.tolist() == [0, 2] and text.seeds.tolist() == [1, 2]


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
    g = unit_rows(emb).astype(np.float64)
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
    assert np.allclose(sim[sure], s.max(1)[sure], atol=1e-12)


def test_extending_a_clustering_equals_clustering_the_seeds_first():
    emb, _, counts = clustered_embeddings(900, 150, 48, sigma_lo=0.2, sigma_hi=0.6, seed=11)
    base = greedy_cluster(emb[:500], 0.8, visit_order(counts[:500]))
    seeds, new = emb[:500][base.seeds], emb[500:]
    order = visit_order(counts[500:])
    ext = extend_clustering(seeds, new, 0.8, order, block=97, seed_chunk=64)
    k = len(seeds)
    ref = greedy_cluster_loop(np.concatenate([seeds, new]), 0.8, np.concatenate([np.arange(k), order + k]), start=k,
                              initial_seeds=np.arange(k))
    assert np.array_equal(ext.labels, ref.labels[k:]) and np.array_equal(ext.seed_sim, ref.seed_sim[k:])
    assert np.array_equal(ext.new_seeds + k, ref.seeds[k:]) and ext.n_fixed == k
    assert (ext.labels < k).any() and (ext.labels >= k).any()  # some join old clusters, some found new ones
    fixed_only = ext.labels[np.flatnonzero(ext.labels < k)]
    idx, _ = assign(new, seeds, 0.8)
    assert set(fixed_only.tolist()) <= set(idx[idx >= 0].tolist())
    with pytest.raises(ValueError, match="dimension"):
        extend_clustering(seeds, new[:, :10], 0.8)


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
