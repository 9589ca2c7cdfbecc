"""Tiny random-weight models for tests, built into a directory (no download).

The builders live in the package (`forecasters.tiny_models`, also behind ``python -m forecasters tiny-model``) so the
demo can use them; this module is the tests' import point::

    from tiny_models import build_tiny_qwen2, build_tiny_vlm
    path = build_tiny_vlm(tmp_path / "vl", "qwen2_vl")     # -> Path, loads with from_pretrained and vLLM

`TinyModels` builds each kind once per directory (for session fixtures).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from forecasters.tiny_models import (
    INIT_STD,
    TINY_KINDS,
    VLLM_SERVABLE,
    VLM_KINDS,
    build_tiny_model,
    build_tiny_qwen2,
    build_tiny_qwen3,
    build_tiny_vlm,
    build_tokenizer,
)


class TinyModels:
    """Lazily built tiny models under one root: ``models["qwen2_vl"] -> Path`` (built on first use, thread-safe)."""

    def __init__(self, root: str | os.PathLike, seed: int = 0):
        self.root, self.seed = Path(root), seed
        self._lock = threading.Lock()
        self._built: dict[str, Path] = {}

    def __getitem__(self, kind: str) -> Path:
        with self._lock:
            if kind not in self._built:
                self._built[kind] = build_tiny_model(self.root / kind, kind, seed=self.seed)
            return self._built[kind]


__all__ = ["INIT_STD", "TINY_KINDS", "VLLM_SERVABLE", "VLM_KINDS", "TinyModels", "build_tiny_model",
           "build_tiny_qwen2", "build_tiny_qwen3", "build_tiny_vlm", "build_tokenizer"]
