"""The one-pass z-score fusion (`eval.scoring.FusionSource`) against the two-pass fusion it replaced: the same
runs, bit for bit, on the session's synthetic benchmark, with each input's corpus scored once instead of twice."""

from __future__ import annotations

import numpy as np
import pytest
from eval_sources import Counting, TwoPassFusion, oracle_and_pixels

from eval.runs import write_run
from eval.scoring import DenseSource, FusionSource, score_benchmark
from eval.scoring.fusion import needs_full_scores

RUN_ARRAYS = ("topk_scores", "kth_tie_unlisted")


def _inputs(bench):
    """Fair test rows and four inputs: the true-state oracle (state space, closed form), persistence in pixels (8
    prefix tokens by max: full scores needed), a mean over 2 samples in pixels and a plain one-vector pixels source
    (closed form)."""
    rows, oracle, pixels = oracle_and_pixels(bench)
    q = pixels._q.numpy()
    items = pixels._items_np
    mean = DenseSource(q[:, :2], items, reduce="mean")
    last = DenseSource(q[:, -1], items)
    return rows, {"oracle": oracle, "persistence": pixels, "mean": mean, "last": last}


def _same_runs(a, b, tmp_path) -> None:
    assert a.topk_ids == b.topk_ids
    for name in RUN_ARRAYS:
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    for pool, fields in a.stats.items():
        for field, v in fields.items():
            assert v.tobytes() == b.stats[pool][field].tobytes(), (pool, field)
    assert write_run(tmp_path / "a.parquet", a).read_bytes() == write_run(tmp_path / "b.parquet", b).read_bytes()


@pytest.mark.parametrize("names, grid", [
    (("persistence", "oracle"), dict(q_block=64, c_chunk=512)),  # the scorer's grid = the fusion's: all cached
    (("persistence", "mean", "last", "oracle"), dict(q_block=50, c_chunk=700)),
    (("oracle", "last"), dict(q_block=64, c_chunk=512)),  # closed forms only: nothing to cache
], ids=["lftr-like", "four-inputs", "closed-forms"])
def test_one_pass_fusion_equals_the_two_pass_fusion(synth_bench, tmp_path, names, grid):
    rows, inputs = _inputs(synth_bench)
    sources = [inputs[n] for n in names]
    weights = [1.0, 0.5, 2.0, 1.0][:len(names)]
    got = score_benchmark(synth_bench, FusionSource(sources, weights, **grid), rows, method="f", progress=False,
                          **grid)
    want = score_benchmark(synth_bench, TwoPassFusion(sources, weights, **grid), rows, method="f", progress=False,
                           **grid)
    _same_runs(got, want, tmp_path)


def test_each_input_is_scored_once_and_on_another_grid_still_right(synth_bench, tmp_path):
    """On the fusion's own grid an input without a closed form is scored once over the corpus (the two-pass fusion:
    twice, plus its positives); on another grid of the scorer the results are still the two-pass ones."""
    rows, inputs = _inputs(synth_bench)
    n = len(rows) * len(synth_bench.corpus_ids)
    grid = dict(q_block=64, c_chunk=512)
    seen = {}
    for kind, cls in (("one", FusionSource), ("two", TwoPassFusion)):
        pix = Counting(inputs["persistence"])
        assert needs_full_scores(pix)
        run = score_benchmark(synth_bench, cls([pix, inputs["oracle"]], **grid), rows, method="f", progress=False,
                              **grid)
        seen[kind] = (pix.tiles, pix.gathers, run)
    assert seen["one"][:2] == (n, 0)
    assert seen["two"][0] == 2 * n and seen["two"][1] > 0
    _same_runs(seen["one"][2], seen["two"][2], tmp_path)
    other = score_benchmark(synth_bench, FusionSource([inputs["persistence"], inputs["oracle"]], q_block=48,
                                                      c_chunk=300), rows, method="f", progress=False, **grid)
    want = score_benchmark(synth_bench, TwoPassFusion([inputs["persistence"], inputs["oracle"]], q_block=48,
                                                      c_chunk=300), rows, method="f", progress=False, **grid)
    _same_runs(other, want, tmp_path)


def test_coefficients_of_every_query_match_the_two_pass_ones(synth_bench):
    rows, inputs = _inputs(synth_bench)
    sources = [inputs["persistence"], inputs["mean"], inputs["oracle"]]
    a1, b1 = FusionSource(sources, [1.0, 0.3, 2.0], q_block=40, c_chunk=999).coefficients()
    a2, b2 = TwoPassFusion(sources, [1.0, 0.3, 2.0], q_block=40, c_chunk=999).coefficients()
    assert a1.tobytes() == a2.tobytes() and b1.tobytes() == b2.tobytes()
    assert np.isfinite(a1).all() and (a1 > 0).all()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_combine_kernel_is_numpys_float32_arithmetic_bit_for_bit(n):
    from eval.scoring.fusion import combine

    rng = np.random.default_rng(n)
    scores = [rng.standard_normal((37, 1001), dtype=np.float32) * 10 ** k for k in range(n)]
    a = (rng.random((n, 37)) * 3).astype(np.float32)
    a[0, 5] = 0.0  # an input constant for that query
    b = rng.standard_normal(37).astype(np.float32)
    want = None
    for s, ak in zip(scores, a, strict=True):
        t = np.multiply(s, ak[:, None])
        want = t if want is None else np.add(want, t, out=want)
    want -= b[:, None]
    before = [s.copy() for s in scores]
    got = combine(scores, a, b)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert all(np.array_equal(s, s0) for s, s0 in zip(scores, before, strict=True))  # inputs are never written to
    for scratch in range(n):  # an input the caller discards may hold the result; no other is written to
        inputs = [s.copy() for s in before]
        got = combine(inputs, a, b, scratch)
        assert got.tobytes() == want.tobytes(), scratch
        assert all(np.array_equal(s, s0) for k, (s, s0) in enumerate(zip(inputs, before, strict=True))
                   if k != scratch and s is not got)
    # float64 or Fortran-ordered blocks (a duck-typed source) take numpy's path, with numpy's promotion
    mixed = [s.astype(np.float64) if k == 0 else np.asfortranarray(s) for k, s in enumerate(scores)]
    assert np.allclose(combine(mixed, a, b), want, rtol=1e-5, atol=1e-3 * 10 ** (n - 1))


def test_combine_refuses_blocks_of_different_shapes():
    from eval.errors import InputError
    from eval.scoring.fusion import combine

    with pytest.raises(InputError, match="different shapes"):
        combine([np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)], np.ones((2, 2), np.float32),
                np.zeros(2, np.float32))


class _Views:
    """A duck-typed source that returns views of the score matrix it keeps."""

    def __init__(self, S):
        self.S, self.n_queries, self.n_items = S, S.shape[0], S.shape[1]

    def scores(self, q, items):
        return self.S[q, items] if isinstance(items, slice) else self.S[q][:, items]


def test_fusion_writes_its_result_only_into_arrays_nobody_else_holds():
    """A fused tile may take the place of a fresh input tile (`ScoreSource.fresh_arrays`), never of a view of a
    source's kept scores; the fused tiles are bitwise those of the two-pass reference either way. Calls on index
    arrays (the scorer's pass A) may gather a cached tile's scores where the reference computes a product with
    fewer columns, which a BLAS may round differently (measured: torch on an AVX2-only CPU at d = 8): there the
    two agree to float32 rounding, and the scorer compares pass A with the tiles itself (`PassAPlan`)."""
    rng = np.random.default_rng(3)
    S = rng.standard_normal((20, 300), dtype=np.float32)
    kept = S.copy()
    dense = DenseSource(rng.standard_normal((20, 8), dtype=np.float32), rng.standard_normal((300, 8), dtype=np.float32))
    dense2 = DenseSource(rng.standard_normal((20, 3, 8), dtype=np.float32),
                         rng.standard_normal((300, 8), dtype=np.float32))
    buf = np.empty(8 * 100, np.float32)
    for inputs in ([_Views(S), _Views(S * 2)], [_Views(S), dense], [dense, _Views(S)], [dense, dense2],
                   [dense, _Views(S), dense2]):
        one, two = FusionSource(inputs, q_block=8, c_chunk=100), TwoPassFusion(inputs, q_block=8, c_chunk=100)
        for q in (slice(0, 8), slice(8, 16), slice(16, 20)):
            for items in (slice(0, 100), slice(250, 300), np.array([3, 150, 299])):
                if not isinstance(items, slice):
                    assert np.allclose(one.scores(q, items), two.scores(q, items), rtol=1e-6, atol=1e-6)
                    continue
                want = two.scores(q, items).tobytes()
                assert one.scores(q, items).tobytes() == want
                # the scorer's path: tiles into its buffer, none allocated
                n = (q.stop - q.start) * (items.stop - items.start)
                assert one.scores_into(q, items, buf[:n].reshape(q.stop - q.start, -1)).tobytes() == want
        assert np.array_equal(S, kept)


def test_fusion_keeps_one_aligned_buffer_per_input_across_tiles():
    """The scorer's path writes the first input into the scorer's tile and each other input into a buffer the
    fusion keeps: allocated 64-byte aligned once, reused by every later tile that fits, replaced by a larger one."""
    rng = np.random.default_rng(4)
    inputs = [DenseSource(rng.standard_normal((16, 8), dtype=np.float32), rng.standard_normal((300, 8),
                                                                                          dtype=np.float32))
              for _ in range(3)]
    fused = FusionSource(inputs, q_block=8, c_chunk=100)
    out = np.empty((8, 100), np.float32)
    fused.scores_into(slice(0, 8), slice(0, 100), out)
    kept = dict(fused._buffers)
    assert sorted(kept) == [1, 2] and all(b.ctypes.data % 64 == 0 for b in kept.values())
    fused.scores_into(slice(0, 8), slice(100, 200), out)
    fused.scores_into(slice(0, 8), slice(250, 300), out[:, :50].copy())
    assert all(fused._buffers[k] is kept[k] for k in kept)  # smaller and equal tiles reuse the kept memory
    fused.scores_into(slice(0, 16), slice(0, 100), np.empty((16, 100), np.float32))
    assert all(fused._buffers[k] is not kept[k] and fused._buffers[k].size == 1600 for k in kept)
