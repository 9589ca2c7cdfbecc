"""`python -m distill recipe --jobs N` (`distill.recipe.run_side_by_side`): stages side by side once what they read
is done, a failure that lets the running stages finish, a rerun that skips what is done, and the same records as
one at a time. The stages here are small Python jobs, so the scheduling is all that is timed."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distill.recipe import RecipeArgs, RecipeState, Stage, run_side_by_side
from eval.errors import IncompleteJob

JOB = textwrap.dedent('''
    import json, sys, time
    out, name, seconds, fail = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
    t0 = time.time()
    while time.process_time() < 0.2:  # some CPU, which the record counts
        pass
    time.sleep(seconds)
    if fail:
        print("boom", flush=True)
        sys.exit(7)
    with open(f"{out}/{name}.json", "w") as f:
        json.dump({"start": t0, "end": time.time()}, f)
''')


@pytest.fixture
def jobs_env(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "stagejob.py").write_text(JOB)
    return dict(os.environ, PYTHONPATH=str(tmp_path / "mods"))


def _stages(out: Path, spec: dict[str, tuple[float, tuple[str, ...], bool]]) -> list[Stage]:
    """``spec``: name -> (seconds, after, fails)."""
    return [Stage(name, [sys.executable, "-m", "stagejob", str(out), name, str(sec), "1" if fail else "0"],
                  out / f"{name}.json", after=after)
            for name, (sec, after, fail) in spec.items()]


def _run(out, stages, env, jobs=2):
    state = RecipeState(out / "recipe.json", RecipeArgs(out=str(out), dry_run=True))
    ran, skipped = set(), []
    run_side_by_side(stages, jobs, out, env, state, "python -m distill recipe ...", ran, skipped)
    return ran, skipped, json.loads((out / "recipe.json").read_text())["stages"]


def _times(out, name):
    return json.loads((out / f"{name}.json").read_text())


def test_independent_stages_overlap_and_a_stage_waits_for_what_it_reads(tmp_path, jobs_env):
    out = tmp_path / "out"
    out.mkdir()
    spec = {"a": (1.0, (), False), "b": (1.0, (), False), "c": (0.1, ("a", "b"), False), "d": (0.1, ("c",), False)}
    ran, skipped, record = _run(out, _stages(out, spec), jobs_env)
    assert ran == set(spec) and skipped == []
    a, b, c, d = (_times(out, n) for n in "abcd")
    assert a["start"] < b["end"] and b["start"] < a["end"]  # side by side
    assert c["start"] >= max(a["end"], b["end"]) and d["start"] >= c["end"]
    for name in spec:
        assert record[name]["seconds"] > 0 and record[name]["cpu_seconds"] > 0
        assert (out / "logs" / f"{name}.log").read_text().rstrip().endswith("=== exit 0")

    ran, skipped, _ = _run(out, _stages(out, spec), jobs_env)  # a rerun: everything is done
    assert ran == set() and skipped == list(spec)


def test_a_rerun_stage_reruns_what_reads_it_but_not_the_rest(tmp_path, jobs_env):
    out = tmp_path / "out"
    out.mkdir()
    spec = {"a": (0.1, (), False), "b": (0.1, (), False), "c": (0.1, ("a",), False)}
    _run(out, _stages(out, spec), jobs_env)
    (out / "a.json").unlink()
    ran, skipped, _ = _run(out, _stages(out, spec), jobs_env)
    assert ran == {"a", "c"} and skipped == ["b"]


def test_a_failure_lets_the_running_stage_finish_and_stops_what_reads_it(tmp_path, jobs_env):
    out = tmp_path / "out"
    out.mkdir()
    spec = {"slow": (1.5, (), False), "bad": (0.1, (), True), "after-bad": (0.1, ("bad",), False),
            "after-slow": (0.1, ("slow",), False)}
    t0 = time.time()
    with pytest.raises(IncompleteJob, match=r"stage bad failed \(exit code 7\)") as e:
        _run(out, _stages(out, spec), jobs_env)
    assert "bad.log" in str(e.value) and "rerun" in e.value.fix
    assert (out / "slow.json").is_file() and time.time() - t0 >= 1.5  # the running stage finished
    record = json.loads((out / "recipe.json").read_text())["stages"]
    assert set(record) == {"slow"}  # recorded; nothing started after the failure
    assert not (out / "after-bad.json").exists() and not (out / "after-slow.json").exists()
    assert "boom" in (out / "logs" / "bad.log").read_text()


def test_recipe_jobs_must_not_be_negative():
    from eval.errors import InputError

    with pytest.raises(InputError, match="jobs must be >= 0"):
        RecipeArgs(jobs=-1)


def test_an_interrupt_stops_every_running_stage(tmp_path, jobs_env, capsys):
    import signal
    import threading

    out = tmp_path / "out"
    out.mkdir()
    spec = {"a": (60.0, (), False), "b": (60.0, (), False), "c": (0.1, ("a",), False)}
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    # Python's own SIGINT handler, whatever an earlier test of the session installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.time()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _run(out, _stages(out, spec), jobs_env)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.time() - t0 < 30
    for name in ("a", "b"):
        assert (out / "logs" / f"{name}.log").read_text().rstrip().endswith(f"=== exit {-signal.SIGTERM}")
    assert not any((out / f"{n}.json").exists() for n in spec) and not (out / "recipe.json").exists()
    assert "interrupted in stage a, b" in capsys.readouterr().err


def test_the_recipe_records_its_last_runs_wall_time(tmp_path):
    from distill.recipe import STATE_FILE

    state = RecipeState(tmp_path / STATE_FILE, RecipeArgs(out=str(tmp_path), dry_run=True))
    state.ran(["a", "b"], 12.34, 2)
    again = RecipeState(tmp_path / STATE_FILE, RecipeArgs(out=str(tmp_path), dry_run=True))
    assert again.last_run == {"stages": ["a", "b"], "seconds": 12.3, "jobs": 2}
