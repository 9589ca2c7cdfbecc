"""SIGINT / SIGTERM in the middle of a distillation stage (issue 22, item 6): the interrupted stage leaves either
its complete output or nothing (no half-written folder, no staging leftovers, no stage process left running), the
command exits 128 + the signal number with one line, and a rerun of the same command finishes the stage.

Each test starts the real command in a subprocess, waits until it is provably mid-stage (a file it writes only while
working appears), sends the signal and checks what is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "distill" / "tiny-cpu.yaml"
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _interrupt(argv: list[str], ready: Callable[[], bool], sig: int, timeout: float = 600) -> tuple[int, str]:
    """Run ``python ARGV``; once ``ready()`` holds, send ``sig``; returns the exit code and the output."""
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(),
                            cwd=REPO)
    t0 = time.monotonic()
    try:
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"finished before it could be interrupted:\n{proc.stdout.read().decode()[-3000:]}")
            if time.monotonic() - t0 > timeout:
                pytest.fail("never reached the point to interrupt")
            time.sleep(0.02)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out.decode(errors="replace")


def _run(argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=_env(), cwd=REPO,
                          timeout=timeout)


def _leftovers(folder: Path) -> list[str]:
    """Staging folders and temporary files a job builds beside its outputs (`eval.io.atomic_dir` / `atomic_path`)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*")
                  if any(t in p.name for t in (".building-", ".cache-", ".old-", ".tmp", ".partial")))


def _assert_interrupted(rc: int, out: str, sig: int) -> None:
    assert rc == 128 + sig, out[-3000:]
    assert f"interrupted by {signal.Signals(sig).name}" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.parametrize("sig", SIGNALS)
def test_sft_interrupted_then_rerun(synth_dir, template_rationales, tmp_path, sig):
    out = tmp_path / "sft"
    argv = ["-m", "distill", "sft", "--data", str(synth_dir), "--rationales", str(template_rationales), "--out",
            str(out), "--frames", "2", "--limit", "24", "--progress", "false"]
    rc, text = _interrupt(argv, lambda: any(out.glob(".cot.building-*")), sig)
    _assert_interrupted(rc, text, sig)
    assert _leftovers(out) == []
    assert not (out / "sft.summary.json").exists()
    for variant in ("cot", "answer", "trajectory"):  # a variant is there whole (files and hashes) or not at all
        if (out / variant).exists():
            from distill.sft import read_set_info

            assert read_set_info(out / variant) is not None
    res = _run(argv)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out / "sft.summary.json").read_text())
    assert set(summary["variants"]) == {"cot", "answer", "trajectory"} and _leftovers(out) == []


@pytest.mark.parametrize("sig", SIGNALS)
def test_train_interrupted_then_rerun_resumes(sft_dir, tiny_vlm, tmp_path, sig):
    out = tmp_path / "student"
    argv = ["-m", "distill", "train", "--config", str(TINY), "--model_name_or_path", str(tiny_vlm), "--dataset_name",
            str(sft_dir / "cot"), "--output_dir", str(out), "--max_steps", "6", "--save_steps", "1",
            "--save_total_limit", "3", "--eval_strategy", "no", "--seed", "0"]
    ckpts = out / "checkpoints"
    # once a checkpoint is complete (its psr_train.json written): the signal lands in a later step or save
    rc, text = _interrupt(argv, lambda: ckpts.is_dir() and any(ckpts.glob("checkpoint-*/psr_train.json")), sig)
    _assert_interrupted(rc, text, sig)
    assert not (out / "adapter").exists() and not (out / "metrics.json").exists()  # the run's outputs: not yet
    assert not [p for p in out.iterdir() if p.name.startswith(".adapter")]
    res = _run(argv)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and metrics["resumed_from"] is not None  # the newest complete checkpoint
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize("sig", SIGNALS)
def test_recipe_interrupted_stops_its_stage_then_rerun_finishes_it(synth_copy, tiny_vlm, tmp_path, sig):
    import yaml

    doc = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    doc["narrate"] = {**doc.get("narrate", {}), "no_such_key": 1}  # a run stops after the predicates stage
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["-m", "distill", "recipe", "--config", str(preset), "--data", str(synth_copy), "--model", str(tiny_vlm),
            "--out", str(out)]  # its encode stage writes a semantic space into the benchmark
    log = out / "logs" / "predicates.log"
    rc, text = _interrupt(argv, lambda: log.is_file() and b"$ " in log.read_bytes(), sig)
    _assert_interrupted(rc, text, sig)
    assert "interrupted in stage predicates" in text
    assert log.read_text().rstrip().splitlines()[-1].startswith("=== exit ")  # the stage process ended first
    assert not (out / "predicates.config.json").exists() or (out / "predicates.jsonl").is_file()
    assert _leftovers(out) == []
    res = _run(argv)
    assert res.returncode == 3 and "stage narrate-train failed" in res.stderr, res.stdout[-2000:] + res.stderr
    assert "[predicates]" in res.stdout and (out / "predicates.config.json").is_file()
    state = json.loads((out / "recipe.json").read_text())["stages"]
    assert "predicates" in state
