"""``psr``: the toolkit's console script (``[project.scripts]`` in ``pyproject.toml``).

``psr PACKAGE ARGS...`` runs ``python -m PACKAGE ARGS...``: the package's own ``__main__`` module, executed by
`runpy` as the interpreter's ``-m`` does (``__main__`` and ``sys.argv[0]`` are the package's while it runs, so
multiprocessing children and usage lines behave as under ``python -m``; usage lines read ``python -m PACKAGE``,
the command that ``psr PACKAGE`` is short for). Both spellings take the same entry point, the same error surface
(`eval.cli_support`) and the same exit codes. ``psr env`` reports the environment (`eval.environment`).

eval depends on nothing of ours: the packages are named here as strings and imported only when dispatched to.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from eval.cli_support import exit_code as _exit_code
from eval.errors import EXIT_USER_ERROR

#: The runnable packages (``python -m NAME``) and what each does, in the order of the data flow.
PACKAGES: dict[str, str] = {
    "eval": "the benchmark: validate, build the synthetic benchmark, score runs, reports",
    "retrieval": "embedding spaces, indexes, baselines, oracles, LFTR, fusion, canonicalization",
    "forecasters": "model backends and the resumable batch runner that writes phrase files",
    "distill": "oracle predicates, rationales, teacher narration, SFT sets, student training",
}
#: Commands of ``psr`` itself.
COMMANDS: dict[str, str] = {
    "env": "versions, CUDA, faiss GPU, the vLLM venv and the offline model cache (--json for machine output)",
}


def usage() -> str:
    width = max(map(len, [*PACKAGES, *COMMANDS]))
    lines = ["usage: psr PACKAGE [ARGS...]    (the same as: python -m PACKAGE [ARGS...])",
             "       psr env [--json]", "", "packages (psr PACKAGE --help for their commands):"]
    lines += [f"  {name:<{width}}  {text}" for name, text in PACKAGES.items()]
    lines += ["", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "options:", f"  {'--version':<{width}}  the installed psr-toolkit version"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``psr ARGV``: the exit code of the package command dispatched to (0 for ``--help`` / ``--version``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return EXIT_USER_ERROR  # as a package run without a command
    head, rest = argv[0], argv[1:]
    if head in ("-h", "--help", "help"):
        print(usage())
        return 0
    if head == "--version":
        print(f"psr-toolkit {_toolkit_version()}")
        return 0
    if head == "env":
        from eval.cli_support import run_main
        from eval.environment import main as env_main
        return run_main(env_main, rest)
    if head in PACKAGES:
        return run_package(head, rest)
    print(f"error: unknown package or command {head!r} (one of: {', '.join([*PACKAGES, *COMMANDS])}; "
          f"psr --help)", file=sys.stderr)
    return EXIT_USER_ERROR


def run_package(package: str, args: Sequence[str]) -> int:
    """Execute ``package.__main__`` as ``python -m package ARGS`` would; return its exit code. ``sys.argv`` (and,
    by `runpy`, ``sys.modules["__main__"]``) are restored afterwards."""
    saved = sys.argv
    sys.argv = [saved[0] if saved else "psr", *args]  # runpy replaces argv[0] with the module's file
    try:
        runpy.run_module(package, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return _exit_code(e.code)
    finally:
        sys.argv = saved
    return 0


def _toolkit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("psr-toolkit")
    except PackageNotFoundError:
        return "not installed (running from a source tree)"
