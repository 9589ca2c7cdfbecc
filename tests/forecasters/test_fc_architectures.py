"""Every preset's own architecture, tiny and random, through every backend: ``hf`` (here, the toolkit's venv),
``vllm`` in process and the OpenAI-compatible vLLM server (both in the vLLM venv, `arch_driver.py`), with greedy
agreement between the engines on the same weights (`arch_cases` defines it: the same prompt ids, then the same
generated ids at each of 12 steps) and the distilled student's LoRA adapter unmerged.

The vLLM side runs in the background (`arch_runs.py`): in one process from the end of collection, these tests
running last and waiting; under xdist from the first of these tests, which run first (``tests/conftest.py``).
``PSR_ARCH_TABLE=FILE`` writes the architecture x backend table (what ran, agreement, seconds) to FILE.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from arch_cases import BY_KIND, CASES, MAX_TOKENS, N_FRAMES, QUESTIONS, Trace, agreement, hf_traces, requests

from eval.phrases import read_phrases
from forecasters.backends import get_backend
from forecasters.backends.hf import HFConfig
from forecasters.presets import PRESETS
from forecasters.runner import RunConfig, run
from forecasters.tiny_models import ARCHITECTURES, chat_template

KINDS = [c.kind for c in CASES]
#: vLLM's CPU attention backend takes these head sizes only.
VLLM_CPU_HEAD_DIMS = {32, 64, 80, 96, 112, 128}
#: Agreement is exact: the same prompt ids and the same greedy ids at every step. Beside it, the largest gap allowed
#: between two engines' log-probabilities of the same chosen tokens (float32 on CPU), measured: <= 3e-6 between
#: transformers and vLLM when both preprocess the pixels with the same code (text; video and images in the vLLM venv)
#: and between vLLM in process and served (0 for text); up to 4e-3 with images here, where transformers' PIL image
#: processors (this venv has no torchvision) give pixel values that differ in the last bits from the torchvision ones
#: vLLM uses.
TOL = {"text": 1e-4, "video": 1e-4, "images": 1e-2, "same_engine": 1e-4}
#: LLaVA tokenizers put <s> in front of a text; the LLaVA-NeXT chat templates do not write it. transformers' processor
#: adds it, and so do the toolkit's vllm and openai backends (`missing_bos`, `OpenAIBackend.adds_bos`); a raw chat
#: completion lacks it (the driver's ``server`` leg) unless it asks for ``add_special_tokens`` (``server_bos``).
BOS_KINDS = ("llava_next", "llava_next_video")

pytestmark = pytest.mark.slow


def _traces(d: dict | None) -> dict[str, Trace]:
    return {k: Trace(**v) for k, v in (d or {}).items()}


def _vllm_results(arch_runs) -> dict:
    from vllm_server import require_vllm, vllm_available

    if not vllm_available():
        if require_vllm():
            pytest.fail("PSR_REQUIRE_VLLM=1 but the vLLM venv is missing: run `make vllm-venv`")
        pytest.skip("no .venv-vllm (run `make vllm-venv`); vLLM architecture runs skipped")
    res = arch_runs.results()
    assert res.get("done") and not res.get("errors"), json.dumps(res.get("errors"), indent=1)[-6000:]
    return res


@pytest.fixture(scope="session")
def arch_spec(arch_runs) -> dict:
    return arch_runs.spec()


@pytest.fixture(scope="session")
def arch_hf(arch_spec):
    """hf traces of each case's text and image requests (video needs torchvision: `arch_driver.py` runs it), built
    once per kind (and once with the student's adapter), with their timings."""
    cache: dict = {}

    def get(kind: str, adapter: bool = False) -> dict:
        key = (kind, adapter)
        if key not in cache:
            t0 = time.monotonic()
            b = get_backend("hf", HFConfig(model=arch_spec["models"][kind], batch_size=1,
                                                adapter=arch_spec["adapter"] if adapter else None))
            t1 = time.monotonic()
            traces = hf_traces(b, [r for r in requests(BY_KIND[kind]) if not r.videos])
            cache[key] = {"backend": b, "traces": traces, "load_s": t1 - t0, "requests_s": time.monotonic() - t1}
        return cache[key]

    return get


def _run_all(cfg_kw: dict, case, backend, runs_dir: Path, skip=(), **kw) -> dict:
    """Each forecaster of ``case`` through the runner on ``backend`` (4 test queries; 2 with an adapter)."""
    out = {}
    for fc in case.forecasters:
        if fc in skip or (fc == "student") != bool(kw.get("adapter")):
            continue
        path = runs_dir / f"{case.kind}-{fc}{'-lora' if kw.get('adapter') else ''}.jsonl"
        s = run(RunConfig(out=str(path), forecaster=fc, limit=2 if kw.get("adapter") else 4, progress=False,
                          max_tokens=32 if fc == "student" else None, **cfg_kw, **kw), backend=backend)
        out[fc] = (s, read_phrases(path))
    return out


# --- the models ---------------------------------------------------------------------------------------------------

def test_every_named_model_has_a_tiny_model_of_its_architecture(arch_spec):
    from distill.narrate import DEFAULT_TEACHER

    named = set(PRESETS.values()) | {DEFAULT_TEACHER}
    assert named == set(ARCHITECTURES), named ^ set(ARCHITECTURES)
    assert {kind for _, kind in ARCHITECTURES.values()} == set(KINDS)
    for model_id, (arch, kind) in ARCHITECTURES.items():
        d = Path(arch_spec["models"][kind])  # built by `forecasters tiny-model --kind KIND --template native`
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["architectures"] == [arch], model_id
        text = cfg.get("text_config", cfg)
        head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
        assert head_dim in VLLM_CPU_HEAD_DIMS, (kind, head_dim)
        assert (d / "chat_template.jinja").read_text() == chat_template(kind, "native")


@pytest.mark.parametrize("kind, config_cls, processor_cls, text_model_type", [
    ("qwen3_vl", "Qwen3VLConfig", "Qwen3VLProcessor", "qwen3_vl_text"),
    ("qwen2_5_vl", "Qwen2_5_VLConfig", "Qwen2_5_VLProcessor", "qwen2_5_vl_text"),
    ("llava_next", "LlavaNextConfig", "LlavaNextProcessor", "mistral"),
    ("llava_next_video", "LlavaNextVideoConfig", "LlavaNextVideoProcessor", "llama"),
    ("qwen3", "Qwen3Config", None, None),
])
def test_config_and_processor_classes_are_the_real_ones(arch_spec, kind, config_cls, processor_cls, text_model_type):
    from transformers import AutoConfig

    from forecasters.backends.hf_loading import load_processor

    d = arch_spec["models"][kind]
    cfg = AutoConfig.from_pretrained(d)
    assert type(cfg).__name__ == config_cls
    if processor_cls:
        assert cfg.text_config.model_type == text_model_type
        proc = load_processor(d)
        assert type(proc).__name__ == processor_cls and proc.image_processor is not None
        assert json.loads((Path(d) / "processor_config.json").read_text())["processor_class"] == processor_cls


def _render(kind: str, spec: dict, content, **kw) -> str:
    from forecasters.backends.hf_loading import load_processor

    proc = load_processor(spec["models"][kind])
    return proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=False, **kw)


def test_native_templates_render_the_real_prompt_formats(arch_spec):
    img, q = {"type": "image"}, {"type": "text", "text": "Q?"}
    vis = "<|vision_start|><|image_pad|><|vision_end|>"
    assert _render("qwen3_vl", arch_spec, [img, img, q]) == f"<|im_start|>user\n{vis}{vis}Q?<|im_end|>\n" \
                                                             "<|im_start|>assistant\n"
    assert _render("qwen2_5_vl", arch_spec, [q]) == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" \
                                                     "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    assert _render("llava_next", arch_spec, [q, img, img]) == "[INST] <image>\n<image>\nQ? [/INST]"
    assert _render("llava_next_video", arch_spec, [q, {"type": "video"}]) == "USER: <video>\nQ? ASSISTANT:"
    assert _render("qwen3", arch_spec, "Q?") == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    assert _render("qwen3", arch_spec, "Q?", enable_thinking=False).endswith("assistant\n<think>\n\n</think>\n\n")


# --- hf (transformers, this venv) -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_hf_backend_runs_the_architecture(arch_spec, arch_hf, kind, tmp_path):
    case = BY_KIND[kind]
    hf = arch_hf(kind)
    traces = hf["traces"]
    assert all(t.error is None and len(t.output_ids) >= 1 for t in traces.values()), traces
    if "images" in case.media:  # 8 frames became image tokens
        assert len(traces["images0"].prompt_ids) >= len(traces["text0"].prompt_ids) + N_FRAMES * 4
    # video needs transformers' video processors, hence torchvision: the hf video path runs in the vLLM venv
    runs = _run_all(dict(data=arch_spec["synth_dir"], backend="hf", model=arch_spec["models"][kind]), case,
                    hf["backend"], tmp_path, skip=("llava-video",))
    assert runs or kind == "llava_next_video"
    for fc, (s, recs) in runs.items():
        assert s.coverage.failed == 0 and s.coverage.ok + s.coverage.parse_failures == len(recs) == 4, (fc, s)
        assert all(r.backend == "hf" and r.raw is not None for r in recs.values())


# --- vllm in process ---------------------------------------------------------------------------------------------

def _assert_agree(rows: dict, what: str, *, same_engine: bool = False) -> None:
    assert rows, what
    for rid, row in rows.items():
        assert "error" not in row, (what, rid, row)
        assert row["prompt_equal"], (what, rid, row)
        assert row["identical"] and row["steps"] >= 1, (what, rid, row)
        tol = TOL["same_engine"] if same_engine else TOL[rid.rstrip("0123456789")]
        assert row["max_logprob_gap"] <= tol, (what, rid, row)


@pytest.mark.vllm
@pytest.mark.parametrize("kind", KINDS)
def test_vllm_in_process_runs_and_agrees_with_hf(arch_runs, arch_hf, kind):
    res = _vllm_results(arch_runs)[kind]
    _assert_agree(agreement(arch_hf(kind)["traces"], _traces(res["vllm"])), f"{kind}: hf vs vllm")
    assert all(t.error is None for t in _traces(res["vllm"]).values()), res["vllm"]
    for fc, s in res["vllm_runs"].items():
        assert s["failed"] == 0 and s["ok"] + s["parse_failures"] == 4, (fc, s)
        assert s["this_run"]["engine"].startswith("vllm 0.32")


@pytest.mark.vllm
@pytest.mark.parametrize("kind", BOS_KINDS)
def test_vllm_chat_prompts_of_llava_next_carry_the_bos_like_hf(arch_runs, arch_hf, kind):
    """The template does not write <s>; the vllm backend adds it once (a raw chat completion lacks it)."""
    res = _vllm_results(arch_runs)[kind]
    hf, vl, raw = arch_hf(kind)["traces"], _traces(res["vllm"]), _traces(res["server"])
    assert [vl[k].prompt_ids for k in hf] == [t.prompt_ids for t in hf.values()]
    bos = hf["text0"].prompt_ids[0]
    assert all(vl[k].prompt_ids[1] != bos and raw[k].prompt_ids[0] != bos and vl[k].prompt_ids[1:] == raw[k].prompt_ids
               for k in hf)


@pytest.mark.vllm
def test_with_the_bos_the_served_llava_next_agrees_with_hf(arch_runs, arch_hf):
    """The same chats with ``add_special_tokens`` (the server's switch): prompts and greedy ids equal transformers'."""
    res = _vllm_results(arch_runs)
    for kind in BOS_KINDS:
        hf = arch_hf(kind)["traces"]
        _assert_agree(agreement(hf, _traces(res[kind]["server_bos"])), f"{kind}: hf vs server with BOS")


# --- video -------------------------------------------------------------------------------------------------------

VIDEO_KINDS = [c.kind for c in CASES if "video" in c.media]


@pytest.mark.vllm
@pytest.mark.parametrize("kind", VIDEO_KINDS)
def test_video_runs_through_hf_and_the_server(arch_runs, kind):
    res = _vllm_results(arch_runs)[kind]
    for leg in ("hf_video", "server"):
        video = {k: t for k, t in _traces(res[leg]).items() if k.startswith("video")}
        assert len(video) == 3, (leg, video)
        assert all(t.error is None and len(t.prompt_ids) > N_FRAMES and len(t.output_ids) >= 1
                   for t in video.values()), (leg, video)
    s = res["hf_video_runs"]["llava-video"]  # the llava-video forecaster: the 8 frames as one video
    assert s["failed"] == 0 and s["ok"] + s["parse_failures"] == 4 and s["this_run"]["prompt_tokens"] > 4 * N_FRAMES, s


@pytest.mark.vllm
def test_llava_next_video_video_agrees_across_hf_vllm_and_the_server(arch_runs):
    res = _vllm_results(arch_runs)["llava_next_video"]
    hf = _traces(res["hf_video"])
    _assert_agree(agreement(hf, _traces(res["vllm"])), "hf vs vllm video")
    _assert_agree(agreement(hf, _traces(res["server_bos"])), "hf vs served video (with BOS)")
    s = res["vllm_runs"]["llava-video"]
    assert s["failed"] == 0 and s["ok"] + s["parse_failures"] == 4


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["qwen3_vl", "qwen2_5_vl"])
def test_qwen_vl_video_through_the_vllm_backend_agrees_with_the_server(arch_runs, kind):
    """The vllm backend sends a video with its metadata (vLLM refuses Qwen-VL video without it): the engine in process
    and served (a ``video/jpeg`` data URL, 1 fps, the frame rate of the test's videos) give the same ids."""
    res = _vllm_results(arch_runs)[kind]
    vl = {k: t for k, t in _traces(res["vllm"]).items() if k.startswith("video")}
    assert len(vl) == 3 and all(t.error is None and len(t.prompt_ids) > N_FRAMES for t in vl.values()), vl
    _assert_agree(agreement(vl, _traces(res["server"])), f"{kind}: vllm vs served video", same_engine=True)


@pytest.mark.vllm
def test_qwen3_vl_video_agrees_across_hf_vllm_and_the_server(arch_runs):
    """With the frame rate in the metadata, transformers writes the same frame times into the prompt as vLLM."""
    res = _vllm_results(arch_runs)["qwen3_vl"]
    hf = _traces(res["hf_video"])
    _assert_agree(agreement(hf, _traces(res["vllm"])), "qwen3_vl: hf vs vllm video")
    _assert_agree(agreement(hf, _traces(res["server"])), "qwen3_vl: hf vs served video")


#: Qwen2.5-VL video in transformers 5.x (5.19 here, 5.24 the same): ``get_rope_index`` starts the text after a video
#: at ``max(h, w) / merge`` positions past the video's first, whatever its temporal positions (``t_index *
#: tokens_per_second * second_per_grid_ts``); vLLM starts it after the largest position the video used, as
#: Qwen2.5-VL's original implementation did. The question's tokens then sit at other positions, so greedy ids differ
#: from the first step while the prompt ids are equal.
QWEN25_VIDEO_ROPE = ("transformers 5.x's Qwen2.5-VL get_rope_index continues the text after a video at max(h, w) / "
                     "merge, ignoring the video's temporal positions; vLLM continues after them (Qwen's original)")


@pytest.mark.vllm
@pytest.mark.xfail(strict=True, reason=QWEN25_VIDEO_ROPE)
def test_qwen2_5_vl_video_hf_agrees_with_vllm_at_1_and_2_fps(arch_runs):
    res = _vllm_results(arch_runs)["qwen2_5_vl"]
    slow = {k: t for k, t in _traces(res["hf_video"]).items() if k in ("video0", "video1")}
    _assert_agree(agreement(slow, _traces(res["vllm"])), "qwen2_5_vl: hf vs vllm video")


@pytest.mark.vllm
def test_qwen2_5_vl_video_hf_agrees_with_vllm_where_time_positions_stay_inside_the_frame(arch_runs):
    """The cause above, isolated: at `arch_cases.FAST_FPS` the video's temporal positions stay below its spatial ones,
    both rules start the text at the same position, and transformers and vLLM agree."""
    res = _vllm_results(arch_runs)["qwen2_5_vl"]
    fast = {k: t for k, t in _traces(res["hf_video"]).items() if k == "video2"}
    _assert_agree(agreement(fast, _traces(res["vllm"])), "qwen2_5_vl: hf vs vllm video at FAST_FPS")


# --- the OpenAI-compatible server ----------------------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.parametrize("kind", KINDS)
def test_server_answers_like_the_engine_in_process(arch_runs, kind):
    res = _vllm_results(arch_runs)[kind]
    # the backends add the BOS the LLaVA-NeXT templates lack: the served chats that ask for it are the same prompts
    served = _traces(res["server_bos" if kind in BOS_KINDS else "server"])
    rows = agreement(_traces(res["vllm"]), served)
    _assert_agree(rows, f"{kind}: vllm in process vs served", same_engine=True)
    assert res["server_startup_s"] > 0
    # the openai backend (this toolkit's client) gets the served texts, video (with its frame rate) included
    assert set(res["openai"]) == set(served)
    for rid, c in res["openai"].items():
        assert c["error"] is None and c["text"] == served[rid].text, (rid, c, served[rid].text)
        assert c["prompt_tokens"] == len(served[rid].prompt_ids), (rid, c)  # LLaVA-NeXT: the BOS asked for
    for fc, s in res["openai_runs"].items():
        assert s["failed"] == 0 and s["ok"] + s["parse_failures"] == 4, (fc, s)
        assert s["this_run"]["engine"].startswith("openai-compatible server 0.32")


# --- the student: LoRA unmerged --------------------------------------------------------------------------------

@pytest.mark.vllm
def test_student_lora_unmerged_agrees_across_hf_vllm_and_the_server(arch_runs, arch_hf, tmp_path):
    res = _vllm_results(arch_runs)["qwen3_vl"]
    hf_lora = arch_hf("qwen3_vl", adapter=True)["traces"]
    vl_lora, vl_base = _traces(res["vllm_lora"]), _traces(res["vllm"])
    _assert_agree(agreement(hf_lora, vl_lora), "hf + LoRA vs vllm + LoRARequest")
    _assert_agree(agreement(vl_lora, _traces(res["server_lora"])), "vllm + LoRA vs served --lora-modules",
                  same_engine=True)
    changed = [k for k in hf_lora if vl_lora[k].output_ids != vl_base[k].output_ids]
    assert len(changed) >= 2, "the adapter changes the greedy answers"
    spec = arch_runs.spec()
    runs = _run_all(dict(data=spec["synth_dir"], backend="hf", model=spec["models"]["qwen3_vl"]), BY_KIND["qwen3_vl"],
                    arch_hf("qwen3_vl", adapter=True)["backend"], tmp_path, adapter=spec["adapter"])
    assert set(runs) == {"student"} and runs["student"][0].coverage.failed == 0
    assert all(r.extra["adapter"] == spec["adapter"] for r in runs["student"][1].values())
    for key in ("vllm_lora_runs", "openai_lora_runs"):
        s = res[key]["student"]
        assert s["failed"] == 0 and s["ok"] + s["parse_failures"] == 2, (key, s)


# --- the table ---------------------------------------------------------------------------------------------------

def _summary(rows: dict) -> str:
    """``k/n same`` (requests whose prompt and 12 greedy ids are identical) and the largest log-probability gap."""
    same = sum(bool(r.get("prompt_equal") and r.get("identical")) for r in rows.values())
    gap = max((r["max_logprob_gap"] for r in rows.values() if "max_logprob_gap" in r), default=0.0)
    return f"{same}/{len(rows)} same, gap {gap:.0e}" if gap else f"{same}/{len(rows)} same, gap 0"


@pytest.mark.vllm
def test_architecture_table(arch_runs, arch_hf, arch_spec):
    """Every architecture x backend ran; ``PSR_ARCH_TABLE=FILE`` writes the markdown table (generated, not typed)."""
    res = _vllm_results(arch_runs)
    t, prep = res["timings_s"], arch_spec["timings_s"]
    names = {kind: arch.removesuffix("ForConditionalGeneration").removesuffix("ForCausalLM")
             for arch, kind in ARCHITECTURES.values()}
    rows = ["| architecture (`--kind`) | stands for | hf: load + requests | vllm in process vs hf | "
            "OpenAI server vs in process | video (8 frames) |", "|---|---|---|---|---|---|"]
    for case in CASES:
        k, hf, r = case.kind, arch_hf(case.kind), res[case.kind]
        vl, srv = _traces(r["vllm"]), _traces(r["server"])
        engines = _summary(agreement(hf["traces"], vl))
        if k in BOS_KINDS:  # the backends add the BOS; so do served chats that ask for add_special_tokens
            srv = _traces(r["server_bos"])
        served = _summary(agreement(vl, srv)) + (" (chats with add_special_tokens)" if k in BOS_KINDS else "")
        video = "-"
        if "video" in case.media:
            video = (f"hf vs vllm {_summary(agreement(_traces(r['hf_video']), vl))}; hf vs served "
                     f"{_summary(agreement(_traces(r['hf_video']), srv))}")
        rows.append(f"| {names[k]} (`{k}`) | {', '.join(case.stands_for)} "
                    f"| {hf['load_s']:.1f} + {hf['requests_s']:.1f} s "
                    f"| {engines}; {t[f'{k}/vllm/init']:.0f} + {t[f'{k}/vllm/requests']:.0f} s "
                    f"| {served}; start {r['server_startup_s']:.0f} s, all {t[f'{k}/server/total']:.0f} s "
                    f"| {video} |")
    lora, r = arch_hf("qwen3_vl", adapter=True), res["qwen3_vl"]
    rows.append(f"| Qwen3VL + LoRA (unmerged) | students (`--adapter`) "
                f"| {lora['load_s']:.1f} + {lora['requests_s']:.1f} s "
                f"| LoRARequest: {_summary(agreement(lora['traces'], _traces(r['vllm_lora'])))}; "
                f"{t['qwen3_vl/vllm_lora/init']:.0f} + {t['qwen3_vl/vllm_lora/requests']:.0f} s "
                f"| `--lora-modules`: {_summary(agreement(_traces(r['vllm_lora']), _traces(r['server_lora'])))} | - |")
    text = "\n".join(rows) + (f"\n\nRequests: {len(QUESTIONS)} text + {len(QUESTIONS)} per medium, "
                              f"{MAX_TOKENS} greedy tokens each; building the models {sum(prep.values()):.0f} s; "
                              f"the vLLM side (vllm {res['vllm_version']}, in process then the servers one by one) "
                              f"{t['total']:.0f} s wall.\n")
    assert len(rows) == 2 + len(CASES) + 1
    if os.environ.get("PSR_ARCH_TABLE"):
        Path(os.environ["PSR_ARCH_TABLE"]).write_text(text)
