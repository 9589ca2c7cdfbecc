"""Measurement records: what a benchmark measured, with the command that measured it and where and when it ran.

A benchmark script ends with `record`, which writes ``FOLDER/NAME.json`` (atomically) holding:

- ``markdown``: the Markdown the benchmark generated (its tables and short generated sentences), shown unedited on
  docs/performance.md, which `scripts/perf_page.py` writes from these records;
- ``command``: the command line as the user typed it (``python scripts/bench_load.py --out X``: the interpreter
  written ``python``, whatever its path);
- ``measured_at``: UTC time (ISO 8601, seconds); ``commit``: ``git rev-parse HEAD`` of the checkout, with
  ``+dirty`` when tracked files differ from it (the record folder and the page it feeds do not count);
- ``load_before`` / ``load_after``: the 1-minute load average when the benchmark started and ended, where the script
  gives them (`load_now`), else both read when the record is written; ``cpus``, ``cpu_model``, ``torch`` (the
  installed version, read from its metadata without importing it);
- ``data``: the benchmark's own results (JSON), for anyone who wants more than the Markdown.

`load` reads every record of a folder back as `Record`. Scripts share their command-line options through
`add_record_options` and `record_from_args`, so every benchmark spells ``--record-dir`` / ``--no-record`` /
``--record-name`` the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from eval.io import FormatError, write_json

#: The checkout this module lives in: records of its benchmarks go to docs/perf/ there (committed; the page is built
#: from them).
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = REPO_ROOT / "docs" / "perf"
#: What the dirty check leaves out: writing records and the page must not mark the next record "+dirty".
GENERATED_PATHS = ("docs/perf", "docs/performance.md")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Record:
    """One measurement, as `record` writes it (``FOLDER/<name>.json``)."""

    name: str
    title: str
    command: str
    markdown: str
    measured_at: str  # UTC, ISO 8601 to the second
    commit: str | None  # "<sha>" or "<sha>+dirty"; None outside a git checkout
    load_before: float  # 1-minute load average
    load_after: float
    cpus: int
    cpu_model: str
    torch: str | None
    data: Any = None
    path: Path | None = field(default=None, compare=False)  # where it was read from; not written

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: Path | None = None) -> Record:
        names = {f.name for f in fields(cls)} - {"path"}
        missing = sorted(n for n in names if n not in d and n != "data")
        if missing:
            raise FormatError(path or "<record>", f"not a measurement record: missing {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names}, path=path)


def load_now() -> float:
    """The 1-minute load average now (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def command_line(argv: Sequence[str] | None = None) -> str:
    """``python SCRIPT ARGS...`` as the user would type it: the script relative to the working directory when it
    lies under it (``sys.argv`` when ``argv`` is None; ``argv[0]`` is the script)."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        script = Path(argv[0])
        if script.is_absolute():
            with contextlib.suppress(ValueError):  # a script outside the working directory keeps its path
                argv[0] = script.relative_to(Path.cwd()).as_posix()
    return shlex.join(["python", *argv])


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """``HEAD``'s sha, ``+dirty`` when tracked files outside `GENERATED_PATHS` differ from it; None without git."""
    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
        except OSError:
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 *(f":(exclude){p}" for p in GENERATED_PATHS))
    return sha + ("+dirty" if status else "")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name and its widest vector instructions (``/proc/cpuinfo``, or the text ``cpuinfo``), e.g.
    ``AMD EPYC (AVX2)`` or ``AMD EPYC (AVX-512, BF16)``: one model name covers CPUs that run the same matmuls at very
    different speeds. Without ``/proc/cpuinfo``: what `platform` says."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return platform.processor() or platform.machine()
    name, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    if not name:
        return platform.processor() or platform.machine()
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else "")
    extras = [x for flag, x in (("avx512_bf16", "BF16"), ("amx_tile", "AMX")) if flag in flags]
    return f"{name} ({', '.join([isa, *extras])})" if isa else name


def torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def record(name: str, *, title: str, markdown: str, data: Any = None, folder: Path = DEFAULT_FOLDER,
           load: tuple[float, float] | None = None, argv: Sequence[str] | None = None) -> Record:
    """Write the measurement ``name`` to ``folder/<name>.json`` (replacing an earlier one of that name) and return it.

    ``load``: the 1-minute load average (before, after) the benchmark; read now for both when None. ``argv``: the
    script and its arguments (default ``sys.argv``)."""
    if not NAME.match(name):
        raise ValueError(f"record name {name!r}: use letters, digits, '.', '_' and '-' (it names a file)")
    now = load_now()
    before, after = load if load is not None else (now, now)
    rec = Record(name=name, title=title, command=command_line(argv), markdown=markdown.strip() + "\n",
                 measured_at=datetime.now(UTC).replace(microsecond=0).isoformat(),
                 commit=git_commit(), load_before=round(before, 2), load_after=round(after, 2),
                 cpus=os.cpu_count() or 0, cpu_model=cpu_model(), torch=torch_version(), data=data)
    path = Path(folder) / f"{name}.json"
    write_json(path, rec.to_dict())
    return Record(**{**rec.to_dict(), "path": path})


def load(folder: Path = DEFAULT_FOLDER) -> list[Record]:
    """Every record of ``folder`` (``*.json``), by name; none when the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise FormatError(path, f"not valid JSON ({e.msg})", line=e.lineno) from None
        if not isinstance(d, dict):
            raise FormatError(path, "not a measurement record: expected a JSON object")
        out.append(Record.from_dict(d, path))
    return out


def add_record_options(parser: argparse.ArgumentParser, name: str | None) -> None:
    """``--record-dir``, ``--no-record`` and, when ``name`` (the default name, in words) is given, ``--record-name``:
    a script whose variants measure different things names each variant's record itself (`record_from_args`)."""
    g = parser.add_argument_group("measurement record (docs/performance.md is built from these)")
    g.add_argument("--record-dir", type=Path, default=DEFAULT_FOLDER,
                   help="folder of the record NAME.json (default: docs/perf of this checkout)")
    g.add_argument("--no-record", action="store_true", help="write no measurement record")
    if name is not None:
        g.add_argument("--record-name", default=None, help=f"the record's name (default: {name})")


def record_from_args(args: argparse.Namespace, name: str, *, title: str, markdown: str, data: Any = None,
                     load: tuple[float, float] | None = None, argv: Sequence[str] | None = None) -> Record | None:
    """`record` with the options of `add_record_options` (``--record-name``, when given, replaces ``name``); None
    with ``--no-record``. Prints where it wrote."""
    if args.no_record:
        return None
    rec = record(getattr(args, "record_name", None) or name, title=title, markdown=markdown, data=data,
                 folder=args.record_dir, load=load, argv=argv)
    print(f"measurement record: {rec.path} (python scripts/perf_page.py puts it on docs/performance.md)", flush=True)
    return rec
