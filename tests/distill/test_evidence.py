"""The perception-solved student track: the evidence block reads nothing after the prefix and nothing of the answer;
the closed slice; text-only SFT sets; a tiny config-built causal LM fully fine-tuned on them (behind the explicit
flag); a finished run is a no-op; a snapshot at step N is the student of a run stopped at N."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

EVIDENCE_PRESET = Path(__file__).resolve().parents[2] / "configs" / "distill" / "evidence-cpu.yaml"


@pytest.fixture(scope="module")
def index(synth_bench):
    from distill.evidence import EvidenceIndex

    return EvidenceIndex(synth_bench)


def _moving_query(bench, index):
    """A test query whose object has a simulator record (for perturbing the record)."""
    for q in bench.queries("test"):
        rec = index.oracle.sim(q.video_id)
        if rec is not None and q.object_id in [str(x) for x in rec.object_ids]:
            return q
    raise AssertionError("no query with a simulator record")


def test_block_has_every_field_in_order_and_no_digits(synth_bench, index):
    from distill.evidence import EVIDENCE_FIELDS

    for q in synth_bench.queries("test")[:40]:
        block = index.block(q)
        assert [ln.split(":", 1)[0] for ln in block.splitlines()] == list(EVIDENCE_FIELDS)
        assert not any(ch.isdigit() for ch in block), block


def test_block_reads_nothing_after_the_prefix(synth_bench, index):
    """Scrambling every frame of the record after the prefix's end, and the transcript and target after it, leaves
    the block as it was; changing the last prefix frame changes it (the check can fail)."""
    from distill.evidence import EvidenceIndex
    from distill.motion import frame_of

    q = _moving_query(synth_bench, index)
    before = index.block(q)
    rec = index.oracle.sim(q.video_id)
    f_end = frame_of(rec, q.prefix_end)
    rng = np.random.default_rng(0)
    arrays = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in dataclasses.asdict(rec).items()}
    for key in ("pos", "vel", "support", "touch", "held", "contacts", "angle"):
        a = arrays[key]
        a[f_end + 1:] = rng.permutation(a[f_end + 1:].reshape(-1)).reshape(a[f_end + 1:].shape)
    future = type(rec)(**arrays)
    other = EvidenceIndex(synth_bench)
    other.oracle._sims[q.video_id] = future
    later = [e for e in q.transcript if e.t <= q.prefix_end] + [dataclasses.replace(q.transcript[0],
                                                                                   t=q.prefix_end + 0.5,
                                                                                   state="something else")]
    q2 = dataclasses.replace(q, transcript=tuple(later), target_state="another state", target_time=q.target_time + 1)
    assert other.block(q2) == before
    arrays = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in dataclasses.asdict(rec).items()}
    arrays["vel"][max(0, f_end - 4):f_end + 1] = 300.0
    moved = EvidenceIndex(synth_bench)
    moved.oracle._sims[q.video_id] = type(rec)(**arrays)
    assert moved.block(q) != before


def test_evidence_request_is_text_with_the_block(synth_bench, index):
    from distill.evidence import evidence_template, student_request

    q = synth_bench.queries("test")[0]
    req = student_request(q, synth_bench, student_input="evidence", template=evidence_template(), index=index)
    assert not req.images and index.block(q) in req.text and q.question in req.text
    assert evidence_template().id == "student_evidence"


def test_closed_slice_takes_the_most_frequent_train_targets(synth_bench):
    from collections import Counter

    from distill.slice import closed_slice, in_slice

    sl = closed_slice(synth_bench, 5)
    counts = Counter(q.target_state for q in synth_bench.queries("train"))
    assert list(sl.counts) == sorted(counts.values(), reverse=True)[:5]
    assert sl.majority == sl.states[0] and counts[sl.majority] == max(counts.values())
    kept = in_slice(synth_bench.queries("test"), sl)
    assert kept and all(q.target_state in sl for q in kept)


@pytest.mark.slow
def test_predicates_top_states_keeps_the_slice_only(synth_dir, synth_bench, tmp_path):
    from distill.predicates import PredicatesConfig, write_predicates
    from distill.slice import closed_slice

    out = tmp_path / "p.jsonl"
    s = write_predicates(PredicatesConfig(data=str(synth_dir), out=str(out), top_states=4, progress=False))
    states = set(closed_slice(synth_bench, 4).states)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows and {r["answer"] for r in rows} <= states and s["slice"]["k"] == 4


@pytest.fixture(scope="module")
def evidence_sft(synth_dir, pred_file, template_rationales, tmp_path_factory):
    from distill.sft import SFTBuildConfig, build_sft

    out = tmp_path_factory.mktemp("evidence-sft")
    build_sft(SFTBuildConfig(data=str(synth_dir), rationales=str(template_rationales), out=str(out), limit=8,
                             eval_rationales=str(template_rationales), eval_limit=2, student_input="evidence",
                             progress=False))
    return out


@pytest.mark.slow
def test_evidence_sets_are_text_only(evidence_sft):
    from distill.sft import load_sft, read_set_info

    info = read_set_info(evidence_sft / "cot")
    assert info["preprocessing"]["student_input"] == "evidence" and info["preprocessing"]["frames"] is None
    ds = load_sft(evidence_sft / "cot", "train")
    assert "images" not in ds.column_names and len(ds) == 8
    user = ds[0]["messages"][0]["content"]
    assert [p["type"] for p in user] == ["text"] and "state now:" in user[0]["text"]


@pytest.fixture(scope="module")
def tiny_student(evidence_sft, tmp_path_factory):
    from distill.tiny_student import TinyStudentConfig, build_tiny_student

    out = tmp_path_factory.mktemp("tiny-student")
    summary = build_tiny_student(TinyStudentConfig(sft=str(evidence_sft), out=str(out), vocab_size=600))
    return out, summary


@pytest.mark.slow
def test_tiny_student_tokenizer_fits_the_set(tiny_student):
    _, s = tiny_student
    assert s["tokens_per_word"] < 2.0 and 0 < s["parameters"] < 2_000_000


def _args(model, dataset, out, *flags):
    from distill.train_args import parse_train_args

    return parse_train_args(["--config", str(EVIDENCE_PRESET), "--model_name_or_path", str(model),
                             "--dataset_name", str(dataset), "--output_dir", str(out),
                             "--per_device_train_batch_size", "2", "--effective_batch_size", "2",
                             *map(str, flags)])


def _weights(path: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def full_run(tiny_student, evidence_sft, tmp_path_factory):
    from distill.train import train

    out = tmp_path_factory.mktemp("full") / "cot"
    m = train(*_args(tiny_student[0], evidence_sft / "cot", out, "--max_steps", 3, "--snapshot_steps", 2))
    return out, m


@pytest.mark.slow
def test_full_finetune_trains_every_weight_of_the_causal_lm(full_run, tiny_student):
    out, m = full_run
    assert m["trainable"] == m["total"] and m["global_step"] == 3
    assert (out / "model" / "psr_student.json").is_file() and not (out / "adapter").exists()
    rec = json.loads((out / "model" / "psr_student.json").read_text())
    assert rec["full_finetune"] and rec["preprocessing"]["student_input"] == "evidence"
    before, after = _weights(tiny_student[0]), _weights(out / "model")
    assert any(not np.allclose(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_full_finetune_needs_its_flag_and_no_4bit(tiny_student, evidence_sft, tmp_path):
    from distill.train import train
    from eval.errors import InputError

    with pytest.raises(InputError, match="full_finetune"):
        train(*_args(tiny_student[0], evidence_sft / "cot", tmp_path / "a", "--full_finetune", "false",
                     "--max_steps", 1))
    with pytest.raises(InputError, match="load_in_4bit"):
        train(*_args(tiny_student[0], evidence_sft / "cot", tmp_path / "b", "--load_in_4bit", "true",
                     "--max_steps", 1))


@pytest.mark.slow
def test_a_finished_run_is_a_no_op(full_run, tiny_student, evidence_sft):
    from distill.train import train

    out, m = full_run
    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = train(*_args(tiny_student[0], evidence_sft / "cot", out, "--max_steps", 3, "--snapshot_steps", 2))
    assert again["skipped"] and again["global_step"] == 3
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamp


@pytest.mark.slow
def test_snapshot_is_the_student_of_a_run_stopped_there(full_run, tiny_student, evidence_sft, tmp_path):
    """Constant learning rate, no warmup, same seed: the step-2 snapshot of the 3-step run has the weights of a
    2-step run."""
    from distill.train import snapshot_dir, student_weights, train

    out, _ = full_run
    snap, full = student_weights(snapshot_dir(out, 2))
    assert full and json.loads((snap / "psr_student.json").read_text())["snapshot_step"] == 2
    train(*_args(tiny_student[0], evidence_sft / "cot", tmp_path / "two", "--max_steps", 2))
    a, b = _weights(snap), _weights(tmp_path / "two" / "model")
    assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], atol=1e-6) for k in a)
    c = _weights(out / "model")
    assert any(not np.allclose(a[k], c[k]) for k in a)  # step 3 moved on


@pytest.mark.slow
def test_a_rebuilt_base_model_is_another_config(tiny_student, tmp_path):
    import shutil

    from distill.train_args import model_fingerprint

    copy = tmp_path / "m"
    shutil.copytree(tiny_student[0], copy)
    fp = model_fingerprint(str(copy))
    cfg = json.loads((copy / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (copy / "config.json").write_text(json.dumps(cfg))
    assert model_fingerprint(str(copy)) != fp and model_fingerprint("Qwen/Qwen3-0.6B") is None


@pytest.mark.slow
def test_a_run_cut_after_its_last_checkpoint_trains_no_further_step(tiny_student, evidence_sft, tmp_path):
    """The final weights were never written but the checkpoint at max_steps was: the rerun takes that checkpoint's
    weights instead of resuming (resuming would train step max_steps + 1)."""
    import shutil

    from distill.train import train

    flags = ("--max_steps", 2, "--save_strategy", "steps", "--save_steps", 2)
    train(*_args(tiny_student[0], evidence_sft / "answer", tmp_path, *flags))
    shutil.rmtree(tmp_path / "model")
    m = train(*_args(tiny_student[0], evidence_sft / "answer", tmp_path, *flags))
    assert m["global_step"] == 2 and [s for s, _ in m["losses"]] == [1, 2]
    a, b = _weights(tmp_path / "model"), _weights(tmp_path / "checkpoints" / "checkpoint-2")
    assert all(np.array_equal(a[k], b[k]) for k in a)
