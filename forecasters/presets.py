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

`VLLM_DEFAULTS` are engine settings per preset for the ``vllm`` backend (tensor parallelism, context, pixel caps)
that fit the model on H100/H200-class GPUs; every one is overridable from the CLI.
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
_QWEN_PIXELS = 448 * 448
VLLM_DEFAULTS: dict[str, dict] = {
    "m3": {"tensor_parallel_size": 2, "max_model_len": 8192, "max_pixels": _QWEN_PIXELS},
    "text-only": {"tensor_parallel_size": 1, "max_model_len": 4096},
    "llava": {"tensor_parallel_size": 1, "max_model_len": 32768},
    "llava-video-7b": {"tensor_parallel_size": 1, "max_model_len": 8192},
    "llava-video-34b": {"tensor_parallel_size": 2, "max_model_len": 8192},
    "student-8b": {"tensor_parallel_size": 1, "max_model_len": 8192, "max_pixels": _QWEN_PIXELS},
    "student-2b": {"tensor_parallel_size": 1, "max_model_len": 8192, "max_pixels": _QWEN_PIXELS},
}


def resolve_model(name: str) -> str:
    """A preset name to its HF id; anything else (an id, a local path, a served name) unchanged."""
    return PRESETS.get(name, name)
