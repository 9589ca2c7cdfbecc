"""eval.findings: the calibration table and the findings are computed from report.json / card.json, with verdicts
that follow the numbers (crafted reports, so each verdict is known)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from eval import findings as F
from eval.cli import app


def _run(r5: float, by_h: dict[int, tuple[float, int]] | None = None) -> dict:
    hs = {str(h): {"R@5": v, "n": n} for h, (v, n) in (by_h or {}).items()}
    return {"main": {"R@5": r5}, "by_horizon": hs}


def _report(fusion=0.20, pixels=0.15, persistence=0.05, sig_p=0.001, far=(0.05, 0.10), perfect=0.30) -> dict:
    decl = {1: (0.30, 600), 2: (0.2, 200), 3: (far[0], 80), 4: (far[1], 30)}
    runs = {
        "random": _run(0.001), "lookup[minilm]": _run(0.08), "persistence[pixels]": _run(persistence),
        "independent-appearance[pixels]": _run(0.02),
        "semantic-text[minilm]": _run(0.60, {1: (0.62, 600), 2: (0.58, 200), 3: (0.60, 110)}),
        "paraphrase[minilm]": _run(0.30),
        "lftr[pixels]": _run(pixels, decl), "lftr[minilm]": _run(0.10, decl),
        "lftr-fusion[minilm+pixels]": _run(fusion, decl), "lftr-sim[minilm]": _run(perfect, decl),
        "transition-table[minilm]": _run(0.12),
    }
    sig = [{"run": n, "reference": "lftr-fusion[minilm+pixels]",
            "bootstrap": {"delta": -(fusion - runs[n]["main"]["R@5"]), "p_value": sig_p, "ci_low": -0.1,
                          "ci_high": -0.01},
            "mcnemar": {"p_value": sig_p}}
           for n in ("lookup[minilm]", "persistence[pixels]", "lftr[pixels]")]
    return {"runs": runs, "significance": sig}


def _verdicts(report: dict) -> dict[str, bool | None]:
    return {c.quantity: c.met for c in F.calibration(report)}


def test_every_target_met_on_a_calibrated_report():
    v = _verdicts(_report())
    assert set(v.values()) == {True}, v
    assert len(v) == 10


def test_each_miss_is_reported_with_its_number():
    v = _verdicts(_report(persistence=0.01))
    assert v["persistence from frames R@5"] is False and sum(x is False for x in v.values()) == 1
    checks = {c.quantity: c for c in F.calibration(_report(fusion=0.15, pixels=0.15))}
    assert checks["LFTR fusion R@5"].met is False and "+0.00 pp" in checks["LFTR fusion R@5"].measured
    assert _verdicts(_report(sig_p=0.02))["LFTR fusion R@5"] is False  # significant at 0.05 is not enough
    assert "MISSED" in F.calibration_markdown(F.calibration(_report(persistence=0.01)))


def test_the_fusion_checked_is_the_tested_one_not_the_first_by_name():
    """A many-space fusion whose name sorts first ("...[minilm+pixels+ssl]" < "...[minilm+pixels]") is not the one
    the fusion check, the ceiling row and the findings speak of: that is the reference of the significance tests."""
    rep = _report()
    rep["runs"]["lftr-fusion[minilm+pixels+ssl]"] = _run(0.25)
    assert sorted(F._find(rep, "fusion"))[0] == "lftr-fusion[minilm+pixels+ssl]"
    assert F.headline_fusion(rep) == "lftr-fusion[minilm+pixels]"
    check = next(c for c in F.calibration(rep) if c.quantity == "LFTR fusion R@5")
    assert "`lftr-fusion[minilm+pixels]`" in check.measured and check.met is True
    assert F.ceiling(rep)[-1][1] == "lftr-fusion[minilm+pixels]"
    assert "z-score fusion `lftr-fusion[minilm+pixels]`" in F.findings(rep)[0]
    rep["significance"] = []  # no tests: the fusion of the fewest spaces
    assert F.headline_fusion(rep) == "lftr-fusion[minilm+pixels]"


def test_ceiling_checks_and_decomposition():
    """Perfect perception must sit inside 30-70% of the oracle and frames reach 40% of it; the decomposition lists
    oracle -> perfect perception -> transition table -> best LFTR from frames -> fusion with shares of the oracle."""
    v = _verdicts(_report(perfect=0.10))  # 17% of the oracle's 60: the future is hardly visible
    assert v["perfect-perception LFTR R@5"] is False and v["best single LFTR from frames R@5"] is True
    v = _verdicts(_report(perfect=0.50))  # 83%: hardly uncertain, and frames reach only 30% of it
    assert v["perfect-perception LFTR R@5"] is False and v["best single LFTR from frames R@5"] is False
    rows = F.ceiling(_report())
    assert [r[1] for r in rows] == ["semantic-text[minilm]", "lftr-sim[minilm]", "transition-table[minilm]",
                                    "lftr[pixels]", "lftr-fusion[minilm+pixels]"]
    md = F.ceiling_markdown(_report())
    assert "| forecasting: perfect-perception LFTR | `lftr-sim[minilm]` | 30.00 | 50% |" in md
    # `eval predictability`'s ceilings go right after the oracle, as shares of it
    pred = {"levels": [{"perturbation": "0:0", "pos_sd": 0, "vel_sd": 0, "kept": 1.0, "ceiling_r5": 51.0},
                       {"perturbation": "0.2:0.01", "pos_sd": 0.2, "vel_sd": 0.01, "kept": 0.7, "ceiling_r5": 36.0}]}
    rows = F.ceiling(_report(), pred)
    assert [r[1] for r in rows][:4] == ["semantic-text[minilm]", "eval predictability 0:0",
                                        "eval predictability 0.2:0.01", "lftr-sim[minilm]"]
    md = F.ceiling_markdown(_report(), pred)
    assert "(70% of answers kept) | `eval predictability 0.2:0.01` | 36.00 | 60% |" in md


def test_the_state_classifier_from_the_exact_state_follows_perfect_perception_and_is_no_predictor_from_frames():
    rep = _report()
    rep["runs"]["state-classifier-sim[minilm]"] = _run(0.45)  # better than every predictor from frames
    rows = F.ceiling(rep)
    assert [r[1] for r in rows][:3] == ["semantic-text[minilm]", "lftr-sim[minilm]", "state-classifier-sim[minilm]"]
    assert ("| forecasting: a state classifier from the same exact state (not the paper's method) | "
            "`state-classifier-sim[minilm]` | 45.00 | 75% |") in F.ceiling_markdown(rep)
    best = [x for x in F.findings(rep) if "the best predictor from frames" in x]
    assert best and "`lftr-fusion[minilm+pixels]`" in best[0] and "state-classifier" not in best[0]
    rep["runs"]["state-classifier-ssl[minilm]"] = _run(0.05)  # one from frames is no perfect-perception row
    assert "state-classifier-ssl[minilm]" not in [r[1] for r in F.ceiling(rep)]


def test_lftr_through_the_perceiver_is_lftr_from_frames_beside_the_papers_heads():
    """`lftr-perceiver[...]` reads only frames (through a perceiver trained on another world): the frames check takes
    the better of it and the paper's heads and names which; the decomposition gives it its own row after the best
    paper head; it is judged over horizons and is no fusion input."""
    rep = _report()
    decl = {1: (0.30, 600), 3: (0.05, 80)}
    rep["runs"]["lftr-perceiver[minilm]"] = _run(0.14, decl)  # below lftr[pixels] 0.15: the paper's head is the best
    check = next(c for c in F.calibration(rep) if c.quantity == "best single LFTR from frames R@5")
    assert "`lftr[pixels]`" in check.measured and check.met is True
    rep["runs"]["lftr-perceiver[minilm]"] = _run(0.25, decl)  # 83% of perfect perception's 0.30
    check = next(c for c in F.calibration(rep) if c.quantity == "best single LFTR from frames R@5")
    assert "`lftr-perceiver[minilm]`" in check.measured and "83% of 30.0" in check.measured and check.met is True
    rows = F.ceiling(rep)
    assert [r[1] for r in rows] == ["semantic-text[minilm]", "lftr-sim[minilm]", "transition-table[minilm]",
                                    "lftr[pixels]", "lftr-perceiver[minilm]", "lftr-fusion[minilm+pixels]"]
    assert "supervised perceiver (not the paper's method)" in rows[4][0]
    decline = next(c for c in F.calibration(rep) if c.quantity == "learned heads over horizons")
    assert "`lftr-perceiver[minilm]` h1 30.0" in decline.measured
    rep["runs"]["lftr-perceiver[minilm]"] = _run(0.25, {1: (0.05, 600), 3: (0.30, 80)})  # rising: the check fails
    assert _verdicts(rep)["learned heads over horizons"] is False
    assert any("`lftr-perceiver[minilm]` R@5 by horizon" in x for x in F.findings(rep))
    assert "lftr-perceiver" not in F.headline_fusion(rep)


def test_card_targets_are_checked_by_name():
    card = {"values": {"label_truth": 0.95, "same_state_agreement": 0.55, "prefix_motion_share": 0.9,
                       "fair_test_queries": 2100, "chance_r5_pct": 0.2, "top_state_share": 0.02, "h1_share": 0.55,
                       "gap_median_s": 1.5}}
    checks = {c.quantity: c.met for c in F.card_checks(card)}
    by_key = {q.split("(`")[-1].removesuffix("`)"): m for q, m in checks.items() if "(`" in q}
    assert by_key["same_state_agreement"] is False and by_key["label_truth"] is True and len(by_key) == 8
    assert checks["GT precision of the main pool (measured)"] is False  # not reported
    del card["values"]["label_truth"]
    assert {c.quantity: c.met for c in F.card_checks(card)}[
        "label truth (segments whose true state satisfies their canonical state) (`label_truth`)"] is None


def test_decline_pools_the_far_horizons():
    # h4 alone (30 queries) above h1, but h >= 3 pooled (110 queries) below it: a decline
    c = {c.quantity: c for c in F.calibration(_report(far=(0.05, 0.40)))}["learned heads over horizons"]
    pooled = 100 * (0.05 * 80 + 0.40 * 30) / 110
    assert c.met is True and f"h3+ {pooled:.1f} (n 110" in c.measured
    assert _verdicts(_report(far=(0.35, 0.40)))["learned heads over horizons"] is False


def test_the_fusion_through_the_perceiver_is_judged_over_horizons():
    rep = _report()
    rep["runs"]["lftr-perceiver-fusion[minilm+pixels]"] = _run(0.22, {1: (0.30, 600), 3: (0.05, 80)})
    c = {c.quantity: c for c in F.calibration(rep)}["learned heads over horizons"]
    assert c.met is True and "`lftr-perceiver-fusion[minilm+pixels]` h1 30.0 -> h3+ 5.0" in c.measured
    rep["runs"]["lftr-perceiver-fusion[minilm+pixels]"] = _run(0.22, {1: (0.05, 600), 3: (0.30, 80)})
    assert _verdicts(rep)["learned heads over horizons"] is False


def test_missing_runs_are_not_measured_rather_than_met():
    rep = _report()
    del rep["runs"]["persistence[pixels]"], rep["runs"]["paraphrase[minilm]"]
    v = _verdicts(rep)
    assert v["persistence from frames R@5"] is None and v["paraphrase oracle (held-out phrasing) R@5"] is None


def test_findings_cli_prints_card_calibration_and_findings(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps(_report()))
    card = {"values": {"segments": 11043, "states": 2528}, "paper": {"segments": 218276, "states": 51362}}
    (tmp_path / "card.json").write_text(json.dumps(card))
    r = CliRunner().invoke(app, ["findings", str(tmp_path), "--card", str(tmp_path / "card.json"), "--calibration"])
    assert r.exit_code == 0, r.output
    assert "| states | 2,528 | 51,362 |" in r.output and "| met |" in r.output
    assert "fusion `lftr-fusion[minilm+pixels]` beats the better single space `lftr[pixels]`" in r.output



def _geometry(**eff: tuple[float, int]) -> dict:
    g = {"minilm": {"kind": "semantic", "items": 900, "dim": 384, "effective_dim": 20.0, "anisotropy": 0.6},
         "pixels": {"kind": "visual", "items": 9000, "dim": 576, "effective_dim": 2.0, "anisotropy": 0.1}}
    g.update({s: {"kind": "visual", "items": 9000, "dim": d, "effective_dim": e, "anisotropy": 0.1}
              for s, (e, d) in eff.items()})
    return g


def test_each_learned_visual_space_must_be_a_space():
    """Effective dimension >= 25% of the width and a state-prototype oracle at least the pixel space's: a collapsed
    space misses on either, the semantic space and the pixel space itself are not judged."""
    rep = _report()
    rep["runs"].update({"oracle-state-prototype[pixels]": _run(0.12), "oracle-state-prototype[ssl]": _run(0.20),
                        "oracle-state-prototype[lit]": _run(0.01)})
    checks = {c.quantity: c for c in F.calibration(rep, geometry=_geometry(ssl=(77.1, 96), lit=(200.0, 384)))}
    ssl, lit = checks["learned visual space `ssl` is a space"], checks["learned visual space `lit` is a space"]
    assert ssl.met is True and "77.1 of 96 (80%)" in ssl.measured and "20.00 vs 12.00 (pixels)" in ssl.measured
    assert lit.met is False and "1.00 vs 12.00" in lit.measured  # wide enough, but no state structure
    assert not any("minilm" in q or "`pixels`" in q for q in checks)
    narrow = {c.quantity: c.met for c in F.calibration(rep, geometry=_geometry(ssl=(5.5, 96)))}
    assert narrow["learned visual space `ssl` is a space"] is False  # collapsed: 5.5 of 96
    del rep["runs"]["oracle-state-prototype[ssl]"]
    unmeasured = {c.quantity: c for c in F.calibration(rep, geometry=_geometry(ssl=(77.1, 96)))}
    assert unmeasured["learned visual space `ssl` is a space"].met is None
    assert "no state-prototype run of ssl" in unmeasured["learned visual space `ssl` is a space"].measured
    assert not any(q.startswith("learned visual space") for q in _verdicts(rep))  # no geometry, no check


def test_a_space_aligned_to_a_text_model_is_told_what_that_model_spans():
    """A LiT space names the locked text model it maps into; when a semantic space of that model was measured, the
    check says what the text model spans over the states, and whether matching it could meet the width target. The
    verdict is the space's own either way."""
    rep = _report()
    rep["runs"].update({"oracle-state-prototype[pixels]": _run(0.12), "oracle-state-prototype[lit]": _run(0.01)})
    geo = _geometry(lit=(3.3, 384), ssl=(77.1, 96))
    geo["minilm"]["text_model"] = geo["lit"]["text_model"] = "packaged:all-MiniLM-L6-v2"
    checks = {c.quantity: c for c in F.calibration(rep, geometry=geo)}
    lit = checks["learned visual space `lit` is a space"]
    assert lit.met is False and "its locked text tower spans 20.0 over the states (`minilm`, 5% of 384)" in lit.measured
    assert "keeps it below the target" in lit.measured
    assert "text tower" not in checks["learned visual space `ssl` is a space"].measured  # no text model: no reach
    geo["minilm"]["text_model"] = "another-model"  # not the model the space maps into: nothing to say
    assert "text tower" not in {c.quantity: c for c in F.calibration(rep, geometry=geo)}[
        "learned visual space `lit` is a space"].measured
    geo["minilm"].update(text_model="packaged:all-MiniLM-L6-v2", effective_dim=200.0)
    wide = {c.quantity: c for c in F.calibration(rep, geometry=geo)}["learned visual space `lit` is a space"]
    assert "keeps it within the target" in wide.measured and wide.met is False


def test_findings_cli_reads_the_geometry_and_names_a_file_without_it(tmp_path):
    rep = _report()
    rep["runs"].update({"oracle-state-prototype[pixels]": _run(0.12), "oracle-state-prototype[ssl]": _run(0.02)})
    (tmp_path / "report.json").write_text(json.dumps(rep))
    comp = tmp_path / "complementarity.json"
    comp.write_text(json.dumps({"recall": {}, "geometry": _geometry(ssl=(70.0, 96))}))
    r = CliRunner().invoke(app, ["findings", str(tmp_path), "--calibration", "--complementarity", str(comp)])
    assert r.exit_code == 0, r.output
    assert "| learned visual space `ssl` is a space |" in r.output and "2.00 vs 12.00 (pixels) | MISSED |" in r.output
    comp.write_text(json.dumps({"recall": {}}))
    r = CliRunner().invoke(app, ["findings", str(tmp_path), "--calibration", "--complementarity", str(comp)])
    assert r.exit_code != 0 and "no 'geometry' of the spaces" in r.output and str(comp) in r.output


def _pair(run: str, ref: str, delta: float, p: float) -> dict:
    return {"run": run, "reference": ref, "n": 500, "bootstrap": {"delta": delta, "p_value": p, "ci_low": delta - 0.01,
                                                                  "ci_high": delta + 0.01},
            "mcnemar": {"p_value": p}}


def test_pair_tests_and_the_zero_shot_oracle_become_findings():
    """A `--pair` test says whether a learned visual space beats pixels significantly; a second semantic-text oracle
    (a text -> image space) is reported as zero-shot retrieval."""
    rep = _report()
    rep["runs"]["lftr[ssl]"] = _run(0.25)
    rep["runs"]["semantic-text[lit]"] = _run(0.33)
    rep["pairs"] = [_pair("lftr[ssl]", "lftr[pixels]", 0.10, 0.001), _pair("lftr[minilm]", "lftr[pixels]", -0.05, 0.2)]
    lines = F.findings(rep)
    win = next(x for x in lines if x.startswith("- `lftr[ssl]`"))
    assert "beats `lftr[pixels]` significantly" in win and "R@5 25.0 vs 15.0" in win and "Δ +10.0 pp" in win
    loss = next(x for x in lines if x.startswith("- `lftr[minilm]` does"))
    assert "does not beat `lftr[pixels]` significantly" in loss
    # significant at 0.05 only is not a win
    rep["pairs"] = [_pair("lftr[ssl]", "lftr[pixels]", 0.10, 0.03)]
    assert any("`lftr[ssl]` does not beat" in x for x in F.findings(rep))
    zs = next(x for x in lines if "Zero-shot" in x)
    assert "`semantic-text[lit]`" in zs and "R@5 33.0" in zs and "`semantic-text[minilm]` 60.0" in zs


def test_the_state_tie_ceiling_joins_the_oracle_check_the_decomposition_and_the_horizon_findings():
    """A card with `eval.card.state_tie_ceiling` puts it beside the semantic-text oracle's horizons (the verdict still
    follows the oracle), first in the decomposition (shares stay shares of the oracle), and divides the learned
    heads' R@5 of each horizon by it."""
    card = {"values": {"state_tie_ceiling_r5_pct": 55.0, "present_state_tie_ceiling_r5_pct": 6.5},
            "state_tie_ceiling": {"k": 5, "r5_pct": 55.0, "by_horizon": {
                "1": {"r5_pct": 50.0, "n": 600, "state_segments_median": 40.0},
                "2": {"r5_pct": 40.0, "n": 200, "state_segments_median": 60.0},
                "3": {"r5_pct": 80.0, "n": 80, "state_segments_median": 9.0},
                "4": {"r5_pct": 0.0, "n": 30, "state_segments_median": 0.0}}}}
    rep = _report()
    oracle = next(c for c in F.calibration(rep, card) if c.quantity == "semantic-text oracle R@5")
    assert "state-tie ceiling (`eval card`" in oracle.measured and "h1-h5 50 / 40 / 80 / 0" in oracle.measured
    assert "median segments of the target state 40 / 60 / 9 / 0" in oracle.measured
    assert oracle.met is next(c for c in F.calibration(rep) if c.quantity == oracle.quantity).met is True
    persistence = next(c for c in F.calibration(rep, card) if c.quantity == "persistence from frames R@5")
    assert persistence.measured == ("5.00 (`persistence[pixels]`); with the present's canonical state known (`eval "
                                    "card`: persistence with perfect perception) 6.50") and persistence.met is True
    rows = F.ceiling(rep, None, card)
    assert [r[1] for r in rows] == ["eval card", "semantic-text[minilm]", "lftr-sim[minilm]",
                                    "transition-table[minilm]", "eval card", "lftr[pixels]",
                                    "lftr-fusion[minilm+pixels]"]
    assert rows[0][2] == 55.0 and rows[4][2] == 6.5 and "persistence with perfect perception" in rows[4][0]
    md = F.ceiling_markdown(rep, None, card)
    assert "| `eval card` | 55.00 | 92% |" in md and "| `semantic-text[minilm]` | 60.00 | 100% |" in md
    lines = [x for x in F.findings(rep, card) if "share of the state-tie ceiling" in x]
    # lftr-sim 30 / 20 / 5 at h1-h3 (h4's ceiling is 0: left out); best single lftr[pixels] and the fusion likewise
    assert lines[0] == ("- `lftr-sim[minilm]` R@5 as a share of the state-tie ceiling of each horizon: h1 60% → h2 50% "
                        "→ h3 6%.")
    assert [x.split("`")[1] for x in lines] == ["lftr-sim[minilm]", "lftr[pixels]", "lftr-fusion[minilm+pixels]"]
    assert not [x for x in F.findings(rep) if "state-tie" in x] and F.ceiling(rep) == F.ceiling(rep, None, {})


def test_the_fusion_through_the_perceiver_is_judged_on_the_seed_means():
    """The fusion through the perceiver is checked against the best single LFTR from frames of either route; the test
    of the seed means (`--pair GROUP:GROUP`) decides where the report holds it, and every test found is shown."""
    rep = _report(fusion=0.12, pixels=0.10)  # the headline fusion is below the perceiver's single head
    for s, (single, fused) in enumerate(((0.14, 0.16), (0.15, 0.18), (0.16, 0.20))):
        rep["runs"][f"lftr-perceiver[minilm]-seed{s}"] = _run(single)
        rep["runs"][f"lftr-perceiver-fusion[minilm+pixels]-seed{s}"] = _run(fused)
    rep["entries"] = [{"names": [n]} for n in rep["runs"] if "seed" not in n] + [
        {"names": [f"{g}-seed{s}" for s in range(3)]}
        for g in ("lftr-perceiver[minilm]", "lftr-perceiver-fusion[minilm+pixels]")]

    def test(run, ref, p, seeds=()):
        t = {"run": run, "reference": ref, "n": 900, "seeds": list(seeds), "bootstrap": {
            "delta": 0.03, "p_value": p, "ci_low": 0.01, "ci_high": 0.05}, "mcnemar": {"p_value": p}}
        if seeds:
            t["ttest"] = {"delta": 0.03, "t": 3.1, "df": len(seeds) - 1, "p_value": 0.09, "seeds": list(seeds)}
        return t

    rep["pairs"] = [test("lftr-perceiver-fusion[minilm+pixels]-seed0", "lftr-perceiver[minilm]-seed0", 0.08),
                    test("lftr-perceiver-fusion[minilm+pixels]", "lftr-perceiver[minilm]", 0.001, (0, 1, 2)),
                    test("lftr-perceiver-fusion[minilm+pixels]-seed0", "lftr-perceiver[minilm]-seed1", 0.5)]
    check = next(c for c in F.calibration(rep) if c.quantity == "LFTR fusion R@5")
    assert check.met is True  # the target names the per-query tests; the t-test over seeds is shown beside them
    assert "vs best single `lftr-perceiver[minilm]` +3.00 pp" in check.measured
    assert ("seed mean (seeds 0, 1, 2): bootstrap p 0.001, McNemar p 0.001, paired t over seeds p 0.09"
            in check.measured and "p 0.08" in check.measured)
    assert check.measured.count("paired t") == 1  # a test of single runs has no seeds to test over
    assert check.measured.index("seed mean") < check.measured.index("p 0.08")
    assert "p 0.5" not in check.measured  # one seed's head against another seed's fusion is no comparison
    rep["pairs"][1] = test("lftr-perceiver-fusion[minilm+pixels]", "lftr-perceiver[minilm]", 0.02, (0, 1, 2))
    assert next(c for c in F.calibration(rep) if c.quantity == "LFTR fusion R@5").met is False
    rep["pairs"] = [rep["pairs"][0], rep["pairs"][2]]  # only the seed-0 test: it decides
    assert next(c for c in F.calibration(rep) if c.quantity == "LFTR fusion R@5").met is False
    rows = F.ceiling(rep)
    assert rows[-1][1] == "lftr-perceiver-fusion[minilm+pixels]" and rows[-1][2] == 18.0
    lines = F.findings(rep)
    assert any(line.startswith("- `lftr-perceiver-fusion[minilm+pixels]-seed0` does not beat") for line in lines)
    rep["pairs"].append(test("lftr-perceiver-fusion[minilm+pixels]", "lftr-perceiver[minilm]", 0.001, (0, 1, 2)))
    group_line = next(x for x in F.findings(rep) if x.startswith("- `lftr-perceiver-fusion[minilm+pixels]` beats"))
    assert "R@5 18.0 vs 15.0" in group_line and "averaged over seeds 0, 1, 2" in group_line
    assert "paired t over those seeds p = 0.09" in group_line
