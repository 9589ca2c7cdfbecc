"""The same seed builds the same benchmark on every machine (issue 22, item 7): the build's cosine decisions are made
on float64 embeddings rounded to a grid (`retrieval.canon.grid`), with exact dot products and documented tie rules.

Another machine is emulated in a subprocess by what differs between machines: the thread count and the kernels of
the BLAS / oneDNN / ATen paths (``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, ``DNNL_MAX_CPU_ISA``, ``OPENBLAS_CORETYPE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
#: One thread everywhere, and the defaults of this machine's kernels.
BASE = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
#: Two threads and other kernels: ATen's scalar code, MKL's compatible code path, oneDNN limited to SSE4.1,
#: OpenBLAS's Prescott kernels.
OTHER = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "default",
         "MKL_CBWR": "COMPATIBLE", "DNNL_MAX_CPU_ISA": "SSE41", "OPENBLAS_CORETYPE": "Prescott"}
PHRASES = ["rolling to the left", "rolling leftwards", "falling off the edge", "tumbling down", "resting on the shelf",
           "lying on the shelf", "sliding along the ramp", "gliding down the ramp", "spinning in place",
           "red ball rolling slowly", "red ball rolling fast", "the box tips over", "tipped over box"]


def _python(args: list[str], env: dict[str, str], timeout: float = 1200) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in {*BASE, *OTHER}}
    full.update(env, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full, cwd=REPO, timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def test_cosines_of_grid_rows_are_exact_in_any_summation_order():
    from retrieval.canon.cluster import exact_dots
    from retrieval.canon.grid import GRID, snap

    rng = np.random.default_rng(0)
    x = snap(rng.normal(size=(200, 384)))
    assert np.array_equal(np.round(x.astype(np.float64) / GRID), x.astype(np.float64) / GRID)  # on the grid
    assert np.abs(np.linalg.norm(x.astype(np.float64), axis=1) - 1).max() < 1e-4
    a, b = np.repeat(np.arange(200), 200), np.tile(np.arange(200), 200)
    exact = exact_dots(x, a, b).reshape(200, 200)
    x64 = x.astype(np.float64)
    assert np.array_equal(x64 @ x64.T, exact)  # a BLAS product (any blocking, any threads) is exact on the grid
    assert np.array_equal((x64[:, ::-1] @ x64[:, ::-1].T), exact)  # so is the reversed summation order
    assert np.array_equal(snap(np.vstack([x, x[:1]]))[-1], x[0])  # snapping grid rows changes nothing


def test_mining_orders_by_exact_cosine_then_by_row():
    from retrieval.canon.grid import snap
    from retrieval.canon.mining import _order

    rng = np.random.default_rng(1)
    base = snap(rng.normal(size=(3, 16)))
    seg_vec = np.vstack([base[0], base[1], base[2], base[1], base[0]])  # rows 1 and 3 (and 0 and 4) are equal
    order = _order(np.array([4, 3, 2, 1]), 0, seg_vec)
    sims = {int(r): float(seg_vec[r].astype(np.float64) @ seg_vec[0]) for r in (1, 2, 3, 4)}
    assert order[0] == 4  # the target's own phrasing first
    want = sorted([1, 2, 3], key=lambda r: (-sims[r], r))
    assert order[1:].tolist() == want and want.index(1) < want.index(3)  # an exact tie goes to the lower row


@pytest.mark.slow
def test_grid_embeddings_do_not_depend_on_threads_or_kernels(tmp_path):
    """float32 MiniLM embeddings change with the kernels (every row, on this machine); the grid embeddings do not."""
    script = ("import sys, numpy as np\n"
              "from retrieval.encoders import TextEncoder, PACKAGED_MINILM\n"
              "from retrieval.canon.grid import grid_embeddings\n"
              f"phrases = {PHRASES!r}\n"
              "enc = TextEncoder(PACKAGED_MINILM, device='cpu')\n"
              "np.save(sys.argv[1] + '-f32.npy', enc.encode_items(phrases))\n"
              "np.save(sys.argv[1] + '-grid.npy', grid_embeddings(enc, phrases))\n")
    for name, env in (("base", BASE), ("other", OTHER)):
        _python(["-c", script, str(tmp_path / name)], env)
    grid = [np.load(tmp_path / f"{n}-grid.npy") for n in ("base", "other")]
    f32 = [np.load(tmp_path / f"{n}-f32.npy") for n in ("base", "other")]
    assert grid[0].dtype == np.float32 and grid[0].shape == (len(PHRASES), 384)
    assert np.array_equal(grid[0], grid[1]), np.abs(grid[0] - grid[1]).max()
    # the grid is the float embedding up to its rounding (a cosine moves by ~1e-5)
    assert np.abs(grid[0] - f32[0]).max() <= 2 ** -17 + 1e-6


@pytest.mark.slow
def test_a_build_under_other_threads_and_kernels_has_the_same_fingerprint(tmp_path):
    """`python -m retrieval synth` twice, with 1 thread and this machine's kernels, then with 2 threads and other
    kernels: the same records (byte for byte) and the same build fingerprint on the card. The canonicalization
    encoder is given (`--no-tune-encoder`: the packaged MiniLM): its fine-tune is training, whose weights differ in
    their last bits across thread counts and kernels, so the default build is reproduced elsewhere by reusing its
    `OUT-encoder/` folder."""
    outs = {}
    for name, env in (("base", BASE), ("other", OTHER)):
        out = tmp_path / name / "psr-synth"
        _python(["-m", "retrieval", "synth", "--out", str(out), "--videos", "30", "--seed", "0", "--workers", "1",
                 "--no-tune-encoder"], env)
        res = _python(["-m", "eval", "card", str(out)], env)
        outs[name] = (out, [ln for ln in res.stdout.splitlines() if ln.startswith("Build fingerprint")])
    (a, fa), (b, fb) = outs["base"], outs["other"]
    for f in ("states.jsonl", "corpus.jsonl", "queries.jsonl", "phrase_map.jsonl"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert fa and fa == fb


class _Counting:
    """An encoder without a sentence-transformers model (`grid_embeddings` snaps its output): counts its calls."""

    batch_size = 4

    def __init__(self):
        self.calls = 0

    def encode_items(self, texts, progress=False):
        self.calls += 1
        return np.array([[len(t), t.count("o") + 1.0, 1.0] for t in texts], np.float64)


def test_a_list_embedded_once_is_read_back_exactly_and_a_damaged_entry_is_computed_again(tmp_path):
    from retrieval.canon.grid import cached_grid_embeddings, grid_embeddings

    enc, cache = _Counting(), tmp_path / "cache"
    first, key = cached_grid_embeddings(enc, PHRASES, "some-model", cache)
    again, key2 = cached_grid_embeddings(enc, PHRASES, "some-model", cache)
    assert enc.calls == 1 and key2 == key and (cache / f"{key}.npy").is_file()
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(first, grid_embeddings(_Counting(), PHRASES))
    # another list, order or model is another entry
    for texts, model in ((PHRASES[:-1], "some-model"), (PHRASES[::-1], "some-model"), (PHRASES, "other-model")):
        assert cached_grid_embeddings(enc, texts, model, cache)[1] != key
    assert enc.calls == 4
    (cache / f"{key}.npy").write_bytes(b"not an array")
    np.testing.assert_array_equal(cached_grid_embeddings(enc, PHRASES, "some-model", cache)[0], first)
    assert enc.calls == 5
    np.testing.assert_array_equal(np.load(cache / f"{key}.npy"), first)  # replaced by the computed entry
    assert cached_grid_embeddings(enc, PHRASES, "some-model", None)[0].shape == first.shape and enc.calls == 6
