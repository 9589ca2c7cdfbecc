"""Run files are validated on read, and checked against the benchmark they are scored on (fingerprint, pool sizes)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.cli import app
from eval.errors import InputError
from eval.evaluate import check_run_against
from eval.io import FormatError
from eval.metrics import RankStats
from eval.runs import META_KEY, read_run, write_run
from eval.scoring import DenseSource, score_benchmark


@pytest.fixture(scope="module")
def pixels_run(synth_bench, tmp_path_factory):
    """The persistence run over every test query (Q1-Q5), written once; rows are ordered fair queries first, so the
    edited row 3 below has a non-empty main pool."""
    rows = synth_bench.query_rows("test")
    fair = np.asarray(synth_bench.queries_ds.select(rows)["fair"][:], bool)
    rows = np.concatenate([rows[fair], rows[~fair]])
    pre, corp = synth_bench.features("pixels", "prefixes"), synth_bench.features("pixels", "corpus")
    pidx = pre.index()
    src = DenseSource(np.asarray(pre.array)[[pidx[p] for p in synth_bench.queries_ds.select(rows)["prefix_id"]]],
                      corp.array)
    run = score_benchmark(synth_bench, src, rows, method="persistence", progress=False)
    path = write_run(tmp_path_factory.mktemp("run") / "persistence.parquet", run)
    return run, path


def _rewrite(src, dst, *, drop=(), replace=None, meta=None):
    """Copy a run file, dropping / replacing columns or editing its metadata."""
    t = pq.read_table(src)
    t = t.drop_columns(list(drop))
    for col, arr in (replace or {}).items():
        t = t.set_column(t.column_names.index(col), col, arr)
    m = json.loads(t.schema.metadata[META_KEY])
    if meta:
        meta(m)
    pq.write_table(t.replace_schema_metadata({META_KEY: json.dumps(m).encode()}), dst)
    return dst


def _col(path, col):
    return pq.read_table(path).column(col).to_numpy().copy()


def test_run_written_by_the_scorer_reads_back_with_its_fingerprint(synth_bench, pixels_run):
    run, path = pixels_run
    back = read_run(path)
    assert back.fingerprint == synth_bench.fingerprint and set(back.fingerprint) == {"name", "version", "sha256"}
    check_run_against(back, synth_bench)  # passes: same benchmark, same pool sizes


def test_missing_tie_columns_are_refused_not_scored_tie_free(pixels_run, tmp_path):
    _, path = pixels_run
    # the case: a run without its tie columns was scored as if nothing tied (R@1 100 instead of 20.6)
    bad = _rewrite(path, tmp_path / "no_ties.parquet", drop=["type2-all/n_tie_neg", "type2-all/n_tie_pos",
                                                             "type2-all/n_tie_neg_first"],
                   meta=lambda m: m["pools"].__setitem__("type2-all", ["n_pos", "n_above", "best"]))
    with pytest.raises(FormatError, match=r"no_ties\.parquet field 'type2-all/n_tie_neg': column missing.*tie-aware"):
        read_run(bad)
    with pytest.raises(InputError, match="lack"):
        RankStats.from_arrays({"n_pos": np.array([1]), "n_above": np.array([0])})


@pytest.mark.parametrize("col,edit,match", [
    ("type2-all/n_above", lambda v: np.where(np.arange(len(v)) == 3, -5, v), r"n_above = -5 < 0"),
    ("type2-all/n_tie_pos", lambda v: np.where(np.arange(len(v)) == 3, 0, v), r"n_tie_pos = 0 with n_pos = \d+"),
    ("type2-all/n_tie_pos", lambda v: np.where(np.arange(len(v)) == 3, 10_000, v), r"n_tie_pos = 10000 outside"),
    ("type2-all/n_tie_neg_first", lambda v: np.where(np.arange(len(v)) == 3, -1, v), r"n_tie_neg_first = -1"),
    ("type2-all/n_pos", lambda v: pa.array(np.where(np.arange(len(v)) == 3, np.nan, v.astype(float))),
     r"expected integer counts, got a float64 column \(value nan\)"),
    ("type2-all/n_above", lambda v: pa.array(v.astype(float) + np.where(np.arange(len(v)) == 3, 0.5, 0)),
     r"expected integer counts, got a float64 column \(value \d+\.5\)"),
    ("type2-all/n_above", lambda v: pa.array(v.astype(str)), r"expected integer counts, got a object column"),
    ("in_video/best", lambda v: pa.array(np.where(np.arange(len(v)) == 3, np.inf, v), pa.float32()),
     r"best = inf"),
])
def test_bad_run_statistics_are_refused_with_file_column_and_query(pixels_run, tmp_path, col, edit, match):
    run, path = pixels_run
    v = _col(path, col)
    new = edit(v)
    bad = _rewrite(path, tmp_path / "bad.parquet", replace={col: new if isinstance(new, pa.Array) else pa.array(new)})
    with pytest.raises(FormatError) as e:
        read_run(bad)
    msg = str(e.value)
    assert "bad.parquet" in msg and f"field '{col}'" in msg, msg
    assert re.search(match, msg), msg
    row = 0 if "object column" in msg else 3  # a string column names its first row, a bad value its own row
    assert f"row {row} (query {run.query_ids[row]!r})" in msg, msg


def test_bad_top_k_and_empty_pools_are_refused(pixels_run, tmp_path):
    run, path = pixels_run
    sc = [list(r) for r in run.topk_scores]
    sc[2][1] = float("nan")
    bad = _rewrite(path, tmp_path / "nan.parquet", replace={"topk_scores": pa.array(sc, pa.list_(pa.float32()))})
    with pytest.raises(FormatError, match=rf"field 'topk_scores': row 2 \(query {run.query_ids[2]!r}\).*NaN"):
        read_run(bad)
    # counts on a query whose pool is empty
    empty = int(np.flatnonzero(run.stats["type2-consensus"]["n_pos"] == 0)[0])
    v = _col(path, "type2-consensus/n_above")
    v[empty] = 7
    bad = _rewrite(path, tmp_path / "empty.parquet", replace={"type2-consensus/n_above": pa.array(v)})
    with pytest.raises(FormatError, match=rf"query {run.query_ids[empty]!r}\): an empty pool"):
        read_run(bad)
    # write_run refuses the same run in memory
    run2 = read_run(path)
    run2.stats["type2-all"]["n_tie_pos"][0] = run2.stats["type2-all"]["n_pos"][0] + 1
    with pytest.raises(InputError, match="not written"):
        write_run(tmp_path / "never.parquet", run2)
    assert not (tmp_path / "never.parquet").exists()


def _bench_copy(src, dst, *, manifest=None, query=None, corpus=None):
    """A benchmark directory of the JSONL files only (reports need nothing else), optionally edited."""
    dst.mkdir()
    shutil.copy(src / "states.jsonl", dst / "states.jsonl")
    m = json.loads((src / "manifest.json").read_text())
    if manifest:
        manifest(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    for name, edit in (("queries.jsonl", query), ("corpus.jsonl", corpus)):
        rows = [json.loads(x) for x in (src / name).read_text().splitlines() if x.strip()]
        if edit:
            rows = edit(rows)
        (dst / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def test_run_of_another_benchmark_is_refused_naming_both(synth_dir, synth_bench, pixels_run, tmp_path):
    _, path = pixels_run
    runner = CliRunner()
    ok = runner.invoke(app, ["score", "--data", str(synth_dir), "--run", str(path), "--out", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output

    def drop_gt(rows):
        q = next(r for r in rows if r["split"] == "test" and len(r["gt_pools"]["in_dataset"]) > 1)
        q["gt_pools"]["in_dataset"] = q["gt_pools"]["in_dataset"][1:]  # a stale pool: one GT id fewer
        return rows

    cases = {
        "renamed": dict(manifest=lambda m: m.__setitem__("name", "other-bench")),
        "stale_pool": dict(query=drop_gt),
        "emptied_corpus": dict(corpus=lambda rows: rows[:-5]),
    }
    fps = set()
    for name, edit in cases.items():
        other = _bench_copy(synth_dir, tmp_path / name, **edit)
        fp = Benchmark.load(other).fingerprint
        fps.add(fp["sha256"] + fp["name"])
        res = runner.invoke(app, ["score", "--data", str(other), "--run", str(path), "--out", str(tmp_path / f"o-{name}")])
        assert res.exit_code != 0, (name, res.output)
        out = " ".join(res.output.split())
        assert "was scored on benchmark 'psr-synth'" in out and synth_bench.fingerprint["sha256"][:12] in out, out
        assert fp["sha256"][:12] in out and str(other) in out, out
        assert not (tmp_path / f"o-{name}").exists()
    assert len(fps) == 3 and synth_bench.fingerprint["sha256"] + "psr-synth" not in fps


def test_stale_pool_sizes_and_unfingerprinted_runs_are_refused(synth_bench, pixels_run, tmp_path):
    run, path = pixels_run
    back = read_run(path)
    back.stats["type1-all"]["n_pos"] = back.stats["type1-all"]["n_pos"].copy()
    i = int(np.flatnonzero(back.stats["type1-all"]["n_pos"] > 0)[0])
    back.stats["type1-all"]["n_pos"][i] += 1
    back.stats["type1-all"]["n_tie_pos"][i] = 1
    with pytest.raises(InputError, match=rf"query {run.query_ids[i]!r} has n_pos = \d+ in pool 'type1-all'.*gives it"):
        check_run_against(back, synth_bench)
    old = _rewrite(path, tmp_path / "old.parquet", meta=lambda m: (m.pop("benchmark_fingerprint"),
                                                                    m.__setitem__("format_version", "1.0")))
    res = CliRunner().invoke(app, ["score", "--data", str(synth_bench.root), "--run", str(old), "--out",
                                   str(tmp_path / "r")])
    assert res.exit_code != 0 and "records no benchmark fingerprint" in res.output and "score the method again" in res.output


@pytest.mark.slow
def test_fingerprint_covers_what_the_scorer_reads(synth_dir, synth_bench, tmp_path):
    base = synth_bench.fingerprint
    same = Benchmark.load(_bench_copy(synth_dir, tmp_path / "same"))
    assert same.fingerprint == base  # content, not path: a copy is the same benchmark

    def reorder(rows):
        return rows[1:] + rows[:1]

    def null_type1(rows):
        for r in rows:
            if not r.get("gt_type1"):
                r["gt_type1"] = None  # null and [] mean the same to the scorer
        return rows

    assert Benchmark.load(_bench_copy(synth_dir, tmp_path / "null", query=null_type1)).fingerprint == base
    # corpus row order changes the row tie-break, so it changes the fingerprint
    assert Benchmark.load(_bench_copy(synth_dir, tmp_path / "order", corpus=reorder)).fingerprint != base

    def question_text(rows):
        rows[0]["question"] += " (reworded)"
        return rows

    assert Benchmark.load(_bench_copy(synth_dir, tmp_path / "text", query=question_text)).fingerprint == base


def test_the_fingerprint_is_cached_for_the_files_it_was_taken_from(synth_dir, synth_bench, tmp_path, monkeypatch):
    """The fingerprint is kept in .cache/fingerprint.json for the files the benchmark was loaded from: a second load
    reads it, a changed file or a stale key recomputes it, and a read-only benchmark keeps none."""
    import eval.fingerprint as F

    root = _bench_copy(synth_dir, tmp_path / "b")
    first = Benchmark.load(root).fingerprint
    assert first == synth_bench.fingerprint and (root / ".cache" / F.CACHE_FILE).is_file()

    def never(_bench):
        raise AssertionError("the cached fingerprint was not used")

    with monkeypatch.context() as m:
        m.setattr(F, "benchmark_fingerprint", never)
        assert Benchmark.load(root).fingerprint == first
    # the same content in a file written again, then other content: recomputed each time
    (root / "corpus.jsonl").write_bytes((root / "corpus.jsonl").read_bytes())
    with monkeypatch.context() as m:
        m.setattr(F, "benchmark_fingerprint", never)
        with pytest.raises(AssertionError, match="not used"):
            _ = Benchmark.load(root).fingerprint
    assert Benchmark.load(root).fingerprint == first
    rows = (root / "corpus.jsonl").read_text().splitlines(keepends=True)
    (root / "corpus.jsonl").write_text("".join(rows[1:] + rows[:1]))
    reordered = Benchmark.load(root).fingerprint
    assert reordered != first
    # a cache that claims another key (another version of the hash) is not believed
    doc = json.loads((root / ".cache" / F.CACHE_FILE).read_text())
    (root / ".cache" / F.CACHE_FILE).write_text(json.dumps({**doc, "key": "0" * 64,
                                                            "fingerprint": {**doc["fingerprint"], "sha256": "x"}}))
    assert Benchmark.load(root).fingerprint == reordered
    monkeypatch.setattr(F, "FINGERPRINT_VERSION", F.FINGERPRINT_VERSION + 1)
    with monkeypatch.context() as m:
        m.setattr(F, "benchmark_fingerprint", never)
        with pytest.raises(AssertionError, match="not used"):
            _ = Benchmark.load(root).fingerprint


def test_a_benchmark_that_cannot_keep_a_cache_is_still_fingerprinted(synth_dir, synth_bench, tmp_path):
    root = _bench_copy(synth_dir, tmp_path / "nocache")
    (root / ".cache").write_text("a file where the cache folder would be")  # no folder can be made there
    assert Benchmark.load(root).fingerprint == synth_bench.fingerprint
    assert (root / ".cache").read_text().startswith("a file")


def test_gt_rows_are_the_corpus_rows_of_the_gt_ids_and_an_unknown_id_is_named(synth_dir, synth_bench, tmp_path):
    from eval.errors import UnknownName
    from eval.schema import GT_DEFINITIONS

    queries = [synth_bench.query(i) for i in range(0, len(synth_bench.queries_ds), 7)]
    idx = synth_bench.corpus_index
    for definition in GT_DEFINITIONS:
        got = synth_bench.gt_rows(queries, definition)
        assert [r.tolist() for r in got] == [[idx[x] for x in q.gt(definition)] for q in queries]
    assert synth_bench.gt_rows([], "type2-all") == []

    def unknown(rows):
        rows[3]["gt_pools"]["cross_dataset"] = [*rows[3]["gt_pools"]["cross_dataset"], "no-such-segment"]
        return rows

    bad = Benchmark.load(_bench_copy(synth_dir, tmp_path / "bad", query=unknown))
    with pytest.raises(UnknownName, match=r"query .*: GT id 'no-such-segment' is not in the corpus") as e:
        bad.gt_rows([bad.query(i) for i in range(6)], "type2-all")
    assert bad.query(3).id in str(e.value)
    with pytest.raises(UnknownName, match=r"query .*: GT id 'no-such-segment' is not in the corpus") as e:
        bad.gt_rows_at(bad.query_table(range(6)), "type2-all")
    assert bad.query(3).id in str(e.value)


def test_gt_rows_from_the_arrow_table_equal_those_from_the_query_objects(synth_dir, synth_bench, tmp_path):
    """`Benchmark.gt_rows_at` (the scorer's path: Arrow columns) against `Benchmark.gt_rows` (Query objects), for
    every GT definition and tier, on rows in any order, with a repeated row, an empty list and a null one."""
    from eval.schema import GT_DEFINITIONS, GT_TIERS

    def holes(rows):
        rows[1]["gt_pools"]["in_dataset"] = []
        rows[2]["gt_pools"]["cross_dataset"] = None
        rows[4]["gt_type1"] = None
        return rows

    for bench in (synth_bench, Benchmark.load(_bench_copy(synth_dir, tmp_path / "holes", query=holes))):
        rows = [5, 0, 1, 2, 4, 3, 2, *range(7, len(bench.queries_ds), 11)]
        table, queries = bench.query_table(rows), [bench.query(r) for r in rows]
        for definition in GT_DEFINITIONS:
            want = bench.gt_rows(queries, definition)
            got = bench.gt_rows_at(table, definition)
            assert [r.tolist() for r in got] == [r.tolist() for r in want], definition
        for tier in GT_TIERS:
            want = bench.gt_rows(queries, tier=tier)
            assert [r.tolist() for r in bench.gt_rows_at(table, tier=tier)] == [r.tolist() for r in want], tier
        together = bench.gt_pools_at(table, definitions=GT_DEFINITIONS, tiers=GT_TIERS)  # one lookup for all
        assert list(together) == [*GT_DEFINITIONS, *GT_TIERS]
        for name, got in together.items():
            want = bench.gt_rows(queries, tier=name) if name in GT_TIERS else bench.gt_rows(queries, name)
            assert [r.tolist() for r in got] == [r.tolist() for r in want], name
    assert synth_bench.gt_rows_at(synth_bench.query_table([]), "type2-all") == []


def test_expected_pool_sizes_count_each_querys_distinct_positives_outside_its_video(synth_bench, monkeypatch):
    """The check a report makes of every run: per query, the distinct positives of each pool (minus the own-video
    rows, except in_video) and of each probe, and the own-video rows; counted here one query at a time."""
    from eval.scoring import benchmark_groups, expected_pool_sizes

    ids = synth_bench.query_ids[::3]
    sizes, n_excl = expected_pool_sizes(synth_bench, ids)
    queries = [synth_bench.query(q) for q in ids]
    pools, exclude, probes = benchmark_groups(synth_bench, queries)
    assert n_excl.tolist() == [len(np.unique(e)) for e in exclude]
    for name, lists in pools.items():
        want = [len(np.unique(r)) if name == "in_video" else len(np.setdiff1d(r, e))
                for r, e in zip(lists, exclude, strict=True)]
        assert sizes[name].tolist() == want, name
    for name, lists in probes.items():
        assert sizes[name].tolist() == [len(np.unique(r)) for r in lists], name
    assert sum(sizes["type2-all"]) > 0 and sum(sizes["in_video"]) > 0
    sizes["type2-all"][:] = -1  # the caller's copy: the kept one is unchanged
    again, _ = expected_pool_sizes(synth_bench, ids)
    assert again["type2-all"].tolist() == [len(np.setdiff1d(r, e)) for r, e in zip(pools["type2-all"], exclude,
                                                                                     strict=True)]
    # the kept sizes follow the GT mapping as it is at the call
    from eval.schema import GT_DEFINITION_FIELDS

    monkeypatch.setitem(GT_DEFINITION_FIELDS, "sim-exact", ("gt_type1",))
    patched, _ = expected_pool_sizes(synth_bench, ids)
    assert patched["sim-exact"].tolist() == patched["type1-all"].tolist()


def test_absent_and_empty_gt_lists_hash_alike():
    """A GT list column a benchmark lacks (an older benchmark without an optional definition) hashes like one that
    no query fills, so adding an optional, empty GT field does not change existing fingerprints."""
    import hashlib

    from eval.fingerprint import _hash_columns

    def digest(table):
        h = hashlib.sha256()
        _hash_columns(h, table, ["id", "gt_extra"], frozenset({"gt_extra"}))
        return h.hexdigest()

    ids = pa.array(["q0", "q1", "q2"])
    absent = pa.table({"id": ids})
    empty = pa.table({"id": ids, "gt_extra": pa.array([[], None, []], pa.list_(pa.string()))})
    filled = pa.table({"id": ids, "gt_extra": pa.array([[], ["c1"], []], pa.list_(pa.string()))})
    assert digest(absent) == digest(empty) != digest(filled)


def test_a_bad_score_is_named_by_its_position_not_by_the_whole_list(pixels_run, tmp_path):
    """A top-50 list in an error message is unreadable: the message names the score and shows its neighbours."""
    run, path = pixels_run
    sc = [list(r) for r in run.topk_scores]
    assert len(sc[2]) >= 20
    sc[2][12] = float("nan")
    bad = _rewrite(path, tmp_path / "nan.parquet", replace={"topk_scores": pa.array(sc, pa.list_(pa.float32()))})
    with pytest.raises(FormatError, match=r"score 12 is nan") as e:
        read_run(bad)
    assert str(e.value).count(",") < 12, str(e.value)
    sc = [list(r) for r in run.topk_scores]
    sc[3][15] = sc[3][0] + 1.0
    bad = _rewrite(path, tmp_path / "order.parquet", replace={"topk_scores": pa.array(sc, pa.list_(pa.float32()))})
    with pytest.raises(FormatError, match=r"row 3 .*score 15 .* exceeds score 14") as e:
        read_run(bad)
    assert str(e.value).count(",") < 12, str(e.value)
