"""Model presets: short names for the paper's models. ``--model`` takes a preset name, an HF id, or a local path.

=====================  ==========================================  =============================================
preset                 model                                       used for
=====================  ==========================================  =============================================
``m3``                 ``Qwen/Qwen3-VL-32B-Instruct``              M3, the multimodal-LLM baseline (8 frames)
``text-only``          ``Qwen/Qwen2.5-VL-7B-Instruct``             the text-only predictor (run text-only)
``llava``              ``llava-hf/llava-v1.6-mistral-7b-hf``       LLaVA-1.6-7B, images
``llava-video-7b``     ``llava-hf/LLaVA-NeXT-Video-7B-hf``         LLaVA-NeXT-Video 7B, video input
``llava-video-34b``    ``llava-hf/LLaVA-NeXT-Video-34B-hf``        LLaVA-NeXT-Video 34B, video input
``student-8b``         ``Qwen/Qwen3-VL-8B-Instruct``               base of a distilled student (DynaPix: 8B, 2B)
``student-2b``         ``Qwen/Qwen3-VL-2B-Instruct``               base of a distilled student
=====================  ==========================================  =============================================

`VLLM_DEFAULTS` are engine settings per preset for the ``vllm`` backend (tensor parallelism, context) that fit the
model on H100/H200-class GPUs; every one is overridable from the CLI.

Pixel policy (every backend): the runner resizes each frame on our side, before any backend or server sees it, to
at most the forecaster's ``max_pixels`` pixels (aspect ratio kept, bicubic; `forecasters.media.FrameCache`):
`DEFAULT_MAX_PIXELS` (448 x 448) for the image forecasters, `STUDENT_MAX_PIXELS` (336 x 336, the SFT default of
`distill.sft`) for ``student``. ``--max-pixels N`` overrides it, ``--max-pixels 0`` sends full-size frames. The
model's own processor then does its usual processing (Qwen-VL rounds to multiples of 28), the same in ``hf``,
``vllm`` and any server, so no server-side pixel cap is needed. The cap applied goes into the config hash and the
run config.
"""

from __future__ import annotations

PRESETS: dict[str, str] = {
    "m3": "Qwen/Qwen3-VL-32B-Instruct",
    "text-only": "Qwen/Qwen2.5-VL-7B-Instruct",
    "llava": "llava-hf/llava-v1.6-mistral-7b-hf",
    "llava-video-7b": "llava-hf/LLaVA-NeXT-Video-7B-hf",
    "llava-video-34b": "llava-hf/LLaVA-NeXT-Video-34B-hf",
    "student-8b": "Qwen/Qwen3-VL-8B-Instruct",
    "student-2b": "Qwen/Qwen3-VL-2B-Instruct",
}

#: 8 frames at <= 448x448 (Qwen-VL: 256 tokens a frame at merge 2 / patch 14) keep M3 prompts near 2.2k tokens.
DEFAULT_MAX_PIXELS = 448 * 448
#: the students' frames: the SFT default (`distill.sft.DEFAULT_MAX_PIXELS`), so a student is served as it was trained
STUDENT_MAX_PIXELS = 336 * 336

VLLM_DEFAULTS: dict[str, dict] = {
    "m3": {"tensor_parallel_size": 2, "max_model_len": 8192},
    "text-only": {"tensor_parallel_size": 1, "max_model_len": 4096},
    "llava": {"tensor_parallel_size": 1, "max_model_len": 32768},
    "llava-video-7b": {"tensor_parallel_size": 1, "max_model_len": 8192},
    "llava-video-34b": {"tensor_parallel_size": 2, "max_model_len": 8192},
    "student-8b": {"tensor_parallel_size": 1, "max_model_len": 8192},
    "student-2b": {"tensor_parallel_size": 1, "max_model_len": 8192},
}


def resolve_model(name: str) -> str:
    """A preset name to its HF id; anything else (an id, a local path, a served name) unchanged."""
    return PRESETS.get(name, name)
