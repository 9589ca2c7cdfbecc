"""Time a command and record its wall seconds for docs/performance.md.

    python scripts/time_command.py NAME [--title TEXT] [--record-dir DIR] [--no-record] -- CMD [ARG...]
    python scripts/time_command.py make-test -- make test

Runs CMD (no shell: ``-- bash -c "..."`` for a pipeline), passing its output through, and records as NAME
(`eval.measured`): the command, its exit code, its wall seconds, the 1-minute load average before and after and,
when its output holds pytest summary lines (``N passed, M skipped in S``), each of them in order, joined by ``; ``
(a command that runs pytest more than once has a line per run). Exits with CMD's exit code
(128 + the signal number when a signal ended it).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from a checkout: find the packages
    sys.path.insert(0, str(ROOT))

from eval.measured import add_record_options, load_now, record_from_args  # noqa: E402

#: pytest's final line: "3 passed, 1 skipped, 2 warnings in 4.56s (0:00:04)", between "=" rules without -q.
PYTEST_OUTCOMES = r"\d+ (?:passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?|rerun)"
PYTEST_SUMMARY = re.compile(rf"^=*\s*((?:{PYTEST_OUTCOMES})(?:, {PYTEST_OUTCOMES})* in [\d.]+s(?: \([\d:]+\))?)"
                            r"\s*=*$")


@dataclass(frozen=True)
class Timed:
    """One run of a command."""

    command: list[str]
    exit_code: int
    wall_s: float
    load_before: float
    load_after: float
    pytest_summary: str | None


def pytest_summary(output: str) -> str | None:
    """The pytest summary lines of ``output`` (without their ``=`` rules) in order, joined by ``; ``; None when
    there is none."""
    found = [m.group(1) for line in output.splitlines() if (m := PYTEST_SUMMARY.match(line.strip()))]
    return "; ".join(found) if found else None


def run(command: list[str], echo=sys.stdout) -> Timed:
    """Run ``command``, copying its output (stdout and stderr, merged) to ``echo`` as it comes."""
    load_before = load_now()
    t0 = time.perf_counter()
    out = []
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as e:
        raise SystemExit(f"time_command: cannot run {shlex.join(command)}: {e}") from None
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace")
        out.append(line)
        echo.write(line)
        echo.flush()
    rc = proc.wait()
    wall = time.perf_counter() - t0
    return Timed(command, 128 - rc if rc < 0 else rc, wall, load_before, load_now(), pytest_summary("".join(out)))


def markdown(t: Timed) -> str:
    rows = ["| command | exit code | wall | load average before / after |", "|---|---:|---:|---|",
            f"| `{shlex.join(t.command)}` | {t.exit_code} | {format_seconds(t.wall_s)} | "
            f"{t.load_before:.1f} / {t.load_after:.1f} |"]
    if t.pytest_summary:
        rows += ["", f"pytest: {t.pytest_summary}"]
    return "\n".join(rows) + "\n"


def format_seconds(s: float) -> str:
    """``12.3 s`` under a minute, ``13 min 56 s`` from a minute, ``1 h 02 min`` from an hour."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    own, command = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="python scripts/time_command.py NAME [options] -- CMD [ARG...]")
    ap.add_argument("name", help="the record's name (docs/perf/NAME.json)")
    ap.add_argument("--title", default=None, help="the record's heading (default: the command)")
    add_record_options(ap, None)
    a = ap.parse_args(own)
    if not command:
        ap.error("no command: give it after '--' (python scripts/time_command.py NAME -- CMD [ARG...])")
    t = run(command)
    print(f"time_command: exit code {t.exit_code}, {format_seconds(t.wall_s)} wall"
          + (f"; pytest: {t.pytest_summary}" if t.pytest_summary else ""), flush=True)
    record_from_args(a, a.name, title=a.title or f"`{shlex.join(command)}`", markdown=markdown(t), data=asdict(t),
                     load=(t.load_before, t.load_after), argv=["scripts/time_command.py", *argv])
    return t.exit_code


if __name__ == "__main__":
    sys.exit(main())
