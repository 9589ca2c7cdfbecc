"""The toolkit's error vocabulary: errors a user can fix, each naming what and where and, when known, the fix.

Every command's entry point prints a `PSRError` (and `eval.io.FormatError`, a subclass) as one line, without a
traceback (unless ``--debug`` or ``PSR_DEBUG=1``), and exits with `EXIT_USER_ERROR`. Raise the most specific
class; put the file / line / field or the id in the message and the remedy in ``fix``.
"""

from __future__ import annotations

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

    def __init__(self, message: str, *, fix: str | None = None):
        self.message, self.fix = message, fix
        super().__init__(message if not fix else f"{message} ({fix})")


class InputError(PSRError, ValueError):
    """A bad input: a missing file or directory, a wrong value, an unknown id, mismatched data."""


class OutputRefused(PSRError, FileExistsError):
    """An output path that the command will not replace (not written by the toolkit for this kind of output,
    or holding the job's own inputs)."""


class ModelNotFound(PSRError, OSError):
    """A model id that is neither a local path nor in the local cache (the hub is unreachable offline)."""


class IncompleteJob(PSRError):
    """A job that ran but did not do everything it was asked; the message says what is missing and how to finish."""


class MissingDependency(PSRError, ImportError):
    """An optional package that the chosen option needs is not installed; ``fix`` gives the pip command."""


class EmptySelection(InputError):
    """A job asked to work on nothing: a split, a filter or a phrase file that selects no query. A job over no query
    would exit 0 having done nothing, so this is an error unless the command is asked for it (``--allow-empty``)."""
