"""One error surface for every command line of the toolkit (``python -m eval | retrieval | forecasters | distill``
and ``distill.train``).

Every typer app is set up with `install` (its command group reports errors, so ``python -m PACKAGE``, typer's
``CliRunner`` and scripts calling the app see the same thing) and every package's ``__main__`` runs it through
`run_typer`; argparse-style ``main(argv) -> int`` entry points run through `run_main`. Errors are reported as
follows:

- a known error -- `eval.errors.PSRError` (``FormatError``, ``InputError``, ``OutputRefused``, ``ModelNotFound``,
  ...), an operating-system error about a file (missing, a directory, no permission, disk full), a model that is
  neither a local path nor in the local cache (an ``OSError`` / ``ValueError`` raised while transformers,
  sentence-transformers or huggingface_hub load it), or a check of the toolkit's own (a ``ValueError``,
  ``LookupError`` or ``RuntimeError`` raised by a ``raise`` statement in toolkit code) -- prints ONE red line
  ``error: WHAT AND WHERE (FIX)`` and exits with `EXIT_USER_ERROR` (`EXIT_INCOMPLETE` for an `IncompleteJob`: the
  job ran but left items undone);
- typer/click usage errors (a missing option, a bad value, a ``--data`` that is not a benchmark directory) keep
  click's own message and exit code (2, the same as `EXIT_USER_ERROR`);
- anything else is a bug: the traceback is printed, then one red line, and the exit code is `EXIT_INTERNAL`;
- SIGINT (Ctrl-C) and SIGTERM raise `Interrupted` where the command was (`signals_as_exceptions`), so every cleanup
  runs (a folder being built is removed, a lock released, a stage's child process stopped); one line says so and
  the exit code is 128 + the signal number (130, 143). Further signals are ignored while the command unwinds.

``--debug`` (anywhere on the command line) or ``PSR_DEBUG=1`` prints the traceback of known errors too.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import typer

from eval.errors import EXIT_INCOMPLETE, EXIT_INTERNAL, EXIT_USER_ERROR, IncompleteJob, InputError, PSRError

DEBUG_FLAG = "--debug"
DEBUG_ENV = "PSR_DEBUG"
#: Keys of the click context's ``obj`` / ``meta`` that `run_typer` and the ``--debug`` option fill.
DEBUG_KEY, ARGV_KEY = "psr_debug", "psr_argv"
#: Top-level packages whose own ``raise`` statements are checks with a message for the user.
TOOLKIT_PACKAGES = frozenset({"eval", "retrieval", "forecasters", "distill", "prompts"})
#: Libraries that load models by id or path; an OSError / ValueError from them while loading means "model not found".
MODEL_LOADERS = frozenset({"transformers", "huggingface_hub", "sentence_transformers", "peft", "tokenizers"})
#: Local variable names under which those libraries hold the model id being loaded.
MODEL_ARG_NAMES = ("pretrained_model_name_or_path", "model_name_or_path", "path_or_repo_id", "repo_id")
#: The text model that ships with the toolkit's dependencies (`retrieval.encoders.PACKAGED_MINILM`; eval cannot
#: import retrieval, so the name is repeated here).
PACKAGED_TEXT_MODEL = "packaged:all-MiniLM-L6-v2"
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


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """While the block runs (in the main thread), SIGINT and SIGTERM raise `Interrupted`; once one has, both are
    ignored until the block ends, so the cleanup the exception triggers is not itself cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, _frame):
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
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
            app(args=args, prog_name=prog_name, standalone_mode=True, obj={DEBUG_KEY: debug, ARGV_KEY: args})
    except SystemExit as e:  # click exits through SystemExit: usage errors, --help, typer.Exit, reported errors
        return exit_code(e.code)
    except Interrupted as e:
        return _interrupted(e)
    except Exception as e:  # outside any command (an app without `install`)
        return report_error(e, debug=debug, argv=args)
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
        return report_error(e, debug=debug, argv=args)


def exit_code(code: object) -> int:
    """The process exit code of a ``SystemExit.code`` (None: 0; a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") semantics
    return 1


# --- error reporting ------------------------------------------------------------------------------------------

def report_error(e: BaseException, *, debug: bool = False, argv: Sequence[str] = ()) -> int:
    """Print ``e`` the toolkit's way (module docstring) and return the exit code."""
    known = describe_error(e, argv)
    if known is None:
        traceback.print_exception(e)
        _print_line(f"internal error: {type(e).__name__}: {_one_line(str(e))} -- a bug in the toolkit; please "
                    f"report it with the traceback above")
        return EXIT_INTERNAL
    if debug:
        traceback.print_exception(e)
    message, fix = known
    _print_line("error: " + message + (f" ({fix})" if fix else ""))  # as str(PSRError): one format everywhere
    return EXIT_INCOMPLETE if isinstance(e, IncompleteJob) else EXIT_USER_ERROR


def _print_line(text: str) -> None:
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, highlight=False).print(Text(_one_line(text), style="red"), soft_wrap=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe_error(e: BaseException, argv: Sequence[str] = ()) -> tuple[str, str | None] | None:
    """``(message, fix)`` for a known error, None for an unexpected one (a bug)."""
    if isinstance(e, PSRError):
        return e.message, e.fix
    model = _model_error(e, argv)
    if model is not None:
        return model
    if isinstance(e, OSError) and e.errno is not None:
        where = f"{e.filename}: " if e.filename else ""
        fix = "check the path" if isinstance(e, FileNotFoundError | NotADirectoryError) else None
        return where + (e.strerror or str(e)), fix
    if isinstance(e, ValueError | LookupError | RuntimeError | FileNotFoundError) and _raised_by_toolkit(e):
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        return str(msg), None
    return None


def _frames(e: BaseException):
    return list(traceback.walk_tb(e.__traceback__))


def _package(frame) -> str:
    return str(frame.f_globals.get("__name__", "")).split(".")[0]


def _raised_by_toolkit(e: BaseException) -> bool:
    """True when the innermost frame is toolkit code and its line is a ``raise`` statement (a deliberate check,
    not e.g. a failing ``float()`` or a dict lookup, which are bugs)."""
    frames = _frames(e)
    if not frames:
        return False
    frame, lineno = frames[-1]
    if _package(frame) not in TOOLKIT_PACKAGES:
        return False
    return linecache.getline(frame.f_code.co_filename, lineno).lstrip().startswith("raise")


def _model_error(e: BaseException, argv: Sequence[str]) -> tuple[str, str] | None:
    """A model that could not be loaded by id or path: what it is, and how to fix it."""
    if not isinstance(e, OSError | ValueError):
        return None
    frames = _frames(e)
    if not frames or _package(frames[-1][0]) not in MODEL_LOADERS:
        return None
    model = next((str(f.f_locals[n]) for f, _ in frames if _package(f) in MODEL_LOADERS
                  for n in MODEL_ARG_NAMES if isinstance(f.f_locals.get(n), str | os.PathLike)), None)
    if model is None:
        return None
    flag = _flag_of(model, argv)
    text = _one_line(str(e))
    if Path(model).exists():
        return (f"{model} is not a loadable model folder ({text[:200]})",
                "pass the folder that holds the model's config.json and weights")
    sentence = any(_package(f) == "sentence_transformers" for f, _ in frames)
    alt = f"pass {flag} {PACKAGED_TEXT_MODEL} or a local path" if sentence else \
        f"pass a local path as {flag} (download the model on a machine with network access)"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0") or "connect" in text or \
        type(e).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled")
    if offline:
        return f"{model} is not in the local cache and the hub is unreachable", alt
    return f"{model} is neither a local path nor a model id that could be loaded ({text[:200]})", alt


def _flag_of(value: str, argv: Sequence[str]) -> str:
    """The option of ``argv`` that carried ``value`` (``--model`` when it came from a default)."""
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" in a and a.split("=", 1)[1] == value:
            return a.split("=", 1)[0]
        if a == value and i > 0 and argv[i - 1].startswith("--"):
            return argv[i - 1]
    return "--model"


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
                obj = ctx.find_root().obj if isinstance(ctx.find_root().obj, dict) else {}
                debug = bool(obj.get(DEBUG_KEY) or ctx.meta.get(DEBUG_KEY)) or debug_env()
                ctx.exit(report_error(e, debug=debug, argv=obj.get(ARGV_KEY, ())))

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
