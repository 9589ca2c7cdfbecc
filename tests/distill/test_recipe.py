"""`python -m distill recipe` (`distill.recipe`): the stages it plans from its flags and the preset, the CPU demo end to
end through `scripts/distill.sh` (as `make demo` runs it), resuming, and the error of a failing stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_run import run_cli, snapshot

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "distill" / "tiny-cpu.yaml"


def _plan(*flags):
    from distill.recipe import parse_recipe_args, plan, resolve_inputs

    args = parse_recipe_args([str(f) for f in flags])
    return args, {s.name: s for s in plan(args, resolve_inputs(args))}


def _preset(tmp_path: Path, **sections) -> Path:
    """The tiny CPU preset with ``sections`` merged in (a section's keys replace the preset's)."""
    doc = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    for name, values in sections.items():
        doc[name] = {**doc.get(name, {}), **values}
    p = tmp_path / "preset.yaml"
    p.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return p


def test_gpu_plan_launches_training_through_accelerate(synth_dir, tmp_path):
    out = tmp_path / "out"
    preset = REPO / "configs" / "distill" / "qwen3-vl-2b.yaml"
    args, stages = _plan("--data", synth_dir, "--out", out, "--config", preset, "--accelerate",
                         "configs/accelerate/multi_gpu.yaml", "--num-processes", 4, "--teacher-url",
                         "http://127.0.0.1:8000/v1", "--forecast-backend", "hf")
    assert args.config == str(preset) and args.num_processes == 4
    assert list(stages)[:3] == ["predicates", "narrate-train", "narrate-val"]  # no demo inputs to build
    train = stages["train-cot"].argv
    launch = train[:train.index("distill.train") + 1]
    assert Path(launch[4]).resolve() == REPO / "configs" / "accelerate" / "multi_gpu.yaml"
    assert launch[1:4] + launch[5:] == ["-m", "accelerate.commands.launch", "--config_file", "--num_processes", "4",
                                        "-m", "distill.train"]
    model = yaml.safe_load(preset.read_text())["train"]["model_name_or_path"]
    assert train[train.index("--model_name_or_path") + 1] == model
    assert train[train.index("--dataset_name") + 1] == str(out / "sft" / "cot")
    assert stages["train-cot"].key[:2] == ["-m", "distill.train"]  # the launcher is not part of the key
    for split in ("train", "val"):
        n = stages[f"narrate-{split}"].argv
        assert n[n.index("--backend"):n.index("--backend") + 4] == ["--backend", "openai", "--base-url",
                                                                    "http://127.0.0.1:8000/v1"]
    assert "--base-url" not in stages["narrate-test"].argv  # the test side of the leakage probe: template
    sft = yaml.safe_load(preset.read_text())["sft"]
    for method, student in (("zero-shot", None), ("answer-only", "answer"), ("cot", "cot")):
        f = stages[f"forecast-{method}"].argv
        assert f[f.index("--frames") + 1] == f"spaced:{sft['frames']}"
        assert f[f.index("--max-pixels") + 1] == str(sft["max_pixels"])
        assert ("--adapter" in f) == (student is not None)
        if student:
            assert f[f.index("--adapter") + 1] == str(out / "students" / student / "adapter")
    # a dry run plans without writing anything
    res = run_cli("distill", "recipe", "--data", synth_dir, "--out", out, "--config", preset, "--forecast-backend",
                  "hf", "--dry-run")
    assert res.code == 0, res.text
    assert "[faithfulness]" in res.out and "-m accelerate.commands.launch" in res.out
    assert not out.exists()


def test_cpu_demo_settings_come_from_the_preset_recipe_section(tmp_path):
    out = tmp_path / "demo"
    args, stages = _plan("--cpu-demo", "--out", out)
    assert args.config.endswith("tiny-cpu.yaml") and args.forecast_backend == "hf" and args.accelerate is None
    assert list(stages)[:2] == ["synth", "tiny-model"]  # built under --out when not given
    assert stages["synth"].argv[stages["synth"].argv.index("--out") + 1] == str(out / "psr-synth")
    assert stages["train-cot"].argv[1:3] == ["-m", "distill.train"]
    assert stages["train-cot"].argv[-2:] == ["--max_steps", "8"]
    assert stages["narrate-train"].argv[stages["narrate-train"].argv.index("--narrator") + 1] == "template-noisy"
    assert stages["forecast-cot"].argv[stages["forecast-cot"].argv.index("--limit") + 1] == "8"
    # flags override the section; --cpu_demo and --cpu-demo are the same flag
    _, stages = _plan("--cpu_demo", "--out", out, "--limit", 3, "--narrator", "template")
    assert stages["forecast-cot"].argv[stages["forecast-cot"].argv.index("--limit") + 1] == "3"
    assert stages["narrate-train"].argv[stages["narrate-train"].argv.index("--narrator") + 1] == "template"


def test_evidence_plan_runs_the_study_on_the_slice(synth_dir, tmp_path):
    """--student-input evidence (the demo's preset): predicates of the closed slice, narration, the validator's catch
    rates, evidence SFT sets, the tiny student (CPU demo) and the study with the preset's seeds and budgets; no
    per-student forecast or retrieval stage."""
    out = tmp_path / "out"
    preset = REPO / "configs" / "distill" / "evidence-cpu.yaml"
    args, stages = _plan("--cpu-demo", "--config", preset, "--data", synth_dir, "--out", out)
    assert args.student_input == "evidence"
    assert list(stages) == ["predicates", "narrate-train", "narrate-val", "narrate-test", "rationale-stats", "leaks",
                            "sft", "tiny-student", "study"]
    sft = stages["sft"].argv
    assert sft[sft.index("--student-input") + 1] == "evidence"
    study = stages["study"].argv
    rec = yaml.safe_load(preset.read_text())["recipe"]
    assert study[study.index("--model") + 1] == str(out / "tiny-student")
    assert study[study.index("--seeds") + 1:study.index("--seeds") + 4] == [str(s) for s in rec["seeds"]]
    assert study[study.index("--budgets") + 1:study.index("--budgets") + 3] == rec["budgets"]
    assert "tiny-student" in stages["study"].after and "sft" in stages["tiny-student"].after
    assert study[study.index("--workers") + 1] == str(rec["study_workers"])
    # train and val narrate only what the SFT sets take; test narrates every set (the leakage probe)
    for split, key in (("train", "sft_limit"), ("val", "sft_eval_limit")):
        nar = stages[f"narrate-{split}"].argv
        assert nar[nar.index("--limit") + 1] == str(rec[key])
    assert "--limit" not in stages["narrate-test"].argv
    _, stages = _plan("--cpu-demo", "--config", preset, "--data", synth_dir, "--out", out, "--top-states", 7)
    p = stages["predicates"].argv
    assert p[p.index("--top-states") + 1] == "7"


def test_results_section_reads_the_recipes_outputs(tmp_path):
    from distill.results import section, stage_seconds

    assert section(tmp_path) == []  # no study: nothing to report
    (tmp_path / "recipe.json").write_text(json.dumps({"config": {"config": "configs/distill/evidence-cpu.yaml",
                                                                 "student_input": "evidence"},
                                                      "stages": {"sft": {"seconds": 12.0, "cpu_seconds": 10.5},
                                                                 "study": {"seconds": 300.4, "cpu_seconds": 290.0}},
                                                      "last_run": {"stages": ["sft", "study"], "seconds": 250.2,
                                                                   "jobs": 2}}))
    rows = stage_seconds(tmp_path)
    assert "| sft | 12 | 10 |" in rows and "| **sum of the stages** | **312** | **300** |" in rows
    assert "| **the recipe's last run** (2 stages, 2 at a time) | **250** | |" in rows


def test_a_complete_stage_without_a_record_is_adopted_and_reruns_when_its_command_changes(tmp_path):
    """Outputs complete but no record (the stage finished just before an interrupt reached the recipe): skipped and
    recorded under its command with no seconds, so a later change of that command reruns it."""
    from distill.recipe import RecipeArgs, RecipeState, Stage, decide
    from distill.results import stage_seconds

    done = tmp_path / "predicates.jsonl"
    done.write_text("{}\n")
    stage = Stage("predicates", [sys.executable, "-m", "distill", "predicates", "--limit", "8"], done)
    state = RecipeState(tmp_path / "recipe.json", RecipeArgs(out=str(tmp_path)))
    assert decide(stage, state, set()) is None
    state.adopt(stage)
    again = RecipeState(tmp_path / "recipe.json", RecipeArgs(out=str(tmp_path)))
    assert again.stages["predicates"]["key"] == stage.key and again.stages["predicates"]["seconds"] is None
    changed = Stage("predicates", [sys.executable, "-m", "distill", "predicates", "--limit", "9"], done)
    assert decide(changed, again, set()).startswith("its command changed")
    assert "| predicates | – | – |" in stage_seconds(tmp_path)
    again.finished(stage, 3.0, 2.0)
    again.adopt(stage)  # a recorded stage keeps its record
    assert RecipeState(tmp_path / "recipe.json", RecipeArgs(out=str(tmp_path))).stages["predicates"]["seconds"] == 3.0


@pytest.mark.parametrize(("section", "flags", "needle"), [
    ({"recipe": {"max_step": 8}}, (), "max_step"),
    ({"recipe": {"limit": "eight"}}, (), "limit"),
    ({}, ("--forecast_backend", "ollama"), "forecast_backend"),
    ({}, ("--no_such_flag", "1"), "--no_such_flag"),
])
def test_bad_arguments_are_named(synth_dir, tmp_path, section, flags, needle):
    res = run_cli("distill", "recipe", "--config", _preset(tmp_path, **section), "--data", synth_dir, "--out",
                  tmp_path / "out", "--dry-run", *flags)
    assert res.code == 2, res.text
    assert needle in res.err


def test_missing_data_and_vllm_venv_are_input_errors(tmp_path, monkeypatch):
    res = run_cli("distill", "recipe", "--out", tmp_path / "out", "--forecast-backend", "hf")
    assert res.code == 2 and "--data is required" in res.err
    monkeypatch.setenv("VLLM_PY", str(tmp_path / "no-vllm" / "python"))
    res = run_cli("distill", "recipe", "--cpu-demo", "--out", tmp_path / "out", "--forecast-backend", "vllm")
    assert res.code == 2 and "no-vllm" in res.err and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_failing_stage_is_named_with_its_log_and_the_resume_command(synth_dir, tiny_vlm, tmp_path):
    out = tmp_path / "out"
    preset = _preset(tmp_path, predicates={"no_such_key": 1})
    res = run_cli("distill", "recipe", "--config", preset, "--data", synth_dir, "--model", tiny_vlm, "--out", out)
    assert res.code == 3, res.text
    log = out / "logs" / "predicates.log"
    assert f"stage predicates failed (exit code 2); its output is in {log}" in res.err
    assert "rerun `python -m distill recipe --config" in res.err and "finished stages are skipped" in res.err
    text = log.read_text()
    assert f"$ {sys.executable} -m distill predicates --config {preset}" in text  # the exact command line
    assert "no_such_key" in text and "=== exit 2" in text
    assert not (out / "logs" / "narrate-train.log").exists()  # nothing after the failed stage ran


@pytest.mark.slow
def test_rerun_skips_finished_stages_and_reruns_changed_ones(synth_dir, tiny_vlm, tmp_path):
    """A recipe stopped by a failing stage resumes: finished stages are skipped (their outputs untouched, their logs
    not appended), the failed one and what follows run; a stage whose command changed, or whose inputs were
    rewritten in this invocation, runs again."""
    out = tmp_path / "out"
    # one stage at a time (the preset runs them side by side): which stages finish before a failure is then fixed
    flags = ("--data", synth_dir, "--model", tiny_vlm, "--out", out, "--jobs", "1", "--narrator", "template")
    res = run_cli("distill", "recipe", "--config", _preset(tmp_path, narrate={"no_such_key": 1}), *flags)
    assert res.code == 3 and "stage narrate-train failed" in res.err, res.text
    assert (out / "predicates.config.json").is_file()
    before = (out / "predicates.jsonl").stat().st_mtime_ns, (out / "logs" / "predicates.log").read_text()

    res = run_cli("distill", "recipe", "--config", _preset(tmp_path, sft={"no_such_key": 1}), *flags)
    assert res.code == 3 and "stage sft failed" in res.err, res.text
    assert "[predicates] skipped: done" in res.out
    assert ((out / "predicates.jsonl").stat().st_mtime_ns, (out / "logs" / "predicates.log").read_text()) == before
    for d in ("rationales", "rationales-val", "rationales-test"):
        assert (out / d / "narrate.summary.json").is_file()
    state = json.loads((out / "recipe.json").read_text())["stages"]
    assert set(state) == {"predicates", "narrate-train", "narrate-val", "narrate-test", "rationale-stats"}
    assert state["narrate-train"]["key"][:4] == ["-m", "distill", "narrate", "--config"]

    res = run_cli("distill", "recipe", "--config", _preset(tmp_path, sft={"no_such_key": 1}), *flags[:-1],
                  "template-noisy", "--dry-run")
    assert res.code == 0, res.text
    assert "[predicates] skipped" in res.out and "[narrate-test] skipped" in res.out
    assert "[narrate-train] (its command changed (was:" in res.out
    assert "[rationale-stats] (narrate-train ran)" in res.out
    assert "[sft] (its outputs are not complete)" in res.out


@pytest.mark.slow
def test_cpu_demo_end_to_end_through_the_launcher(tmp_path):
    """`bash scripts/distill.sh --cpu-demo` (as `make demo` runs it, minus --data: the demo builds its own benchmark
    and tiny student base): every stage's outputs, the students served with their adapters' preprocessing, and a
    rerun that skips everything and changes nothing."""
    out = tmp_path / "demo"
    cmd = ["bash", "scripts/distill.sh", "--cpu-demo", "--out", str(out), "--python", sys.executable]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    report = (out / "report" / "main.md").read_text()
    for method in ("zero-shot", "answer-only", "trajectory-labels", "cot"):
        assert method in report
        summary = json.loads((out / "phrases" / f"{method}.summary.json").read_text())
        assert summary["complete"] and summary["selected"] == 8
    for student in ("cot", "answer", "trajectory"):
        served = json.loads((out / "students" / student / "adapter" / "psr_student.json").read_text())
        assert served["preprocessing"]["frames"] == yaml.safe_load(TINY.read_text())["sft"]["frames"]
    stats = json.loads((out / "rationale-stats" / "rationale_stats.json").read_text())
    assert stats["rejects"], "the noisy narrator's rejects are reported"
    assert json.loads((out / "faithfulness" / "faithfulness.json").read_text())["counts"]["in_split"] > 0
    assert "== answer accuracy ==" in first.stdout and "== faithfulness ==" in first.stdout
    files = snapshot(out, skip=(".cache", "logs"))

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("skipped: done") == len(json.loads((out / "recipe.json").read_text())["stages"])
    assert snapshot(out, skip=(".cache", "logs")) == files
