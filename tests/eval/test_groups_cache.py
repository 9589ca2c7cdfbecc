"""`eval.scoring.benchmark.cached_benchmark_groups`: the groups a command computed are read back, identical, for the
same files, GT mapping and query rows, and computed again when any of them changes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import eval.scoring.benchmark as SB
from eval.benchmark import Benchmark


@pytest.fixture
def bench_copy(synth_dir, tmp_path):
    return shutil.copytree(synth_dir, tmp_path / "b", ignore=shutil.ignore_patterns(".cache", "frames", "sim"))


def _equal(a: SB.BenchmarkGroups, b: SB.BenchmarkGroups) -> None:
    assert list(a.pools) == list(b.pools) and list(a.probes) == list(b.probes)
    for x, y in [*zip(a.pools.values(), b.pools.values(), strict=True), (a.exclude, b.exclude),
                 *zip(a.probes.values(), b.probes.values(), strict=True)]:
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            assert np.asarray(v).dtype == np.int64
            np.testing.assert_array_equal(u, v)


def _computed(monkeypatch) -> tuple[list[int], object]:
    """Count `benchmark_groups` calls; returns the counter and the real function."""
    calls: list[int] = []
    real = SB.benchmark_groups
    monkeypatch.setattr(SB, "benchmark_groups", lambda bench, table: (calls.append(1), real(bench, table))[1])
    return calls, real


def test_groups_are_read_back_identical_for_the_same_files_mapping_and_rows(bench_copy, monkeypatch):
    bench = Benchmark.load(bench_copy)
    rows = np.asarray(bench.query_rows("test"))
    table = bench.query_table(rows)
    calls, real = _computed(monkeypatch)
    want = real(bench, table)
    first = SB.cached_benchmark_groups(bench, table, rows)
    assert calls == [1] and len(list((bench_copy / ".cache" / SB.GROUPS_CACHE).glob("*.npz"))) == 1
    again = SB.cached_benchmark_groups(Benchmark.load(bench_copy), table, rows)
    assert calls == [1]  # read back
    _equal(first, want)
    _equal(again, want)
    # other rows: computed (and right)
    sub = rows[::2]
    _equal(SB.cached_benchmark_groups(bench, bench.query_table(sub), sub), real(bench, bench.query_table(sub)))
    assert len(calls) == 2
    # another GT mapping or cache version: another key
    key = SB._groups_key(bench, rows)
    monkeypatch.setitem(SB.GT_DEFINITION_FIELDS, "type2-all", ("gt_pools.in_dataset",))
    assert SB._groups_key(bench, rows) != key
    monkeypatch.undo()
    calls, real = _computed(monkeypatch)
    monkeypatch.setattr(SB, "GROUPS_CACHE_VERSION", SB.GROUPS_CACHE_VERSION + 1)
    SB.cached_benchmark_groups(bench, table, rows)
    assert calls == [1]
    # a rewritten file: another key
    q = bench_copy / "queries.jsonl"
    q.write_bytes(q.read_bytes())
    SB.cached_benchmark_groups(Benchmark.load(bench_copy), table, rows)
    assert calls == [1, 1]
    # a file that is not a readable archive is computed again (and replaced)
    for f in (bench_copy / ".cache" / SB.GROUPS_CACHE).glob("*.npz"):
        f.write_bytes(b"PK\x03\x04 not a zip")
    _equal(SB.cached_benchmark_groups(Benchmark.load(bench_copy), table, rows), want)
    assert calls == [1, 1, 1]
    # the folder keeps the newest few of its own files only; a file it did not write is never removed
    folder = bench_copy / ".cache" / SB.GROUPS_CACHE
    mine = folder / "notes.npz"
    mine.write_bytes(b"a user's file")
    for n in range(1, SB.GROUPS_CACHE_FILES + 2):
        sub = rows[::n + 1]
        SB.cached_benchmark_groups(bench, bench.query_table(sub), sub)
    ours = [p for p in folder.glob("*.npz") if p != mine]
    assert len(ours) == SB.GROUPS_CACHE_FILES and mine.read_bytes() == b"a user's file"


def test_a_benchmark_not_loaded_from_its_files_is_never_cached(bench_copy, monkeypatch):
    bench = Benchmark.load(bench_copy)
    bench.source_stats = None
    rows = np.asarray(bench.query_rows("test"))
    calls, _ = _computed(monkeypatch)
    SB.cached_benchmark_groups(bench, bench.query_table(rows), rows)
    SB.cached_benchmark_groups(bench, bench.query_table(rows), rows)
    assert len(calls) == 2 and not (bench_copy / ".cache" / SB.GROUPS_CACHE).exists()
