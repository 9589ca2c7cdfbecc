"""`PSR_TEST_SYNTH_DIR`: the session's benchmarks are built into a folder once and reused; a folder holding a build of
another size is refused, never replaced. `PSR_TEST_SYNTH_CACHE` (`make test-fast`): one build per version of the code
and packages that make it, reused by later runs (`tests/conftest.py`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _conftest():
    spec = importlib.util.spec_from_file_location("psr_tests_conftest", Path(__file__).with_name("conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_kept_build_is_reused_only_when_it_is_this_sessions_size(tmp_path):
    mod = _conftest()
    truth, canon = tmp_path / "psr-synth-truth", tmp_path / "psr-synth"
    assert not mod._kept_build(truth, truth)  # nothing built yet: build it there
    truth.mkdir()
    (truth / "manifest.json").write_text(json.dumps({"extra": {"videos": mod.SYNTH_VIDEOS, "seed": 0}}))
    assert mod._kept_build(truth, truth)
    assert not mod._kept_build(canon, truth)  # the canonicalized build is still to make
    (truth / "manifest.json").write_text(json.dumps({"extra": {"videos": mod.SYNTH_VIDEOS + 1, "seed": 0}}))
    with pytest.raises(pytest.UsageError, match="another folder"):
        mod._kept_build(truth, truth)
    assert (truth / "manifest.json").exists()  # refused, not replaced


def test_the_cache_key_follows_the_builder_code_and_the_cache_folder(tmp_path):
    mod = _conftest()
    repo = tmp_path / "repo"
    for f in ("eval/synth/a.py", "retrieval/b.py", "distill/c.py"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text("x = 1\n")
    cache = tmp_path / "cache"
    key = mod.build_key(cache, repo)
    assert len(key) == 16 and key == mod.build_key(cache, repo)
    (repo / "distill" / "c.py").write_text("x = 2\n")  # not builder code
    assert mod.build_key(cache, repo) == key
    (repo / "eval" / "synth" / "a.py").write_text("x = 2\n")
    changed = mod.build_key(cache, repo)
    assert changed != key
    (repo / "eval" / "synth" / "a.py").write_text("x = 1\n")
    assert mod.build_key(cache, repo) == key and mod.build_key(tmp_path / "moved", repo) != key


def test_the_cache_keeps_its_recent_builds_and_nothing_else_is_removed(tmp_path):
    import os

    mod = _conftest()
    cache = tmp_path / "cache"
    (cache / "notes").mkdir(parents=True)  # not a build of the cache's: never removed
    (cache / ("e" * 16)).mkdir()  # named like a key but without the cache's marker: never removed
    old = []
    for i in range(3):
        d = cache / f"{i:016x}"
        d.mkdir()
        (d / mod.CACHE_MARKER).touch()
        os.utime(d / mod.CACHE_MARKER, (1000 + i, 1000 + i))
        old.append(d)
    home = mod._cached_home(cache, "f" * 16)
    assert home == cache / ("f" * 16) and (home / mod.CACHE_MARKER).is_file()
    kept = sorted(d.name for d in cache.iterdir() if d.is_dir())
    assert kept == sorted(["notes", "e" * 16, "f" * 16, *[d.name for d in old[-(mod.KEPT_KEYS - 1):]]])


_SHARE_TEST = '''
import json, os

import pytest


@pytest.mark.parametrize("i", range(6))
def test_sees_the_build(i, synth_truth_dir):
    st = (synth_truth_dir / "manifest.json").stat()
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER"), str(synth_truth_dir), st.st_ino]) + "\\n")
'''


# Appended to the suite's copy of conftest.py: each worker marks its arrival before it asks for the benchmark (an
# autouse session fixture is set up before the session's other fixtures), and the build, counted, starts only once
# both have arrived. So without the lock the other worker is certain to be building too.
_COUNT_BUILDS = '''

_builds = Path(os.environ["BUILDS"])


@pytest.fixture(scope="session", autouse=True)
def _arrived():
    (_builds.parent / f"arrived-{XDIST_WORKER}").touch()


import eval.synth as _synth  # noqa: E402

_build = _synth.build_benchmark


def _counted_build(*args, **kwargs):
    import time

    with open(_builds, "a") as f:
        f.write("build\\n")
    deadline = time.monotonic() + 60
    while len(list(_builds.parent.glob("arrived-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return _build(*args, **kwargs)


_synth.build_benchmark = _counted_build
'''


def _run_suite(tmp_path, env):
    import subprocess
    import sys

    suite = tmp_path / "suite"
    if not suite.exists():
        suite.mkdir()
        (suite / "conftest.py").write_text(Path(__file__).with_name("conftest.py").read_text() + _COUNT_BUILDS)
        (suite / "test_share.py").write_text(_SHARE_TEST)
    for f in tmp_path.glob("arrived-*"):
        f.unlink()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "load", "-p", "no:cacheprovider",
                          "--basetemp", str(tmp_path / "base"), str(suite)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


@pytest.mark.slow
def test_a_cached_build_is_reused_by_the_next_run(tmp_path):
    """Two runs one after the other with `PSR_TEST_SYNTH_CACHE`: the first builds, the second reads that build."""
    import os

    seen, builds = tmp_path / "seen.jsonl", tmp_path / "builds.txt"
    env = {**os.environ, "SEEN": str(seen), "BUILDS": str(builds), "PSR_TEST_SYNTH_VIDEOS": "4",
           "PSR_TEST_SYNTH_CACHE": str(tmp_path / "cache")}
    env.pop("PSR_TEST_SYNTH_DIR", None)
    _run_suite(tmp_path, env)
    _run_suite(tmp_path, env)
    assert builds.read_text().splitlines() == ["build"]  # built once over both runs
    rows = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(rows) == 12 and len({(r[1], r[2]) for r in rows}) == 1
    assert Path(rows[0][1]).parent.parent == tmp_path / "cache"


@pytest.mark.slow
@pytest.mark.parametrize("home", [False, True], ids=["temp", "PSR_TEST_SYNTH_DIR"])
def test_xdist_workers_share_one_build(tmp_path, home):
    """Two pytest-xdist workers build the session's benchmark once, under a lock, and both read that one build."""
    import os
    import subprocess
    import sys

    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "conftest.py").write_text(Path(__file__).with_name("conftest.py").read_text() + _COUNT_BUILDS)
    (tmp_path / "suite" / "test_share.py").write_text(_SHARE_TEST)
    seen = tmp_path / "seen.jsonl"
    builds = tmp_path / "builds.txt"
    env = {**os.environ, "SEEN": str(seen), "BUILDS": str(builds), "PSR_TEST_SYNTH_VIDEOS": "4"}
    env.pop("PSR_TEST_SYNTH_DIR", None)
    if home:
        env["PSR_TEST_SYNTH_DIR"] = str(tmp_path / "home")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "load", "-p", "no:cacheprovider",
                          "--basetemp", str(tmp_path / "base"), str(tmp_path / "suite")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(rows) == 6 and {r[0] for r in rows} == {"gw0", "gw1"}  # both workers ran tests
    assert builds.read_text().splitlines() == ["build"]  # built once
    assert len({(r[1], r[2]) for r in rows}) == 1  # one folder, the same manifest file
    where = Path(rows[0][1])
    assert where.parent == (tmp_path / "home" if home else tmp_path / "base" / "psr-synth-shared")
    assert (where.parent / ".build.lock").exists()
