"""Loading transformers models and processors for the ``hf`` backend, including on machines without torchvision.

Without torchvision, transformers cannot build the video processors of Qwen-VL models, and
``AutoProcessor.from_pretrained`` then silently returns only the tokenizer. `load_processor` detects that and
rebuilds the image+text processor from the saved ``processor_class`` with the video processor left out
(`processor_class_without_video`), so image inputs work everywhere; video inputs need torchvision.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from pathlib import Path


@functools.cache
def processor_class_without_video(proc_cls: type) -> type:
    """A subclass of a transformers processor class whose constructor has no ``video_processor`` attribute.

    transformers derives a processor's attributes from its ``__init__`` signature, so dropping the parameter is
    what keeps it from checking (and needing) a video processor class.
    """
    if "video_processor" not in inspect.signature(proc_cls.__init__).parameters:
        return proc_cls

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        proc_cls.__init__(self, image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                          chat_template=chat_template, **kwargs)

    sub = type(proc_cls.__name__, (proc_cls,), {"__init__": __init__, "__module__": __name__})
    sub.__qualname__ = proc_cls.__qualname__
    return sub


def _saved_processor_class(path: Path) -> str | None:
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        f = path / name
        if f.is_file():
            with open(f, encoding="utf-8") as fh:
                cls = json.load(fh).get("processor_class")
            if cls:
                return cls
    return None


def is_vision_config(config) -> bool:
    """True for image-text-to-text configs (a ``vision_config`` is present)."""
    return getattr(config, "vision_config", None) is not None


def load_processor(model: str | os.PathLike, *, trust_remote_code: bool = False, **kwargs):
    """``AutoProcessor.from_pretrained`` that never silently degrades to a bare tokenizer for a VLM.

    ``kwargs`` go to the image processor (e.g. ``min_pixels`` / ``max_pixels`` caps for Qwen-VL).
    Raises ``ValueError`` when a vision model's processor cannot be built.
    """
    import transformers
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    first_error: Exception | None = None
    try:
        proc = AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:  # transformers raises OSError/ImportError/ValueError here depending on what is missing
        proc, first_error = None, e
    if not is_vision_config(config) and proc is None:
        raise first_error
    if not is_vision_config(config):
        return proc
    if proc is not None and getattr(proc, "image_processor", None) is not None:
        return proc
    path = Path(model)
    name = _saved_processor_class(path) if path.is_dir() else None
    if not name or not hasattr(transformers, name):
        raise ValueError(f"{model}: could not build the image processor of this vision model (processor class "
                         f"{name!r}; AutoProcessor said: {first_error}); is torchvision missing?")
    cls = processor_class_without_video(getattr(transformers, name))
    return cls.from_pretrained(model, trust_remote_code=trust_remote_code, **kwargs)
