"""The scorer against results recorded from an earlier version of it: any change of behaviour fails here.

``data/scoring_reference/results.npz`` holds every array that `score_stream` returned on five fixed random problems
(exact ties, own-video exclusion, an unexcluded pool, probes, several query blocks and corpus chunks, a state-space
expansion, K samples by max and by mean, a z-score fusion with a plain duck-typed input, the random baseline, a
corpus shorter than k). ``data/scoring_reference/checkpoint/`` is the checkpoint that version wrote for problem
``lattice``. Scores are exact by construction (small-integer vectors, counter-based random numbers, streamed fusion
moments), so the recorded values do not depend on the BLAS or the thread count.

Regenerate (only after a deliberate change of the scorer's results, saying so in the commit)::

    python tests/eval/test_scoring_reference.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from eval.runs import RankedPositives, Run, write_run
from eval.scoring import DenseSource, FusionSource, RandomSource, score_stream

DATA = Path(__file__).parent / "data" / "scoring_reference"
RANKED_FIELDS = ("top_offsets", "mask", "above", "tie", "count_offsets", "pos_mask", "pos_count")


def _lattice(rng, *shape):
    return rng.integers(-2, 3, size=shape).astype(np.float32)


def _groups(rng, nq, n, max_size, empty_rate=0.15):
    return [rng.choice(n, size=0 if rng.random() < empty_rate else int(rng.integers(1, max_size + 1)),
                       replace=False).astype(np.int64) for _ in range(nq)]


class _Matrix:
    """A duck-typed source (no `eval.scoring.ScoreSource` base, no moments) over a fixed score matrix."""

    def __init__(self, full, name):
        self.full, self.name = np.asarray(full, np.float32), name
        self.n_queries, self.n_items = self.full.shape

    def scores(self, q, items):
        return self.full[q][:, items].copy()


def problems() -> dict[str, tuple]:
    """name -> (source, pools, exclude, keyword arguments of `score_stream`)."""
    out = {}
    rng = np.random.default_rng(2024)
    nq, n = 37, 211
    pools = {"a": _groups(rng, nq, n, 6), "b": _groups(rng, nq, n, 2), "self": _groups(rng, nq, n, 3)}
    exclude = _groups(rng, nq, n, 12, empty_rate=0.2)
    pools["a"][0] = np.concatenate([pools["a"][0], exclude[1][:2]])  # positives inside the excluded rows
    out["lattice"] = (DenseSource(_lattice(rng, nq, 5), _lattice(rng, n, 5)), pools, exclude,
                      dict(k=9, q_block=8, c_chunk=50, no_exclude_pools=("self",),
                           probes={"pr": _groups(rng, nq, n, 4)}))
    nq, n, m = 29, 300, 23
    expanded = DenseSource(_lattice(rng, nq, 3, 4), _lattice(rng, m, 4), item_rows=rng.integers(0, m, n))
    out["expanded_max"] = (expanded, {"a": _groups(rng, nq, n, 20), "in_video": _groups(rng, nq, n, 3)},
                           _groups(rng, nq, n, 30), dict(k=12, q_block=10, c_chunk=64))
    mean = DenseSource(_lattice(rng, nq, 2, 4), _lattice(rng, n, 4), reduce="mean")
    plain = _Matrix(rng.integers(-40, 41, size=(nq, n)), "matrix")
    fused = FusionSource([mean, plain], weights=[1.0, 0.5], c_chunk=70, q_block=11)
    out["fusion"] = (fused, {"a": _groups(rng, nq, n, 8), "b": _groups(rng, nq, n, 8)}, _groups(rng, nq, n, 15),
                     dict(k=7, q_block=16, c_chunk=128, probes={"pr": _groups(rng, nq, n, 5)}))
    nq, n = 40, 500
    out["random"] = (RandomSource(nq, n, seed=3), {"a": _groups(rng, nq, n, 10), "empty": [np.zeros(0, np.int64)] * nq},
                     _groups(rng, nq, n, 20), dict(k=20, q_block=64, c_chunk=128))
    nq, n = 6, 12
    out["short"] = (DenseSource(_lattice(rng, nq, 2), _lattice(rng, n, 2)), {"a": _groups(rng, nq, n, 4)},
                    _groups(rng, nq, n, 5, empty_rate=0.0), dict(k=12, q_block=4, c_chunk=5))
    return out


def result_arrays(res) -> dict[str, np.ndarray]:
    """Every array of a `score_stream` result, flat, by name."""
    arrays = {"topk_rows": res.topk_rows, "topk_scores": res.topk_scores, "kth_tie_unlisted": res.kth_tie_unlisted}
    arrays.update({f"stats/{p}/{f}": v for p, d in res.stats.items() for f, v in d.items()})
    arrays.update({f"ranked/{f}": getattr(res.ranked, f) for f in RANKED_FIELDS})
    return arrays


def _run(arrays: dict[str, np.ndarray], pool_names: list[str], name: str) -> Run:
    """A run file's content from the flat arrays (corpus ids ``c<row>``)."""
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, v in arrays.items():
        if key.startswith("stats/"):
            _, pool, field = key.split("/")
            stats.setdefault(pool, {})[field] = v
    ranked = RankedPositives(pool_names, *(arrays[f"ranked/{f}"] for f in RANKED_FIELDS))
    ids = [[f"c{r}" if r >= 0 else "" for r in row] for row in arrays["topk_rows"]]
    return Run(method=name, config={"problem": name}, query_ids=[f"q{i}" for i in range(len(ids))], topk_ids=ids,
               topk_scores=arrays["topk_scores"], stats=stats, benchmark="reference",
               kth_tie_unlisted=arrays["kth_tie_unlisted"], ranked=ranked)


def _recorded(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / "results.npz") as z:
        return {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith(f"{name}:")}


@pytest.mark.parametrize("name", ["lattice", "expanded_max", "fusion", "random", "short"])
def test_results_are_byte_identical_to_the_recorded_ones(name, tmp_path):
    source, pools, exclude, kw = problems()[name]
    got = result_arrays(score_stream(source, pools, exclude, progress=False, **kw))
    want = _recorded(name)
    assert sorted(got) == sorted(want)
    for key, v in want.items():
        assert got[key].dtype == v.dtype and got[key].shape == v.shape, key
        assert got[key].tobytes() == v.tobytes(), key
    names = list(pools)
    a = write_run(tmp_path / "recorded.parquet", _run(want, names, name))
    b = write_run(tmp_path / "now.parquet", _run(got, names, name))
    assert a.read_bytes() == b.read_bytes()


def test_a_checkpoint_written_by_the_recorded_version_is_resumed(tmp_path):
    """The checkpoint format is unchanged: every block comes from the recorded files, none is scored again."""
    source, pools, exclude, kw = problems()["lattice"]

    class Unused:
        n_queries, n_items = source.n_queries, source.n_items

        def scores(self, q, items):
            raise AssertionError("a finished block was scored again")

    ckpt = tmp_path / "ck"
    shutil.copytree(DATA / "checkpoint", ckpt)
    got = result_arrays(score_stream(Unused(), pools, exclude, progress=False, checkpoint=ckpt,
                                     fingerprint="reference", **kw))
    for key, v in _recorded("lattice").items():
        assert got[key].tobytes() == v.tobytes(), key


def write_reference() -> None:
    """Record the current scorer's results (and problem ``lattice``'s checkpoint) under `DATA`."""
    DATA.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for name, (source, pools, exclude, kw) in problems().items():
        ck = {"checkpoint": DATA / "checkpoint", "fingerprint": "reference"} if name == "lattice" else {}
        res = score_stream(source, pools, exclude, progress=False, **kw, **ck)
        arrays.update({f"{name}:{k}": v for k, v in result_arrays(res).items()})
    np.savez_compressed(DATA / "results.npz", **arrays)


if __name__ == "__main__":
    if (DATA / "checkpoint").exists():
        sys.exit(f"{DATA / 'checkpoint'} exists: remove it first (it is rewritten with the results)")
    write_reference()
