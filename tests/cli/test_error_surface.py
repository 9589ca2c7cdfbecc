"""One error surface: every package's command line reports a user error as one red line with the fix, exit code 2,
no traceback (unless --debug / PSR_DEBUG=1); every --data is checked before the command runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import assert_one_clear_error, run_cli

REPO = Path(__file__).resolve().parents[2]
MINILM = "packaged:all-MiniLM-L6-v2"

#: Every command with a --data option, with the other arguments it needs to get that far.
DATA_COMMANDS = {
    "eval score": ["eval", "score", "--run", "r.parquet", "--out", "o"],
    "eval report": ["eval", "report", "r.parquet", "--out", "o"],
    "eval compare": ["eval", "compare", "--out", "o", "--phrases", "m3=p.jsonl", "--text-space", "s"],
    "retrieval encode": ["retrieval", "encode", "--space", "s"],
    "retrieval search": ["retrieval", "search", "--phrases", "p.jsonl", "--space", "s", "--out", "o.parquet"],
    "retrieval fuse": ["retrieval", "fuse", "--run", "a", "--run", "b", "--out", "o.parquet"],
    "retrieval baseline": ["retrieval", "baseline", "random", "--out", "o.parquet"],
    "retrieval oracle": ["retrieval", "oracle", "semantic-text", "--space", "s", "--out", "o.parquet"],
    "retrieval topk": ["retrieval", "topk", "--space", "s", "--text", "falling"],
    "retrieval lftr train": ["retrieval", "lftr", "train", "--out", "o"],
    "retrieval lftr predict": ["retrieval", "lftr", "predict", "--ckpt", "c", "--out", "o.parquet"],
    "retrieval lftr seeds": ["retrieval", "lftr", "seeds", "--space", "s", "--out", "o"],
    "retrieval demo": ["retrieval", "demo", "--out", "o"],
    "retrieval canon sweep": ["retrieval", "canon", "sweep", "--out", "o"],
    "retrieval canon apply": ["retrieval", "canon", "apply", "--out", "o"],
    "retrieval canon finetune": ["retrieval", "canon", "finetune", "--out", "o"],
    "retrieval canon report": ["retrieval", "canon", "report", "--out", "o", "--exact", "e", "--paraphrase", "p"],
    "forecasters run": ["forecasters", "run", "--out", "o.jsonl"],
    "forecasters merge": ["forecasters", "merge", "a.jsonl", "--out", "o.jsonl"],
    "forecasters probes synonyms": ["forecasters", "probes", "synonyms", "--out", "o.jsonl"],
}
DISTILL_DATA_COMMANDS = {
    "predicates": ["--out", "o.jsonl"],
    "validate": ["--predicates", "p", "--rationales", "r"],
    "narrate": ["--predicates", "p", "--out", "o"],
    "sft": ["--rationales", "r", "--out", "o"],
    "faithfulness": ["--model", "m", "--predicates", "p", "--out", "o"],
    "rationale-stats": ["--rationales", "r", "--out", "o"],
    "answers": ["--phrases", "a.jsonl", "--out", "o"],
    "recipe": ["--out", "o"],
}


@pytest.mark.parametrize("bad", ["missing", "not-a-benchmark", "a-file"])
@pytest.mark.parametrize("command", sorted(DATA_COMMANDS))
def test_every_data_option_is_checked_up_front(tmp_path, monkeypatch, command, bad):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / bad
    if bad == "not-a-benchmark":
        data.mkdir()
    elif bad == "a-file":
        data.write_text("x")
    res = run_cli(*DATA_COMMANDS[command], "--data", data)
    assert res.code == 2 and "Traceback" not in res.text, res.text
    assert "--data" in res.err and bad in res.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([bad] if bad != "missing" else [])  # nothing written


@pytest.mark.parametrize("stage", sorted(DISTILL_DATA_COMMANDS))
def test_distill_checks_data_up_front(tmp_path, stage):
    res = run_cli("distill", stage, "--data", tmp_path / "missing", *DISTILL_DATA_COMMANDS[stage])
    assert_one_clear_error(res, f"--data {tmp_path / 'missing'} does not exist")


@pytest.mark.slow
def test_a_hub_id_offline_names_the_model_and_the_packaged_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "p.txt").write_text("falling\nrolling\n")
    res = run_cli("retrieval", "canon", "sweep", "--phrases", tmp_path / "p.txt", "--out", tmp_path / "o")
    line = assert_one_clear_error(res)
    assert line == ("error: BAAI/bge-small-en-v1.5 is not in the local cache and the hub is unreachable (pass "
                    "--model packaged:all-MiniLM-L6-v2 or a local path)")
    assert not (tmp_path / "o").exists()
    res = run_cli("retrieval", "canon", "finetune", "--data", tmp_path / "nope", "--out", tmp_path / "o")
    assert res.code == 2


def test_a_missing_model_of_a_forecaster_names_the_option(cli_world, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = run_cli("forecasters", "run", "--data", cli_world["bench"], "--out", tmp_path / "p.jsonl", "--forecaster",
                  "text-only", "--backend", "hf", "--model", "nobody/no-such-model", "--limit", "1")
    assert_one_clear_error(res, "nobody/no-such-model is not in the local cache", "as --model")
    local = tmp_path / "not-a-model"
    local.mkdir()
    res = run_cli("forecasters", "run", "--data", cli_world["bench"], "--out", tmp_path / "p.jsonl", "--forecaster",
                  "text-only", "--backend", "hf", "--model", local, "--limit", "1")
    assert_one_clear_error(res, f"{local} is not a loadable model folder")


def test_debug_shows_the_traceback_of_a_known_error(cli_world, tmp_path, monkeypatch):
    args = ["eval", "score", "--data", cli_world["bench"], "--run", tmp_path / "none.parquet", "--out", tmp_path / "o"]
    res = run_cli(*args)
    assert_one_clear_error(res, "none.parquet")
    res = run_cli(*args, "--debug")
    assert res.code == 2 and "Traceback" in res.err and res.err.rstrip().splitlines()[-1].startswith("error:")
    monkeypatch.setenv("PSR_DEBUG", "1")
    assert "Traceback" in run_cli(*args).err


@pytest.mark.parametrize("argv", [
    ["eval", "score", "--data", "{tmp}/b", "--run", "r", "--out", "o"],
    ["retrieval", "canon", "sweep", "--phrases", "{tmp}/missing.txt", "--out", "{tmp}/o", "--model", MINILM],
    ["forecasters", "merge", "{tmp}/missing.jsonl", "--out", "{tmp}/o.jsonl"],
    ["distill", "predicates", "--data", "{tmp}/b", "--out", "{tmp}/o.jsonl"],
    pytest.param(["distill.train", "--model_name_or_path", "m", "--dataset_name", "{tmp}/d", "--output_dir", "{tmp}/o",
                  "--effective_batch_size", "3", "--per_device_train_batch_size", "2"], marks=pytest.mark.slow),
])
def test_the_real_entry_points(tmp_path, argv):
    """``python -m PACKAGE``: the same exit code (2) and one line, from a fresh interpreter."""
    (tmp_path / "b").mkdir()
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("PSR_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    errors = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 or "Invalid value" in p.stderr, p.stderr[-2000:]
