"""`distill.study`: budgets and their nesting, the seed-averaged scores with video-clustered CIs and paired
differences, the simulator motion class; one small study end to end on CPU (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distill.study import Budget, StudyConfig, plan_runs, score_budget

EVIDENCE_PRESET = Path(__file__).resolve().parents[2] / "configs" / "distill" / "evidence-cpu.yaml"


def test_budgets_parse_and_reject_bad_specs():
    assert Budget.parse("steps:40").flags() == ["--max_steps", "40"]
    assert Budget.parse("epochs:2").flags() == ["--num_train_epochs", "2", "--max_steps", "-1"]
    for bad in ("steps:0", "steps:1.5", "hours:2", "epochs", "epochs:-1"):
        with pytest.raises(ValueError, match="budget"):
            Budget.parse(bad)


def _sft_dir(tmp_path: Path, n_train: int) -> Path:
    for v in ("answer", "trajectory", "cot"):
        (tmp_path / v).mkdir(parents=True)
        (tmp_path / v / "psr_sft.json").write_text(json.dumps({"splits": {"train": n_train}}))
    return tmp_path


def _cfg(tmp_path, sft, budgets, extra_config: str = ""):
    preset = tmp_path / "preset.yaml"
    preset.write_text(EVIDENCE_PRESET.read_text() + extra_config)
    return StudyConfig(data="d", sft=str(sft), predicates="p", out=str(tmp_path / "out"), train_config=str(preset),
                       model="m", budgets=budgets)


def test_equal_steps_nest_in_the_equal_epochs_run_under_a_constant_schedule(tmp_path):
    sft = _sft_dir(tmp_path / "sft", 32)  # the preset's effective batch 8: 4 steps per epoch
    runs, where = plan_runs(_cfg(tmp_path, sft, ["steps:6", "epochs:2"]))
    assert where == {"steps-6": ("epochs-2", 6), "epochs-2": ("epochs-2", None)}
    assert runs["epochs-2"].snapshots == (6,)
    runs, where = plan_runs(_cfg(tmp_path, sft, ["steps:9", "epochs:2"]))  # longer than 2 epochs: its own run
    assert where["steps-9"] == ("steps-9", None) and not runs["epochs-2"].snapshots


def test_no_nesting_under_a_decaying_schedule(tmp_path):
    sft = _sft_dir(tmp_path / "sft", 32)
    cfg = _cfg(tmp_path, sft, ["steps:2", "epochs:2"])
    cfg.train_config = str(tmp_path / "cos.yaml")
    Path(cfg.train_config).write_text(EVIDENCE_PRESET.read_text().replace("lr_scheduler_type: constant",
                                                                         "lr_scheduler_type: cosine"))
    runs, where = plan_runs(cfg)
    assert where["steps-2"] == ("steps-2", None) and set(runs) == {"steps-2", "epochs-2"}


class _Q:
    def __init__(self, i, video, target):
        self.id, self.video_id, self.target_state = f"q{i}", video, target


def test_scores_average_seeds_and_pair_by_video(tmp_path):
    queries = [_Q(i, f"v{i // 2}", "a" if i % 3 else "b") for i in range(40)]
    rng = np.random.default_rng(0)
    good = [{"exact": (rng.random(40) < 0.8).astype(float), "motion": np.ones(40), "parsed": np.ones(40)}
            for _ in range(3)]
    bad = [{"exact": (rng.random(40) < 0.2).astype(float), "motion": np.ones(40), "parsed": np.ones(40)}
           for _ in range(3)]
    cfg = StudyConfig(data="d", sft="s", predicates="p", out="o", train_config="c", resamples=500)
    s = score_budget(cfg, {"cot": good, "answer": bad}, queries, "a", {"a": "rolling", "b": "at_rest"})
    cot, ans = s["students"]["cot"], s["students"]["answer"]
    assert cot["seeds"] == 3 and len(cot["per_seed"]["exact"]) == 3
    assert cot["exact"]["value"] == pytest.approx(np.mean([g["exact"].mean() for g in good]))
    assert cot["exact"]["ci_low"] < cot["exact"]["value"] < cot["exact"]["ci_high"]
    assert s["majority"]["exact"]["value"] == pytest.approx(np.mean([q.target_state == "a" for q in queries]))
    pair = next(p for p in s["pairs"] if (p["a"], p["b"], p["read"]) == ("cot", "answer", "exact"))
    assert pair["delta"] == pytest.approx(cot["exact"]["value"] - ans["exact"]["value"]) and pair["ci_low"] > 0


def test_motion_class_is_the_commonest_motion_of_a_states_segments(synth_bench):
    from collections import Counter

    from distill.study import motion_classes

    m = motion_classes(synth_bench)
    c = synth_bench.corpus_ds
    state = c["state"][0]
    motions = Counter(s.split("|")[0] for st, s in zip(c["state"][:], c["sim_state"][:], strict=True) if st == state)
    assert m[state] in {k for k, v in motions.items() if v == max(motions.values())}


@pytest.mark.slow
def test_study_end_to_end_on_a_tiny_slice(synth_dir, tmp_path, monkeypatch):
    """Predicates of a 3-state slice, template narration, evidence SFT sets, a tiny student, 2 seeds x (steps:2
    nested in epochs:1): every student is trained, answers, is scored; faithfulness has its floors; the section of
    the results page renders from the outputs. The same study in two processes (``workers=2``) trains the same
    weights and writes the same answers as one process on one thread."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the one-process run on one thread, as each pooled worker
    from distill.narrate import NarrateConfig, run_narration
    from distill.predicates import PredicatesConfig, write_predicates
    from distill.results import section
    from distill.sft import SFTBuildConfig, build_sft
    from distill.study import run_study
    from distill.tiny_student import TinyStudentConfig, build_tiny_student

    pred = tmp_path / "predicates.jsonl"
    write_predicates(PredicatesConfig(data=str(synth_dir), out=str(pred), top_states=3, progress=False))
    for split, name in (("train", "rationales"), ("val", "rationales-val")):
        run_narration(NarrateConfig(data=str(synth_dir), predicates=str(pred), out=str(tmp_path / name),
                                    narrator="template", split=split, progress=False))
    build_sft(SFTBuildConfig(data=str(synth_dir), rationales=str(tmp_path / "rationales"), out=str(tmp_path / "sft"),
                             eval_rationales=str(tmp_path / "rationales-val"), student_input="evidence", limit=12,
                             progress=False))
    build_tiny_student(TinyStudentConfig(sft=str(tmp_path / "sft"), out=str(tmp_path / "tiny-student"),
                                         vocab_size=600))
    preset = tmp_path / "preset.yaml"
    preset.write_text(EVIDENCE_PRESET.read_text().replace("per_device_train_batch_size: 16",
                                                          "per_device_train_batch_size: 4")
                      .replace("effective_batch_size: 16", "effective_batch_size: 4"))
    cfg = StudyConfig(data=str(synth_dir), sft=str(tmp_path / "sft"), predicates=str(pred),
                      out=str(tmp_path / "study"), train_config=str(preset), model=str(tmp_path / "tiny-student"),
                      seeds=[0, 1], budgets=["steps:2", "epochs:1"], limit=8, max_new_tokens=24,
                      faithfulness_limit=6, resamples=200, device="cpu", progress=False)
    r = run_study(cfg)
    assert set(r["budgets"]) == {"steps-2", "epochs-1"} and r["runs"]["epochs-1"]["snapshots"] == [2]
    for b in r["budgets"].values():
        assert set(b["students"]) == {"answer", "trajectory", "cot"}
        assert all(s["seeds"] == 2 and 0 <= s["exact"]["value"] <= 1 for s in b["students"].values())
        f = b["faithfulness"]
        assert "moved_shuffled" in f and f["chance"] == pytest.approx(1 / 3) and len(f["moved_per_seed"]) == 2
    assert r["budgets"]["steps-2"]["students"]["cot"]["runs"][0]["global_step"] == 2
    phrases = tmp_path / "study" / "phrases" / "epochs-1" / "cot-s1.jsonl"
    assert len(phrases.read_text().splitlines()) == r["n"]
    stamp = phrases.stat().st_mtime_ns
    run_study(cfg)  # a rerun trains nothing and reuses every answer
    assert phrases.stat().st_mtime_ns == stamp
    text = "\n".join(section(tmp_path))
    assert "three students" in text and "majority class" in text and "shuffled-body floor" in text

    from dataclasses import replace

    import torch
    from safetensors.torch import load_file

    from distill.study import load_student

    pooled = replace(cfg, out=str(tmp_path / "study-pooled"), workers=2)
    r2 = run_study(pooled)
    for b in r["budgets"]:
        for v in ("answer", "trajectory", "cot"):
            for seed in (0, 1):
                rel = Path("phrases") / b / f"{v}-s{seed}.jsonl"
                one = [json.loads(x)["raw"] for x in (tmp_path / "study" / rel).read_text().splitlines()]
                two = [json.loads(x)["raw"] for x in (tmp_path / "study-pooled" / rel).read_text().splitlines()]
                assert one == two, rel
    for v in ("answer", "cot"):
        w1, w2 = (load_student(c, "epochs-1", v, 1, None)["weights"] for c in (cfg, pooled))
        t1, t2 = (load_file(next(w.glob("*.safetensors"))) for w in (w1, w2))
        assert t1.keys() == t2.keys() and all(torch.equal(t1[k], t2[k]) for k in t1)
    assert r2["budgets"]["epochs-1"]["students"]["cot"]["exact"] == r["budgets"]["epochs-1"]["students"]["cot"]["exact"]
