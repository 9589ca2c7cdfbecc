"""How `make test` shares the tests between its two xdist workers (`tests/conftest.py`): each background vLLM job's
test files form one scope, so one worker runs them and the job runs once; the architecture job's tests come first,
then the slow tests, then the quick ones. In one process the order stays as collected, the architecture tests last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = '''
import json, pytest

class Probe:
    def pytest_collection_finish(self, session):
        rows = [{"id": it.nodeid, "fixtures": sorted(getattr(it, "fixturenames", ())),
                 "long": any(it.get_closest_marker(m) for m in ("slow", "vllm", "gpu"))} for it in session.items]
        print("ORDER=" + json.dumps(rows))

pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", "tests"], plugins=[Probe()])
'''


def _collected(worker: str | None) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    if worker:
        env["PYTEST_XDIST_WORKER"] = worker
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    line = next((x for x in res.stdout.splitlines() if x.startswith("ORDER=")), None)
    assert line is not None, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(line[len("ORDER="):])


def _conftest():
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "tests" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_under_xdist_each_job_is_one_scope_and_the_order_is_arch_then_slow_then_quick():
    conf = _conftest()
    rows = _collected("gw0")
    # every test that starts a background job is in that job's files, so its scope holds it
    for r in rows:
        for fixture, job in conf.BACKGROUND_FIXTURES.items():
            if fixture in r["fixtures"]:
                assert conf.background_job(r["id"]) == job, (r["id"], fixture)
    jobs = [conf.background_job(r["id"]) for r in rows]
    assert set(jobs) == {None, *conf.BACKGROUND_JOBS}

    arch = next(iter(conf.BACKGROUND_JOBS))
    n_arch = jobs.count(arch)
    assert n_arch and jobs[:n_arch] == [arch] * n_arch  # the longest job's tests first
    rest = [r["long"] for r in rows[n_arch:]]
    assert True in rest and False in rest and rest == sorted(rest, reverse=True)  # then slow, then quick


@pytest.mark.slow
def test_in_one_process_the_order_is_as_collected_with_the_architecture_tests_last():
    rows = _collected(None)
    arch = [i for i, r in enumerate(rows) if "test_fc_architectures.py" in r["id"]]
    assert arch and arch == list(range(len(rows) - len(arch), len(rows)))
    long = [r["long"] for r in rows[:arch[0]]]
    assert long != sorted(long, reverse=True)  # slow and quick tests interleaved, as collected


def test_the_scheduler_makes_one_scope_per_job_and_one_per_other_test():
    """The scopes of the scheduler `make test` gets (``--dist loadgroup``), from node ids as xdist's controller has
    them; other ``--dist`` modes (``make test-fast``: worksteal) keep xdist's own."""
    from xdist.scheduler import LoadScopeScheduling

    conf = _conftest()
    cls = conf.background_job_scheduling()
    assert issubclass(cls, LoadScopeScheduling)
    ids = ["tests/forecasters/test_fc_architectures.py::test_a[qwen3]",
           "tests/forecasters/test_fc_faults.py::test_b", "tests/forecasters/test_fc_likelihood.py::test_c",
           "tests/eval/test_x.py::test_d[1]", "tests/eval/test_x.py::test_d[2]"]
    assert [cls._split_scope(None, i) for i in ids] == ["vllm-arch", "vllm", "vllm", ids[3], ids[4]]

    class Config:
        @staticmethod
        def getoption(name):
            return "worksteal" if name == "dist" else None

    assert conf.pytest_xdist_make_scheduler(Config, None) is None


def test_each_worker_half_starts_with_work_while_the_shared_benchmark_is_built():
    """``make test-fast`` (worksteal) hands each worker one half of the order: the first half holds only modules
    that need no shared build, the modules that need one open the second half, and a module moves whole."""
    from types import SimpleNamespace as Item

    conf = _conftest()
    items = ([Item(nodeid=f"tests/a.py::t{i}", fixturenames=["synth_dir"]) for i in range(2)]
             + [Item(nodeid=f"tests/b.py::t{i}", fixturenames=[]) for i in range(3)]
             + [Item(nodeid="tests/c.py::t0", fixturenames=[]),
                Item(nodeid="tests/c.py::t1", fixturenames=["synth_truth_dir"])]
             + [Item(nodeid=f"tests/d.py::t{i}", fixturenames=["tmp_path"]) for i in range(2)]
             + [Item(nodeid="tests/e.py::t0", fixturenames=[])])
    order = [it.nodeid for it in conf._builder_first(items, len(items) // 2)]
    assert sorted(order) == sorted(it.nodeid for it in items)
    modules = [i.split("::")[0].split("/")[-1] for i in order]
    assert modules == ["b.py"] * 3 + ["d.py"] * 2 + ["a.py"] * 2 + ["c.py"] * 2 + ["e.py"]
    assert order[5:9] == ["tests/a.py::t0", "tests/a.py::t1", "tests/c.py::t0", "tests/c.py::t1"]
    # a half too small for any free module: the modules that build come first
    assert [i.split("::")[0] for i in (it.nodeid for it in conf._builder_first(items, 0))][:4] == \
        ["tests/a.py"] * 2 + ["tests/c.py"] * 2
