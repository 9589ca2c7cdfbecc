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
    import time

    import pytest

    mod = _demo_module()
    demo = mod.Demo(argparse.Namespace())
    stamp = "import sys, time, pathlib; pathlib.Path(sys.argv[1]).write_text(str(time.time())); time.sleep(1.0)"
    a, b = tmp_path / "a", tmp_path / "b"
    t0 = time.time()
    demo.run_side_by_side([[sys.executable, "-c", stamp, str(a)], [sys.executable, "-c", stamp, str(b)]], "encoders")
    assert time.time() - t0 < 1.9  # two 1 s sleeps side by side
    assert abs(float(a.read_text()) - float(b.read_text())) < 0.9
    assert [x["stage"] for x in demo.log] == ["encoders", "encoders"] and all(x["seconds"] >= 1 for x in demo.log)
    late = tmp_path / "late"
    with pytest.raises(subprocess.CalledProcessError):
        demo.run_side_by_side([[sys.executable, "-c", "raise SystemExit(3)"],
                               [sys.executable, "-c", stamp, str(late)]], "encoders")
    assert late.exists()  # the failure waited for its neighbour
    assert len(demo.log) == 4
    demo.run_side_by_side([], "encoders")  # nothing to do
    assert len(demo.log) == 4
