"""`scripts/canon_probes.py`: ``--finetune-only`` runs the fine-tune alone, and a later full call reuses it (and
keeps its cost in ``canon_log.json``), as `make demo` runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts_support import load_script


def _calls(mod, monkeypatch, tmp_path, *flags: str, models: bool = False) -> list[list[str]]:
    """Run the script's main with ``flags``; every command is recorded, and one naming an output creates it."""
    ran = []

    def fake_run(cmd, check):
        ran.append(cmd)
        if "--out" in cmd:
            out = Path(cmd[cmd.index("--out") + 1])
            (out if out.suffix == "" else out.parent).mkdir(parents=True, exist_ok=True)
            if out.suffix:
                out.touch()
            elif "finetune" in cmd:
                (out / "model").mkdir(exist_ok=True)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake_run)
    monkeypatch.setattr(mod, "space_model", lambda data, space: None)
    monkeypatch.setattr(sys, "argv", ["canon_probes.py", "--data", str(tmp_path / "bench"), "--out",
                                      str(tmp_path / "canon"), *([] if models else ["--no-models"]), *flags])
    mod.main()
    return ran


def _commands(ran: list[list[str]]) -> list[str]:
    return [" ".join(c[c.index("-m") + 1:c.index("-m") + 3]) if "-m" in c else c[1] for c in ran]


def test_finetune_only_then_the_full_call_reuses_the_finetune(tmp_path, monkeypatch):
    mod = load_script("canon_probes")
    early = _calls(mod, monkeypatch, tmp_path, "--finetune-only")
    assert _commands(early) == ["retrieval canon", "retrieval encode"]
    assert early[0][4] == "finetune" and "minilm-robust" in early[1]
    log = json.loads((tmp_path / "canon" / "canon_log.json").read_text())
    assert [x["cmd"].split()[3] for x in log] == ["canon", "encode"]

    full = _calls(mod, monkeypatch, tmp_path)
    assert not any(c[3:5] == ["canon", "finetune"] for c in full if "-m" in c)  # reused: it exists
    log = json.loads((tmp_path / "canon" / "canon_log.json").read_text())
    cmds = [x["cmd"] for x in log]
    assert any(" canon finetune " in c for c in cmds)  # its cost kept from the early call
    assert any(" canon sweep " in c for c in cmds) and any(" canon report " in c for c in cmds)

    # --force redoes everything, the fine-tune too unless --keep-finetune
    forced = _calls(mod, monkeypatch, tmp_path, "--force", "--keep-finetune")
    assert not any(c[3:5] == ["canon", "finetune"] for c in forced if "-m" in c)
    assert any(c[3:5] == ["canon", "sweep"] for c in forced if "-m" in c)
    forced = _calls(mod, monkeypatch, tmp_path, "--force")
    assert any(c[3:5] == ["canon", "finetune"] for c in forced if "-m" in c)


def test_the_tiny_models_it_builds_decode_in_large_batches_and_a_given_model_at_its_default(tmp_path, monkeypatch):
    mod = load_script("canon_probes")
    ran = _calls(mod, monkeypatch, tmp_path, "--llm", "Qwen/Qwen3-32B", models=True)
    runs = {c[c.index("--forecaster") + 1]: c for c in ran if c[2:4] == ["forecasters", "run"]}
    assert set(runs) == {"paraphrase", "describe"}
    assert "--batch-size" not in runs["paraphrase"] and "Qwen/Qwen3-32B" in runs["paraphrase"]
    describe = runs["describe"]
    assert describe[describe.index("--batch-size") + 1] == str(mod.TINY_BATCH)
    assert any(c[2:4] == ["forecasters", "tiny-model"] and "qwen2_vl" in c for c in ran)
