"""Run a command line in-process through the same entry point as ``python -m PACKAGE`` (`eval.cli_support`), with
stdout and stderr captured: what a user sees, without paying the interpreter start-up per call."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

APPS = {
    "eval": ("eval.cli", "app"),
    "retrieval": ("retrieval.cli", "app"),
    "forecasters": ("forecasters.cli", "app"),
    "distill": ("distill.cli", "main"),
    "distill.train": ("distill.train", "main"),
}


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_cli(package: str, *args) -> CliResult:
    """``python -m PACKAGE ARGS...`` in this process; returns the exit code and the captured output."""
    import importlib

    from eval.cli_support import run_main, run_typer

    module, name = APPS[package]
    target = getattr(importlib.import_module(module), name)
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_main(target, argv) if name == "main" else run_typer(target, argv, prog_name=f"python -m {package}")
    return CliResult(code, out.getvalue(), err.getvalue())


def snapshot(root: Path, skip: tuple[str, ...] = (".cache",)) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (relative path -> digest), ``skip``ped folder names left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() if not p.is_symlink() else \
                "link:" + os.readlink(p)
    return out


def assert_unchanged(before: dict[str, str], after: dict[str, str]) -> None:
    """Every file of ``before`` is still there, byte-identical."""
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert not changed, f"pre-existing files changed or removed: {changed[:10]}"


def error_lines(res) -> list[str]:
    return [x for x in res.err.splitlines() if x.startswith("error:")]


def assert_one_clear_error(res, *needles: str) -> str:
    """Exit code 2, no traceback, exactly one ``error:`` line, holding every needle; returns that line."""
    assert res.code == 2, f"exit code {res.code}\n{res.text[-3000:]}"
    assert "Traceback" not in res.text, res.text[-3000:]
    lines = error_lines(res)
    assert len(lines) == 1, res.err[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def copy_world(world: dict, dest: Path) -> dict:
    """A private, writable copy of `cli_world` under ``dest`` (same keys)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(world["bench"], dest / "bench", ignore=shutil.ignore_patterns(".cache"), symlinks=True)
    (dest / "runs").mkdir(exist_ok=True)
    for f in world["run"].parent.iterdir():
        shutil.copy2(f, dest / "runs" / f.name)
    shutil.copy2(world["phrases"], dest / "phrases.jsonl")
    return {"root": dest, "bench": dest / "bench", "run": dest / "runs" / world["run"].name,
            "phrases": dest / "phrases.jsonl"}
