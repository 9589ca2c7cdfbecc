"""`scripts/demo.py`: a rerun of some stages keeps the other stages' commands and seconds in the demo's log."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _demo_module():
    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rerun_of_one_stage_keeps_the_other_stages_log(tmp_path):
    mod = _demo_module()
    path = tmp_path / "demo_log.json"
    first = [{"stage": s, "cmd": f"cmd {s}", "seconds": 1.0} for s in ("data", "retrieval", "distill")]
    path.write_text(json.dumps(first))
    demo = mod.Demo(argparse.Namespace())
    demo.log = [{"stage": "distill", "cmd": "cmd distill again", "seconds": 2.0},
                {"stage": "encoders", "cmd": "cmd encoders", "seconds": 3.0}]
    log = demo.merged_log(path)
    assert [x["stage"] for x in log] == ["data", "encoders", "retrieval", "distill"]  # in stage order
    assert [x["cmd"] for x in log if x["stage"] == "distill"] == ["cmd distill again"]  # the rerun replaces its own
    assert demo.merged_log(tmp_path / "none.json") == sorted(demo.log, key=lambda x: mod.STAGES.index(x["stage"]))


def test_side_by_side_commands_run_at_once_and_a_failure_raises_after_all_finish(tmp_path):
    import subprocess
    import sys

    import pytest

    mod = _demo_module()
    demo = mod.Demo(argparse.Namespace())
    # each command announces itself, then waits for the other's announcement: run one after the other, the first
    # would give up and fail
    meet = ("import sys, time, pathlib; pathlib.Path(sys.argv[1]).touch(); other = pathlib.Path(sys.argv[2]); "
            "end = time.time() + 60\nwhile not other.exists() and time.time() < end: time.sleep(0.05)\n"
            "raise SystemExit(0 if other.exists() else 1)")
    a, b = tmp_path / "a", tmp_path / "b"
    demo.run_side_by_side([[sys.executable, "-c", meet, str(a), str(b)],
                           [sys.executable, "-c", meet, str(b), str(a)]], "encoders")
    assert [x["stage"] for x in demo.log] == ["encoders", "encoders"]
    late = tmp_path / "late"
    slow = "import sys, time, pathlib; time.sleep(1.0); pathlib.Path(sys.argv[1]).touch()"
    with pytest.raises(subprocess.CalledProcessError):
        demo.run_side_by_side([[sys.executable, "-c", "raise SystemExit(3)"],
                               [sys.executable, "-c", slow, str(late)]], "encoders")
    assert late.exists()  # the failure waited for its neighbour
    assert len(demo.log) == 4
    demo.run_side_by_side([], "encoders")  # nothing to do
    assert len(demo.log) == 4


def test_commands_are_logged_with_their_cpu_seconds_and_their_children_s(tmp_path):
    import subprocess
    import sys

    import pytest

    mod = _demo_module()
    demo = mod.Demo(argparse.Namespace())
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    # the CPU is spent by a grandchild that the command waits for: it is counted
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}], check=True)"
    demo.run([sys.executable, "-c", parent], "report")
    demo.run_side_by_side([[sys.executable, "-c", "import time; time.sleep(0.5)"],
                           [sys.executable, "-c", spin]], "encoders")
    busy, sleeper, spinner = demo.log
    assert busy["cpu_seconds"] >= 0.4 and spinner["cpu_seconds"] >= 0.4
    assert sleeper["cpu_seconds"] < 0.3 and sleeper["seconds"] >= 0.5
    with pytest.raises(subprocess.CalledProcessError):
        demo.run([sys.executable, "-c", "raise SystemExit(4)"], "report")
    assert len(demo.log) == 3
