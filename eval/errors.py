"""The toolkit's error vocabulary: errors a user can fix, each naming what and where and, when known, the fix.

Every command's entry point (`eval.cli_support`) prints a `PSRError` (and `eval.io.FormatError`, a subclass) as one
line, without a traceback (unless ``--debug`` or ``PSR_DEBUG=1``), and exits with the class's ``exit_code``
(`EXIT_USER_ERROR`; `EXIT_INCOMPLETE` for `IncompleteJob`). Any other exception is a bug. Raise the most specific
class where the error is found; put the file / line / field or the id in the message and the remedy in ``fix``.
Each class also derives from the built-in exception a caller would catch (``ValueError``, ``KeyError``,
``FileNotFoundError``, ...). Wrap the library call that loads a model by id or path in `loading_model`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

EXIT_USER_ERROR = 2
"""Exit code of every command for an error the user can fix (bad input, refused output, missing model, ...)."""
EXIT_INCOMPLETE = 3
"""Exit code of a job that ran but left requested items undone (e.g. queries without an answer)."""
EXIT_CHECK_FAILED = 1
"""Exit code of a check command (``eval validate``, ``distill validate``) that ran and found problems."""
EXIT_INTERNAL = 70
"""Exit code of an unexpected error: a bug in the toolkit (the traceback is printed; please report it)."""


class PSRError(Exception):
    """An error the user can fix. ``fix``: one sentence saying how (printed after the message)."""

    #: The process exit code of a command that stops on this error.
    exit_code: int = EXIT_USER_ERROR

    def __init__(self, message: str, *, fix: str | None = None):
        self.message, self.fix = message, fix
        super().__init__(str(self))

    def __str__(self) -> str:  # one format for every base (a KeyError's own would quote the message)
        return self.message if not self.fix else f"{self.message} ({self.fix})"


class InputError(PSRError, ValueError):
    """A bad input: a missing file or directory, a wrong value, an unknown id, mismatched data."""


class UnknownName(InputError, KeyError):
    """An id, name or key that the data or the option's choices do not hold (a query id, a pool, a GT tier)."""


class MissingInput(PSRError, FileNotFoundError):
    """A file or folder the job needs (an input, a checkpoint, a trained tower) does not exist."""


class OutputRefused(PSRError, FileExistsError):
    """An output path that the command will not replace (not written by the toolkit for this kind of output,
    or holding the job's own inputs)."""


class OutputLocked(PSRError, RuntimeError):
    """An output that another job is writing now (it holds the output's lock)."""


class ModelNotFound(PSRError, OSError):
    """A model id that is neither a local path nor in the local cache (the hub is unreachable offline)."""


class IncompleteJob(PSRError):
    """A job that ran but did not do everything it was asked; the message says what is missing and how to finish."""

    exit_code = EXIT_INCOMPLETE


class EngineError(PSRError, RuntimeError):
    """A model, inference engine or score source that behaves in a way the job cannot use (scores that change between
    two passes, tokens that do not match, fewer results than requests, a module layout LoRA does not expect)."""


class MissingDependency(PSRError, ImportError):
    """An optional package that the chosen option needs is not installed; ``fix`` gives the pip command."""


class EmptySelection(InputError):
    """A job asked to work on nothing: a split, a filter or a phrase file that selects no query. A job over no query
    would exit 0 having done nothing, so this is an error unless the command is asked for it (``--allow-empty``)."""


@contextlib.contextmanager
def loading_model(model: str | os.PathLike, *, flag: str = "--model", packaged: str | None = None) -> Iterator[None]:
    """Report a model that cannot be loaded as `ModelNotFound`. Wrap the library calls that load ``model`` by id or
    path (transformers, sentence-transformers, huggingface_hub, peft): an ``OSError`` or ``ValueError`` they raise
    means ``model`` is no model there. ``flag``: the option that names it; ``packaged``: a model that ships with the
    toolkit's dependencies, offered as the fix."""
    try:
        yield
    except PSRError:
        raise
    except (OSError, ValueError) as e:
        raise model_not_found(str(model), e, flag=flag, packaged=packaged) from e


def model_not_found(model: str, error: BaseException, *, flag: str = "--model",
                    packaged: str | None = None) -> ModelNotFound:
    """The `ModelNotFound` of ``model`` that failed to load with ``error``: a local folder that holds no model, an
    id missing from the local cache while the hub is offline, or an id the hub does not have."""
    text = " ".join(str(error).split())
    if Path(model).exists():
        return ModelNotFound(f"{model} is not a loadable model folder ({text[:200]})",
                             fix="pass the folder that holds the model's config.json and weights")
    alt = f"pass {flag} {packaged} or a local path" if packaged else \
        f"pass a local path as {flag} (download the model on a machine with network access)"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0") or "connect" in text or \
        type(error).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled")
    if offline:
        return ModelNotFound(f"{model} is not in the local cache and the hub is unreachable", fix=alt)
    return ModelNotFound(f"{model} is neither a local path nor a model id that could be loaded ({text[:200]})", fix=alt)
