"""The score-source interface: the `ScoreSource` base, foreign objects adapted where they enter, fusion inputs."""

from __future__ import annotations

import numpy as np
import pytest

from eval.scoring import (
    DenseSource,
    FusionSource,
    ScoreSource,
    as_score_source,
    score_stream,
    source_name,
    stream_moments,
)
from eval.scoring.sources import aligned_empty, tile_buffer


class Matrix(ScoreSource):
    """A subclass implementing only what the base requires."""

    def __init__(self, full):
        self.full = np.asarray(full, np.float32)
        self.n_queries, self.n_items = self.full.shape

    def scores(self, q, items):
        return self.full[q][:, items]


def test_a_subclass_needs_only_scores():
    rng = np.random.default_rng(0)
    full = rng.integers(-3, 4, size=(5, 40)).astype(np.float32)
    src = Matrix(full)
    assert src.label == "Matrix" and source_name(src) == "Matrix" and not src.cached_blocks
    mean, std = src.moments(slice(1, 4), c_chunk=7)  # the default: streamed
    np.testing.assert_allclose(mean, full[1:4].astype(np.float64).mean(1), rtol=1e-12)
    np.testing.assert_allclose(std, full[1:4].astype(np.float64).std(1), rtol=1e-12)
    res = score_stream(src, {"p": [np.array([i]) for i in range(5)]}, None, k=3, c_chunk=16, progress=False)
    assert (res.stats["p"]["n_above"] == [(full[i] > full[i, i]).sum() for i in range(5)]).all()
    src.name = "mine"
    assert source_name(src) == "mine"
    with pytest.raises(TypeError):
        ScoreSource()  # abstract: scores is required


def test_foreign_objects_are_adapted_or_refused():
    class Foreign:
        n_queries, n_items, name = 2, 6, "foreign"

        def scores(self, q, items):
            return np.arange(12, dtype=np.float32).reshape(2, 6)[q][:, items]

        def moments(self, q):
            raise NotImplementedError  # "no closed form": streamed instead

    src = as_score_source(Foreign())
    assert isinstance(src, ScoreSource) and src.label == "foreign" and as_score_source(src) is src
    np.testing.assert_allclose(src.moments(slice(0, 2))[0], stream_moments(Foreign(), slice(0, 2))[0])

    class NoScores:
        n_queries, n_items = 2, 6

    with pytest.raises(TypeError, match="NoScores is not a score source: it has no scores"):
        score_stream(NoScores(), {}, None, progress=False)


def test_dense_moments_with_samples_are_streamed():
    rng = np.random.default_rng(1)
    src = DenseSource(rng.standard_normal((4, 3, 8)).astype(np.float32), rng.standard_normal((50, 8)).astype(np.float32))
    np.testing.assert_array_equal(src.moments(slice(0, 4), c_chunk=9)[1], stream_moments(src, slice(0, 4), 9)[1])


def test_fusion_never_writes_to_an_input_array():
    """An input may return a view of its own score matrix; fusing must leave that matrix as it was."""
    rng = np.random.default_rng(2)
    a, b = Matrix(rng.random((3, 30))), Matrix(rng.random((3, 30)))
    before = a.full.copy(), b.full.copy()
    fused = FusionSource([a, b]).scores(slice(0, 3), slice(0, 30))
    assert np.array_equal(a.full, before[0]) and np.array_equal(b.full, before[1])
    z = [(m - m.mean(1, keepdims=True)) / m.std(1, keepdims=True) for m in before]
    np.testing.assert_allclose(fused, z[0] + z[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("K, reduce", [(1, "max"), (3, "max"), (3, "mean")])
def test_dense_scores_into_writes_the_scores_into_the_callers_buffer(K, reduce):
    """`ScoreSource.scores_into`: the same bytes as `scores`, written into the caller's buffer (no new tile)."""
    rng = np.random.default_rng(K)
    src = DenseSource(rng.standard_normal((70, K, 16), dtype=np.float32), rng.standard_normal((500, 16),
                                                                                             dtype=np.float32),
                      reduce=reduce)
    buf = np.full(64 * 200, np.nan, np.float32)
    for q, items in ((slice(0, 64), slice(0, 200)), (slice(64, 70), slice(200, 500, 1)), (slice(3, 9), slice(450, 500))):
        nq, ni = len(range(*q.indices(70))), len(range(*items.indices(500)))
        out = buf[:nq * ni].reshape(nq, ni) if nq * ni <= buf.size else np.empty((nq, ni), np.float32)
        got = src.scores_into(q, items, out)
        assert got is out
        assert got.tobytes() == src.scores(q, items).tobytes()


def test_scores_into_refuses_a_buffer_it_cannot_fill_and_a_state_space_returns_its_own():
    rng = np.random.default_rng(1)
    q, items = rng.standard_normal((6, 8), dtype=np.float32), rng.standard_normal((40, 8), dtype=np.float32)
    src = DenseSource(q, items)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        src.scores_into(slice(0, 6), slice(0, 20), np.empty((6, 40), np.float32)[:, :20])
    with pytest.raises(ValueError, match="shape"):
        src.scores_into(slice(0, 6), slice(0, 20), np.empty((6, 21), np.float32))
    states = DenseSource(q, items[:5], item_rows=np.arange(40) % 5)
    out = np.empty((6, 20), np.float32)
    got = states.scores_into(slice(0, 6), slice(0, 20), out)
    assert got is not out and got.tobytes() == states.scores(slice(0, 6), slice(0, 20)).tobytes()


class Buffered(Matrix):
    """`Matrix` writing its tiles into the scorer's buffer, recording the buffer's address."""

    def __init__(self, full):
        super().__init__(full)
        self.addresses = []

    def scores_into(self, q, items, out):
        out[...] = self.full[q][:, items]
        self.addresses.append(out.__array_interface__["data"][0])
        return out


def test_new_tiles_are_64_byte_aligned_and_reused_tiles_keep_their_memory():
    """numpy aligns a new array to 16 bytes; BLAS writes a product into a tile 16 bytes off a 32-byte boundary
    slower (`scripts/bench_scoring.py`'s misaligned column), so the scorer's tiles come from `aligned_empty`."""
    for shape in ((1, 1), (3, 5), (512, 16384), (7, 1000)):
        a = aligned_empty(shape)
        assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % 64 == 0
        a[...] = 1.0  # every element is addressable
        t = tile_buffer(*shape)
        assert t.ctypes.data % 64 == 0 and t.shape == shape
        smaller = tile_buffer(max(shape[0] - 1, 1), shape[1], t)
        assert smaller.ctypes.data == t.ctypes.data and smaller.flags.c_contiguous
    buffered = Buffered(np.arange(12 * 250, dtype=np.float32).reshape(12, 250))
    score_stream(buffered, {"p": [np.array([i]) for i in range(12)]}, None, k=3, q_block=12, c_chunk=64,
                 progress=False)
    assert buffered.addresses and all(a % 64 == 0 for a in buffered.addresses)


def test_the_scorer_streams_every_tile_of_a_block_through_one_buffer():
    rng = np.random.default_rng(2)
    full = rng.integers(-4, 5, size=(12, 250)).astype(np.float32)
    pools = {"p": [rng.choice(250, size=3, replace=False) for _ in range(12)]}
    exclude = [np.arange(i, i + 4) for i in range(12)]
    buffered = Buffered(full)
    a = score_stream(buffered, pools, exclude, k=7, q_block=12, c_chunk=64, progress=False)
    b = score_stream(Matrix(full), pools, exclude, k=7, q_block=12, c_chunk=64, progress=False)
    assert len(buffered.addresses) == 4 and len(set(buffered.addresses)) == 1  # 4 tiles of 64, 64, 64, 58 items
    assert a.topk_rows.tobytes() == b.topk_rows.tobytes() and a.topk_scores.tobytes() == b.topk_scores.tobytes()
    for field, v in a.stats["p"].items():
        assert v.tobytes() == b.stats["p"][field].tobytes(), field
