"""`scripts/psr_scale.py` end to end on the session's synthetic benchmark (tiny LFTR budget: 1 epoch)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("psr_scale", ROOT / "scripts" / "psr_scale.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["psr_scale"] = mod  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_psr_scale_measures_every_stage_and_resumes(synth_dir, lftr_test_config, tmp_path, capsys):
    data = shutil.copytree(synth_dir, tmp_path / "bench", ignore=shutil.ignore_patterns("frames", "sim", ".cache"))
    assert not (data / "features" / "minilm").exists()  # the pipeline encodes the semantic space itself
    out, report = tmp_path / "out", tmp_path / "scale"
    argv = ["--data", str(data), "--out", str(out), "--report", str(report), "--lftr-epochs", "1",
            "--lftr-config", str(lftr_test_config), "--resamples", "200", "--fb-batches", "2",
            "--record-dir", str(tmp_path / "perf")]
    ps = _script()
    assert ps.main(argv) == 0
    doc = json.loads((report / "scale.json").read_text())
    stages = {r["stage"]: r for r in doc["stages"]}
    assert set(stages) == {"encode-minilm", "baseline-random", "baseline-question-only", "baseline-lookup",
                           "baseline-knn-future", "baseline-persistence", "baseline-zero-shot",
                           "oracle-semantic-text", "oracle-state-prototype", "oracle-independent-appearance",
                           "lftr-train-minilm", "lftr-predict-minilm", "lftr-train-pixels", "lftr-predict-pixels",
                           "fusion", "report"}
    for r in stages.values():
        assert r["wall_s"] > 0 and r["cpu_s"] > 0 and r["peak_rss_mb"] > 50, r
        assert r["bound_s"] > 0 and r["ratio"] > 0 and r["bound"], r
    for space in ("minilm", "pixels"):
        e = stages[f"lftr-train-{space}"]["extra"]
        assert e["epochs"] == 1 and e["s_per_epoch"] > 0 and e["fb_s_per_epoch"] > 0
        assert 0 <= e["outside_fb_share"] < 1
    assert "(80," not in stages["lftr-predict-pixels"]["bound"]  # K samples per query: rows = n_test x K
    # the semantic space's stages are held to their margin over the bound, the others to their ratio
    semantic = {s for s, r in stages.items() if r["state_space"]}
    assert semantic == {"baseline-question-only", "baseline-lookup", "baseline-knn-future", "oracle-semantic-text",
                        "lftr-predict-minilm"}
    widest = max(semantic, key=lambda s: stages[s]["wall_s"] - stages[s]["bound_s"])
    assert doc["worst_semantic_margin"] == {"stage": widest,
                                            "margin_s": stages[widest]["wall_s"] - stages[widest]["bound_s"]}
    assert doc["worst_scoring_ratio"]["stage"] not in semantic | {"baseline-random"}
    assert doc["meets"]["semantic_margin_s"] == (doc["worst_semantic_margin"]["margin_s"] <= 5)
    assert doc["dominant"]["stage"] in stages and doc["peak_rss_mb"] == max(r["peak_rss_mb"] for r in
                                                                             stages.values())
    md = (report / "scale.md").read_text()
    assert all(f"| {s} |" in md for s in stages) and "Dominant stage" in md and "outside forward/backward" in md
    rep = json.loads((out / "report" / "report.json").read_text())
    assert json.dumps(rep).count("lftr-fusion[minilm+pixels]") > 0
    assert "dominant stage:" in capsys.readouterr().out
    rec = json.loads((tmp_path / "perf" / "psr_scale.json").read_text())  # the record docs/performance.md shows
    assert rec["markdown"] == md and rec["command"].startswith("python scripts/psr_scale.py --data")

    # a rerun skips every finished stage, keeps their measurements and rewrites nothing it finished
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.parquet")}
    (out / "mine.txt").write_text("a file the script did not write")
    assert ps.main(argv) == 0
    printed = capsys.readouterr().out
    assert all(f"[{s}] skipped" in printed for s in stages), printed
    again = {r["stage"]: r for r in json.loads((report / "scale.json").read_text())["stages"]}
    assert {s: r["wall_s"] for s, r in again.items()} == {s: r["wall_s"] for s, r in stages.items()}
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.parquet")} == mtimes
    assert (out / "mine.txt").exists()


def test_without_lftr_plans_every_stage_but_lftr_and_the_fusion(synth_dir, tmp_path):
    """``--without-lftr``: the encoding, every baseline and oracle and the report (with no reference run); the
    same options otherwise plan both LFTR spaces and the fusion the report is tested against."""
    import argparse

    from eval.benchmark import Benchmark

    ps = _script()
    a = argparse.Namespace(data=Path(synth_dir), out=tmp_path / "out", semantic_space="minilm", visual_space="pixels",
                           text_model="packaged:all-MiniLM-L6-v2", split="test", resamples=200, lftr_config=[],
                           lftr_epochs=1, seed=0, without_lftr=True)
    bench = Benchmark.load(synth_dir)
    names = [s.name for s in ps.plan(a, bench)]
    assert names[0] == "encode-minilm" and names[-1] == "report"
    assert not [n for n in names if n.startswith("lftr") or n == "fusion"]
    assert {"baseline-random", "oracle-semantic-text", "oracle-state-prototype"} <= set(names)
    report = ps.plan(a, bench)[-1].cmd
    assert "--reference" not in report and sum(x.endswith(".parquet") for x in report) == len(names) - 2
    a.without_lftr = False
    full = ps.plan(a, bench)
    assert {"lftr-train-minilm", "lftr-predict-pixels", "fusion"} <= {s.name for s in full}
    assert "--reference" in full[-1].cmd
