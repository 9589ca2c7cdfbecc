"""Run a command line in-process through the same entry point as ``python -m PACKAGE`` (`eval.cli_support`), with
stdout and stderr captured: what a user sees, without paying the interpreter start-up per call."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

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
