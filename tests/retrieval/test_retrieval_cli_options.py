"""`python -m retrieval`'s options: one definition per option shared by commands, one parser of --shard."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import retrieval.cli
from retrieval.cli import app
from retrieval.shard import parse_shard

#: Flags that mean something different per command, so each command defines its own: what ``--out`` writes; the
#: ``--k`` of `complementarity` (an R@k cutoff, not a top-k list); ``--overwrite`` of `encode` (the space folder, not
#: an ``--out``); ``--model`` of `encode` (the space's encoder) and of `synth` (the canonicalization's embedder).
OWN_PER_COMMAND = {"--out", "--k", "--overwrite", "--model"}


def _option_flags() -> list[str]:
    """The first flag of every ``typer.Option(...)`` written in retrieval/cli.py."""
    tree = ast.parse(Path(retrieval.cli.__file__).read_text(encoding="utf-8"))
    flags = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "typer.Option":
            first = next(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
            flags.append(first.split("/")[0])
    return flags


def _commands(group, prefix=""):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            if name != "canon":  # the canonicalization probes have their own command line
                yield from _commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def test_an_option_shared_by_commands_is_defined_once():
    flags = _option_flags()
    twice = sorted({f for f in flags if flags.count(f) > 1} - OWN_PER_COMMAND)
    assert not twice, f"defined more than once in retrieval/cli.py: {twice}"
    # ... and every command that takes a shared option shows the same option (help, type, repeatable)
    seen = defaultdict(dict)
    for name, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            if p.opts and p.opts[0].startswith("--") and p.opts[0] not in OWN_PER_COMMAND:
                seen[p.opts[0]][name] = (p.help, str(p.type_descriptor.annotation), p.multiple, tuple(p.opts))
    shared = {flag: by_cmd for flag, by_cmd in seen.items() if len(by_cmd) > 1}
    assert {"--data", "--device", "--split", "--space", "--config", "--set", "--seed"} <= set(shared)
    for flag, by_cmd in shared.items():
        assert len(set(by_cmd.values())) == 1, (flag, by_cmd)


def test_shard_has_one_parser():
    assert parse_shard("1/4") == (1, 4) == parse_shard((1, 4))
    for bad in ("4/4", "x", "1/2/3", "-1/2"):
        with pytest.raises(ValueError, match="--shard must be I/N"):
            parse_shard(bad)


def test_shard_option_errors_name_the_option(tiny_dir):
    res = CliRunner().invoke(app, ["encode", "--data", str(tiny_dir), "--space", "s", "--shard", "2/2"])
    flat = " ".join(res.output.replace("│", " ").split())  # the error box wraps lines
    assert res.exit_code == 2 and "'--shard'" in flat and "0 <= I < N, got 2/2" in flat


@pytest.mark.slow
def test_a_minilm_command_runs_without_bitsandbytes(tiny_dir):
    """No retrieval command quantizes, so loading the packaged MiniLM (sentence-transformers -> transformers -> peft)
    never executes bitsandbytes, whose import logs a kernel warning on some CPUs."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "retrieval", "topk", "--data", str(tiny_dir),
                          "--space", "minilm", "--text", "falling", "--k", "1"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "falling" in res.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "sentence_transformers" in imported and "peft" in imported  # the chain that would pull bitsandbytes in
    assert not [m for m in imported if m.startswith("bitsandbytes.")]
    assert "gemm_4bit" not in res.stderr
