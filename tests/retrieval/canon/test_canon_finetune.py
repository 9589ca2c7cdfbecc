"""The paraphrase-robust encoder fine-tune: state hold-out, training pairs, and that training pulls members onto their
canonical state (a tiny random sentence-transformers model, real trainer and losses)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.io import read_json, read_jsonl
from retrieval.canon.finetune import holdout_draw, matryoshka_dims, split_states, training_pairs
from retrieval.cli import app


def test_holdout_split_and_pairs(synth_bench):
    seen, held = split_states(synth_bench, "train", 0.3, seed=0)
    assert set(seen) | set(held) == set(synth_bench.state_ids) and not set(seen) & set(held)
    assert all(holdout_draw(s, 0) >= 0.3 for s in seen)
    assert split_states(synth_bench, "train", 0.3, seed=0) == (seen, held)  # deterministic
    assert split_states(synth_bench, "train", 0.3, seed=1) != (seen, held)
    seen0, held0 = split_states(synth_bench, "train", 0.0)
    train_videos = {q.video_id for q in synth_bench.queries("train")}
    train_states = {s.state_id for s in synth_bench.segments() if s.video_id in train_videos}
    assert set(seen0) == train_states and set(held0) == set(synth_bench.state_ids) - train_states
    pairs = training_pairs(synth_bench, seen, "train")
    text_of = {s: t for s, t in zip(synth_bench.state_ids, synth_bench.states_ds["text"][:], strict=True)}
    seen_texts = {text_of[s] for s in seen}
    members = {t: set(m) for t, m in zip(synth_bench.states_ds["text"][:], synth_bench.states_ds["members"][:],
                                         strict=True)}
    raw_train = {s.raw for s in synth_bench.segments() if s.video_id in train_videos}
    assert pairs and len(set(pairs)) == len(pairs)
    for a, p in pairs:
        assert p in seen_texts and a in members[p] and a != p and a in raw_train


def test_matryoshka_dims():
    assert matryoshka_dims(384) == [384, 256, 128, 64]
    assert matryoshka_dims(4096) == [4096, 2048, 1024, 512, 256, 128, 64]  # DynaPix: seven widths
    assert matryoshka_dims(128) == [128, 64]
    assert matryoshka_dims(384, [64, 384, 128]) == [384, 128, 64]


@pytest.mark.slow
def test_finetune_pulls_members_onto_their_state(synth_dir, tiny_st_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    def retrieval(model_dir, pairs):
        """Per pair: does the member retrieve its own state among all positives, and its margin over the best
        other state."""
        m = SentenceTransformer(str(model_dir), device="cpu")
        positives = sorted({y for _, y in pairs})
        a = m.encode([x for x, _ in pairs], normalize_embeddings=True)
        sims = a @ m.encode(positives, normalize_embeddings=True).T
        own = np.array([positives.index(y) for _, y in pairs])
        own_sim = sims[np.arange(len(pairs)), own]
        sims[np.arange(len(pairs)), own] = -np.inf
        return own_sim > sims.max(1), own_sim - sims.max(1)

    out = tmp_path / "ft"
    r = CliRunner().invoke(app, ["canon", "finetune", "--data", str(synth_dir), "--out", str(out), "--base-model",
                                 str(tiny_st_model), "--epochs", "6", "--batch-size", "16", "--mini-batch-size", "8",
                                 "--lr", "1e-3", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    hold = read_json(out / "holdout.json")
    pairs = [(d["anchor"], d["positive"]) for d in read_jsonl(out / "pairs.jsonl")]
    log = read_json(out / "train_log.json")
    assert log["matryoshka_dims"] == [128, 64] and log["pairs"] == len(pairs) and len(log["losses"]) >= 6
    assert log["loss"] == "CachedMultipleNegativesRankingLoss"  # --mini-batch-size 8 splits the batch of 16
    assert set(hold["train_states"]) and set(hold["heldout_states"])
    hit0, margin0 = retrieval(tiny_st_model, pairs)
    hit1, margin1 = retrieval(out / "model", pairs)
    assert hit1.mean() > hit0.mean() + 0.2  # members now retrieve their own canonical state
    assert margin1.mean() > margin0.mean()
    assert np.mean([x["loss"] for x in log["losses"][-3:]]) < np.mean([x["loss"] for x in log["losses"][:3]])


@pytest.mark.slow
def test_finetune_report_to_tensorboard_logs_the_training_loss(synth_dir, tiny_st_model, tmp_path):
    """--report-to goes to sentence-transformers' training arguments; transformers' TensorBoard logs land in
    OUT/runs/ and hold the losses of train_log.json."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "ft"
    r = CliRunner().invoke(app, ["canon", "finetune", "--data", str(synth_dir), "--out", str(out), "--base-model",
                                 str(tiny_st_model), "--epochs", "1", "--batch-size", "16",
                                 "--device", "cpu", "--report-to", "tensorboard"])
    assert r.exit_code == 0, r.output
    assert read_json(out / "finetune_config.json")["report_to"] == "tensorboard"
    assert read_json(out / "train_log.json")["loss"] == "MultipleNegativesRankingLoss"  # no cache by default
    (run_dir,) = (out / "runs").iterdir()  # runs/<date>_<host>/, as transformers names it
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    logged = acc.Scalars("train/loss")
    losses = read_json(out / "train_log.json")["losses"]
    assert len(losses) >= 2 and [e.step for e in logged] == [x["step"] for x in losses]
    assert [e.value for e in logged] == pytest.approx([x["loss"] for x in losses], rel=1e-6)
    assert not (out / "trainer").exists()


def test_gradient_cache_only_when_the_chunk_splits_the_batch():
    from retrieval.canon.finetune import FinetuneConfig, uses_gradient_cache

    assert not uses_gradient_cache(FinetuneConfig(data="d", out="o"))  # default: no cache
    assert uses_gradient_cache(FinetuneConfig(data="d", out="o", batch_size=64, mini_batch_size=16))
    assert not uses_gradient_cache(FinetuneConfig(data="d", out="o", batch_size=64, mini_batch_size=64))


def test_finetune_refuses_a_tracker_that_is_not_installed(tmp_path, monkeypatch):
    import sys

    from retrieval.canon.finetune import FinetuneConfig, finetune

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="wandb is not installed .pip install wandb"):
        finetune(FinetuneConfig(data=str(tmp_path / "none"), out=str(tmp_path / "ft"), report_to="wandb"))
    assert not (tmp_path / "ft").exists()
