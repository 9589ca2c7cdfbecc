"""Output directories of the canonicalization jobs: built beside their final place and swapped in at the end, so a
failed job leaves nothing half-written; a directory is only replaced when a previous job of the same kind made it
(`eval.outputs`: kind ``retrieval canon <job>``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from eval.io import atomic_dir
from eval.outputs import check_output_dir

#: The canonicalization jobs' own marker file, accepted beside `eval.outputs`' marker (its content: the job kind).
CANON_MARKER = ".psr-canon"


def output_kind(job: str) -> str:
    return f"retrieval canon {job}"


def _canon_marked(job: str):
    def recognise(d: Path) -> bool:
        m = d / CANON_MARKER
        return m.exists() and m.read_text(encoding="utf-8").strip() == job
    return recognise


def check_out_dir(final: str | os.PathLike, job: str, *, inputs: Iterable = (), overwrite: bool = False) -> Path:
    """Refuse ``final`` before any work unless it may receive the output of ``canon <job>`` (`eval.outputs`)."""
    return check_output_dir(final, output_kind(job), inputs=inputs, overwrite=overwrite, recognise=_canon_marked(job))


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike, kind: str, *, inputs: Iterable = (), overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``final``.

    ``final`` may be missing, empty, or an earlier output of the same job ``kind``; anything else raises
    `eval.errors.OutputRefused` (a `FileExistsError`) unless ``overwrite``, and never a path of ``inputs``."""
    with atomic_dir(final, kind=output_kind(kind), tag=kind, inputs=inputs, overwrite=overwrite,
                    recognise=_canon_marked(kind)) as stage:
        yield stage
