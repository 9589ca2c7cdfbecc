"""The streaming scorer against brute force on small corpora (full score matrices are fine at this size)."""

from __future__ import annotations

import numpy as np
import pytest
from eval_sources import oracle_and_pixels

from eval.errors import InputError
from eval.runs import Run, read_run, write_run
from eval.scoring import SPREAD_RTOL, DenseSource, FusionSource, RandomSource, score_stream, stream_moments
from eval.scoring.fusion import needs_full_scores


def _lattice(rng, n, d, k=None):
    """Small-integer vectors: dot products are exact in float32, so ties are frequent and exact."""
    shape = (n, d) if k is None else (n, k, d)
    return rng.integers(-2, 3, size=shape).astype(np.float32)


def _random_groups(rng, nq, n_items, max_size, empty_rate=0.15):
    out = []
    for _ in range(nq):
        size = 0 if rng.random() < empty_rate else int(rng.integers(1, max_size + 1))
        out.append(rng.choice(n_items, size=size, replace=False).astype(np.int64))
    return out


def brute_stats(full, pools, exclude, no_excl, k):
    """Reference: per query and pool, counts by definition from the full score matrix."""
    nq, n = full.shape
    stats = {p: {f: np.zeros(nq, np.int64) for f in ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")}
             for p in pools}
    top_rows = np.full((nq, k), -1, np.int64)
    for i in range(nq):
        ex = set(exclude[i].tolist()) if exclude is not None else set()
        for p, lists in pools.items():
            ranked = set(range(n)) if p in no_excl else set(range(n)) - ex
            pos = set(lists[i].tolist()) & ranked
            neg = np.array(sorted(ranked - pos), dtype=np.int64)
            st = stats[p]
            st["n_pos"][i] = len(pos)
            if not pos:
                continue
            posa = np.array(sorted(pos))
            t = full[i, posa].max()
            st["n_above"][i] = int((full[i, neg] > t).sum())
            st["n_tie_neg"][i] = int((full[i, neg] == t).sum())
            st["n_tie_pos"][i] = int((full[i, posa] == t).sum())
            first = posa[full[i, posa] == t].min()
            st["n_tie_neg_first"][i] = int(((full[i, neg] == t) & (neg < first)).sum())
        ranked = np.array(sorted(set(range(n)) - ex), dtype=np.int64)
        order = np.lexsort((ranked, -full[i, ranked].astype(np.float64)))
        sel = ranked[order][:k]
        top_rows[i, :len(sel)] = sel
    return stats, top_rows


def _pools(rng, nq, n):
    return {"a": _random_groups(rng, nq, n, 6), "b": _random_groups(rng, nq, n, 2), "self": _random_groups(rng, nq, n, 3)}


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("tile", [(7, 13), (64, 1000)])
def test_stream_matches_brute_force(expanded, tile):
    rng = np.random.default_rng(1 + expanded)
    nq, n, d, m = 23, 157, 5, 31
    q = _lattice(rng, nq, d)
    if expanded:
        items = _lattice(rng, m, d)
        item_rows = rng.integers(0, m, size=n)
        full = (q @ items.T)[:, item_rows]
        src = DenseSource(q, items, item_rows=item_rows)
    else:
        items = _lattice(rng, n, d)
        full = q @ items.T
        src = DenseSource(q, items)
    pools = _pools(rng, nq, n)
    exclude = _random_groups(rng, nq, n, 12, empty_rate=0.2)
    # positives may overlap the excluded rows; they then leave cross-instance pools but stay in "self"
    pools["a"][0] = np.concatenate([pools["a"][0], exclude[0][:2]]) if len(exclude[0]) else pools["a"][0]
    k = 10
    res = score_stream(src, pools, exclude, k=k, q_block=tile[0], c_chunk=tile[1], progress=False,
                       no_exclude_pools=("self",))
    ref, ref_top = brute_stats(full, pools, exclude, {"self"}, k)
    for p in pools:
        for f, v in ref[p].items():
            np.testing.assert_array_equal(res.stats[p][f], v, err_msg=f"{p}/{f}")
    np.testing.assert_array_equal(res.topk_rows, ref_top)
    np.testing.assert_array_equal(res.topk_scores, np.take_along_axis(full, ref_top, 1))
    # unlisted ties at the k-th score
    for i in range(nq):
        ranked = np.setdiff1d(np.arange(n), exclude[i])
        kth = res.topk_scores[i, -1]
        assert res.kth_tie_unlisted[i] == int((full[i, ranked] == kth).sum()) - int((res.topk_scores[i] == kth).sum())
    # ties really occur in this data (the test would be vacuous otherwise)
    assert res.stats["a"]["n_tie_neg"].sum() > 0 and res.stats["a"]["n_tie_pos"].max() > 1
    assert res.kth_tie_unlisted.sum() > 0


def test_ranked_positives_match_brute_force():
    rng = np.random.default_rng(5)
    nq, n, d = 17, 90, 4
    q, items = _lattice(rng, nq, d), _lattice(rng, n, d)
    full = q @ items.T
    pools = _pools(rng, nq, n)
    exclude = _random_groups(rng, nq, n, 8)
    k = 6
    res = score_stream(DenseSource(q, items), pools, exclude, k=k, q_block=5, c_chunk=11, progress=False,
                       no_exclude_pools=("self",))
    r = res.ranked
    assert r.pool_names == ["a", "b", "self"]
    for i in range(nq):
        ranked = np.setdiff1d(np.arange(n), exclude[i])
        s = full[i, ranked]
        kth = np.sort(s)[::-1][k - 1]
        expect_top, expect_counts = [], {}
        for row in ranked:
            mask = sum(1 << b for b, p in enumerate(("a", "b")) if row in set(pools[p][i].tolist()))
            if not mask:
                continue
            expect_counts[mask] = expect_counts.get(mask, 0) + 1
            v = full[i, row]
            if v >= kth:
                expect_top.append((mask, int((s > v).sum()), int((s == v).sum())))
        sl = slice(r.top_offsets[i], r.top_offsets[i + 1])
        got = sorted(zip(r.mask[sl].tolist(), r.above[sl].tolist(), r.tie[sl].tolist(), strict=True))
        assert got == sorted(expect_top)
        sc = slice(r.count_offsets[i], r.count_offsets[i + 1])
        assert dict(zip(r.pos_mask[sc].tolist(), r.pos_count[sc].tolist(), strict=True)) == expect_counts


def test_multi_sample_queries_take_the_max():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((9, 4, 8)).astype(np.float32)
    items = rng.standard_normal((50, 8)).astype(np.float32)
    src = DenseSource(q, items)
    expect = np.einsum("qkd,nd->qkn", q, items).max(1)
    np.testing.assert_allclose(src.scores(slice(2, 7), np.array([3, 1, 49])), expect[2:7, [3, 1, 49]], rtol=1e-5)
    mean = DenseSource(q, items, reduce="mean").scores(slice(0, 9), slice(0, 50))
    np.testing.assert_allclose(mean, np.einsum("qkd,nd->qkn", q, items).mean(1), rtol=1e-4, atol=1e-5)


def test_expanded_ties_are_bitwise_identical_across_calls():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((20, 16)).astype(np.float32)
    items = rng.standard_normal((7, 16)).astype(np.float32)
    item_rows = rng.integers(0, 7, size=300)
    src = DenseSource(q, items, item_rows=item_rows)
    a = src.scores(slice(0, 20), slice(0, 300))
    b = np.concatenate([src.scores(slice(0, 20), slice(c, min(300, c + 37))) for c in range(0, 300, 37)], axis=1)
    c = src.scores(slice(0, 20), np.arange(300)[::-1].copy())[:, ::-1]
    assert np.array_equal(a, b) and np.array_equal(a, c)
    same_state = item_rows[:, None] == item_rows[None, :]
    for i in range(20):
        eq = a[i][:, None] == a[i][None, :]
        assert np.all(eq[same_state])


def test_fusion_moments_closed_form_and_streamed():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((11, 6)).astype(np.float32)
    items = rng.standard_normal((9, 6)).astype(np.float32)
    item_rows = rng.integers(0, 9, size=120)
    dense = DenseSource(q, items, item_rows=item_rows)
    full = (q.astype(np.float64) @ items.T.astype(np.float64))[:, item_rows]
    mean, std = dense.moments(slice(0, 11))
    np.testing.assert_allclose(mean, full.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, full.std(1), rtol=1e-5)
    m2, s2 = stream_moments(dense, slice(0, 11), c_chunk=17)
    np.testing.assert_allclose(m2, full.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s2, full.std(1), rtol=1e-5)
    # K = 3 samples (max): moments are streamed
    qk = rng.standard_normal((11, 3, 6)).astype(np.float32)
    vis = DenseSource(qk, rng.standard_normal((120, 6)).astype(np.float32))
    fused = FusionSource([dense, vis], weights=[1.0, 0.5], c_chunk=29)
    fv = vis.scores(slice(0, 11), slice(0, 120)).astype(np.float64)
    expect = (full - full.mean(1, keepdims=True)) / full.std(1, keepdims=True) + \
        0.5 * (fv - fv.mean(1, keepdims=True)) / fv.std(1, keepdims=True)
    np.testing.assert_allclose(fused.scores(slice(0, 11), slice(0, 120)), expect, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fused.scores(slice(3, 5), np.array([7, 2])), expect[3:5, [7, 2]], rtol=1e-4, atol=1e-4)


def test_closed_form_moments_of_unexpanded_items_take_the_symmetric_product():
    """Without expansion the closed form sums ``y^T y`` by a symmetric rank-k update: an exactly symmetric Gram
    matrix, and the same moments as float64 arithmetic over every score, over several chunks of items."""
    from eval.scoring.sources import DEFAULT_C_CHUNK, _gram

    rng = np.random.default_rng(5)
    y = rng.standard_normal((300, 24)).astype(np.float32)
    g = _gram(y)
    assert g.dtype == np.float64 and (g == g.T).all()
    np.testing.assert_allclose(g, y.T.astype(np.float64) @ y.astype(np.float64), rtol=1e-5, atol=1e-3)
    q = rng.standard_normal((40, 24)).astype(np.float32)
    items = (rng.standard_normal((DEFAULT_C_CHUNK + 777, 24)) + 3.0).astype(np.float32)  # off-centre, two chunks
    full = q.astype(np.float64) @ items.T.astype(np.float64)
    mean, std = DenseSource(q, items, moments="closed").moments(slice(0, 40))
    np.testing.assert_allclose(mean, full.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std, full.std(1), rtol=1e-5)


def test_random_source_is_chunking_invariant():
    src = RandomSource(10, 1000, seed=7)
    a = src.scores(slice(0, 10), slice(0, 1000))
    b = np.concatenate([src.scores(slice(0, 10), slice(c, c + 300)) for c in range(0, 1000, 300)], axis=1)
    assert np.array_equal(a, b) and a.dtype == np.float32
    assert np.array_equal(src.scores(slice(4, 5), np.array([999, 3])), a[4:5, [999, 3]])
    assert 0.45 < a.mean() < 0.55 and a.min() >= 0 and a.max() < 1
    assert not np.array_equal(a, RandomSource(10, 1000, seed=8).scores(slice(0, 10), slice(0, 1000)))


def _random_scores_numpy(src, q: slice, cols: np.ndarray) -> np.ndarray:
    """The random baseline's scores in numpy: splitmix64 of ``(q * n_items + col) ^ key``, its top 24 bits."""
    from eval.scoring.sources import _splitmix64

    rows = np.arange(q.start, q.stop, dtype=np.uint64) * np.uint64(src.n_items)
    x = _splitmix64((rows[:, None] + cols.astype(np.uint64)[None, :]) ^ src._key)
    return (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_random_source_kernel_is_the_numpy_hash_bit_for_bit(seed):
    """The numba kernel gives the numpy splitmix64 reference's exact bits (runs scored before it stay valid)."""
    src = RandomSource(300, 211_500, seed=seed)
    for q, cols in ((slice(0, 40), np.arange(211_500)), (slice(250, 300), np.arange(100_000, 100_777)),
                    (slice(7, 9), np.array([211_499, 0, 5, 5])), (slice(3, 3), np.arange(10))):
        items = slice(int(cols[0]), int(cols[-1]) + 1) if len(cols) > 4 else cols
        assert np.array_equal(src.scores(q, items), _random_scores_numpy(src, q, cols))


def test_bad_rows_are_reported():
    src = DenseSource(np.ones((2, 3), np.float32), np.ones((5, 3), np.float32))
    with pytest.raises(InputError, match="query 1: corpus row 9"):
        score_stream(src, {"a": [np.array([0]), np.array([9])]}, None, k=2, progress=False)
    with pytest.raises(ValueError, match="has 1 queries"):
        score_stream(src, {"a": [np.array([0])]}, None, k=2, progress=False)


def _small_run(rng, name="m"):
    nq, n, d = 12, 60, 4
    q, items = _lattice(rng, nq, d), _lattice(rng, n, d)
    res = score_stream(DenseSource(q, items), _pools(rng, nq, n), _random_groups(rng, nq, n, 5), k=5,
                       progress=False, no_exclude_pools=("self",), probes={"pr": _random_groups(rng, nq, n, 3)})
    ids = [f"c{j:03d}" for j in range(n)]
    return Run(method=name, config={"space": "x", "seed": 1}, query_ids=[f"q{i}" for i in range(nq)],
               topk_ids=[[ids[j] for j in row] for row in res.topk_rows], topk_scores=res.topk_scores,
               stats=res.stats, benchmark="toy", kth_tie_unlisted=res.kth_tie_unlisted, ranked=res.ranked)


def test_run_round_trip(tmp_path):
    run = _small_run(np.random.default_rng(6))
    p = write_run(tmp_path / "run.parquet", run)
    back = read_run(p)
    assert (back.method, back.config, back.benchmark, back.query_ids, back.topk_ids) == \
        (run.method, run.config, run.benchmark, run.query_ids, run.topk_ids)
    np.testing.assert_array_equal(back.topk_scores, run.topk_scores)
    assert back.stats.keys() == run.stats.keys()
    for pool, d in run.stats.items():
        for f, v in d.items():
            np.testing.assert_array_equal(back.stats[pool][f], v)
    for f in ("top_offsets", "mask", "above", "tie", "count_offsets", "pos_mask", "pos_count"):
        np.testing.assert_array_equal(getattr(back.ranked, f), getattr(run.ranked, f))
    sub = back.select(["q3", "q1"])
    assert sub.query_ids == ["q3", "q1"] and sub.stats["a"]["n_above"][0] == run.stats["a"]["n_above"][3]
    assert sub.ranked.top_offsets[-1] == (run.ranked.top_offsets[4] - run.ranked.top_offsets[3]
                                          + run.ranked.top_offsets[2] - run.ranked.top_offsets[1])


def test_read_run_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eval.io import FormatError

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(FormatError, match="bad.parquet"):
        read_run(bad)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"query_id": ["q0"]}), plain)
    with pytest.raises(FormatError, match="psr_run"):
        read_run(plain)
    run = _small_run(np.random.default_rng(7))
    good = write_run(tmp_path / "good.parquet", run)
    t = pq.read_table(good)
    pq.write_table(t.drop_columns(["a/n_above"]), tmp_path / "drop.parquet")
    with pytest.raises(FormatError, match="a/n_above"):
        read_run(tmp_path / "drop.parquet")
    assert not list(tmp_path.glob(".*"))  # atomic writes leave no temp files


def test_score_benchmark_protocol(synth_bench):
    from eval.scoring import BENCHMARK_POOLS, benchmark_groups, score_benchmark

    bench = synth_bench
    rows, oracle, pixels = oracle_and_pixels(bench)
    queries = [bench.query(int(r)) for r in rows]
    run = score_benchmark(bench, pixels, rows, method="pixels", config={"space": "pixels"}, k=8, progress=False,
                          q_block=16, c_chunk=100)
    assert run.query_ids == [q.id for q in queries] and run.benchmark == bench.name
    assert set(BENCHMARK_POOLS) <= set(run.pools)
    pools, exclude, probes = benchmark_groups(bench, queries)
    full = pixels.scores(slice(0, len(rows)), slice(0, len(bench.corpus_ids)))
    ref, ref_top = brute_stats(full, pools, exclude, {"in_video"}, 8)
    for p in BENCHMARK_POOLS:
        for f, v in ref[p].items():
            np.testing.assert_array_equal(run.stats[p][f], v, err_msg=f"{p}/{f}")
    ids = np.asarray(bench.corpus_ids)
    assert run.topk_ids == ids[ref_top].tolist()
    seg_video = np.asarray(bench.corpus_ds["video_id"][:])
    for q, top in zip(queries, run.topk_ids, strict=True):
        assert q.video_id not in set(seg_video[[bench.corpus_index[x] for x in top]])  # own video never ranked
    # the main pool is in_dataset + cross_dataset, and the probes follow their definitions
    assert (run.stats["type2-all"]["n_pos"] == run.stats["in_dataset"]["n_pos"] + run.stats["cross_dataset"]["n_pos"]).all()
    seg_state = np.asarray(bench.corpus_ds["state_id"][:])
    for q, tmp, sem in zip(queries, probes["triplet_temporal"], probes["triplet_semantic"], strict=True):
        assert (seg_video[tmp] == q.video_id).all() and (seg_state[tmp] != q.target_state_id).all()
        assert (seg_video[sem] != q.video_id).all() and (seg_state[sem] == q.target_state_id).all()

    # the true-state oracle ranks a main-pool positive first: nothing is above it; the pool is a mined subset of the
    # target state's segments, so exactly the other videos' remaining segments of that state tie with it
    orun = score_benchmark(bench, oracle, rows, method="oracle", k=8, progress=False)
    st = orun.stats["type2-all"]
    assert (st["n_above"] == 0).all() and (st["n_tie_pos"] == st["n_pos"]).all()
    rest = [int(((seg_state == q.target_state_id) & (seg_video != q.video_id)).sum()) - len(q.gt_pools.main)
            for q in queries]
    assert st["n_tie_neg"].tolist() == rest and sum(rest) > 0
    # type1 is stricter: same-state segments of other subjects tie with its positives as negatives
    assert orun.stats["type1-all"]["n_tie_neg"].sum() > 0


class _Wobbly:
    """A dense source whose calls on index arrays (pass A) round differently in the last bit from slice calls."""

    def __init__(self, inner):
        self.inner, self.n_queries, self.n_items = inner, inner.n_queries, inner.n_items
        self.calls = 0

    def scores(self, q, items):
        s = self.inner.scores(q, items)
        if not isinstance(items, slice):
            s = np.nextafter(s, np.float32(np.inf))
        self.calls += 1
        return s


def test_pass_a_disagreement_is_resolved_from_the_tiles():
    rng = np.random.default_rng(8)
    nq, n, d = 12, 80, 3
    q, items = _lattice(rng, nq, d), _lattice(rng, n, d)
    full = q @ items.T
    pools = _pools(rng, nq, n)
    exclude = _random_groups(rng, nq, n, 6)
    src = _Wobbly(DenseSource(q, items))
    res = score_stream(src, pools, exclude, k=4, q_block=nq, c_chunk=32, progress=False, no_exclude_pools=("self",))
    ref, _ = brute_stats(full, pools, exclude, {"self"}, 4)
    for p in pools:
        for f, v in ref[p].items():
            np.testing.assert_array_equal(res.stats[p][f], v, err_msg=f"{p}/{f}")
    assert src.calls > 2 * 3  # the block was streamed twice (3 chunks each)


class _FewRows:
    """A dense source that rounds a call with fewer than ``rows`` query rows differently in the last bit, as a BLAS
    does that splits a short, deep product over its threads; it records each call's (query rows, slice?)."""

    def __init__(self, inner, rows):
        self.inner, self.rows, self.n_queries, self.n_items = inner, rows, inner.n_queries, inner.n_items
        self.calls = []

    def scores(self, q, items):
        s = self.inner.scores(q, items)
        self.calls.append((q.stop - q.start, isinstance(items, slice)))
        return np.nextafter(s, np.float32(np.inf)) if q.stop - q.start < self.rows else s


@pytest.mark.parametrize("splits", [True, False])
def test_pass_a_takes_whole_blocks_where_sub_blocks_round_differently(splits):
    """`eval.scoring.block.PassAPlan`: a source whose short calls round differently gets pass A on whole blocks (each
    block streamed once, not twice); a source that rounds alike keeps the cheaper sub-blocks. Exact either way."""
    from eval.scoring.block import PASS_A_QUERIES

    rng = np.random.default_rng(9)
    nq, n, d, q_block = 2 * (PASS_A_QUERIES + 36), 80, 3, PASS_A_QUERIES + 36
    q, items = _lattice(rng, nq, d), _lattice(rng, n, d)
    pools = _pools(rng, nq, n)
    exclude = _random_groups(rng, nq, n, 6)
    src = _FewRows(DenseSource(q, items), q_block if splits else 0)
    res = score_stream(src, pools, exclude, k=4, q_block=q_block, c_chunk=32, progress=False,
                       no_exclude_pools=("self",))
    ref, _ = brute_stats(q @ items.T, pools, exclude, {"self"}, 4)
    for p in pools:
        for f, v in ref[p].items():
            np.testing.assert_array_equal(res.stats[p][f], v, err_msg=f"{p}/{f}")
    assert sum(1 for rows, tile in src.calls if tile) == 2 * 3  # two blocks, three chunks each, streamed once
    pass_a = {rows for rows, tile in src.calls if not tile}
    assert pass_a == ({q_block, PASS_A_QUERIES} if splits else {q_block, PASS_A_QUERIES, 36})  # probe's + pass A's


class _SplitsOverThreads(_FewRows):
    """A `_FewRows` source that rounds its short calls as its tiles do when torch runs on one thread."""

    def scores(self, q, items):
        import torch

        s = self.inner.scores(q, items)
        self.calls.append((q.stop - q.start, isinstance(items, slice), torch.get_num_threads()))
        split = q.stop - q.start < self.rows and torch.get_num_threads() > 1
        return np.nextafter(s, np.float32(np.inf)) if split else s


def test_pass_a_runs_its_sub_blocks_on_one_thread_where_that_rounds_as_the_tiles():
    import torch

    from eval.scoring.block import PASS_A_QUERIES

    rng = np.random.default_rng(10)
    nq, n, d, q_block = 2 * (PASS_A_QUERIES + 36), 80, 3, PASS_A_QUERIES + 36
    q, items = _lattice(rng, nq, d), _lattice(rng, n, d)
    pools = _pools(rng, nq, n)
    exclude = _random_groups(rng, nq, n, 6)
    src = _SplitsOverThreads(DenseSource(q, items), q_block)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = score_stream(src, pools, exclude, k=4, q_block=q_block, c_chunk=32, progress=False,
                           no_exclude_pools=("self",))
        assert torch.get_num_threads() == 2  # restored after each pass A
    finally:
        torch.set_num_threads(before)
    ref, _ = brute_stats(q @ items.T, pools, exclude, {"self"}, 4)
    for p in pools:
        for f, v in ref[p].items():
            np.testing.assert_array_equal(res.stats[p][f], v, err_msg=f"{p}/{f}")
    assert sum(1 for _, tile, _ in src.calls if tile) == 2 * 3  # streamed once
    pass_a = [(rows, threads) for rows, tile, threads in src.calls if not tile][3:]  # after the probe's three
    assert sorted(set(pass_a)) == [(36, 1), (PASS_A_QUERIES, 1)]  # sub-blocks, on one thread


class _CountingDense(DenseSource):
    """A dense source that records the (query rows, corpus rows) of every pass-A call, gathered or sliced; with
    ``gathers=False`` it scores slices of queries only (`ScoreSource.scores_rows` -> None); with ``wobbly`` its
    gathered calls round differently in the last bit."""

    def __init__(self, *a, gathers=True, wobbly=False, **kw):
        super().__init__(*a, **kw)
        self.gathers, self.wobbly, self.pass_a = gathers, wobbly, []

    def scores(self, q, items):
        if not isinstance(items, slice):
            self.pass_a.append((q.stop - q.start, len(items)))
        return super().scores(q, items)

    def scores_rows(self, queries, items):
        if not self.gathers:
            return None
        self.pass_a.append((len(queries), len(items)))
        s = super().scores_rows(queries, items)
        return np.nextafter(s, np.float32(np.inf)) if self.wobbly else s


def _shared_state_pools(rng, nq, n, n_states):
    """Queries whose main pool is every corpus row of their target state (states of many rows, neighbouring queries
    in different states), as in the synthetic benchmark's ``sim-exact`` pool; plus small random pools."""
    state_of_row = rng.integers(0, n_states, n)
    target = rng.permutation(np.arange(nq) % n_states)
    state_rows = [np.flatnonzero(state_of_row == s) for s in range(n_states)]
    pools = _pools(rng, nq, n)
    pools["state"] = [state_rows[t] for t in target]
    return pools


@pytest.mark.parametrize("wobbly", [False, True])
def test_pass_a_groups_queries_that_share_positives(wobbly):
    """Pass A of a source that scores query rows in any order gathers queries with the same large pool into one
    sub-block (`eval.scoring.block.PassAPlan.grouped`): the same exact counts for fewer scored (query, row) pairs
    than sub-blocks of consecutive queries. A source whose gathered calls round differently is called in slices."""
    from eval.scoring.block import PASS_A_QUERIES

    rng = np.random.default_rng(11)
    nq, n, d, n_states = 4 * PASS_A_QUERIES, 3000, 3, 8
    q, items = _lattice(rng, nq, d), _lattice(rng, n, d)
    pools = _shared_state_pools(rng, nq, n, n_states)
    exclude = _random_groups(rng, nq, n, 6)
    ref, _ = brute_stats(q @ items.T, pools, exclude, {"self"}, 4)
    work = {}
    for gathers in (True, False):
        src = _CountingDense(q, items, gathers=gathers, wobbly=wobbly)
        res = score_stream(src, pools, exclude, k=4, q_block=nq, c_chunk=10_000, progress=False,
                           no_exclude_pools=("self",))
        for pool in pools:
            for f, v in ref[pool].items():
                np.testing.assert_array_equal(res.stats[pool][f], v, err_msg=f"{pool}/{f} (gathers={gathers})")
        work[gathers] = sum(rows * cols for rows, cols in src.pass_a[3 if gathers else 2:])  # after the probe
    if wobbly:
        assert work[True] == work[False]  # gathered calls disagree with the tiles: pass A keeps its slices
    else:
        assert work[True] < 0.5 * work[False]


def test_unstable_or_nan_sources_are_errors():
    rng = np.random.default_rng(9)

    class Noisy:
        n_queries, n_items = 4, 50

        def scores(self, q, items):
            return rng.random((q.stop - q.start, len(np.arange(self.n_items)[items]))).astype(np.float32)

    pools = {"a": [np.array([1, 2])] * 4}
    with pytest.raises(RuntimeError, match="not deterministic"):
        score_stream(Noisy(), pools, None, k=3, progress=False)

    class WithNaN(Noisy):
        def scores(self, q, items):
            s = np.zeros((q.stop - q.start, len(np.arange(self.n_items)[items])), np.float32)
            s[:, -1] = np.nan
            return s

    with pytest.raises(ValueError, match="NaN"):
        score_stream(WithNaN(), pools, None, k=3, progress=False)


def test_checkpoint_resumes_finished_blocks(tmp_path):
    rng = np.random.default_rng(10)
    nq, n, d = 20, 70, 3
    inner = DenseSource(_lattice(rng, nq, d), _lattice(rng, n, d))
    calls = []

    class Counted:
        n_queries, n_items = nq, n

        def scores(self, q, items):
            calls.append(q.start)
            return inner.scores(q, items)

    pools = _pools(rng, nq, n)
    kw = dict(k=4, q_block=8, c_chunk=32, progress=False, no_exclude_pools=("self",), checkpoint=tmp_path / "ck",
              fingerprint="m1", checkpoint_every_s=0)
    first = score_stream(Counted(), pools, None, **kw)
    assert sorted(p.name for p in (tmp_path / "ck").glob("block_*.npz")) == [
        "block_00000000_00000008.npz", "block_00000008_00000016.npz", "block_00000016_00000020.npz"]
    calls.clear()
    (tmp_path / "ck" / "block_00000008_00000016.npz").unlink()  # as if the job died in the second block
    again = score_stream(Counted(), pools, None, **kw)
    assert set(calls) == {8}  # only the missing block was scored again
    np.testing.assert_array_equal(again.topk_rows, first.topk_rows)
    for p in pools:
        for f, v in first.stats[p].items():
            np.testing.assert_array_equal(again.stats[p][f], v)
    np.testing.assert_array_equal(again.ranked.mask, first.ranked.mask)
    with pytest.raises(ValueError, match="fingerprint"):
        score_stream(Counted(), pools, None, **{**kw, "fingerprint": "m2"})


def test_checkpoint_saves_start_after_the_interval_and_take_every_unsaved_block(tmp_path, monkeypatch):
    import eval.scoring.streaming as S

    rng = np.random.default_rng(11)
    nq, n = 20, 70
    src = DenseSource(_lattice(rng, nq, 3), _lattice(rng, n, 3))
    pools = _pools(rng, nq, n)
    kw = dict(k=4, q_block=8, c_chunk=32, progress=False, no_exclude_pools=("self",), fingerprint="m1")
    # a job shorter than the interval writes its meta only
    short = score_stream(src, pools, None, checkpoint=tmp_path / "a", **kw)
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["meta.json"]
    # a clock that moves 10 s per block: with a 15 s interval the second block saves the first two, the third
    # waits (it would go with the next save)
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(S.time, "monotonic", lambda: float(next(clock)))
    again = score_stream(src, pools, None, checkpoint=tmp_path / "b", checkpoint_every_s=15, **kw)
    assert sorted(p.name for p in (tmp_path / "b").glob("block_*.npz")) == [
        "block_00000000_00000008.npz", "block_00000008_00000016.npz"]
    np.testing.assert_array_equal(again.topk_rows, short.topk_rows)


def test_missed_queries_are_misses_whatever_the_source(synth_bench, tmp_path):
    """A query flagged as missed (no usable forecast) scores 0 on every recall, even under the true-state oracle,
    and the flag survives a write/read round trip; the other queries are untouched."""
    from eval.metrics import per_query_metrics
    from eval.scoring import score_benchmark

    bench = synth_bench
    rows, oracle, _ = oracle_and_pixels(bench)
    missed = np.zeros(len(rows), bool)
    missed[::3] = True
    plain = score_benchmark(bench, oracle, rows, method="oracle", k=8, progress=False)
    run = score_benchmark(bench, oracle, rows, method="oracle", k=8, progress=False, missed=missed)
    back = read_run(write_run(tmp_path / "r.parquet", run))
    np.testing.assert_array_equal(back.missed, missed)
    for pool in ("type2-all", "type1-all", "in_video"):
        got, ref = per_query_metrics(back, pool), per_query_metrics(plain, pool)
        valid = back.stats[pool]["n_pos"] > 0
        assert (got["R@50"][missed & valid] == 0).all() and (got["RR"][missed & valid] < 0.05).all()
        np.testing.assert_array_equal(got["R@5"][~missed], ref["R@5"][~missed])
    ref = per_query_metrics(plain, "type2-all")
    assert ref["R@50"][missed].mean() > 0.9  # the oracle would have hit them
    assert all(x == "" for i in np.flatnonzero(missed) for x in back.topk_ids[i])
    assert (per_query_metrics(back, "type2-all", ndcg_k=5)["nDCG@5"][missed] == 0).all()


class _Fixed:
    """A source with a fixed score matrix (n_queries x n_items)."""

    def __init__(self, full, name=""):
        self.full = np.asarray(full, np.float32)
        self.n_queries, self.n_items = self.full.shape
        if name:
            self.name = name

    def scores(self, q, items):
        return self.full[q][:, items]


@pytest.mark.parametrize("positive,negative", [(-np.inf, 0.0), (np.inf, 0.0), (1.0, np.inf), (1.0, -np.inf),
                                               (1.0, np.nan), (np.nan, 0.0)])
def test_non_finite_scores_are_refused_naming_source_query_and_item(positive, negative):
    """The issue's cases: a -inf only positive among four 0 negatives gave R@1 = 1.0, a +inf positive a negative tie
    count; any non-finite score, positive or negative, must stop the scorer with a message naming where it is."""
    full = np.zeros((3, 5), np.float32)
    full[1, 0] = positive
    full[1, 3] = negative
    pools = {"main": [np.array([0])] * 3}
    with pytest.raises(InputError) as e:
        score_stream(_Fixed(full, "m3-bge"), pools, None, k=2, progress=False, c_chunk=2,
                     query_ids=["qa", "qb", "qc"], item_ids=[f"seg{j}" for j in range(5)])
    msg = str(e.value)
    bad_item = 0 if not np.isfinite(positive) else 3
    assert "score source m3-bge" in msg and "query 'qb'" in msg and f"'seg{bad_item}'" in msg, msg
    assert "must be finite" in msg


def test_non_finite_fusion_input_is_named():
    rng = np.random.default_rng(11)
    good = _Fixed(rng.random((4, 30)), "bge")
    full = rng.random((4, 30)).astype(np.float32)
    full[2, 7] = np.inf
    fused = FusionSource([good, _Fixed(full, "dinov2")])
    with pytest.raises(InputError, match=r"fusion input 1 \(dinov2\)"):
        score_stream(fused, {"p": [np.array([1])] * 4}, None, k=3, progress=False)


def test_end_to_end_inf_query_vector_is_refused(synth_bench):
    """A method whose query vector holds inf (e.g. a zero vector divided by its norm) never reaches a run file."""
    from eval.scoring import score_benchmark

    rows, _, pixels = oracle_and_pixels(synth_bench)
    q = np.asarray(pixels._q.numpy()).copy()
    q[5, 0, 0] = np.inf
    bad = DenseSource(q, pixels._items_np)
    with pytest.raises(InputError, match=rf"'persistence' \(DenseSource\) gave query {synth_bench.query_ids[rows[5]]!r}"):
        score_benchmark(synth_bench, bad, rows, method="persistence", progress=False)


def test_constant_fusion_input_gets_weight_zero_or_is_refused():
    """A constant source's spread computed as ~2e-3 from float error once gave it a weight of 10^4; its spread is
    now exactly 0 (closed form and streamed), it gets weight 0 where constant, and is refused where always constant."""
    rng = np.random.default_rng(12)
    d, m = 16, 500
    items = np.tile(rng.standard_normal(d).astype(np.float32) * 7, (m, 1))  # every item the same vector
    q = rng.standard_normal((6, d)).astype(np.float32)
    const = DenseSource(q, items, moments="closed")
    mean, std = const.moments(slice(0, 6))
    assert (std == 0).all() and np.allclose(mean, q.astype(np.float64) @ items[0].astype(np.float64), rtol=1e-6)
    m2, s2 = stream_moments(const, slice(0, 6), c_chunk=37)
    # streamed, the scores of equal items are equal only as far as the matmul kernel computes equal columns alike
    # (not so on every CPU / BLAS code path: 1 ulp apart seen): what counts is that the spread is read as constant
    assert (s2 <= SPREAD_RTOL * np.sqrt(m2**2 + s2**2)).all(), s2
    varied = DenseSource(q, rng.standard_normal((m, d)).astype(np.float32))
    with pytest.raises(InputError, match=r"fusion input 1 \(const\) gives every query constant scores"):
        FusionSource([varied, const], names=["varied", "const"]).coefficients()
    # constant for some queries only (a zero query vector, e.g. a missed forecast): weight 0 there, and the fused
    # scores of those queries are the other source's z-scores
    items2 = rng.standard_normal((m, d)).astype(np.float32)
    q2 = q.copy()
    q2[[1, 4]] = 0
    part = DenseSource(q2, items2)
    fused = FusionSource([varied, part])
    a, _ = fused.coefficients()
    assert (a[1, [1, 4]] == 0).all() and (a[1, [0, 2, 3, 5]] > 0).all() and fused.constant[1].sum() == 2
    z = fused.scores(slice(0, 6), slice(0, m))
    v = varied.scores(slice(0, 6), slice(0, m)).astype(np.float64)
    np.testing.assert_allclose(z[1], (v[1] - v[1].mean()) / v[1].std(), rtol=1e-4, atol=1e-4)
    assert np.abs(a).max() < 1e3  # nothing like the 8,000-20,000 weights of a mis-measured spread


def test_dense_moments_take_the_cheaper_of_closed_form_and_stream():
    """``moments="auto"``: the closed form (a d x d product over the items) for one vector per query when d <= n_q
    or for a state space; a stream (one pass of the queries, the fusion's own score arrays) otherwise; both agree."""
    rng = np.random.default_rng(5)
    items = rng.standard_normal((300, 16)).astype(np.float32)
    few, many = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((20, 16)).astype(np.float32)
    assert DenseSource(few, items).streams_moments() and not DenseSource(many, items).streams_moments()
    assert not DenseSource(few, items[:9], item_rows=rng.integers(0, 9, 300)).streams_moments()
    assert DenseSource(rng.standard_normal((20, 3, 16)).astype(np.float32), items).streams_moments()
    assert not DenseSource(few, items, moments="closed").streams_moments()
    assert DenseSource(many, items, moments="stream").streams_moments()
    with pytest.raises(InputError, match="one vector per query"):
        DenseSource(rng.standard_normal((4, 3, 16)).astype(np.float32), items, moments="closed")
    full = few.astype(np.float64) @ items.T.astype(np.float64)
    for how in ("auto", "closed", "stream"):
        mean, std = DenseSource(few, items, moments=how).moments(slice(0, 6))
        np.testing.assert_allclose(mean, full.mean(1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(std, full.std(1), rtol=1e-5)
    assert needs_full_scores(DenseSource(few, items)) and not needs_full_scores(DenseSource(many, items))


def test_gt_definitions_present_counts_every_chunk_of_a_list_column():
    """A definition is scored when its fields exist and some query's list is non-empty, wherever in the column's
    chunks that query lies; a field the table lacks leaves the definition out."""
    from types import SimpleNamespace

    import pyarrow as pa

    from eval.scoring.benchmark import gt_definitions_present

    pools = pa.struct([("in_dataset", pa.list_(pa.string())), ("cross_dataset", pa.list_(pa.string())),
                       ("consensus", pa.list_(pa.string()))])
    ids = pa.list_(pa.string())

    def bench(consensus_last: list[str], sim_last: list[str], with_type1: bool = True):
        rows = [{"gt_pools": {"in_dataset": ["a"], "cross_dataset": [], "consensus": []}, "gt_type1": [],
                 "gt_sim_exact": []}] * 2
        last = {"gt_pools": {"in_dataset": [], "cross_dataset": ["b"], "consensus": consensus_last},
                "gt_type1": ["c"], "gt_sim_exact": sim_last}
        schema = pa.schema([("gt_pools", pools), ("gt_type1", ids), ("gt_sim_exact", ids)])
        chunks = [pa.Table.from_pylist(rows, schema), pa.Table.from_pylist([last], schema)]
        table = pa.concat_tables(chunks)
        if not with_type1:
            table = table.drop_columns(["gt_type1"])
        assert table.column("gt_pools").num_chunks == 2
        return SimpleNamespace(queries_ds=SimpleNamespace(data=SimpleNamespace(table=table)))

    assert gt_definitions_present(bench(["x"], ["y"])) == ["type2-all", "type2-consensus", "type1-all", "sim-exact"]
    assert gt_definitions_present(bench([], [])) == ["type2-all", "type1-all"]
    assert gt_definitions_present(bench(["x"], [], with_type1=False)) == ["type2-all", "type2-consensus"]
