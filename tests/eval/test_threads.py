"""The training loops' threads (`eval.threads`): the count follows the CPU affinity, and the OpenMP wait policy set
before torch loads makes idle workers sleep. Each check runs in a fresh interpreter (the policy is read once, when
the OpenMP runtime loads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _fresh(code: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**base, **env})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_thread_count_follows_the_affinity_and_is_restored():
    out = _fresh("""
import json, os
cpu = sorted(os.sched_getaffinity(0))[0]
os.sched_setaffinity(0, {cpu})
from eval.threads import training_threads
import torch
torch.set_num_threads(3)
with training_threads() as n:
    inside = torch.get_num_threads()
with training_threads(2) as m:
    explicit = torch.get_num_threads()
print(json.dumps({"n": n, "inside": inside, "m": m, "explicit": explicit, "after": torch.get_num_threads()}))
""")
    assert out == {"n": 1, "inside": 1, "m": 2, "explicit": 2, "after": 3}


def test_omp_num_threads_from_a_launcher_wins():
    out = _fresh("""
import json
from eval.threads import default_threads
print(json.dumps({"n": default_threads()}))
""", OMP_NUM_THREADS="1")
    assert out == {"n": 1}


@pytest.mark.slow
def test_the_policy_is_set_only_while_it_can_take_effect():
    out = _fresh("""
import json, os
from eval.threads import openmp_loaded, prefer_passive_wait
before = openmp_loaded()
ok = prefer_passive_wait()
import torch
print(json.dumps({"before": before, "ok": ok, "env": os.environ.get("OMP_WAIT_POLICY"), "after": openmp_loaded()}))
""")
    assert out == {"before": False, "ok": True, "env": "PASSIVE", "after": True}
    late = _fresh("""
import json, os
import torch
from eval.threads import prefer_passive_wait
print(json.dumps({"ok": prefer_passive_wait(), "env": os.environ.get("OMP_WAIT_POLICY")}))
""")
    assert late == {"ok": False, "env": None}  # too late for this process: its children are not changed either


@pytest.mark.parametrize("package", ["retrieval", "eval", "distill"])
def test_the_entry_points_ask_for_passive_waiting_before_torch_loads(package):
    out = _fresh(f"""
import json, os, runpy, sys
sys.argv = ["{package}", "--help"]
try:
    runpy.run_module("{package}", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
from eval.threads import openmp_loaded, prefer_passive_wait
print(json.dumps({{"policy": os.environ.get("OMP_WAIT_POLICY"), "in_effect": prefer_passive_wait(),
                  "torch": "torch" in sys.modules}}))
""")
    assert out == {"policy": "PASSIVE", "in_effect": True, "torch": False}



@pytest.mark.slow
def test_the_hf_forecasters_ask_for_passive_waiting_before_torch_loads(tmp_path):
    """`forecasters tiny-model` and the ``hf`` backend decode in many short OpenMP regions: beside one busy core,
    spinning workers made a tiny model's run about 6x slower. Both set the policy before torch loads."""
    built = _fresh(f"""
import json, os, runpy, sys
sys.argv = ["forecasters", "tiny-model", "--out", {str(tmp_path / "tiny")!r}, "--kind", "qwen2"]
try:
    runpy.run_module("forecasters", run_name="__main__", alter_sys=True)
except SystemExit as e:
    assert not e.code, e.code
from eval.threads import prefer_passive_wait
print(json.dumps({{"policy": os.environ.get("OMP_WAIT_POLICY"), "in_effect": prefer_passive_wait()}}))
""")
    assert built == {"policy": "PASSIVE", "in_effect": True}
    loaded = _fresh(f"""
import json, os
from forecasters.backends.hf import HFBackend, HFConfig
b = HFBackend(HFConfig(model={str(tmp_path / "tiny")!r}, device="cpu"))
print(json.dumps({{"policy": os.environ.get("OMP_WAIT_POLICY"), "in_effect": b.passive_wait}}))
""")
    assert loaded == {"policy": "PASSIVE", "in_effect": True}
    chosen = _fresh(f"""
import json
from forecasters.backends.hf import HFBackend, HFConfig
print(json.dumps({{"in_effect": HFBackend(HFConfig(model={str(tmp_path / "tiny")!r}, device="cpu")).passive_wait}}))
""", OMP_WAIT_POLICY="ACTIVE")
    assert chosen == {"in_effect": False}  # a policy the user chose is kept

IDLE_CPU = """
import json, sys, time
from eval.threads import prefer_passive_wait
prefer_passive_wait()
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
for _ in range(20):
    a @ a
c0 = time.process_time()
time.sleep(0.6)  # the main thread sleeps: any CPU time now is a worker waiting for work
print(json.dumps({"idle_cpu": time.process_time() - c0}))
"""


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs for a second OpenMP worker")
def test_idle_workers_sleep_instead_of_spinning():
    """With the policy our helper sets, an idle worker costs no CPU; with spinning workers (ACTIVE) it burns
    whatever share of a core it gets while the main thread sleeps."""
    passive = _fresh(IDLE_CPU)["idle_cpu"]
    active = _fresh(IDLE_CPU, OMP_WAIT_POLICY="ACTIVE")["idle_cpu"]
    assert passive < 0.02, passive
    assert active > 0.05 and active > 5 * passive, (active, passive)


def test_retained_memory_stays_with_the_process_after_a_free():
    """A 256 MiB block freed: glibc's default unmaps it (resident memory falls back), after `retain_freed_memory`
    the heap keeps it for the next allocation."""
    code = """
import json, os, sys
import numpy as np
from eval.threads import retain_freed_memory
ok = retain_freed_memory() if sys.argv[1] == 'retained' else None
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') >> 20
before = rss()
a = np.ones(256 << 18, np.float32)  # 256 MiB, touched
peak = rss()
del a
print(json.dumps({'ok': ok, 'before': before, 'peak': peak, 'after': rss()}))
"""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    res = {}
    for mode in ("default", "retained"):
        r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=REPO, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        res[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["retained"]["ok"] is True
    for r in res.values():
        assert r["peak"] - r["before"] > 200
    assert res["default"]["peak"] - res["default"]["after"] > 200  # unmapped at once
    assert res["retained"]["peak"] - res["retained"]["after"] < 50  # kept for reuse
