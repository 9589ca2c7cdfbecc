"""The batch runner on the synthetic benchmark through the hf backend: lines, resume, repair, shards, leakage."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import prompts
from eval.errors import InputError
from eval.phrases import PhraseRecord, read_phrases
from forecasters import phrasefile
from forecasters.runner import RunConfig, plan, render_request, select_queries, shard_of
from forecasters.runner import run as run_job

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(hf_backends, tiny):
    """`forecasters.runner.run` on the session's loaded hf backends (loading costs more than generating)."""

    def go(cfg, backend=None):
        kind = next(k for k in ("qwen2", "qwen2_vl", "llava") if cfg.model == str(tiny[k]))
        return run_job(cfg, backend=backend or hf_backends(kind))

    return go


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def _cfg(synth_dir, tiny, out, **kw) -> RunConfig:
    base = dict(data=str(synth_dir), out=str(out), forecaster="text-only", backend="hf", model=str(tiny["qwen2"]),
                limit=12, progress=False)
    base.update(kw)
    return RunConfig(**base)


def test_one_line_per_query_with_provenance(synth_dir, synth_bench, tiny, tmp_path, run):
    out = tmp_path / "t.jsonl"
    s = run(_cfg(synth_dir, tiny, out))
    lines = _lines(out)
    c = s.coverage
    assert c.queries == s.attempted == len(lines) == 12 and c.ok + c.parse_failures + c.failed == 12
    t = prompts.load("text_only")
    test_ids = {q.id for q in synth_bench.queries("test")}
    for d in lines:
        rec = PhraseRecord.from_dict(d)
        assert rec.query_id in test_ids
        assert (rec.forecaster, rec.backend, rec.prompt_id, rec.prompt_hash) == ("text-only", "hf", "text_only", t.hash)
        assert rec.model == str(tiny["qwen2"]) and rec.config_hash == s.config_hash
        assert rec.decoding == {"temperature": 0.0, "max_tokens": 24, "top_p": 1.0, "n": 1, "seed": 0, "stop": []}
        assert rec.error is None and isinstance(rec.raw, str)
        assert rec.parse_ok == (rec.phrase is not None) and rec.phrases == ([rec.phrase] if rec.phrase else [])
        assert rec.extra["engine"].startswith("transformers") and rec.extra["batch_size"] == 8
        assert rec.extra["seed"] == 0 and rec.extra["completion_tokens"] >= 1
    cfg = json.loads((tmp_path / "t.config.json").read_text())
    assert cfg["config_hash"] == s.config_hash and cfg["identity"]["prompt_hash"] == t.hash
    assert cfg["versions"]["transformers"] and cfg["batch_size"] == 8 and cfg["seed"] == 0
    summary = json.loads((tmp_path / "t.summary.json").read_text())
    assert summary["complete"] and summary["selected"] == 12 and summary["missing"] == summary["failed"] == 0
    run_part = summary["this_run"]
    assert run_part["attempted"] == 12 and run_part["wall_s"] > 0 and run_part["completion_tokens"] > 0


def test_rerun_skips_done_queries_and_extends(synth_dir, tiny, tmp_path, run):
    out = tmp_path / "r.jsonl"
    run(_cfg(synth_dir, tiny, out, limit=6))
    again = run(_cfg(synth_dir, tiny, out, limit=6, batch_size=3))  # throughput settings do not change the hash
    assert again.skipped_done == 6 and again.attempted == 0
    more = run(_cfg(synth_dir, tiny, out, limit=10))
    assert more.skipped_done == 6 and more.attempted == 4
    ids = [d["query_id"] for d in _lines(out)]
    assert len(ids) == len(set(ids)) == 10


def test_another_config_in_the_same_file_is_refused_unless_overwrite(synth_dir, tiny, tmp_path, run):
    out = tmp_path / "c.jsonl"
    first = run(_cfg(synth_dir, tiny, out, limit=4))
    with pytest.raises(ValueError, match="another config"):
        run(_cfg(synth_dir, tiny, out, limit=4, max_tokens=12))
    s = run(_cfg(synth_dir, tiny, out, limit=4, max_tokens=12, overwrite=True))
    assert s.config_hash != first.config_hash
    assert {d["config_hash"] for d in _lines(out)} == {s.config_hash} and len(_lines(out)) == 4


def test_torn_tail_is_repaired_and_every_query_appears_once(synth_dir, tiny, tmp_path, run):
    out = tmp_path / "torn.jsonl"
    run(_cfg(synth_dir, tiny, out, limit=5))
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # a crash mid-append
    assert len(read_phrases(out)) == 3  # readers ignore the torn tail
    s = run(_cfg(synth_dir, tiny, out, limit=5))
    assert s.attempted == 2
    ids = [d["query_id"] for d in _lines(out)]
    assert len(ids) == len(set(ids)) == 5 and out.read_bytes().endswith(b"\n")


def test_failed_queries_are_recorded_and_redone_on_request(synth_dir, synth_bench, tiny, tmp_path, run):
    data = tmp_path / "bench"
    shutil.copytree(synth_dir, data, ignore=shutil.ignore_patterns(".cache"))
    qs = select_queries(synth_bench, _cfg(synth_dir, tiny, "x", forecaster="m3", limit=10))
    video = qs[0].video_id
    (data / "frames" / video).rename(data / "frames" / f"{video}.hidden")  # frames of one video go missing
    out = tmp_path / "m3.jsonl"
    kw = dict(forecaster="m3", model=str(tiny["qwen2_vl"]), limit=10)
    s = run(_cfg(data, tiny, out, **kw))
    broken = {q.id for q in qs if q.video_id == video}
    recs = read_phrases(out)
    assert s.coverage.failed == len(broken) > 0
    for qid in broken:
        assert recs[qid].error.startswith("input: FileNotFoundError") and recs[qid].extra["error_kind"] == "input"
    assert run(_cfg(data, tiny, out, **kw)).attempted == 0  # failed lines count as done by default
    (data / "frames" / f"{video}.hidden").rename(data / "frames" / video)
    s2 = run(_cfg(data, tiny, out, redo_failed=True, **kw))
    assert s2.attempted == len(broken) and s2.coverage.failed == 0
    ids = [d["query_id"] for d in _lines(out)]
    assert len(ids) == len(set(ids)) == 10 and all(d["error"] is None for d in _lines(out))


def test_shards_partition_by_prefix_and_merge_back(synth_dir, synth_bench, tiny, tmp_path, run):
    full = select_queries(synth_bench, _cfg(synth_dir, tiny, "x", limit=None))
    parts = [select_queries(synth_bench, _cfg(synth_dir, tiny, "x", limit=None, shard=f"{i}/3")) for i in range(3)]
    assert sorted(q.id for p in parts for q in p) == sorted(q.id for q in full)
    for i, p in enumerate(parts):
        assert all(shard_of(q.prefix_id, 3) == i for q in p)
    prefixes = [{q.prefix_id for q in p} for p in parts]
    assert not (prefixes[0] & prefixes[1] or prefixes[0] & prefixes[2] or prefixes[1] & prefixes[2])
    outs = []
    for i in range(3):
        outs.append(tmp_path / f"s{i}.jsonl")
        run(_cfg(synth_dir, tiny, outs[-1], limit=4, shard=f"{i}/3"))
    rep = phrasefile.merge_phrase_files(outs, tmp_path / "merged.jsonl",
                                        expected_ids=[q.id for q in synth_bench.queries("test")])
    assert rep.n_queries == 12 and len(rep.missing) == len(full) - 12 and rep.unexpected == []
    merged = _lines(tmp_path / "merged.jsonl")
    assert len({d["query_id"] for d in merged}) == 12
    order = {q.id: i for i, q in enumerate(synth_bench.queries("test"))}
    assert [order[d["query_id"]] for d in merged] == sorted(order[d["query_id"]] for d in merged)
    other = tmp_path / "other.jsonl"
    run(_cfg(synth_dir, tiny, other, limit=2, max_tokens=5))
    with pytest.raises(Exception, match="config"):
        phrasefile.merge_phrase_files([outs[0], other], tmp_path / "bad.jsonl")


def test_frames_load_once_per_prefix_and_prompts_are_sorted_by_prefix(synth_dir, tiny, tmp_path, run):
    cfg = _cfg(synth_dir, tiny, tmp_path / "m3.jsonl", forecaster="m3", model=str(tiny["qwen2_vl"]), limit=15)
    p = plan(cfg)
    prefixes = [q.prefix_id for q in p.todo]
    assert prefixes == sorted(prefixes) and len(set(prefixes)) < len(prefixes)  # several questions per prefix
    s = run(cfg)
    distinct_frames = {f for q in p.todo for f in q.prefix_frames}  # objects of one video can share frames
    assert s.frames_loaded == len(distinct_frames) <= 8 * len(set(prefixes))
    assert s.coverage.failed == 0 and s.attempted == 15


def test_text_only_prompt_never_shows_a_state_at_or_after_the_target(synth_dir, synth_bench, tiny, tmp_path):
    p = plan(_cfg(synth_dir, tiny, tmp_path / "x.jsonl", limit=None, split=None))
    from forecasters.media import FrameCache

    frames = FrameCache(synth_dir)
    n_checked = 0
    for q in select_queries(synth_bench, p.cfg):
        leaky = dataclasses.replace(q, transcript=(*q.transcript, type(q.transcript[0])(q.target_time, "LEAKED STATE"),
                                                   type(q.transcript[0])(q.target_time + 1, "LATER STATE")))
        text = render_request(p.spec, p.template, leaky, synth_bench, frames, sampling=p.sampling).text
        assert "LEAKED" not in text and "LATER" not in text
        times = [float(t) for t in re.findall(r"(\d+(?:\.\d+)?)s: ", text)]
        assert all(t < q.target_time for t in times) and len(times) == sum(e.t < q.target_time for e in q.transcript)
        n_checked += 1
    assert n_checked == len(synth_bench.queries())


def test_multi_sample_mode_writes_k_phrases(synth_dir, tiny, tmp_path, run):
    out = tmp_path / "k.jsonl"
    run(_cfg(synth_dir, tiny, out, limit=3, samples=3, temperature=0.9))
    for d in _lines(out):
        assert isinstance(d["raw"], list) and len(d["raw"]) == 3 and d["decoding"]["n"] == 3
        assert len(d["phrases"]) <= 3 and d["phrase"] == (d["phrases"][0] if d["phrases"] else None)


def _cli(*args, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "forecasters", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, **kw)


@pytest.mark.slow
def test_kill_9_mid_job_then_rerun_completes_each_query_exactly_once(synth_dir, tiny, tmp_path):
    out = tmp_path / "killed.jsonl"
    args = ["run", "--data", str(synth_dir), "--forecaster", "text-only", "--backend", "hf", "--model",
            str(tiny["qwen2"]), "--out", str(out), "--batch-size", "1", "--limit", "24", "--max-tokens", "8", "--no-progress"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "forecasters", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or len(out.read_bytes().splitlines()) < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(_lines(out))
    assert 5 <= n_before < 24, "the job should have been killed mid-way"
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    ids = [d["query_id"] for d in _lines(out)]
    assert len(ids) == 24 and len(set(ids)) == 24


def _cli_inproc(*args):
    from typer.testing import CliRunner

    from forecasters.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_help_for_every_command():
    assert "Usage" in _cli("--help").stdout  # the module entry point itself
    for cmd in (["run"], ["merge"], ["tiny-model"], ["list"]):
        r = _cli_inproc(*cmd, "--help")
        assert r.exit_code == 0 and "Usage" in r.output, (cmd, r.output)
    r = _cli_inproc("list")
    assert r.exit_code == 0 and "m3" in r.output and "Qwen/Qwen3-VL-32B-Instruct" in r.output


@pytest.mark.slow
def test_cli_merge_and_bad_input_errors(synth_dir, tiny, tmp_path, run):
    outs = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, o in enumerate(outs):
        run(_cfg(synth_dir, tiny, o, limit=2, shard=f"{i}/2"))
    r = _cli("merge", *map(str, outs), "--out", str(tmp_path / "all.jsonl"), "--data", str(synth_dir),
             "--require-complete")
    assert r.returncode == 3 and "missing" in r.stderr  # 4 of the test split's queries only
    assert Counter(d["query_id"] for d in _lines(tmp_path / "all.jsonl")).most_common(1)[0][1] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "q1"}\n{"phrase": "no id"}\n')
    r = _cli("merge", str(bad), "--out", str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "bad.jsonl:2" in r.stderr and "query_id" in r.stderr
    r = _cli("run", "--data", str(synth_dir), "--out", str(tmp_path / "y.jsonl"), "--forecaster", "nope")
    assert r.returncode == 2 and "unknown forecaster" in r.stderr


def test_cli_run_from_a_yaml_config_with_command_line_overrides(synth_dir, tiny, tmp_path):
    import yaml

    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump({"forecaster": "text-only", "backend": "hf", "model": str(tiny["qwen2"]),
                                    "limit": 2, "max_tokens": 6, "num_threads": 1}))
    out = tmp_path / "yaml.jsonl"
    r = _cli_inproc("run", "--data", str(synth_dir), "--out", str(out), "--config", str(conf), "--limit", "3",
                    "--no-progress")
    assert r.exit_code == 0, r.output
    lines = _lines(out)
    assert len(lines) == 3 and all(d["decoding"]["max_tokens"] == 6 for d in lines)  # limit from the CLI, rest YAML
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_option: 1\n")
    from cli_run import run_cli  # the entry point of python -m forecasters: one error line, exit code 2

    r = run_cli("forecasters", "run", "--data", synth_dir, "--out", out, "--config", bad)
    assert r.code == 2 and "no_such_option" in r.err


def _copy_bench(synth_dir, dest: Path) -> Path:
    shutil.copytree(synth_dir, dest, ignore=shutil.ignore_patterns(".cache"))
    return dest


@pytest.mark.slow
def test_summary_describes_the_file_and_the_exit_code_says_until_every_query_is_answered(
        synth_dir, synth_bench, tiny, tmp_path, run):
    data = _copy_bench(synth_dir, tmp_path / "bench")
    kw = dict(forecaster="m3", model=str(tiny["qwen2_vl"]), limit=10)
    qs = select_queries(synth_bench, _cfg(synth_dir, tiny, "x", **kw))
    video = qs[0].video_id
    broken = {q.id for q in qs if q.video_id == video}
    (data / "frames" / video).rename(data / "frames" / f"{video}.hidden")
    out = tmp_path / "m3.jsonl"
    s = run(_cfg(data, tiny, out, **kw))
    err = s.incomplete("python -m forecasters run --out m3.jsonl")
    assert f"{len(broken)} of 10 selected queries have no answer ({len(broken)} failed: input x{len(broken)}" in str(err)
    assert err.fix.endswith("run: python -m forecasters run --out m3.jsonl --redo-failed")
    summary = json.loads((tmp_path / "m3.summary.json").read_text())
    assert (summary["complete"], summary["failed"], summary["missing"]) == (False, len(broken), 0)
    args = ["run", "--data", str(data), "--forecaster", "m3", "--backend", "hf", "--model", str(tiny["qwen2_vl"]),
            "--limit", "10", "--out", str(out), "--num-threads", "1", "--no-progress"]
    r = _cli_inproc(*args)  # a plain rerun: nothing attempted, and it still says the file is incomplete
    assert r.exit_code == 3 and f"{len(broken)} failed" in r.output, r.output
    finish = f"python -m forecasters run --data {data} --out {out} --forecaster m3 --backend hf --model"
    assert finish in r.output and "--limit 10" in r.output and r.output.rstrip().endswith("--no-progress --redo-failed)")
    summary = json.loads((tmp_path / "m3.summary.json").read_text())
    assert summary["this_run"]["attempted"] == 0 and summary["failed"] == len(broken) and not summary["complete"]
    r = _cli_inproc("merge", str(out), "--out", str(tmp_path / "merged.jsonl"), "--data", str(data), "--split", "all",
                    "--require-complete")
    assert r.exit_code == 3 and "no answer" in r.output
    (data / "frames" / f"{video}.hidden").rename(data / "frames" / video)
    s = run(_cfg(data, tiny, out, redo_failed=True, **kw))
    assert s.complete and s.incomplete() is None and s.attempted == len(broken)
    assert s.coverage.failed == s.coverage.missing == 0
    assert json.loads((tmp_path / "m3.summary.json").read_text())["complete"]
    assert _cli_inproc(*args).exit_code == 0


def test_merge_require_complete_means_every_query_answered(synth_bench, synth_dir, tmp_path):
    ids = [q.id for q in synth_bench.queries("test")]
    base = {"config_hash": "h1", "model": "m", "forecaster": "m3"}
    cases = {  # name: (lines, exit code)
        "all_failed": ([{**base, "query_id": q, "error": "APIConnectionError", "parse_ok": False} for q in ids], 3),
        "one_missing": ([{**base, "query_id": q, "phrase": "rolling"} for q in ids[1:]], 3),
        "answered": ([{**base, "query_id": q, "phrase": "rolling"} for q in ids[:-1]]
                     + [{**base, "query_id": ids[-1], "phrase": None, "parse_ok": False, "raw": ""}], 0),
    }
    for name, (lines, code) in cases.items():
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(json.dumps(d) + "\n" for d in lines))
        r = _cli_inproc("merge", str(f), "--out", str(tmp_path / f"{name}.merged.jsonl"), "--data", str(synth_dir),
                        "--require-complete")
        assert r.exit_code == code, (name, r.output)
    assert f"{len(ids)} of {len(ids)} queries have no answer ({len(ids)} failed" in _cli_inproc(
        "merge", str(tmp_path / "all_failed.jsonl"), "--out", str(tmp_path / "x.jsonl"), "--data", str(synth_dir),
        "--require-complete").output
    r = _cli_inproc("merge", str(tmp_path / "answered.jsonl"), "--out", str(tmp_path / "y.jsonl"), "--require-complete")
    assert r.exit_code == 2 and "needs --data" in r.output


def test_drop_foreign_moves_only_the_other_configs_lines(synth_dir, tiny, tmp_path, run):
    out = tmp_path / "mixed.jsonl"
    s = run(_cfg(synth_dir, tiny, out, limit=6))
    stray = [dict(d, config_hash="0123456789abcdef", phrase="stray") for d in _lines(out)[:2]]
    with open(out, "a") as f:  # a later line of another config for two done queries
        f.write("".join(json.dumps(d) + "\n" for d in stray))
    before = out.read_bytes()
    with pytest.raises(InputError, match="--drop-foreign"):
        run(_cfg(synth_dir, tiny, out, limit=8))
    assert out.read_bytes() == before  # refused: untouched
    s2 = run(_cfg(synth_dir, tiny, out, limit=8, drop_foreign=True))
    assert s2.attempted == 2 and s2.complete and s2.config_hash == s.config_hash  # the 6 own lines were kept
    lines = _lines(out)
    assert len(lines) == 8 and {d["config_hash"] for d in lines} == {s.config_hash}
    assert [json.loads(x) for x in Path(str(out) + ".foreign").read_text().splitlines()] == stray


def test_frames_are_resized_on_our_side_to_one_recorded_cap(synth_dir, synth_bench, tiny, tmp_path, run):
    from PIL import Image

    data = _copy_bench(synth_dir, tmp_path / "bench")
    kw = dict(forecaster="m3", model=str(tiny["qwen2_vl"]), limit=2)
    q = select_queries(synth_bench, _cfg(synth_dir, tiny, "x", **kw))[0]
    for rel in q.prefix_frames:  # full-size frames: 1280 x 960
        with Image.open(data / rel) as im:
            im.convert("RGB").resize((1280, 960)).save(data / rel)
    capped = run(_cfg(data, tiny, tmp_path / "capped.jsonl", **kw))
    conf = json.loads((tmp_path / "capped.config.json").read_text())
    assert conf["identity"]["max_pixels"] == conf["backend"]["max_pixels"] == 448 * 448
    w, h = capped.largest_frame
    assert w * h <= 448 * 448 and abs(w / h - 4 / 3) < 0.01 and w > 500  # aspect ratio kept
    full = run(_cfg(data, tiny, tmp_path / "full.jsonl", max_pixels=0, **kw))
    assert full.largest_frame == (1280, 960) and full.config_hash != capped.config_hash
    assert json.loads((tmp_path / "full.config.json").read_text())["identity"]["max_pixels"] is None
    student = plan(_cfg(data, tiny, tmp_path / "st.jsonl", forecaster="student", model=str(tiny["qwen2_vl"])))
    assert student.identity.max_pixels == 336 * 336  # the students' frames, as distill.sft trains them


def test_unreachable_server_on_a_small_split_exits_non_zero_and_writes_nothing(synth_dir, tmp_path):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "nobody.jsonl"
    r = _cli_inproc("run", "--data", str(synth_dir), "--forecaster", "m3", "--backend", "openai", "--model", "m",
                    "--base-url", f"http://127.0.0.1:{port}/v1", "--limit", "5", "--out", str(out),
                    "--max-attempts", "2", "--wait-initial", "0.01", "--wait-max", "0.05", "--no-progress")
    assert r.exit_code == 2 and "no OpenAI-compatible server answers" in r.output and "Traceback" not in r.output
    assert not out.exists() and not (tmp_path / "nobody.config.json").exists()


@pytest.mark.parametrize("trained, flag, expect", [
    ({"max_pixels": 112896}, None, 112896), ({"max_pixels": None}, None, None), ({}, None, 336 * 336),
    ({"max_pixels": 112896}, 200704, "trained with 112896"), ({"max_pixels": None}, 200704, "trained with 0")])
def test_a_student_adapter_is_served_with_the_pixel_cap_it_was_trained_on(synth_dir, tiny, tmp_path, trained, flag,
                                                                          expect):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "psr_student.json").write_text(json.dumps({"preprocessing": trained}))
    cfg = _cfg(synth_dir, tiny, tmp_path / "s.jsonl", forecaster="student", model=str(tiny["qwen2_vl"]),
               adapter=str(adapter), max_pixels=flag)
    if isinstance(expect, str):
        with pytest.raises(InputError, match=expect):
            plan(cfg)
    else:
        assert plan(cfg).identity.max_pixels == expect  # None: full-size frames, as in training


@pytest.mark.parametrize("flag, expect", [
    (None, "spaced:4"), ("spaced:4", "spaced:4"), ("last:4", "trained with spaced:4"), ("all", "trained with"),
])
def test_a_student_adapter_is_served_the_frames_it_was_trained_on(synth_dir, tiny, tmp_path, flag, expect):
    """The adapter's ``frames: K`` (K evenly spaced frames, as distill.sft trains) is taken when --frames is unset;
    another selection is refused, a spelling that selects the same frames of the 8-frame prefix is not."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "psr_student.json").write_text(json.dumps({"preprocessing": {"frames": 4}}))
    cfg = _cfg(synth_dir, tiny, tmp_path / "s.jsonl", forecaster="student", model=str(tiny["qwen2_vl"]),
               adapter=str(adapter), frames=flag)
    if expect.startswith("trained"):
        with pytest.raises(InputError, match=expect):
            plan(cfg)
    else:
        assert str(plan(cfg).cfg.frame_selection()) == expect


def test_a_spelling_of_the_same_eight_frames_agrees_with_an_eight_frame_student(synth_dir, tiny, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "psr_student.json").write_text(json.dumps({"preprocessing": {"frames": 8}}))
    for flag in ("8", "last:8", "spaced:8", "all"):
        cfg = _cfg(synth_dir, tiny, tmp_path / "s.jsonl", forecaster="student", model=str(tiny["qwen2_vl"]),
                   adapter=str(adapter), frames=flag)
        plan(cfg)  # no conflict: every spelling selects the 8 prefix frames
