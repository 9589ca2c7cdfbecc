"""The transformers backend on tiny random models: text, every VLM kind with images, batching, sampling, LoRA."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from forecasters.backends import ImagePart, Request, SamplingParams, get_backend
from forecasters.backends.hf import HFConfig


def _frames(n: int, seed: int = 0) -> tuple[ImagePart, ...]:
    rng = np.random.default_rng(seed)
    return tuple(ImagePart(Image.fromarray((rng.random((120, 160, 3)) * 255).astype("uint8")), f"f{i}")
                 for i in range(n))


QUESTIONS = ["What will the red ball do next?", "What happens to the purple block right after this clip?",
             "Where does the cup end up?"]


@pytest.fixture(scope="module")
def text_backend(tiny):
    return get_backend("hf", HFConfig(model=str(tiny["qwen2"]), batch_size=2))


def test_text_model_generates_and_counts_tokens(text_backend):
    out = text_backend.generate([Request(f"q{i}", (q,), SamplingParams(max_tokens=8)) for i, q in enumerate(QUESTIONS)])
    assert [c.request_id for c in out] == ["q0", "q1", "q2"]
    for c in out:
        assert c.ok and len(c.texts) == 1 and c.prompt_tokens > 5 and 1 <= c.completion_tokens <= 8
    assert len({c.texts[0] for c in out}) == 3  # different prompts, different greedy outputs
    assert text_backend.engine_version.startswith("transformers ")


def test_batched_equals_one_by_one(text_backend, tiny):
    reqs = [Request(f"q{i}", (q,), SamplingParams(max_tokens=8)) for i, q in enumerate(QUESTIONS)]
    batched = [c.texts for c in text_backend.generate(reqs)]
    single = get_backend("hf", HFConfig(model=str(tiny["qwen2"]), batch_size=1))
    assert [c.texts for c in single.generate(reqs)] == batched  # left padding does not change greedy outputs


def test_multi_sample_is_seeded(text_backend):
    sp = SamplingParams(temperature=1.0, n=4, max_tokens=6, seed=7)
    a = text_backend.generate([Request("a", (QUESTIONS[0],), sp)])[0]
    b = text_backend.generate([Request("a", (QUESTIONS[0],), sp)])[0]
    assert len(a.texts) == 4 and a.texts == b.texts
    assert len(set(a.texts)) > 1  # temperature 1 on a random model: the samples differ


def test_images_to_a_text_model_are_a_recorded_failure(text_backend):
    out = text_backend.generate([Request("img", (*_frames(1), "what next?")), Request("txt", ("what next?",))])
    assert not out[0].ok and out[0].error_kind == "unsupported" and "text-only" in out[0].error
    assert out[1].ok


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava"])
def test_vlm_kinds_take_eight_frames(tiny, kind):
    b = get_backend("hf", HFConfig(model=str(tiny[kind]), batch_size=2))
    frames_a, frames_b = _frames(8, 0), _frames(8, 1)
    reqs = [Request("a", (*frames_a, QUESTIONS[0]), SamplingParams(max_tokens=6)),
            Request("b", (*frames_b, QUESTIONS[0]), SamplingParams(max_tokens=6)),
            Request("t", (QUESTIONS[0],), SamplingParams(max_tokens=6))]  # text-only prompt to a VLM
    out = b.generate(reqs)
    assert all(c.ok for c in out), [c.error for c in out]
    assert out[0].prompt_tokens > out[2].prompt_tokens + 8  # the frames became image tokens
    assert out[0].texts != out[1].texts or out[0].texts != out[2].texts  # the images reach the model


def test_lora_adapter_is_applied_unmerged(tiny, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny["qwen2"])
    peft_model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a strong random adapter: it must change the outputs
    peft_model.save_pretrained(tmp_path / "adapter")
    reqs = [Request(f"q{i}", (q,), SamplingParams(max_tokens=8)) for i, q in enumerate(QUESTIONS)]
    plain = [c.texts for c in get_backend("hf", HFConfig(model=str(tiny["qwen2"]))).generate(reqs)]
    adapted_backend = get_backend("hf", HFConfig(model=str(tiny["qwen2"]), adapter=str(tmp_path / "adapter")))
    assert type(adapted_backend.model).__name__.startswith("Peft")
    adapted = [c.texts for c in adapted_backend.generate(reqs)]
    assert adapted != plain


def _student_copy(tiny, tmp_path, preprocessing: dict):
    """The tiny Qwen3-VL copied with a distill.train ``psr_student.json`` (a fully fine-tuned student's layout)."""
    import json
    import shutil

    d = tmp_path / "student"
    shutil.copytree(tiny["qwen3_vl"], d)
    (d / "psr_student.json").write_text(json.dumps({"preprocessing": preprocessing}))
    return str(d)


def test_pixel_caps_reach_the_processor(tiny):
    """Frames of 160 x 120 pixels: the processor's own cap (112 x 112) would shrink them to 12 image tokens; with the
    run's cap passed on they keep the 20 tokens their size gives, as in training."""
    req = [Request("a", (*_frames(2), QUESTIONS[0]), SamplingParams(max_tokens=2))]
    plain = get_backend("hf", HFConfig(model=str(tiny["qwen3_vl"])))
    capped = get_backend("hf", HFConfig(model=str(tiny["qwen3_vl"]), max_pixels=336 * 336))
    n_plain = plain.image_tokens_per_frame(req, plain.encode_prompts(req, [plain.chat_prompt(req[0])]))
    n_capped = capped.image_tokens_per_frame(req, capped.encode_prompts(req, [capped.chat_prompt(req[0])]))
    assert n_plain == [12.0] and n_capped == [20.0]


def test_a_student_is_served_the_image_tokens_it_was_trained_on(tiny, tmp_path):
    from forecasters.backends.hf import PreprocessingMismatch

    req = [Request("a", (*_frames(2), QUESTIONS[0]), SamplingParams(max_tokens=2))]
    good = _student_copy(tiny, tmp_path / "good", {"max_pixels": 336 * 336, "image_tokens_per_frame": [20.0]})
    b = get_backend("hf", HFConfig(model=good))  # no cap given: the student's is taken
    assert b.generate(req)[0].ok
    bad = _student_copy(tiny, tmp_path / "bad", {"max_pixels": 336 * 336, "image_tokens_per_frame": [12.0]})
    b = get_backend("hf", HFConfig(model=bad))
    with pytest.raises(PreprocessingMismatch, match=r"\[20.0\] image tokens per frame, the student was trained on"):
        b.encode_prompts(req, [b.chat_prompt(req[0])])
    assert not b.generate(req)[0].ok  # the runner's path records the failure with the reason
    with pytest.raises(PreprocessingMismatch, match="max_pixels 12544 differs"):
        get_backend("hf", HFConfig(model=good, max_pixels=112 * 112))
