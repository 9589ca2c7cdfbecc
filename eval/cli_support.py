"""One error surface for every command line of the toolkit (``python -m eval | retrieval | forecasters | distill``
and ``distill.train``).

Every typer app is set up with `install` (its command group reports errors, so ``python -m PACKAGE``, typer's
``CliRunner`` and scripts calling the app see the same thing) and every package's ``__main__`` runs it through
`run_typer`; argparse-style ``main(argv) -> int`` entry points run through `run_main`. Errors are reported as
follows:

- a known error -- by its type: an `eval.errors.PSRError` (``FormatError``, ``InputError``, ``OutputRefused``,
  ``ModelNotFound``, ...), raised where the toolkit finds the problem; an operating-system error about a file
  (missing, a directory, no permission, disk full); or another exception whose class declares an ``exit_code``
  (``prompts.PromptError``: prompts depends on nothing) -- prints ONE red line ``error: WHAT AND WHERE (FIX)`` and
  exits with the class's ``exit_code`` (`EXIT_USER_ERROR`; `EXIT_INCOMPLETE` for an `IncompleteJob`: the job ran
  but left items undone);
- typer/click usage errors (a missing option, a bad value, a ``--data`` that is not a benchmark directory) keep
  click's own message and exit code (2, the same as `EXIT_USER_ERROR`);
- anything else is a bug: the traceback is printed, then one red line, and the exit code is `EXIT_INTERNAL`;
- SIGINT (Ctrl-C) and SIGTERM raise `Interrupted` where the command was (`signals_as_exceptions`), so every cleanup
  runs (a folder being built is removed, a lock released, a stage's child process stopped); one line says so and
  the exit code is 128 + the signal number (130, 143). Further signals are ignored while the command unwinds. An
  error that library code made of the `Interrupted` (Python's class creation wraps it in ``RuntimeError``,
  ``datasets`` in ``DatasetGenerationError``) is reported as the interruption it is (`interruption_behind`).

``--debug`` (anywhere on the command line) or ``PSR_DEBUG=1`` prints the traceback of known errors too.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import typer

from eval.errors import EXIT_INTERNAL, EXIT_USER_ERROR, InputError, PSRError

DEBUG_FLAG = "--debug"
DEBUG_ENV = "PSR_DEBUG"
#: Key of the click context's ``obj`` / ``meta`` that `run_typer` and the ``--debug`` option fill.
DEBUG_KEY = "psr_debug"
OVERWRITE_HELP = ("replace an existing --out that this toolkit did not write for this command (never a path that "
                  "is, holds or lies inside an input of the job)")


# --- entry points ---------------------------------------------------------------------------------------------

def debug_env() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (before a ``--`` separator), and whether debug output is on."""
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    debug = DEBUG_FLAG in argv[:end]
    rest = [a for a in argv[:end] if a != DEBUG_FLAG] + argv[end:]
    return rest, debug or debug_env()


class Interrupted(BaseException):
    """SIGINT or SIGTERM delivered to a command (`signals_as_exceptions`). A `BaseException`, like
    ``KeyboardInterrupt``, so only cleanup code (``finally``, ``except BaseException: ...; raise``) sees it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


#: The signal delivered inside the running `signals_as_exceptions` block, if one was.
_delivered: int | None = None


def interruption_behind(e: BaseException) -> Interrupted | None:
    """The `Interrupted` that ``e`` stands for: one in its chain of causes, or, where a wrapper dropped the chain, the
    signal delivered inside the running `signals_as_exceptions` block (an exception raised after a signal arrived is
    part of the unwinding it started). None where no signal came."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, Interrupted):
            return x
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return Interrupted(_delivered) if _delivered is not None else None


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """While the block runs (in the main thread), SIGINT and SIGTERM raise `Interrupted`; once one has, both are
    ignored until the block ends, so the cleanup the exception triggers is not itself cut short.

    A signal can land while a finalizer (``__del__``) runs, where Python prints an exception and drops it. Such an
    `Interrupted` is not lost: the unraisable hook of the block re-arms the handler and trips the signal again, so it
    is raised in the code the finalizer interrupted, a moment later."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_hook = sys.unraisablehook

    def handler(signum, _frame):
        global _delivered
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        _delivered = signum
        raise Interrupted(signum)

    def unraisable(u) -> None:
        if isinstance(u.exc_value, Interrupted):
            # trip the signal again from another thread a moment later, once this hook has returned
            signal.signal(u.exc_value.signum, handler)
            timer = threading.Timer(0.05, _thread.interrupt_main, args=(u.exc_value.signum,))
            timer.daemon = True
            timer.start()
            return
        previous_hook(u)

    global _delivered
    outer, _delivered = _delivered, None
    for s in previous:
        signal.signal(s, handler)
    sys.unraisablehook = unraisable
    try:
        yield
    except Exception as e:  # an interruption that library code wrapped in another error
        behind = interruption_behind(e)
        if behind is None:
            raise
        raise behind from e
    finally:
        _delivered = outer
        sys.unraisablehook = previous_hook
        for s, h in previous.items():
            signal.signal(s, h)


def _interrupted(e: Interrupted) -> int:
    _print_line(f"error: interrupted by {e}: what was being written was removed, finished outputs are kept (rerun "
                "the same command to finish)")
    return 128 + e.signum


def run_typer(app, argv: Sequence[str] | None = None, prog_name: str | None = None) -> int:
    """Run a typer app on ``argv`` (default ``sys.argv[1:]``) and return its exit code (see the module docstring).
    ``--debug`` may stand anywhere; the app's group (`install`) reports errors of its commands."""
    args, debug = split_debug(sys.argv[1:] if argv is None else argv)
    try:
        with signals_as_exceptions():
            app(args=args, prog_name=prog_name, standalone_mode=True, obj={DEBUG_KEY: debug})
    except SystemExit as e:  # click exits through SystemExit: usage errors, --help, typer.Exit, reported errors
        return exit_code(e.code)
    except Interrupted as e:
        return _interrupted(e)
    except Exception as e:  # outside any command (an app without `install`)
        return report_error(e, debug=debug)
    return 0


def run_main(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run an argparse-style ``main(argv) -> exit code`` under the same error handling as `run_typer`."""
    args, debug = split_debug(sys.argv[1:] if argv is None else argv)
    try:
        with signals_as_exceptions():
            return int(main(args) or 0)
    except SystemExit as e:  # argparse usage errors and --help
        return exit_code(e.code)
    except Interrupted as e:
        return _interrupted(e)
    except Exception as e:
        return report_error(e, debug=debug)


def exit_code(code: object) -> int:
    """The process exit code of a ``SystemExit.code`` (None: 0; a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") semantics
    return 1


# --- error reporting ------------------------------------------------------------------------------------------

def report_error(e: BaseException, *, debug: bool = False) -> int:
    """Print ``e`` the toolkit's way (module docstring; by its type alone) and return the exit code."""
    known = describe_error(e)
    if known is None:
        traceback.print_exception(e)
        _print_line(f"internal error: {type(e).__name__}: {_one_line(str(e))} -- a bug in the toolkit; please "
                    f"report it with the traceback above")
        return EXIT_INTERNAL
    if debug:
        traceback.print_exception(e)
    message, fix, code = known
    _print_line("error: " + message + (f" ({fix})" if fix else ""))  # as str(PSRError): one format everywhere
    return code


def _print_line(text: str) -> None:
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, highlight=False).print(Text(_one_line(text), style="red"), soft_wrap=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe_error(e: BaseException) -> tuple[str, str | None, int] | None:
    """``(message, fix, exit code)`` of a known error (module docstring), None for an unexpected one (a bug)."""
    if isinstance(e, PSRError):
        return e.message, e.fix, e.exit_code
    if isinstance(e, OSError) and e.errno is not None:
        where = f"{e.filename}: " if e.filename else ""
        fix = "check the path" if isinstance(e, FileNotFoundError | NotADirectoryError) else None
        return where + (e.strerror or str(e)), fix, EXIT_USER_ERROR
    code = getattr(type(e), "exit_code", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return str(e), None, code
    return None


# --- shared options ----------------------------------------------------------------------------------------------

def check_benchmark_dir(path: str | os.PathLike, option: str = "--data") -> Path:
    """``path`` if it is a benchmark directory (a folder holding manifest.json), or the snapshot folder of the Hub
    dataset ``owner/name[@revision]`` it names (`eval.hub.resolve_data`); else `InputError`."""
    from eval.hub import resolve_data

    p = resolve_data(path, option)
    if not p.exists():
        raise InputError(f"{option} {path} does not exist", fix="pass a benchmark directory (python -m eval synth "
                                                                "--out DIR builds the synthetic one)")
    if not p.is_dir():
        raise InputError(f"{option} {path} is a file, not a benchmark directory", fix="pass the folder that holds "
                                                                                      "manifest.json")
    if not (p / "manifest.json").is_file():
        raise InputError(f"{option} {path} is not a benchmark directory (no manifest.json)",
                         fix="pass the folder that holds manifest.json, queries.jsonl, corpus.jsonl, states.jsonl")
    return p


def data_callback(value):
    """typer callback of a ``--data`` option: an existing benchmark directory, else a usage error (exit 2)."""

    if value is None:
        return value
    try:
        return check_benchmark_dir(value)
    except InputError as e:
        raise typer.BadParameter(f"{e.message} ({e.fix})") from None


def data_option(default=..., help: str = "benchmark directory, or a Hub dataset owner/name[@revision] (eval/hub.py)"):
    """A ``--data`` typer option that must name an existing benchmark directory (checked before the command runs)."""

    return typer.Option(default, "--data", help=help, callback=data_callback)


def overwrite_option():
    """The ``--overwrite`` typer option of every command that writes ``--out``."""

    return typer.Option(False, "--overwrite", help=OVERWRITE_HELP)


def _group_class():
    """A typer command group that reports the errors of its commands the toolkit's way and exits with their code."""
    from typer.core import TyperGroup
    from typer.exceptions import Abort, Exit, TyperException

    class PSRGroup(TyperGroup):
        def invoke(self, ctx):
            try:
                return super().invoke(ctx)
            except (Exit, Abort, TyperException, SystemExit):  # click's own: --help, usage errors, typer.Exit
                raise
            except Exception as e:
                behind = interruption_behind(e)
                if behind is not None:  # a signal that library code wrapped in another error: run_typer reports it
                    raise behind from e
                obj = ctx.find_root().obj if isinstance(ctx.find_root().obj, dict) else {}
                debug = bool(obj.get(DEBUG_KEY) or ctx.meta.get(DEBUG_KEY)) or debug_env()
                ctx.exit(report_error(e, debug=debug))

    return PSRGroup


def install(app) -> None:
    """Give the typer ``app`` the toolkit's error surface (its group reports errors of every command, nested apps
    included) and a ``--debug`` option (also accepted after the command: `run_typer` takes it off the line)."""

    app.info.cls = _group_class()

    @app.callback()
    def _root(ctx: typer.Context, debug: bool = typer.Option(False, DEBUG_FLAG, help="print the traceback of known "
                                                                                    f"errors too (or set {DEBUG_ENV}=1)")
              ) -> None:
        if debug:
            ctx.meta[DEBUG_KEY] = True
