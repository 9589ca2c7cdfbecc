"""Loading transformers models and processors for the ``hf`` backend, including on machines without torchvision.

Without torchvision, transformers cannot build the video processors of Qwen-VL models, and
``AutoProcessor.from_pretrained`` then silently returns only the tokenizer. `load_processor` detects that and
rebuilds the image+text processor from the saved ``processor_class`` with the video processor left out
(`processor_class_without_video`), so image inputs work everywhere; video inputs need torchvision.
"""

from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

from eval.errors import InputError


@functools.cache
def processor_class_without_video(proc_cls: type) -> type:
    """A subclass of a transformers processor class whose constructor has no ``video_processor`` attribute.

    transformers derives a processor's attributes from its ``__init__`` signature, so dropping the parameter is
    what keeps it from checking (and needing) a video processor class.
    """
    if "video_processor" not in inspect.signature(proc_cls.__init__).parameters:
        return proc_cls
    from transformers import ProcessorMixin

    parent_attributes = proc_cls.get_attributes()  # the order in which proc_cls passes its sub-processors on

    class _WithoutVideoArgument(ProcessorMixin):
        """Sits between ``proc_cls`` and ProcessorMixin in the MRO: drops the video processor ``proc_cls`` passes on
        (positionally, in its own order: LLaVA-NeXT-Video's comes first, Qwen-VL's last)."""

        def __init__(self, *args, **kwargs):
            kwargs.update(zip(parent_attributes, args, strict=False))
            kwargs.pop("video_processor", None)
            ProcessorMixin.__init__(self, **kwargs)

    # The parent's constructor without the video processor, written out: transformers reads a processor's attributes
    # and the settings it saves and loads (patch_size, image_token, ...) from its __init__'s parameters.
    params = [(n, p.default) for n, p in inspect.signature(proc_cls.__init__).parameters.items()
              if n not in ("self", "video_processor") and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    namespace = {"_parent": proc_cls, "_defaults": dict(params)}
    exec(f"def __init__(self, {''.join(f'{n}=_defaults[{n!r}], ' for n, _ in params)}**kwargs):\n"  # noqa: S102
         f"    _parent.__init__(self, video_processor=None, {''.join(f'{n}={n}, ' for n, _ in params)}**kwargs)",
         namespace)
    __init__ = namespace["__init__"]
    sub = type(proc_cls.__name__, (proc_cls, _WithoutVideoArgument), {"__init__": __init__, "__module__": __name__})
    sub.__qualname__ = proc_cls.__qualname__
    return sub


def _saved_processor_class(path: Path) -> str | None:
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        f = path / name
        if f.is_file():
            from eval.io import read_json

            d = read_json(f)
            cls = d.get("processor_class") if isinstance(d, dict) else None
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
        raise InputError(f"{model}: could not build the image processor of this vision model (processor class "
                         f"{name!r}; AutoProcessor said: {first_error}); is torchvision missing?")
    cls = processor_class_without_video(getattr(transformers, name))
    return cls.from_pretrained(model, trust_remote_code=trust_remote_code, **kwargs)
