"""File helpers shared by every job: JSONL reading with line numbers, atomic writes, clear format errors."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eval.atomic import atomic_path, signals_held
from eval.atomic import write_json as write_json
from eval.errors import InputError


class FormatError(InputError):
    """A malformed input file. The message names the file, the line (1-based) and the field when known."""

    def __init__(self, path: str | os.PathLike, message: str, line: int | None = None, field: str | None = None,
                 *, fix: str | None = None):
        self.path, self.line, self.field, self.reason = str(path), line, field, message
        where = self.path + (f":{line}" if line is not None else "") + (f" field '{field}'" if field else "")
        super().__init__(f"{where}: {message}", fix=fix)


def iter_jsonl(path: str | os.PathLike, *, allow_torn_tail: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-empty line of a JSONL file.

    A line that is not a JSON object raises `FormatError` naming the line. With ``allow_torn_tail`` a last line
    without a trailing newline that does not parse (a write torn by a crash) is skipped instead.
    """
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    torn_tail_possible = not data.endswith(b"\n")
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if allow_torn_tail and torn_tail_possible and i == len(lines):
                return
            raise FormatError(path, f"not valid JSON ({e.msg if hasattr(e, 'msg') else e})", line=i) from None
        if not isinstance(obj, dict):
            raise FormatError(path, f"expected a JSON object, got {type(obj).__name__}", line=i)
        yield i, obj


def read_jsonl(path: str | os.PathLike, **kw) -> list[dict[str, Any]]:
    return [obj for _, obj in iter_jsonl(path, **kw)]


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, kind: str | None = None, tag: str = "building", inputs=(),
               overwrite: bool = False, recognise=None) -> Iterator[Path]:
    """Yield an empty staging directory beside ``path``; on success it replaces ``path``, on an exception it is
    deleted, so a failed job never leaves a half-written output directory.

    Only an output of the same ``kind`` is ever replaced (`eval.outputs`): the target is checked on entry and again
    before the swap (`eval.outputs.check_output_dir` with ``inputs``, ``overwrite``, ``recognise``), and the stage gets
    the marker of ``kind``, listing what the job wrote. Replacing an earlier output of the same kind keeps the files
    a user added to it (`eval.outputs.files_not_written`: they are moved into the new output; one whose name the new
    output also writes refuses the swap). ``kind`` None replaces only a missing or empty directory (or anything,
    with ``overwrite``). Should the target change during the job so that it may no longer be replaced, the finished
    output is kept under a visible name beside it and `OutputRefused` names both. ``tag`` names the stage folder.
    """
    from eval.errors import OutputRefused
    from eval.outputs import check_output_dir, write_marker, written_listing

    def check() -> None:
        check_output_dir(path, kind, inputs=inputs, overwrite=overwrite, recognise=recognise)

    check()
    final = Path(os.path.abspath(path))  # "." and ".." name their folder; its name makes the stage's
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = None
    try:
        with signals_held():
            stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.{tag}-", dir=final.parent))
        umask = os.umask(0)
        os.umask(umask)
        stage.chmod(0o777 & ~umask)  # mkdtemp makes it private; outputs are meant to be shared
        yield stage
        if kind is not None:
            write_marker(stage, kind, written=written_listing(stage))
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    # The output is complete: an interrupt now waits until it is in place (or kept aside), so none leaves the
    # finished stage behind as a hidden folder.
    with signals_held():
        try:
            check()
            users = _users_files(final, stage, kind, overwrite)
        except OutputRefused as e:
            kept = Path(tempfile.mkdtemp(prefix=f"{final.name}.new-", dir=final.parent))
            os.replace(stage, kept / final.name)
            raise OutputRefused(f"{e.message}; the finished output is kept in {kept / final.name}",
                                fix=e.fix) from None
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        _swap_in(stage, final, users)


def _users_files(final: Path, stage: Path, kind: str | None, overwrite: bool) -> list[str]:
    """Files a user added to ``final``, an earlier output of ``kind`` (none when ``final`` is another kind that
    ``overwrite`` replaces whole); `OutputRefused` when the new output writes one of their names."""
    from eval.errors import OutputRefused
    from eval.outputs import files_not_written, read_marker

    if kind is None or not final.is_dir() or final.is_symlink() or (read_marker(final) or {}).get("kind") != kind \
            and overwrite:
        return []
    users = files_not_written(final, stage)
    clash = [f for f in users if os.path.lexists(stage / f)]
    if clash:
        raise OutputRefused(f"{final} holds {len(clash)} file(s) this command did not write that its new output "
                            f"would replace, e.g. {final / clash[0]}", fix="move them out of the folder and rerun")
    return users


def _swap_in(stage: Path, final: Path, users: list[str]) -> None:
    """Replace ``final`` by ``stage``, moving the ``users`` files of the old ``final`` into the new one. Should a move
    fail, the old folder is kept beside ``final`` under a visible name (named in the error)."""
    old = None
    try:
        if final.exists() or final.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, old / "x")
        os.replace(stage, final)
    except BaseException:
        if old is not None and (old / "x").exists() and not final.exists():
            os.replace(old / "x", final)  # put the previous output back
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is None:
        return
    try:
        for rel in users:
            (final / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(old / "x" / rel, final / rel)
    except BaseException:
        kept = final.with_name(f"{final.name}.previous")
        os.replace(old / "x", kept)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_jsonl(path: str | os.PathLike, rows, *, sort_keys: bool = False) -> int:
    """Write rows (dicts) as JSONL atomically; returns the number of rows."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=sort_keys) + "\n")
            n += 1
    return n


_BOM = "\ufeff"


def read_text(path: str | os.PathLike) -> str:
    """The one reader of the toolkit's text inputs: the file as strict UTF-8 (a leading byte-order mark dropped).
    Bytes that are not UTF-8 raise `FormatError` naming the file, the line (1-based), the column and the byte."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        raise FormatError(path, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start - line_start + 1}: "
                                f"{e.reason})", line=raw.count(b"\n", 0, e.start) + 1,
                          fix="re-encode the file as UTF-8") from None
    return text[1:] if text.startswith(_BOM) else text


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a text file (`read_text`), without their line ends."""
    return read_text(path).splitlines()


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file; invalid JSON or UTF-8 raises `FormatError` naming the file and the line."""
    path = Path(path)
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(path, f"not valid JSON ({e.msg})", line=e.lineno) from None


def read_yaml(path: str | os.PathLike):
    """The YAML document of ``path`` (an empty file: ``{}``); invalid YAML or UTF-8 is a `FormatError` naming the
    file and line."""
    import yaml

    text = read_text(path)
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise FormatError(path, f"not valid YAML ({' '.join(str(e).split())[:200]})",
                          line=None if mark is None else mark.line + 1) from None


def writable_dir(preferred: str | os.PathLike, fallback: str | os.PathLike) -> Path:
    """``preferred`` (created) when this process can write there, else ``fallback`` (created): where a cache lives
    beside read-only data."""
    d = Path(preferred)
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    f = Path(fallback)
    f.mkdir(parents=True, exist_ok=True)
    return f
