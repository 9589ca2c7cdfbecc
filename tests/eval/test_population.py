"""The evaluated population: explicit, the same for every table, Q5 scored apart with its joint metric."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from eval_sources import oracle_and_pixels
from typer.testing import CliRunner

from eval.cli import app
from eval.errors import InputError
from eval.evaluate import Population, QueryLabels, evaluate_groups, evaluate_run, multi_object_groups
from eval.metrics import RankStats, recall_at_k
from eval.report import ReportConfig, build_report, render_tables
from eval.runs import Run, write_run
from eval.scoring import score_benchmark
from eval.stats import MIN_BOOTSTRAP_N


@pytest.fixture(scope="module")
def all_runs(synth_bench, tmp_path_factory):
    """Oracle and persistence over every query of the benchmark (all splits, fair or not, Q1-Q5), written."""
    rows = np.arange(len(synth_bench.query_ids))
    _, oracle, pixels = oracle_and_pixels(synth_bench, rows)
    missed = np.zeros(len(rows), bool)
    missed[::4] = True
    runs = {"oracle": score_benchmark(synth_bench, oracle, rows, method="oracle", progress=False),
            "persistence": score_benchmark(synth_bench, pixels, rows, method="persistence", progress=False),
            "persistence-missed": score_benchmark(synth_bench, pixels, rows, method="persistence-missed",
                                                  progress=False, missed=missed)}
    d = tmp_path_factory.mktemp("all_runs")
    return runs, {n: write_run(d / f"{n}.parquet", r) for n, r in runs.items()}


def test_default_population_is_the_fair_test_queries_of_q1_to_q4(synth_bench):
    pop = Population()
    ids = pop.query_ids(synth_bench)
    labels = QueryLabels.from_benchmark(synth_bench, synth_bench.query_ids)
    expect = [q for q, s, f, t in zip(labels.query_ids, labels.split, labels.fair, labels.qtype, strict=True)
              if s == "test" and f and t in ("Q1", "Q2", "Q3", "Q4")]
    assert ids == expect and len(ids) > 20
    assert pop.describe() == "test split, fair queries (main GT pool non-empty), Q1–Q4"
    assert Population(None, False, ("Q1", "Q3")).describe() == "all splits, all queries (fair or not), Q1, Q3"
    with pytest.raises(InputError, match="unknown split"):
        Population(("tests",))


@pytest.mark.slow
def test_report_uses_one_population_everywhere(synth_dir, synth_bench, all_runs, tmp_path):
    """A run over train+val+test is restricted to the population with a note; every table's caption names it;
    the main n, the nDCG mean, the strata, tiers, triplets and the significance n all count the same queries."""
    _, paths = all_runs
    out = tmp_path / "rep"
    res = CliRunner().invoke(app, ["report", str(paths["oracle"]), str(paths["persistence"]), "--data", str(synth_dir),
                                   "--out", str(out), "--reference", "persistence", "--resamples", "300"])
    assert res.exit_code == 0, res.output
    pop_ids = Population().query_ids(synth_bench)
    n = len(pop_ids)
    out_text = " ".join(res.output.split())
    assert "note:" in out_text and "outside the population" in out_text and "other splits: train, val" in out_text
    doc = json.loads((out / "report.json").read_text())
    assert doc["population"]["n"] == n and doc["population"]["description"].startswith("test split, fair")
    for name, r in doc["runs"].items():
        assert r["n_queries"] == n and r["main"]["n"] == n, name
        assert sum(v["n"] + v["n_empty"] for v in r["by_horizon"].values()) == n
        assert sum(v["n"] + v["n_empty"] for v in r["by_qtype"].values()) == n and set(r["by_qtype"]) <= {
            "Q1", "Q2", "Q3", "Q4"}
        for section in ("by_tier", "by_gt_definition"):
            assert all(v["n"] + v["n_empty"] == n for v in r[section].values()), (name, section)
        assert r["triplets"]["all"]["n"] + r["triplets"]["all"]["n_incomplete"] == n
    sig = [s for s in doc["significance"] if "run" in s]
    assert sig and all(s["n"] == n for s in sig)
    # per-horizon groups below the bootstrap minimum get no p-value, shown as such
    small = [h for h, v in sig[0]["by_horizon"].items() if v["n"] < MIN_BOOTSTRAP_N]
    assert small and all(sig[0]["by_horizon"][h]["p_value"] is None for h in small)
    assert "n too small" in (out / "significance.md").read_text()
    assert "never depends on the corpus row order" in doc["tables"]["significance"]["caption"]
    for name, t in doc["tables"].items():
        if name != "multi_object":
            assert f"n = {n:,} queries" in t["caption"] and "test split, fair queries" in t["caption"], name
    assert "Population: test split" in (out / "report.md").read_text()
    # the nDCG mean is over the population too
    run = all_runs[0]["persistence"].select(pop_ids)
    from eval.metrics import mean_valid, ndcg_at_k
    assert doc["runs"]["persistence"]["main"]["nDCG@10"] == pytest.approx(mean_valid(ndcg_at_k(run.ranked, 10))[0])


@pytest.mark.slow
def test_population_options_and_refusals(synth_dir, synth_bench, all_runs, tmp_path):
    runs, paths = all_runs
    runner = CliRunner()
    res = runner.invoke(app, ["score", "--data", str(synth_dir), "--run", str(paths["persistence"]), "--out",
                              str(tmp_path / "train"), "--split", "train", "--no-fair", "--qtypes", "Q2"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "train" / "report.json").read_text())
    main = doc["runs"]["persistence"]["main"]
    labels = QueryLabels.from_benchmark(synth_bench, synth_bench.query_ids)
    in_pop = (labels.split == "train") & (labels.qtype == "Q2")
    assert main["n"] + main["n_empty"] == in_pop.sum() and main["n_empty"] == (in_pop & ~labels.fair).sum() > 0
    # a run that holds none of the population, and an empty run, are errors
    train_only = runs["persistence"].select([q for q, s in zip(labels.query_ids, labels.split, strict=True)
                                             if s == "train"])
    p = write_run(tmp_path / "train_only.parquet", train_only)
    res = runner.invoke(app, ["score", "--data", str(synth_dir), "--run", str(p), "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "holds no query of the population (test split" in " ".join(res.output.split())
    empty = runs["persistence"].select([])
    p = write_run(tmp_path / "empty.parquet", empty)
    res = runner.invoke(app, ["score", "--data", str(synth_dir), "--run", str(p), "--out", str(tmp_path / "y")])
    assert res.exit_code != 0 and "is empty (0 queries)" in res.output and not (tmp_path / "y").exists()
    with pytest.raises(InputError, match="holds no query"):
        evaluate_run(empty, QueryLabels.from_benchmark(synth_bench, []), population=Population())
    # a run lacking part of the population is refused, unless --intersect
    pop_ids = Population().query_ids(synth_bench)
    part = runs["oracle"].select([q for q in runs["oracle"].query_ids if q not in set(pop_ids[:5])])
    part.name = "oracle-part"
    pp = write_run(tmp_path / "part.parquet", part)
    res = runner.invoke(app, ["report", str(pp), str(paths["persistence"]), "--data", str(synth_dir), "--out",
                              str(tmp_path / "z")])
    assert res.exit_code != 0 and "lacks 5 of the" in res.output
    res = runner.invoke(app, ["report", str(pp), str(paths["persistence"]), "--data", str(synth_dir), "--out",
                              str(tmp_path / "z"), "--intersect"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "z" / "report.json").read_text())
    assert {r["main"]["n"] for r in doc["runs"].values()} == {len(pop_ids) - 5}
    assert any("--intersect" in note for note in doc["notes"])


def test_q5_joint_metric_is_the_product_and_has_its_own_table(synth_dir, synth_bench, all_runs, tmp_path):
    runs, paths = all_runs
    groups, left = multi_object_groups(synth_bench, Population())
    labels = QueryLabels.from_benchmark(synth_bench, synth_bench.query_ids)
    assert groups and all(len(m) >= 2 for m in groups.values())
    assert all(labels.split[synth_bench.query_index[q]] == "test" for m in groups.values() for q in m)
    res = evaluate_groups(runs["persistence"], groups, ks=(1, 5))
    st = RankStats.from_run(runs["persistence"], "type2-all")
    idx = {q: i for i, q in enumerate(runs["persistence"].query_ids)}
    hit = recall_at_k(st, 5)
    joint = [np.prod([hit[idx[q]] for q in m]) for m in groups.values()]
    assert res["joint"]["R@5"] == pytest.approx(np.mean(joint)) and res["n_groups"] == len(groups)
    assert res["per_object"]["R@5"] == pytest.approx(np.mean([hit[idx[q]] for m in groups.values() for q in m]))
    assert res["joint"]["R@5"] <= res["per_object"]["R@5"]
    # the true-state oracle ties only with its own state's segments: every member is a hit within the top 50
    assert evaluate_groups(runs["oracle"], groups)["joint"]["R@50"] == pytest.approx(1.0)
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", str(paths["oracle"]), str(paths["persistence"]), "--data", str(synth_dir),
                                 "--out", str(out), "--resamples", "200"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "report.json").read_text())
    assert doc["multi_object"]["persistence"]["joint"]["R@5"] == pytest.approx(res["joint"]["R@5"])
    t = doc["tables"]["multi_object"]
    assert "Q5" in t["caption"] and "product" in t["caption"] and "joint R@5" in t["columns"]
    # Q5 stays out of the main pool: no Q5 column in the question-type table
    assert not any("Q5" in c for c in doc["tables"]["by_qtype"]["columns"])


@pytest.mark.parametrize("members", [[(0, 2, 1), (1, 1, 2)], [(0, 3, 2), (2, 2, 1), (0, 1, 1)]])
def test_joint_expectation_equals_enumeration_of_tie_orders(members):
    """Members rank independently: averaging 'all hit' over every combination of their tie orders is the product."""
    a, n, t = (np.array(x) for x in zip(*members, strict=True))
    st = {"n_pos": t, "n_above": a, "n_tie_neg": n, "n_tie_pos": t, "n_tie_neg_first": np.zeros_like(a),
          "best": np.zeros(len(a), np.float32)}
    ids = [f"q{i}" for i in range(len(a))]
    run = Run("m", {}, ids, [[""]] * len(a), np.full((len(a), 1), -np.inf), {"type2-all": st}, "toy")
    res = evaluate_groups(run, {"g": ids}, ks=(1, 2, 3))
    for k in (1, 2, 3):
        orders = [[a_i + min(pos) for pos in itertools.combinations(range(1, n_i + t_i + 1), t_i)]
                  for a_i, n_i, t_i in zip(a, n, t, strict=True)]
        all_hit = [all(r <= k for r in combo) for combo in itertools.product(*orders)]
        assert res["joint"][f"R@{k}"] == pytest.approx(np.mean(all_hit), abs=1e-12)


def test_triplets_count_missed_queries_as_failures(synth_bench, all_runs):
    runs, _ = all_runs
    pop = Population()
    ids = pop.query_ids(synth_bench)
    plain, missed = runs["persistence"].select(ids), runs["persistence-missed"].select(ids)
    lab = QueryLabels.from_benchmark(synth_bench, ids)
    a = evaluate_run(plain, lab, population=pop)["triplets"]["all"]
    b = evaluate_run(missed, lab, population=pop)["triplets"]["all"]
    comp_missed = missed.missed & np.isfinite(plain.stats["type1-all"]["best"]) & np.isfinite(
        plain.stats["triplet_temporal"]["best"]) & np.isfinite(plain.stats["triplet_semantic"]["best"])
    assert b["n"] == a["n"] and b["n_missed"] == comp_missed.sum() > 0
    from eval.triplets import TripletScores, per_query_triplets
    per = per_query_triplets(TripletScores.from_run(plain))
    keep = np.isfinite(per["acc_tri"]) & ~missed.missed
    assert b["acc_tri"] == pytest.approx(per["acc_tri"][keep].sum() / a["n"])
    shares = sum(v["share"] for v in b["orders"].values())
    assert shares == pytest.approx(1.0) and b["orders"]["missed"]["share"] == pytest.approx(b["n_missed"] / b["n"])


def test_an_extra_gt_definition_is_scored_and_reported(synth_bench, monkeypatch, tmp_path):
    """GT definitions are data: adding one to the mapping (as the synthetic benchmark's sim-exact will) is enough
    for scoring, the evaluator and the reports."""
    from eval.schema import GT_DEFINITION_FIELDS

    monkeypatch.setitem(GT_DEFINITION_FIELDS, "sim-exact", ("gt_type1",))
    rows, oracle, _ = oracle_and_pixels(synth_bench)
    run = score_benchmark(synth_bench, oracle, rows, method="oracle", progress=False)
    assert "sim-exact" in run.pools
    for f in ("n_pos", "n_above", "n_tie_neg", "n_tie_pos"):
        np.testing.assert_array_equal(run.stats["sim-exact"][f], run.stats["type1-all"][f])
    rep = build_report([run], synth_bench, tmp_path / "r", ReportConfig())
    assert "sim-exact" in rep.runs["oracle"].by_gt_definition
    table = next(t for t in render_tables(rep) if t.name == "by_gt_definition")
    assert any(c.startswith("sim-exact") for c in table.columns)


def test_significance_states_and_honours_the_tie_rule(synth_bench, all_runs, tmp_path):
    runs, _ = all_runs
    pop_ids = Population().query_ids(synth_bench)
    out = {}
    for tie in ("row", "expected"):
        cfg = ReportConfig(tie=tie, reference="oracle", n_resamples=200)
        doc = build_report([runs["oracle"], runs["persistence"]], synth_bench, tmp_path / tie, cfg).to_dict()
        s = next(x for x in doc["significance"] if x.get("run") == "persistence")
        out[tie] = s
        cap = doc["tables"]["significance"]["caption"]
        assert f"under the {tie!r} tie rule" in cap
    row, exp = out["row"]["mcnemar"], out["expected"]["mcnemar"]
    assert row["method"] == "exact" and "exact binomial test on the 0/1 hits of the 'row' tie-break" in \
        json.loads((tmp_path / "row" / "report.json").read_text())["tables"]["significance"]["caption"]
    # the expected-hit counts are the mean of the row counts over tie orders, not the row counts themselves
    st = RankStats.from_run(runs["persistence"].select(pop_ids), "type2-all")
    ref = RankStats.from_run(runs["oracle"].select(pop_ids), "type2-all")
    d = recall_at_k(st, 5) - recall_at_k(ref, 5)
    assert exp["b"] == pytest.approx(np.maximum(d, 0).sum()) and exp["c"] == pytest.approx(np.maximum(-d, 0).sum())
