"""Fault injection between the openai backend / runner and a real vLLM server: 500s, 429s, timeouts, dropped
connections, HTML and empty 200s, a server that dies mid-run; and the errors retrying cannot fix (a wrong model name,
404s, vLLM's own 400s, a server gone before the first answer). Retries happen as specified; errors that retrying
cannot fix stop the job early; nothing is lost or duplicated; the summary and the exit code say what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.phrases import read_phrases
from forecasters.backends import Request, RetryPolicy, SamplingParams, get_backend
from forecasters.backends.openai_compat import OpenAIConfig
from forecasters.runner import NO_ANSWER_LIMIT, REJECTED_IN_A_ROW, RunConfig, run

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm
FAST = dict(wait_initial=0.05, wait_max=0.5)
POST = '"max_tokens"'  # a needle only chat-completion bodies contain (not GET /v1/models, /version, POST /tokenize)


def _backend(proxy, *, attempts=4, timeout=3.0, concurrency=8):
    return get_backend("openai", OpenAIConfig(model="tiny-vl", base_url=proxy.base_url, timeout_s=timeout,
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
    expect = {  # name: (ok, faults it meets, attempts when no pass outlives its timeout)
        "req-ok": (True, 0, 1), "req-500": (True, 2, 3), "req-503-forever": (False, 4, 4), "req-429": (True, 1, 2),
        "req-timeout": (True, 1, 2), "req-drop": (True, 2, 3), "req-400": (False, 1, 1)}
    for n, (ok, faults, attempts) in expect.items():
        c, seen, passed = out[n], p.log.count(f"{n}:"), p.log.count(f"{n}:", action="pass")
        # every attempt the backend counted reached the server once, and met the faults it was meant to; a pass that
        # outlives the 1 s timeout on a loaded machine is retried, one more attempt on both sides
        assert (c.ok, c.attempts, seen - passed) == (ok, seen, faults), (n, c)
        assert c.attempts == attempts if not ok else c.attempts >= attempts, (n, c)
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
    actions = ("500", "429", "drop", "timeout", "503", "html", "nochoices")
    for residue, action in enumerate(actions):
        p.add(action, per_request=2, select=(8, residue), retry_after=0.05, hang_s=4)
    out = tmp_path / "storm.jsonl"
    s = run(_run_cfg(synth_dir, p, out))
    recs = read_phrases(out)
    assert s.coverage.failed == 0 and len(recs) == 24 and sorted(_ids(out)) == sorted(set(_ids(out)))
    # what the server saw, per request body (one body per query, the same on each of its attempts)
    seen: dict[str, list[str]] = {}
    for _, action, body in p.log.entries:
        if POST in body:
            seen.setdefault(body, []).append(action)
    assert len(seen) == 24
    # each attempt the runner counted reached the server once: none lost, none made twice. A pass that outlives
    # the 1.5 s timeout on a loaded machine is one more attempt on both sides, so this holds under load too
    assert sorted(r.extra["attempts"] for r in recs.values()) == sorted(len(a) for a in seen.values())
    faults = [sum(a != "pass" for a in acts) for acts in seen.values()]
    assert set(faults) <= {0, 2} and sum(f == 2 for f in faults) >= 10  # a selected body meets its fault twice
    assert all(acts[:f] == [acts[0]] * f and "pass" in acts[f:] for f, acts in zip(faults, seen.values(), strict=True))
    assert sum(r.extra["attempts"] >= 3 for r in recs.values()) >= sum(f == 2 for f in faults)
    assert sum(p.log.count(action=a) > 0 for a in actions) >= 5


def test_server_dies_mid_run_and_comes_back(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy
    p.add("delay", times=8, delay_s=0.0)  # 8 requests go through, then the server dies for 1.5 s
    p.add("down", times=1, down_s=1.5)
    out = tmp_path / "revive.jsonl"
    t0 = time.monotonic()
    s = run(_run_cfg(synth_dir, p, out, max_attempts=12, wait_max=0.6))
    assert p.log.count(action="down") == 1 and time.monotonic() - t0 >= 1.5
    assert s.coverage.failed == 0 and s.attempted == 24 and len(set(_ids(out))) == len(_ids(out)) == 24


def test_server_dead_for_good_stops_early_then_rerun_redoes_failures(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy
    p.add("delay", times=6, delay_s=0.0)
    p.add("down", times=1, down_s=None)  # dies after 6 requests and stays down
    out = tmp_path / "dead.jsonl"
    cfg = _run_cfg(synth_dir, p, out, max_attempts=2, concurrency=2, batch_size=4, max_consecutive_failures=4)
    s = run(cfg)
    assert s.aborted and s.coverage.failed >= 4 and s.attempted < 24
    recs = read_phrases(out)
    assert all(r.extra["error_kind"] == "connection" for r in recs.values() if r.error)
    n_ok_before = sum(r.error is None for r in recs.values())
    p.up()  # the server is back
    s2 = run(RunConfig(**{**cfg.__dict__, "redo_failed": True}))
    assert not s2.aborted and s2.coverage.failed == 0 and s2.attempted == 24 - n_ok_before
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == 24 and all(r.error is None for r in read_phrases(out).values())


def _cli(*args):
    from typer.testing import CliRunner

    from forecasters.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _cli_args(synth_dir, base_url, out, *extra):
    return ["run", "--data", synth_dir, "--forecaster", "m3", "--backend", "openai", "--model", "tiny-vl",
            "--base-url", base_url, "--out", out, "--max-tokens", "6", "--timeout-s", "3", "--max-attempts", "2",
            "--wait-initial", "0.05", "--wait-max", "0.2", "--no-progress", *extra]


def test_a_model_the_server_does_not_serve_is_refused_before_the_first_request(fault_proxy, synth_dir, tmp_path):
    out = tmp_path / "wrong.jsonl"
    args = _cli_args(synth_dir, fault_proxy.base_url, out, "--limit", "49")
    args[args.index("tiny-vl")] = "Qwen/Qwen3-VL-32B-Instruct"
    r = _cli(*args)
    assert r.exit_code == 2, r.output
    assert "does not serve --model 'Qwen/Qwen3-VL-32B-Instruct'; it serves ['tiny-vl']" in r.output
    assert fault_proxy.log.count(POST) == 0 and not out.exists()


def test_404_on_every_request_stops_the_job_at_once_with_a_non_zero_exit(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy  # the server lists the model but answers 404 (e.g. a LoRA adapter that is not loaded)
    p.add("404", times=10_000)
    out = tmp_path / "404.jsonl"
    r = _cli(*_cli_args(synth_dir, p.base_url, out, "--limit", "49", "--concurrency", "4"))
    assert r.exit_code == 3 and "http_404" in r.output and "stopped early" in r.output, r.output
    summary = json.loads((tmp_path / "404.summary.json").read_text())
    assert summary["selected"] == 49 and summary["ok"] == 0 and summary["error_kinds"]["http_404"] == summary["failed"]
    assert summary["failed"] + summary["missing"] == 49 and summary["missing"] >= 49 - 4 * 4  # never 566 requests
    assert p.log.count(POST) <= 4 * 4 and "http_404" in summary["this_run"]["aborted"]


def test_vllm_400s_stop_the_job_after_a_run_of_them(vllm_server, synth_dir, tmp_path):
    out = tmp_path / "400.jsonl"  # max_tokens beyond the served context: the real server's 400 on every request
    s = run(RunConfig(data=str(synth_dir), out=str(out), forecaster="text-only", backend="openai", model="tiny-vl",
                      base_url=vllm_server.base_url, limit=49, concurrency=2, max_tokens=100_000, progress=False))
    assert "rejected" in s.aborted and s.coverage.error_kinds == {"http_400": s.coverage.failed} and s.coverage.ok == 0
    c = s.coverage
    assert REJECTED_IN_A_ROW <= c.failed <= REJECTED_IN_A_ROW + 2 * 4 and c.missing == 49 - c.failed
    rec = next(iter(read_phrases(out).values()))
    assert rec.error.startswith("ServerHTTPError: HTTP 400: ") and "max_tokens" in rec.error  # vLLM's own message
    assert rec.extra["error_kind"] == "http_400" and rec.extra["attempts"] == 1


def test_a_server_gone_after_the_check_stops_a_small_job(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy
    p.add("down", times=1, down_s=None)  # the first chat request kills it for good: the model list was answered
    s = run(_run_cfg(synth_dir, p, tmp_path / "gone.jsonl", limit=20, concurrency=1, max_attempts=2))
    assert s.aborted and f"first {NO_ANSWER_LIMIT} requests all failed" in s.aborted
    assert s.coverage.ok == 0 and s.coverage.failed + s.coverage.missing == 20 and not s.complete
    assert set(s.coverage.error_kinds) == {"connection"} and s.attempted < 20


def test_rerun_after_failure_keeps_saying_what_is_missing_until_done(fault_proxy, synth_dir, synth_bench, tmp_path):
    p = fault_proxy  # a quarter of the requests get an HTML page with status 200, however often they are retried
    p.add("html", per_request=99, select=(4, 1))
    out = tmp_path / "html.jsonl"
    args = _cli_args(synth_dir, p.base_url, out, "--limit", "16", "--concurrency", "4")
    r = _cli(*args)
    summary = json.loads((tmp_path / "html.summary.json").read_text())
    n_bad = summary["failed"]
    assert r.exit_code == 3 and 0 < n_bad < 16 and summary["error_kinds"] == {"bad_response": n_bad}, r.output
    assert p.log.count(action="html") == 2 * n_bad  # retried like a 5xx
    r = _cli(*args)  # a plain rerun attempts nothing and still reports the failures
    summary = json.loads((tmp_path / "html.summary.json").read_text())
    assert r.exit_code == 3 and f"{n_bad} failed" in r.output and "--redo-failed" in r.output
    assert summary["this_run"]["attempted"] == 0 and summary["failed"] == n_bad and not summary["complete"]
    p.clear()
    r = _cli(*args, "--redo-failed")
    summary = json.loads((tmp_path / "html.summary.json").read_text())
    assert r.exit_code == 0 and summary["complete"] and summary["this_run"]["attempted"] == n_bad, r.output
    assert len(_ids(out)) == len(set(_ids(out))) == 16


def test_retry_back_off_holds_no_concurrency_slot(fault_proxy):
    p = fault_proxy
    p.add("503", match="req-a:", times=1)
    b = get_backend("openai", OpenAIConfig(model="tiny-vl", base_url=p.base_url, concurrency=1, timeout_s=5.0,
                                            retry=RetryPolicy(max_attempts=3, wait_initial=1.5, wait_max=1.5)))
    b._rng.uniform = lambda lo, hi: hi  # wait the full 1.5 s before the retry
    try:
        out = b.generate([Request(n, (f"{n}: what next?",), SamplingParams(max_tokens=4)) for n in ("req-a", "req-b")])
    finally:
        b.close()
    assert all(c.ok for c in out) and out[0].attempts == 2
    seen = {n: [t for t, _, body in p.log.entries if f"{n}:" in body] for n in ("req-a", "req-b")}
    (a1, a2), (b1,) = seen["req-a"], seen["req-b"]
    assert a1 < b1 < a2 and b1 - a1 < 1.0  # b reached the server while a waited, with 1 request in flight


def test_kill_9_keeps_every_answered_line_then_a_rerun_completes(fault_proxy, synth_dir, tmp_path):
    p = fault_proxy
    p.add("delay", times=2, delay_s=120)  # two requests hang; the other answers must reach the file meanwhile
    out = tmp_path / "killed.jsonl"
    args = [sys.executable, "-m", "forecasters",
            *_cli_args(synth_dir, p.base_url, out, "--limit", "18", "--concurrency", "6", "--timeout-s", "300")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (p.log.count(POST) == 18 and out.exists()
                                                and len(_ids(out)) == p.log.count(POST, action="pass")):
        time.sleep(0.1)
    time.sleep(0.3)  # nothing else may arrive: the two hanging requests are all that is left
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert p.log.count(POST, action="delay") == 2 and len(_ids(out)) == 16  # every answered request has its line
    p.clear()
    r = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == 18 and json.loads((tmp_path / "killed.summary.json").read_text())["complete"]
