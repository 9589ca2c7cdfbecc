"""TREC export: ranx, reading our exported run and qrels, reproduces eval's R@n and MRR within the tie convention
(eval/trec.py): exactly ``--tie row`` with ``--scores rank``; with the method's scores, exactly on tie-free
queries and between ``--tie optimistic`` and ``--tie pessimistic`` on tied ones."""

from __future__ import annotations

import numpy as np
import pytest

from eval.errors import OutputRefused
from eval.evaluate import MAIN_POOL, Population, QueryLabels, metric_block
from eval.metrics import RankStats, first_rank, recall_at_k
from eval.runs import write_run
from eval.scoring import DenseSource, score_benchmark
from eval.trec import export_trec, is_qrels, is_trec_run
from tests.cli_run import run_cli

ranx = pytest.importorskip("ranx")
K = 20
NS = (1, 5, 10)


def _pixels_run(bench, out, *, quantize: float | None, missed=None):
    """The persistence baseline in the pixels space over the test split; ``quantize`` rounds features onto a grid
    of that step, so many segments tie; ``missed`` flags queries scored as misses."""
    rows = bench.query_rows("test")
    pre, corp = bench.features("pixels", "prefixes"), bench.features("pixels", "corpus")
    pidx = pre.index()
    q = np.asarray(pre.array)[[pidx[p] for p in bench.queries_ds.select(rows)["prefix_id"]]]
    x = np.asarray(corp.array)
    if quantize:
        q, x = np.round(q / quantize) * quantize, np.round(x / quantize) * quantize
    run = score_benchmark(bench, DenseSource(q, x), rows, method="pixels q" if quantize else "pixels",
                          k=K, progress=False, missed=missed)
    return run, write_run(out, run)


@pytest.fixture(scope="module")
def runs(synth_bench, tmp_path_factory):
    root = tmp_path_factory.mktemp("trec")
    return {"plain": _pixels_run(synth_bench, root / "plain.parquet", quantize=None),
            "tied": _pixels_run(synth_bench, root / "tied.parquet", quantize=0.5)}


def _ranx_scores(run_file, qrels_file) -> dict[str, dict[str, float]]:
    """Per-query ranx hit_rate@n and mrr (one evaluate call: ranx compiles per call)."""
    qrels, rrun = ranx.Qrels.from_file(str(qrels_file), kind="trec"), ranx.Run.from_file(str(run_file), kind="trec")
    names = [f"hit_rate@{n}" for n in NS] + ["mrr"]
    ranx.evaluate(qrels, rrun, names, make_comparable=True)
    return {m: dict(rrun.scores[m]) for m in names}


def _ours(run, bench):
    """Our per-query stats over the default population, and the population mask."""
    keep = Population().mask(QueryLabels.from_benchmark(bench, run.query_ids))
    sub = run.select([q for q, k in zip(run.query_ids, keep, strict=True) if k])
    return sub, RankStats.from_run(sub, MAIN_POOL)


def _export(world, name, tmp_path, *extra):
    run, path = world[name]
    out, qrels = tmp_path / f"{name}.trec", tmp_path / f"{name}.qrels"
    res = run_cli("eval", "export-trec", path, "--data", world["data"], "--out", out, "--qrels", qrels, "--k", K,
                  *extra)
    assert res.code == 0, res.text
    return out, qrels


@pytest.fixture
def world(runs, synth_dir):
    return {**runs, "data": synth_dir}


@pytest.mark.slow  # ranx compiles its metrics on first use (~10 s)
@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaTypeSafetyWarning")
@pytest.mark.parametrize("name", ["plain", "tied"])
def test_ranx_reproduces_row_order_metrics_with_rank_scores(world, synth_bench, tmp_path, name):
    out, qrels = _export(world, name, tmp_path, "--scores", "rank")
    got = _ranx_scores(out, qrels)
    sub, st = _ours(world[name][0], synth_bench)
    assert set(got["mrr"]) == set(sub.query_ids) and st.valid.all()
    rank = first_rank(st, "row")
    for n in NS:
        ours = recall_at_k(st, n, "row")
        np.testing.assert_array_equal([got[f"hit_rate@{n}"][q] for q in sub.query_ids], ours)
        assert np.mean(ours) == pytest.approx(metric_block(st, ks=NS, tie="row")[f"R@{n}"], abs=1e-12)
    np.testing.assert_allclose([got["mrr"][q] for q in sub.query_ids], np.where(rank <= K, 1 / rank, 0.0),
                               atol=1e-12)


@pytest.mark.slow  # ranx compiles its metrics on first use (~10 s)
@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaTypeSafetyWarning")
@pytest.mark.parametrize("name", ["plain", "tied"])
def test_ranx_with_method_scores_is_exact_without_ties_and_bounded_with_them(world, synth_bench, tmp_path, name):
    out, qrels = _export(world, name, tmp_path)
    got = _ranx_scores(out, qrels)
    sub, st = _ours(world[name][0], synth_bench)
    tied = st.n_tie_neg > 0
    if name == "tied":
        assert tied.sum() >= 5, "the quantized run should have tied queries"
    lo, hi = first_rank(st, "pessimistic"), first_rank(st, "optimistic")
    for n in NS:
        theirs = np.array([got[f"hit_rate@{n}"][q] for q in sub.query_ids])
        np.testing.assert_array_equal(theirs[~tied], recall_at_k(st, n, "expected")[~tied])
        assert ((theirs >= (lo <= n)) & (theirs <= (hi <= n))).all()
    theirs = np.array([got["mrr"][q] for q in sub.query_ids])
    cut = lambda r: np.where(r <= K, 1 / r, 0.0)  # noqa: E731  (MRR@K: what a K-deep file can give)
    np.testing.assert_allclose(theirs[~tied], cut(first_rank(st, "row"))[~tied], atol=1e-12)
    assert ((theirs >= cut(lo) - 1e-12) & (theirs <= cut(hi) + 1e-12)).all()


def test_files_follow_the_trec_formats(world, synth_bench, tmp_path):
    out, qrels = _export(world, "tied", tmp_path, "--tag", "my-run")
    run, _ = world["tied"]
    sub, _ = _ours(run, synth_bench)
    lines = [x.split() for x in out.read_text().splitlines()]
    assert all(len(x) == 6 and x[1] == "Q0" and x[5] == "my-run" for x in lines)
    by_q = {}
    for qid, _, doc, rank, score, _ in lines:
        by_q.setdefault(qid, []).append((doc, int(rank), float(score)))
    assert list(by_q) == sub.query_ids  # the population's queries, in the run's order
    for i, q in enumerate(sub.query_ids):
        docs, ranks, scores = zip(*by_q[q], strict=True)
        assert list(docs) == sub.topk_ids[i][:K] and list(ranks) == list(range(1, len(docs) + 1))
        np.testing.assert_array_equal(np.float32(scores), sub.topk_scores[i][:K])  # float32 exactly: ties kept
    gt = {}
    for qid, zero, doc, rel in (x.split() for x in qrels.read_text().splitlines()):
        assert zero == "0" and rel == "1"
        gt.setdefault(qid, set()).add(doc)
    bench_q = {q.id: q for q in synth_bench.queries()}
    assert {q: gt[q] for q in sub.query_ids} == {q: set(bench_q[q].gt("type2-all")) for q in sub.query_ids}
    assert set(gt) == set(sub.query_ids)
    assert is_trec_run(out) and is_qrels(qrels) and not is_trec_run(qrels) and not is_qrels(out)


def test_k_population_and_missed_queries(world, synth_bench, tmp_path):
    """A missed query has no run line (its GT stays in the qrels); --k caps the lines; the population decides."""
    ids = [q.id for q in synth_bench.queries("test")]
    pop = Population()
    in_pop = pop.mask(QueryLabels.from_benchmark(synth_bench, ids))
    miss = np.zeros(len(ids), bool)
    miss[np.flatnonzero(in_pop)[:3]] = True
    run, path = _pixels_run(synth_bench, tmp_path / "missed.parquet", quantize=None, missed=miss)
    res = export_trec(path, world["data"], tmp_path / "r.trec", qrels=tmp_path / "r.qrels", k=3, population=pop)
    qids = [x.split()[0] for x in (tmp_path / "r.trec").read_text().splitlines()]
    missed_ids = {q for q, m in zip(run.query_ids, miss, strict=True) if m}
    assert set(qids) == {q for q, keep in zip(run.query_ids, in_pop & ~miss, strict=True) if keep}
    assert res.n_queries == in_pop.sum() and res.k == 3 and res.n_run_lines == len(qids) == 3 * (in_pop.sum() - 3)
    assert missed_ids <= {x.split()[0] for x in (tmp_path / "r.qrels").read_text().splitlines()}
    everyone = Population(splits=None, fair=False, qtypes=("Q1", "Q2", "Q3", "Q4", "Q5"))
    assert export_trec(path, world["data"], tmp_path / "r.trec", k=3, population=everyone).n_queries == run.n


def test_outputs_are_checked_before_anything_is_written(world, tmp_path):
    _, path = world["plain"]
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes\n")
    res = run_cli("eval", "export-trec", path, "--data", world["data"], "--out", tmp_path / "r.trec",
                  "--qrels", foreign)
    assert res.code == 2 and "--qrels" in res.err and not (tmp_path / "r.trec").exists()
    assert foreign.read_text() == "my notes\n"
    with pytest.raises(OutputRefused):
        export_trec(path, world["data"], foreign)
    res = run_cli("eval", "export-trec", path, "--data", world["data"], "--out", tmp_path / "r.trec", "--scores", "x")
    assert res.code == 2 and "--scores" in res.err
