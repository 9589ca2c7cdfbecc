"""Stratified evaluation, triplet diagnostics, reports and the `score` / `report` commands on the synthetic benchmark."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from eval_sources import oracle_and_pixels
from typer.testing import CliRunner

from eval.cli import app
from eval.evaluate import QueryLabels, evaluate_run
from eval.metrics import RankStats, recall_at_k
from eval.report import group_entries
from eval.runs import seed_group, write_run
from eval.scoring import RandomSource, score_benchmark
from eval.triplets import ORDERS, TripletScores, order_probabilities, per_query_triplets, triplet_summary


# ---------------------------------------------------------------- triplets
def test_triplet_ties_equal_enumeration():
    vals = [0.0, 1.0, 2.0]
    cases = list(itertools.product(vals, repeat=3))
    ts = TripletScores(*(np.array([c[i] for c in cases]) for i in range(3)))
    probs = order_probabilities(ts)
    per = per_query_triplets(ts)
    for row, (m, t, s) in enumerate(cases):
        score = {"main": m, "temp": t, "sem": s}
        # enumerate the 6 orders of the three items with random tie-breaking: sort by (-score, random key)
        counts = dict.fromkeys(ORDERS, 0)
        for keys in itertools.permutations(range(3)):
            key = dict(zip(("main", "temp", "sem"), keys, strict=True))
            counts[tuple(sorted(score, key=lambda c: (-score[c], key[c])))] += 1
        expect = np.array([counts[o] / 6 for o in ORDERS])
        np.testing.assert_allclose(probs[row], expect, atol=1e-12)
        assert per["acc_tri"][row] == pytest.approx(sum(counts[o] for o in ORDERS if o[0] == "main") / 6)
        assert per["acc_temp"][row] == pytest.approx(
            sum(counts[o] for o in ORDERS if o.index("main") < o.index("temp")) / 6)


def test_triplet_summary_counts_incomplete():
    ts = TripletScores(np.array([3.0, 1.0, np.nan]), np.array([1.0, 2.0, 1.0]), np.array([2.0, 0.0, 0.0]))
    s = triplet_summary(ts)
    assert (s["n"], s["n_incomplete"]) == (2, 1)
    assert s["acc_temp"] == 0.5 and s["acc_sem"] == 1.0 and s["acc_tri"] == 0.5
    assert s["orders"]["main > sem > temp"]["count"] == 1 and s["orders"]["temp > main > sem"]["count"] == 1


# ---------------------------------------------------------------- seed groups
def test_seed_grouping_rule():
    assert seed_group("lftr-fusion-seed3") == ("lftr-fusion", 3)
    assert seed_group("lftr_fusion.seed=12") == ("lftr_fusion", 12)
    assert seed_group("m3") == ("m3", None) and seed_group("seed3") == ("seed3", None)
    entries = group_entries(["m3", "lftr-seed1", "lftr-seed0", "oracle-seed0", "lftr-seed2"])
    assert [e.label for e in entries] == ["m3", "lftr (3 seeds)", "oracle-seed0"]
    assert entries[1].names == ["lftr-seed0", "lftr-seed1", "lftr-seed2"] and entries[1].seeds == [0, 1, 2]


# ---------------------------------------------------------------- runs on the synthetic benchmark
@pytest.fixture(scope="module")
def synth_runs(synth_bench, tmp_path_factory):
    bench = synth_bench
    rows, oracle, pixels = oracle_and_pixels(bench)
    runs = [score_benchmark(bench, oracle, rows, method="oracle", config={"space": "state one-hot"}, progress=False),
            score_benchmark(bench, pixels, rows, method="persistence", config={"space": "pixels"}, progress=False)]
    for s in range(3):
        r = score_benchmark(bench, RandomSource(len(rows), len(bench.corpus_ids), seed=s), rows, method="random",
                            config={"seed": s}, progress=False)
        r.name = f"random-seed{s}"
        runs.append(r)
    d = tmp_path_factory.mktemp("runs")
    paths = [write_run(d / f"{r.name}.parquet", r) for r in runs]
    return runs, paths


def test_evaluate_strata_are_consistent(synth_bench, synth_runs):
    runs, _ = synth_runs
    pix = runs[1]
    labels = QueryLabels.from_benchmark(synth_bench, pix.query_ids)
    res = evaluate_run(pix, labels)
    main = res["main"]
    r5 = recall_at_k(RankStats.from_run(pix, "type2-all"), 5)
    assert main["R@5"] == pytest.approx(np.nanmean(r5)) and main["n"] == np.isfinite(r5).sum()
    for section in ("by_horizon", "by_qtype", "by_domain"):
        assert sum(v["n"] for v in res[section].values()) == main["n"]
        weighted = sum(v["R@5"] * v["n"] for v in res[section].values()) / main["n"]
        assert weighted == pytest.approx(main["R@5"])
    per_h = [res["by_horizon"][h]["R@5"] for h in res["by_horizon"]]
    assert main["macro"] == pytest.approx(np.mean(per_h))
    assert set(res["by_tier"]) == {"in_video", "in_dataset", "cross_dataset", "bge_similar"}
    assert set(res["by_gt_definition"]) == {"type2-all", "type2-consensus", "type1-all", "sim-exact"}
    assert res["by_gt_definition"]["type2-all"]["R@5"] == main["R@5"]
    assert res["triplets"]["all"]["n"] + res["triplets"]["all"]["n_incomplete"] == pix.n
    # the oracle: nothing ranks above a main-pool positive, only the target state's other (unmined) segments tie
    # with it, so its R@k is the tie-aware chance of a pool member among them; its semantic negatives share the
    # target state, so they tie too
    o = evaluate_run(runs[0], QueryLabels.from_benchmark(synth_bench, runs[0].query_ids))
    assert 0.5 < o["main"]["R@5"] <= o["main"]["R@50"] == 1.0
    assert o["triplets"]["all"]["acc_temp"] == 1.0 and o["triplets"]["all"]["acc_sem"] == 0.5


def test_report_command_writes_every_table_and_plot(synth_dir, synth_runs, tmp_path):
    runs, paths = synth_runs
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", *map(str, paths), "--data", str(synth_dir), "--out", str(out),
                                   "--reference", "persistence", "--resamples", "500"])
    assert res.exit_code == 0, res.output
    for name in ("main", "by_horizon", "by_qtype", "by_tier", "by_gt_definition", "by_domain", "triplets",
                 "significance"):
        for ext in ("md", "csv", "tex"):
            assert (out / f"{name}.{ext}").stat().st_size > 0, f"{name}.{ext}"
    for png in ("r5_by_horizon.png", "tiers.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "report.json").read_text())
    assert [e["label"] for e in doc["entries"]] == ["oracle", "persistence", "random (3 seeds)"]
    main_md = (out / "main.md").read_text()
    assert "random (3 seeds)" in main_md and "±" in main_md
    # the seed group's cell is the mean of its seeds
    r5 = [doc["runs"][f"random-seed{s}"]["main"]["R@5"] for s in range(3)]
    row = next(r for r in doc["tables"]["main"]["rows"] if r[0] == "random (3 seeds)")
    assert row[2] == f"{100 * np.mean(r5):.2f}±{100 * np.std(r5, ddof=1):.2f}"
    sig = {s["run"]: s for s in doc["significance"] if "run" in s}
    assert set(sig) == {"oracle", "random-seed0", "random-seed1", "random-seed2"}
    o = sig["oracle"]
    assert o["bootstrap"]["delta"] == pytest.approx(doc["runs"]["oracle"]["main"]["R@5"]
                                                    - doc["runs"]["persistence"]["main"]["R@5"])
    assert o["bootstrap"]["p_value"] < 0.01 and o["mcnemar"]["c"] < 0.1 * o["mcnemar"]["b"]  # (tie-aware counts)
    assert r"\toprule" in (out / "by_horizon.tex").read_text()
    assert json.loads((out / "report_config.json").read_text())["reference"] == "persistence"
    # one terminal line per note, naming the run; report.md keeps the full note
    notes = [line for line in res.output.splitlines() if line.startswith("note:")]
    assert len(notes) == len(doc["notes"]) and all("outside the population, left out" in n for n in notes)
    assert all(f"> note: {n}" in (out / "report.md").read_text() for n in doc["notes"])


def test_report_plots_hold_the_report_numbers(synth_dir, synth_runs, tmp_path):
    """The forest plot, triplet order shares and horizon shares are written, linked from report.md, and their
    sidecar JSON holds report.json's numbers."""
    _, paths = synth_runs
    out = tmp_path / "report"
    card = {"values": {f"h{h}_share": h / 15 for h in range(1, 6)}}
    (tmp_path / "card.json").write_text(json.dumps(card))
    res = CliRunner().invoke(app, ["report", *map(str, paths), "--data", str(synth_dir), "--out", str(out),
                                   "--reference", "persistence", "--resamples", "200", "--card",
                                   str(tmp_path / "card.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    for name in ("deltas_by_horizon", "triplet_orders", "horizon_shares"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name}.png)" in md and f"]({name}.json)" in md
    deltas = json.loads((out / "deltas_by_horizon.json").read_text())
    sig = [s for s in doc["significance"] if "run" in s]
    assert [d["run"] for d in deltas] == [s["run"] for s in sig]
    for d, s in zip(deltas, sig, strict=True):
        assert d["delta"] == [s["by_horizon"][str(h)]["delta"] for h in d["horizon"]]
        assert d["ci_low"] == [s["by_horizon"][str(h)]["ci_low"] for h in d["horizon"]]
    shares = {o["label"]: o for o in json.loads((out / "triplet_orders.json").read_text())}
    orders = doc["runs"]["oracle"]["triplets"]["all"]["orders"]
    assert shares["oracle"]["shares"] == [orders[o]["share"] for o in shares["oracle"]["orders"]]
    mix = json.loads((out / "horizon_shares.json").read_text())
    n = [doc["runs"]["oracle"]["by_horizon"].get(str(h), {"n": 0})["n"] for h in mix["horizon"]]
    assert mix["population"] == pytest.approx([x / sum(n) for x in n])
    assert mix["card"] == [card["values"][f"h{h}_share"] for h in mix["horizon"]]
    from cli_run import run_cli

    res = run_cli("eval", "report", paths[0], "--data", synth_dir, "--out", tmp_path / "bad", "--card",
                  tmp_path / "nope.json")
    assert res.code == 2 and "--card" in res.err and "nope.json" in res.err and "Traceback" not in res.err


@pytest.mark.slow
def test_report_pair_tests_equal_the_reference_tests(synth_dir, synth_runs, tmp_path):
    """`--pair A:B` runs the reference test between two other runs: with B as --reference the numbers are identical;
    swapping the pair negates the delta; an unknown run name is a clear error."""
    _, paths = synth_runs
    args = [*map(str, paths), "--data", str(synth_dir), "--resamples", "500"]
    runner = CliRunner()
    res = runner.invoke(app, ["report", *args, "--out", str(tmp_path / "a"), "--reference", "random-seed1",
                              "--pair", "oracle:persistence", "--pair", "persistence:oracle"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", *args, "--out", str(tmp_path / "b"), "--reference", "persistence"])
    assert res.exit_code == 0, res.output
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in "ab")
    fwd, back = a["pairs"]
    direct = next(s for s in b["significance"] if s.get("run") == "oracle")
    assert (fwd["run"], fwd["reference"]) == ("oracle", "persistence")
    assert fwd["bootstrap"] == direct["bootstrap"] and fwd["mcnemar"] == direct["mcnemar"]
    assert back["bootstrap"]["delta"] == pytest.approx(-fwd["bootstrap"]["delta"])
    assert (back["mcnemar"]["b"], back["mcnemar"]["c"]) == (fwd["mcnemar"]["c"], fwd["mcnemar"]["b"])
    assert "oracle" in (tmp_path / "a" / "pairs.md").read_text()
    assert all(s["reference"] == "random-seed1" for s in a["significance"] if "run" in s)
    from cli_run import run_cli

    res = run_cli("eval", "report", *paths, "--data", synth_dir, "--out", tmp_path / "c", "--pair", "oracle:nope")
    assert res.code == 2 and "'nope'" in res.err and "Traceback" not in res.err
    res = run_cli("eval", "report", *paths, "--data", synth_dir, "--out", tmp_path / "d", "--pair", "oracle")
    assert res.code == 2 and "RUN:AGAINST" in res.err


@pytest.mark.slow
def test_report_pairs_two_seed_groups_by_their_seed_means(synth_dir, synth_runs, tmp_path):
    """`--pair A:B` between two seed groups tests each query's hit averaged over their common seeds: its delta is the
    difference of the groups' mean R@5 over those seeds, the seeds are recorded, a paired t-test over the seeds'
    R@5 comes with it, and groups sharing no seed are an error."""
    runs, paths = synth_runs
    d = tmp_path / "runs"
    d.mkdir()
    mixed = []
    for s, r in enumerate([runs[0], runs[1], runs[4]]):  # oracle, persistence, random-seed2 as a group "mix"
        r2 = r.select(r.query_ids)
        r2.name = f"mix-seed{s}"
        mixed.append(write_run(d / f"{r2.name}.parquet", r2))
    for s, r in ((7, runs[2]), (8, runs[3])):  # a group of seeds the others lack
        r2 = r.select(r.query_ids)
        r2.name = f"far-seed{s}"
        mixed.append(write_run(d / f"{r2.name}.parquet", r2))
    args = [*map(str, [*paths[2:], *mixed]), "--data", str(synth_dir), "--resamples", "500"]
    runner = CliRunner()
    res = runner.invoke(app, ["report", *args, "--out", str(tmp_path / "a"), "--pair", "mix:random",
                              "--pair", "mix-seed1:random-seed1"])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "a" / "report.json").read_text())
    group, single = rep["pairs"]
    r5 = {n: v["main"]["R@5"] for n, v in rep["runs"].items()}
    want = np.mean([r5[f"mix-seed{s}"] for s in range(3)]) - np.mean([r5[f"random-seed{s}"] for s in range(3)])
    assert (group["run"], group["reference"], group["seeds"]) == ("mix", "random", [0, 1, 2])
    assert group["bootstrap"]["delta"] == pytest.approx(want, abs=1e-9)
    assert single["seeds"] == [] and single["bootstrap"]["delta"] == pytest.approx(
        r5["mix-seed1"] - r5["random-seed1"], abs=1e-9)
    assert group["bootstrap"]["p_value"] != single["bootstrap"]["p_value"]
    from eval.stats import paired_ttest

    want_t = paired_ttest({s: r5[f"mix-seed{s}"] for s in range(3)}, {s: r5[f"random-seed{s}"] for s in range(3)})
    assert group["ttest"]["seeds"] == [0, 1, 2] and group["ttest"]["df"] == 2
    assert group["ttest"]["delta"] == pytest.approx(want, abs=1e-9)
    assert group["ttest"]["p_value"] == pytest.approx(want_t.p_value, rel=1e-9)
    assert "ttest" not in single  # one run against one run: no seeds to test over
    pairs_md = (tmp_path / "a" / "pairs.md").read_text()
    assert "mean of seeds 0, 1, 2" in pairs_md and "paired t over seeds" in pairs_md
    assert f"{want_t.p_value:.2g}" in pairs_md
    from cli_run import run_cli

    res = run_cli("eval", "report", *args, "--out", tmp_path / "b", "--pair", "far:random")
    assert res.code == 2 and "share no seed" in res.err and "Traceback" not in res.err


def test_score_command_and_clear_errors(synth_dir, synth_runs, tmp_path):
    _, paths = synth_runs
    runner = CliRunner()
    res = runner.invoke(app, ["score", "--data", str(synth_dir), "--run", str(paths[1]), "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "R@5=" in res.output and (tmp_path / "s" / "by_tier.md").exists()
    assert not (tmp_path / "s" / "significance.md").exists()
    from cli_run import run_cli  # the entry point of python -m eval: one error line, exit code 2

    res = run_cli("eval", "report", paths[0], "--data", synth_dir, "--out", tmp_path / "r", "--reference", "nope")
    assert res.code == 2 and "reference 'nope'" in res.err and "Traceback" not in res.err
    bad = tmp_path / "bad.parquet"
    bad.write_text("garbage")
    res = run_cli("eval", "score", "--data", synth_dir, "--run", bad, "--out", tmp_path / "b")
    assert res.code == 2 and "bad.parquet" in res.err and "Traceback" not in res.err


def test_preset_page_shows_the_card_and_the_calibration_of_a_report(synth_dir, synth_bench, synth_runs, tmp_path):
    """`scripts/preset_page.py`: the build's card beside the paper and the calibration rows of a report over its
    runs (a row whose run is missing says so), naming its command; it never replaces a file it did not write."""
    import importlib.util

    _, paths = synth_runs
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", *map(str, paths), "--data", str(synth_dir), "--out", str(out),
                                   "--resamples", "200"])
    assert res.exit_code == 0, res.output
    spec = importlib.util.spec_from_file_location("_preset_page", Path(__file__).resolve().parents[2] / "scripts"
                                                  / "preset_page.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    page = tmp_path / "page.md"
    assert mod.main(["--data", str(synth_dir), "--report", str(out), "--out", str(page)]) == 0
    text = page.read_text()
    assert f"python scripts/preset_page.py --data {synth_dir}" in text and "preset `demo`, seed 0" in text
    from eval.card import make_card

    card = make_card(synth_dir).to_dict()
    assert f"| label_truth (`label_truth`) | >= 0.9 | {card['values']['label_truth']:.3g} |" in text.replace(
        "label truth (segments whose true state satisfies their canonical state)", "label_truth")
    assert "| random R@5 | <= 1 |" in text and "| perfect-perception LFTR R@5 |" in text
    assert "no run" in text and "`random-seed0`" in text
    assert "## Ceiling decomposition" not in text  # no --predictability
    foreign = tmp_path / "mine.md"
    foreign.write_text("my notes")
    with pytest.raises(SystemExit, match="not written by this script"):
        mod.main(["--data", str(synth_dir), "--report", str(out), "--out", str(foreign)])
    assert foreign.read_text() == "my notes"
    # --predictability: the world's ceilings after the semantic-text oracle, as shares of it
    bench = synth_bench
    rows, oracle, _ = oracle_and_pixels(bench)
    run = score_benchmark(bench, oracle, rows, method="oracle-semantic-text[minilm]", progress=False)
    report2 = tmp_path / "report2"
    res = CliRunner().invoke(app, ["report", str(write_run(tmp_path / "o.parquet", run)), "--data", str(synth_dir),
                                   "--out", str(report2), "--resamples", "200"])
    assert res.exit_code == 0, res.output
    pred = tmp_path / "predictability.json"
    pred.write_text(json.dumps({"queries": 10, "levels": [
        {"perturbation": "0.2:0.01", "pos_sd": 0.2, "vel_sd": 0.01, "kept": 0.5, "ceiling_r5": 1.0}]}))
    with pytest.raises(SystemExit, match="no such file"):
        mod.main(["--data", str(synth_dir), "--report", str(report2), "--out", str(page),
                  "--predictability", str(tmp_path / "none.json")])
    assert mod.main(["--data", str(synth_dir), "--report", str(report2), "--out", str(page),
                     "--predictability", str(pred)]) == 0
    text = page.read_text()
    assert "## Ceiling decomposition" in text and "(50% of answers kept) | `eval predictability 0.2:0.01` | 1.00 |" in text


# ---------------------------------------------------------------- the state-tie ceiling of the card

def test_state_tie_ceiling_is_exact_and_the_true_state_oracle_scores_it(synth_bench):
    """`eval.card.state_tie_ceiling`: per query, the hit@5 of every segment of the target state ranked first in a
    random order, counted by enumeration where the state is small; and the one-hot true-state oracle, scored by the
    streaming scorer with expected ties, gets exactly that R@5 on every fair test query (the main pools here are
    subsets of the target state), so the card's per-horizon ceiling is the oracle's per-horizon R@5. The same for
    `present_tie_ceiling` and a one-hot oracle of the query's current state (persistence with perfect perception)."""
    from eval.card import make_card, present_tie_ceiling, state_tie_ceiling
    from eval.scoring import DenseSource
    from eval.segments import current_states

    bench = synth_bench
    rows, oracle, _ = oracle_and_pixels(bench, bench.query_rows("test", fair_only=True, qtypes=("Q1", "Q2", "Q3",
                                                                                                  "Q4")))
    hit, n_state = state_tie_ceiling(bench, rows)
    seg_state, seg_video = bench.corpus_ds["state_id"][:], bench.corpus_ds["video_id"][:]
    index = bench.corpus_index
    enumerated = 0
    for i, q in enumerate(bench.queries_ds.select(rows)):
        state = [r for r, (s, v) in enumerate(zip(seg_state, seg_video, strict=True))
                 if s == q["target_state_id"] and v != q["video_id"]]
        assert n_state[i] == len(state)
        pos = {index[c] for c in (*q["gt_pools"]["in_dataset"], *q["gt_pools"]["cross_dataset"])}
        assert pos <= set(state)  # every main-pool positive carries the target state
        if len(state) <= 11:  # all first-five sets of a random order of the state's segments, equally likely
            firsts = list(itertools.combinations(state, min(5, len(state))))
            assert hit[i] == pytest.approx(sum(bool(pos & set(f)) for f in firsts) / len(firsts), abs=1e-12)
            enumerated += 1
    assert enumerated >= 10 and 0 < hit.mean() < 1 and len(set(np.round(hit, 6))) > 3
    run = score_benchmark(bench, oracle, rows, method="oracle-semantic-text[minilm]", progress=False)
    got = dict(zip(run.query_ids, recall_at_k(RankStats.from_run(run, "type2-all"), 5), strict=True))
    qids = bench.queries_ds.select(rows)["id"]
    np.testing.assert_allclose([got[q] for q in qids], hit, rtol=0, atol=1e-12)
    # persistence with perfect perception: the current state's segments tied first, scored the same way
    current = current_states(bench)[rows]
    present = present_tie_ceiling(bench, rows)
    same = current == np.array([bench.state_index[s] for s in bench.queries_ds.select(rows)["target_state_id"]])
    np.testing.assert_allclose(present[same], hit[same], rtol=0, atol=1e-12)
    assert 0 < same.sum() < len(rows) and (present[~same] == 0).all() and (present[current < 0] == 0).all()
    eye = np.eye(len(bench.state_ids), dtype=np.float32)
    known = rows[current >= 0]
    persistence = DenseSource(eye[current[current >= 0]], eye, item_rows=bench.segment_state_rows)
    run = score_benchmark(bench, persistence, known, method="persistence[perfect]", progress=False)
    scored = recall_at_k(RankStats.from_run(run, "type2-all"), 5)
    # where the tied state has fewer than 5 segments, the scorer's random tail may reach a positive: the card's value
    # is then the lower bound its docstring says
    ids = np.asarray(bench.state_ids, dtype=object)
    m = state_tie_ceiling(bench, known, 5, ids[current[current >= 0]].astype(str))[1]
    np.testing.assert_allclose(scored[m >= 5], present[current >= 0][m >= 5], rtol=0, atol=1e-12)
    assert (scored[m < 5] >= present[current >= 0][m < 5] - 1e-12).all() and (m >= 5).sum() > 50
    card = make_card(bench.root).to_dict()
    assert card["values"]["state_tie_ceiling_r5_pct"] == pytest.approx(100 * hit.mean(), abs=1e-9)
    assert card["values"]["present_state_tie_ceiling_r5_pct"] == pytest.approx(100 * present.mean(), abs=1e-9)
    horizon = np.minimum(np.asarray(bench.queries_ds.select(rows)["horizon"]), 5)
    by_h = card["state_tie_ceiling"]["by_horizon"]
    assert set(by_h) == {str(h) for h in np.unique(horizon)}
    for h, v in by_h.items():
        assert v["r5_pct"] == pytest.approx(100 * hit[horizon == int(h)].mean(), abs=1e-9)
        assert v["n"] == int((horizon == int(h)).sum())
        assert v["state_segments_median"] == float(np.median(n_state[horizon == int(h)]))
        assert v["present_r5_pct"] == pytest.approx(100 * present[horizon == int(h)].mean(), abs=1e-9)
