"""SFT datasets: TRL's vision-language format, CoT and answer-only over the same queries and prompts, the prompt equal
to what the served student sees, and the loss mask on the assistant turn only."""

from __future__ import annotations

import pytest

from distill.sft import load_sft
from distill.train import CHATML_TRAINING_TEMPLATE, measure, training_chat_template


@pytest.fixture(scope="module")
def sets(sft_dir):
    return load_sft(sft_dir / "cot"), load_sft(sft_dir / "answer")


def test_variants_share_queries_images_and_prompts(sets, synth_bench):
    cot, ans = sets
    assert len(cot) == len(ans) == 4
    assert cot["query_id"] == ans["query_id"]
    for a, b in zip(cot, ans, strict=True):
        assert len(a["images"]) == 2 and [im.size for im in a["images"]] == [im.size for im in b["images"]]
        assert a["messages"][0] == b["messages"][0]
        user = a["messages"][0]["content"]
        assert [p["type"] for p in user].count("image") == 2
        q = synth_bench.query(a["query_id"])
        cot_text = a["messages"][1]["content"][0]["text"]
        assert cot_text.splitlines()[-1] == f"Answer: {q.target_state}" and len(cot_text.split()) > 80
        assert b["messages"][1]["content"][0]["text"] == f"Answer: {q.target_state}"
        assert q.question in user[-1]["text"]


def test_prompt_matches_the_served_student(sets, synth_bench):
    """The user turn is the `student` forecaster's request: same template text, same frames (subsampled, last kept)."""
    import prompts
    from forecasters.backends import ImagePart, SamplingParams
    from forecasters.media import FrameCache
    from forecasters.registry import get_forecaster
    from forecasters.runner import render_request

    cot, _ = sets
    ex = cot[0]
    q = synth_bench.query(ex["query_id"])
    req = render_request(get_forecaster("student"), prompts.load("student_answer"), q, synth_bench,
                         FrameCache(synth_bench.root), sampling=SamplingParams(), n_frames=2)
    texts = [p for p in req.parts if isinstance(p, str)]
    assert [p["text"] for p in ex["messages"][0]["content"] if p["type"] == "text"] == texts
    served = [p.image for p in req.parts if isinstance(p, ImagePart)]
    assert [im.tobytes() for im in served] == [im.convert("RGB").tobytes() for im in ex["images"]]
    assert req.images[-1].source == q.prefix_frames[-1]


def test_training_template_renders_like_the_base_template(tiny_vlm, sets):
    from forecasters.backends.hf_loading import load_processor

    proc = load_processor(str(tiny_vlm))
    base = proc.chat_template
    assert training_chat_template(proc) == CHATML_TRAINING_TEMPLATE
    msgs = sets[0][0]["messages"]
    a = proc.apply_chat_template(msgs, tokenize=False)
    b = proc.apply_chat_template(msgs, tokenize=False, chat_template=CHATML_TRAINING_TEMPLATE)
    assert a == b and base == proc.chat_template


def test_loss_mask_covers_exactly_the_assistant_turn(tiny_vlm, sets):
    from trl.data_utils import prepare_multimodal_messages

    from forecasters.backends.hf_loading import load_processor

    proc = load_processor(str(tiny_vlm))
    proc.chat_template = training_chat_template(proc) or proc.chat_template
    for ds in sets:
        rep = measure(ds, proc, max_length=10_000)
        assert rep.overlong == [] and all(s > 0 for s in rep.supervised)
        ex = ds[0]
        out = proc.apply_chat_template(prepare_multimodal_messages(ex["messages"], images=ex["images"]),
                                       tokenize=True, return_dict=True, return_tensors="pt",
                                       return_assistant_tokens_mask=True, processor_kwargs={"add_special_tokens": False})
        ids = out["input_ids"][0][out["assistant_masks"][0].bool()]
        assert proc.tokenizer.decode(ids) == ex["messages"][1]["content"][0]["text"] + "<|im_end|>\n"
        image_pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        assert not (ids == image_pad).any()
        assert rep.lengths[0] == out["input_ids"].shape[-1]


def test_missing_rationales_is_a_clear_error(synth_dir, tmp_path):
    from distill.cli import main

    assert main(["sft", "--data", str(synth_dir), "--rationales", str(tmp_path / "none"),
                 "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o" / "cot").exists()
