"""`eval.features.check_finite_cached`: a feature table's NaN check is made once per file version."""

from __future__ import annotations

import os

import numpy as np
import pytest

from eval import features
from eval.features import FINITE_CACHE, check_finite_cached, load_table, write_table
from eval.io import FormatError


def _table(root, values):
    write_table(root, "sp", "corpus", [f"c{i}" for i in range(len(values))], np.asarray(values, np.float32))
    t = load_table(root, "sp", "corpus")
    return root / "features" / "sp" / "corpus.npy", t


def test_a_passed_table_is_not_read_again_until_it_changes(tmp_path, monkeypatch):
    path, t = _table(tmp_path, np.ones((5, 3)))
    calls = []
    real = features.check_finite
    monkeypatch.setattr(features, "check_finite", lambda *a: (calls.append(a[0]), real(*a)))
    check_finite_cached(tmp_path, path, t.array, t.ids)
    assert calls == [path] and (tmp_path / FINITE_CACHE).exists()
    check_finite_cached(tmp_path, path, t.array, t.ids)  # same file: the kept verdict
    assert calls == [path]

    # rewritten in place (same size: np.save truncates and writes): its mtime changed, so it is checked again
    a = np.load(path)
    a[3, 1] = np.nan
    np.save(path, a)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    bad = load_table(tmp_path, "sp", "corpus")
    with pytest.raises(FormatError, match=r"row 3 \(id 'c3'"):
        check_finite_cached(tmp_path, path, bad.array, bad.ids)
    with pytest.raises(FormatError, match=r"row 3"):  # a failed check is never kept as passed
        check_finite_cached(tmp_path, path, bad.array, bad.ids)

    # replaced atomically (another inode) by a clean table: checked, then kept
    path, t = _table(tmp_path, np.zeros((5, 3)))
    n = len(calls)
    check_finite_cached(tmp_path, path, t.array, t.ids)
    check_finite_cached(tmp_path, path, t.array, t.ids)
    assert len(calls) == n + 1


def test_a_read_only_benchmark_is_checked_every_time(tmp_path, monkeypatch):
    path, t = _table(tmp_path, np.ones((4, 2)))
    calls = []
    real = features.check_finite
    monkeypatch.setattr(features, "check_finite", lambda *a: (calls.append(a[0]), real(*a)))
    (tmp_path / ".cache").mkdir()
    monkeypatch.setattr(features, "write_json", lambda *a, **k: (_ for _ in ()).throw(PermissionError("read-only")))
    for _ in range(2):
        check_finite_cached(tmp_path, path, t.array, t.ids)
    assert len(calls) == 2 and not (tmp_path / FINITE_CACHE).exists()


def test_an_unreadable_cache_is_rebuilt(tmp_path):
    path, t = _table(tmp_path, np.ones((4, 2)))
    (tmp_path / ".cache").mkdir()
    (tmp_path / FINITE_CACHE).write_text("[not a dict")
    check_finite_cached(tmp_path, path, t.array, t.ids)
    assert "features/sp/corpus.npy" in (tmp_path / FINITE_CACHE).read_text()
