"""SFT datasets: TRL's vision-language format in Parquet (read by ``datasets.load_dataset`` and TRL's SFTTrainer),
CoT and answer-only over the same queries and prompts, the prompt equal to what the served student sees, the loss
mask on the assistant turn only."""

from __future__ import annotations

import pytest

from distill.sft import load_sft
from distill.train import CHATML_TRAINING_TEMPLATE, measure, training_chat_template


@pytest.fixture(scope="module")
def sets(sft_dir):
    return load_sft(sft_dir / "cot", "train"), load_sft(sft_dir / "answer", "train")


def test_trajectory_control_holds_the_labels_and_no_reasoning(sets, sft_dir, synth_bench):
    cot, _ = sets
    traj = load_sft(sft_dir / "trajectory", "train")
    assert traj["query_id"] == cot["query_id"]
    for a, t in zip(cot, traj, strict=True):
        assert a["messages"][0] == t["messages"][0]
        lines = t["messages"][1]["content"][0]["text"].splitlines()
        assert lines[0].startswith("Now: ") and lines[-1] == f"Answer: {synth_bench.query(t['query_id']).target_state}"
        assert all(ln.split(": ", 1)[0] in ("Now", "Then", "Also", "Answer") for ln in lines)


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


def test_sets_are_parquet_that_load_dataset_reads(sft_dir, synth_bench):
    import datasets

    import prompts
    from distill.sft import read_set_info
    from eval.io import read_json

    for variant in ("cot", "answer", "trajectory"):
        d = sft_dir / variant
        files = sorted(p.relative_to(d).as_posix() for p in d.rglob("*.parquet"))
        assert files == ["data/train-00000-of-00001.parquet", "data/validation-00000-of-00001.parquet"]
        dd = datasets.load_dataset(str(d))
        assert {k: len(v) for k, v in dd.items()} == {"train": 4, "validation": 2}
        assert all(synth_bench.query(q).split == "val" for q in dd["validation"]["query_id"])
        assert all(synth_bench.query(q).split == "train" for q in dd["train"]["query_id"])
        info = read_set_info(d)
        t = prompts.load("student_answer")
        assert info["preprocessing"] == {"student_input": "frames", "frames": 2, "max_pixels": 336 * 336,
                                         "prompt_id": t.id, "prompt_hash": t.hash}
        assert info["splits"] == {"train": 4, "validation": 2} and len(info["sha256"]) == 64
    assert read_json(sft_dir / "sft.summary.json")["examples"] == {"train": 4, "validation": 2}


def test_trl_sfttrainer_trains_a_step_on_the_set(tiny_vlm, sft_dir, tmp_path):
    """TRL's own path, nothing of ours but the processor loader: ``load_dataset`` -> ``SFTTrainer`` -> one step."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    from forecasters.backends.hf_loading import load_processor

    ds = datasets.load_dataset(str(sft_dir / "cot"))
    args = SFTConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=1, use_cpu=True, bf16=False,
                     report_to="none", logging_steps=1, save_strategy="no", gradient_checkpointing=False,
                     max_length=None)
    trainer = SFTTrainer(model=str(tiny_vlm), args=args, train_dataset=ds["train"], eval_dataset=ds["validation"],
                         processing_class=load_processor(str(tiny_vlm)))
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.state.log_history[0]["loss"] > 0
    assert trainer.evaluate()["eval_loss"] > 0


def test_foreign_output_dir_is_never_replaced(synth_dir, template_rationales, tmp_path):
    from distill.sft import SFTBuildConfig, build_sft
    from eval.errors import OutputRefused

    (tmp_path / "cot").mkdir()
    (tmp_path / "cot" / "mine.txt").write_text("keep me")
    with pytest.raises(OutputRefused, match="not written by"):
        build_sft(SFTBuildConfig(data=str(synth_dir), rationales=str(template_rationales), out=str(tmp_path),
                                 frames=1, limit=1, progress=False))
    assert (tmp_path / "cot" / "mine.txt").read_text() == "keep me"
    assert not (tmp_path / "answer").exists()
