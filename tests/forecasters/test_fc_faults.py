"""Fault injection between the openai backend / runner and a real vLLM server: 500s, 429s, timeouts, dropped
connections, a server that dies mid-run. Retries happen as specified; nothing is lost or duplicated."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eval.phrases import read_phrases
from forecasters.backends import BackendConfig, Request, RetryPolicy, SamplingParams, get_backend
from forecasters.runner import RunConfig, run

pytestmark = pytest.mark.vllm
FAST = dict(wait_initial=0.05, wait_max=0.5)


def _backend(proxy, *, attempts=4, timeout=3.0, concurrency=8):
    return get_backend("openai", BackendConfig(model="tiny-vl", base_url=proxy.base_url, timeout_s=timeout,
                                               concurrency=concurrency,
                                               retry=RetryPolicy(max_attempts=attempts, **FAST)))


def test_each_fault_is_retried_or_not_as_specified(fault_proxy):
    p = fault_proxy
    p.add("500", match="req-500", times=2)
    p.add("503", match="req-503-forever", times=99)
    p.add("429", match="req-429", times=1, retry_after=0.4)
    p.add("timeout", match="req-timeout", times=1, hang_s=5)
    p.add("drop", match="req-drop", times=2)
    p.add("400", match="req-400", times=99)
    names = ["req-ok", "req-500", "req-503-forever", "req-429", "req-timeout", "req-drop", "req-400"]
    b = _backend(p, attempts=4, timeout=1.0)
    out = {c.request_id: c for c in b.generate([Request(n, (f"{n}: what next?",), SamplingParams(max_tokens=4))
                                                for n in names])}
    expect = {  # name: (ok, attempts, requests the server saw)
        "req-ok": (True, 1, 1), "req-500": (True, 3, 3), "req-503-forever": (False, 4, 4), "req-429": (True, 2, 2),
        "req-timeout": (True, 2, 2), "req-drop": (True, 3, 3), "req-400": (False, 1, 1)}
    for n, (ok, attempts, seen) in expect.items():
        c = out[n]
        assert (c.ok, c.attempts, p.log.count(f"{n}:")) == (ok, attempts, seen), (n, c)
    assert out["req-429"].latency_s >= 0.4  # waited at least Retry-After
    assert out["req-503-forever"].error_kind == "http_503" and out["req-400"].error_kind == "http_400"
    assert out["req-ok"].texts and out["req-500"].texts


def _run_cfg(synth_dir, proxy, out, **kw) -> RunConfig:
    base = dict(data=str(synth_dir), out=str(out), forecaster="m3", backend="openai", model="tiny-vl",
                base_url=proxy.base_url, limit=24, concurrency=6, timeout_s=1.5, max_attempts=8, progress=False,
                max_tokens=6, **FAST)
    base.update(kw)
    return RunConfig(**base)


def _ids(path: Path) -> list[str]:
    return [json.loads(x)["query_id"] for x in path.read_text().splitlines() if x.strip()]


def test_runner_survives_a_storm_of_faults_with_every_query_once(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy  # each request body meets one kind of fault (or none) on its first two attempts
    for residue, action in enumerate(("500", "429", "drop", "timeout", "503")):
        p.add(action, per_request=2, select=(6, residue), retry_after=0.05, hang_s=4)
    out = tmp_path / "storm.jsonl"
    s = run(_run_cfg(synth_dir, p, out))
    recs = read_phrases(out)
    assert s.failed == 0 and len(recs) == 24 and sorted(_ids(out)) == sorted(set(_ids(out)))
    faulted = sum(r.extra["attempts"] == 3 for r in recs.values())
    assert faulted >= 10 and all(r.extra["attempts"] in (1, 3) for r in recs.values())
    assert sum(p.log.count(action=a) > 0 for a in ("500", "429", "drop", "timeout", "503")) >= 4
    assert p.log.count(action="pass") == 24 + 1  # one successful call per query (+ the engine's /version)


def test_server_dies_mid_run_and_comes_back(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy
    p.add("delay", times=8, delay_s=0.0)  # 8 requests go through, then the server dies for 1.5 s
    p.add("down", times=1, down_s=1.5)
    out = tmp_path / "revive.jsonl"
    t0 = time.monotonic()
    s = run(_run_cfg(synth_dir, p, out, max_attempts=12, wait_max=0.6))
    assert p.log.count(action="down") == 1 and time.monotonic() - t0 >= 1.5
    assert s.failed == 0 and s.attempted == 24 and len(set(_ids(out))) == len(_ids(out)) == 24


def test_server_dead_for_good_stops_early_then_rerun_redoes_failures(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy
    p.add("delay", times=6, delay_s=0.0)
    p.add("down", times=1, down_s=None)  # dies after 6 requests and stays down
    out = tmp_path / "dead.jsonl"
    cfg = _run_cfg(synth_dir, p, out, max_attempts=2, concurrency=2, batch_size=4, max_consecutive_failures=4)
    s = run(cfg)
    assert s.aborted and s.failed >= 4 and s.attempted < 24
    recs = read_phrases(out)
    assert all(r.extra["error_kind"] == "connection" for r in recs.values() if r.error)
    n_ok_before = sum(r.error is None for r in recs.values())
    p.up()  # the server is back
    s2 = run(RunConfig(**{**cfg.__dict__, "redo_failed": True}))
    assert not s2.aborted and s2.failed == 0 and s2.attempted == 24 - n_ok_before
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == 24 and all(r.error is None for r in read_phrases(out).values())
