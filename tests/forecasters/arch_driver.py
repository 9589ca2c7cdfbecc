"""Every preset architecture through vLLM, in one process of the vLLM venv (the import of vllm is paid once).

usage: python arch_driver.py SPEC.json      (written by the ``arch_runs`` fixture; see `test_fc_architectures.py`)

For each case of `arch_cases.CASES` in the spec, in order:
1. ``vllm`` in process (`forecasters.backends.vllm_backend`): the agreement requests one at a time (token ids and
   log-probabilities captured, `arch_cases.vllm_traces`), then each of the case's forecasters through the runner on
   the same engine; with ``lora``, a second engine with the LoRA adapter unmerged (one ``LoRARequest``).
2. ``hf`` here for the video requests (transformers' video processors need torchvision, which only this venv has).
3. the OpenAI-compatible server (`tests/vllm_server.py`; ``--enable-lora --lora-modules student=ADAPTER`` with LoRA):
   the agreement requests as raw chat completions with ``return_token_ids`` and log-probabilities (video as a
   ``video/jpeg`` data URL of the PNG frames), the same requests through the ``openai`` backend, each forecaster
   through the runner; the server is stopped before the next case starts.
Results go to the spec's ``results`` file after every step (a partial file says how far it got), with timings.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
import traceback
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # arch_cases, vllm_server


def _save(results: dict, path: str) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


def _timed(results: dict, key: str, fn):
    t0 = time.monotonic()
    try:
        return fn()
    except Exception as e:  # recorded for the test to report; the driver goes on with the next step
        results.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        return None
    finally:
        results.setdefault("timings_s", {})[key] = round(time.monotonic() - t0, 1)


def _runs(results, key, spec, case, backend, *, backend_name, model, adapter=None, base_url=None, forecasters=None):
    """Each forecaster of ``case`` (or ``forecasters``) through the runner on an already built backend (4 test
    queries; 2 with a LoRA adapter)."""
    from forecasters.runner import RunConfig, run

    out = {}
    for fc in forecasters or case.forecasters:
        if fc == "student" and not adapter:
            continue
        path = Path(spec["runs_dir"]) / f"{key}-{fc}.jsonl"
        cfg = RunConfig(data=spec["synth_dir"], out=str(path), forecaster=fc, backend=backend_name, model=model,
                        adapter=adapter, base_url=base_url, limit=2 if adapter else 4, max_model_len=2048,
                        progress=False,
                        max_tokens=32 if fc == "student" else None, max_attempts=2, wait_initial=0.1)
        s = _timed(results, f"{key}/run/{fc}", lambda cfg=cfg: run(cfg, backend=backend))
        out[fc] = {"out": str(path), **(s.to_dict() if s is not None else {"error": "see errors"})}
    return out


def inprocess(spec: dict, case, results: dict) -> None:
    from arch_cases import hf_traces, requests, vllm_traces

    from forecasters.backends import get_backend
    from forecasters.backends.hf import HFConfig
    from forecasters.backends.vllm_backend import VLLMConfig

    model = spec["models"][case.kind]
    reqs = requests(case)
    r = results.setdefault(case.kind, {})
    variants = [("vllm", None)] + ([("vllm_lora", spec["adapter"])] if case.lora else [])
    for key, adapter in variants:
        b = _timed(results, f"{case.kind}/{key}/init", lambda adapter=adapter: get_backend(
            "vllm", VLLMConfig(model=model, adapter=adapter, max_model_len=2048)))
        if b is None:
            continue
        mine = [q for q in reqs if not (adapter and q.videos)]  # the student takes images
        traces = _timed(results, f"{case.kind}/{key}/requests", lambda b=b, mine=mine: vllm_traces(b, mine))
        r[key] = {k: t.to_dict() for k, t in (traces or {}).items()}
        r[key + "_runs"] = _runs(results, f"{case.kind}-{key}", spec, case, b, backend_name="vllm", model=model,
                                 adapter=adapter, forecasters=("student",) if adapter else None)
        r["engine"] = b.engine_version
        b.close()
        del b
        gc.collect()
        _save(results, spec["results"])
    if "video" in case.media:  # the hf backend's video path needs torchvision: this venv has it
        video = [q for q in reqs if q.videos]
        b = _timed(results, f"{case.kind}/hf_video/init",
                   lambda: get_backend("hf", HFConfig(model=model, batch_size=1, num_threads=1)))
        if b is not None:
            traces = _timed(results, f"{case.kind}/hf_video/requests", lambda: hf_traces(b, video))
            r["hf_video"] = {k: t.to_dict() for k, t in (traces or {}).items()}
            r["hf_video_runs"] = _runs(results, f"{case.kind}-hf", spec, case, b, backend_name="hf", model=model,
                                       forecasters=("llava-video",))
            b.close()
    _save(results, spec["results"])


def _chat(base_url: str, body: dict) -> dict:
    req = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def server_traces(base_url: str, model: str, reqs, **extra) -> dict:
    """The requests as raw chat completions (the ``openai`` backend's message format; video as a data URL), with
    the prompt / generated token ids (``return_token_ids``) and the sampled tokens' log-probabilities."""
    from arch_cases import Trace

    from forecasters.backends.openai_compat import to_openai_messages

    out = {}
    for r in reqs:
        body = dict(model=model, messages=to_openai_messages(r), temperature=0, max_tokens=r.sampling.max_tokens,
                    seed=0, logprobs=True, top_logprobs=0, return_token_ids=True, **extra)
        if r.videos:  # vLLM's loader takes the frames of a video/jpeg URL at this rate (default 1 fps)
            body["media_io_kwargs"] = {"video": {"fps": r.videos[0].fps}}
        try:
            resp = _chat(base_url, body)
            choice = resp["choices"][0]
            lp = [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
            out[r.id] = Trace(prompt_ids=resp.get("prompt_token_ids") or [], output_ids=choice.get("token_ids") or [],
                              logprobs=lp, text=choice["message"]["content"]).to_dict()
        except Exception as e:
            body_text = e.read().decode(errors="replace")[:1000] if hasattr(e, "read") else ""
            out[r.id] = Trace(error=f"{type(e).__name__}: {e} {body_text}").to_dict()
    return out


def served(spec: dict, case, results: dict) -> None:
    from arch_cases import requests
    from vllm_server import VLLMServer

    from forecasters.backends import get_backend
    from forecasters.backends.openai_compat import OpenAIConfig

    model = spec["models"][case.kind]
    reqs = requests(case)
    r = results.setdefault(case.kind, {})
    extra = list(case.server_args)
    if case.lora:
        extra += ["--enable-lora", "--lora-modules", f"student={spec['adapter']}", "--max-lora-rank", "16",
                  "--max-loras", "1"]
    server = VLLMServer(model, served_name=case.served_name, max_model_len=2048, extra_args=tuple(extra),
                        log_path=Path(spec["runs_dir"]) / f"server-{case.kind}.log")
    t0 = time.monotonic()
    try:
        server.start()
        started = _timed(results, f"{case.kind}/server/start", lambda: server.wait_ready(timeout_s=600) or True)
        if not started:
            r["server_log"] = server.log_tail(60)
            return
        r["server_startup_s"] = round(server.startup_s, 1)
        names = [("server", case.served_name)] + ([("server_lora", "student")] if case.lora else [])
        for key, name in names:
            mine = [q for q in reqs if not (key == "server_lora" and q.videos)]  # the student takes images
            r[key] = _timed(results, f"{case.kind}/{key}/requests", lambda name=name, mine=mine: server_traces(
                server.base_url, name, mine))
            b = get_backend("openai", OpenAIConfig(model=case.served_name, adapter=name if key == "server_lora"
                                                    else None, base_url=server.base_url, concurrency=4))
            comps = _timed(results, f"{case.kind}/{key}/openai_backend", lambda b=b, mine=mine: b.generate(mine)) or []
            r[key.replace("server", "openai")] = {c.request_id: {"text": c.texts[0] if c.ok else None,
                                                                 "error": c.error, "error_kind": c.error_kind,
                                                                 "prompt_tokens": c.prompt_tokens} for c in comps}
            r[key.replace("server", "openai") + "_runs"] = _runs(
                results, f"{case.kind}-openai{'-lora' if key == 'server_lora' else ''}", spec, case, b,
                backend_name="openai", model=case.served_name, adapter=name if key == "server_lora" else None,
                base_url=server.base_url, forecasters=("student",) if key == "server_lora" else None)
            _save(results, spec["results"])
        if case.kind.startswith("llava_next"):  # the same chats with the tokenizer's BOS in front, as transformers has
            r["server_bos"] = _timed(results, f"{case.kind}/server_bos/requests", lambda: server_traces(
                server.base_url, case.served_name, reqs, add_special_tokens=True))
    finally:
        server.stop()
        results.setdefault("timings_s", {})[f"{case.kind}/server/total"] = round(time.monotonic() - t0, 1)
        _save(results, spec["results"])


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through `served`, which stops its server
    spec = json.loads(Path(sys.argv[1]).read_text())
    from arch_cases import BY_KIND

    results: dict = {"started": time.time()}
    t0 = time.monotonic()
    import vllm

    results["vllm_version"] = vllm.__version__
    results.setdefault("timings_s", {})["import_vllm"] = round(time.monotonic() - t0, 1)
    for kind in spec["cases"]:
        inprocess(spec, BY_KIND[kind], results)
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # set by the in-process backend; servers run as usual
    for kind in spec["cases"]:
        served(spec, BY_KIND[kind], results)
    results["timings_s"]["total"] = round(time.monotonic() - t0, 1)
    results["done"] = True
    _save(results, spec["results"])


if __name__ == "__main__":  # vLLM may spawn workers: keep engine construction under the guard
    main()
