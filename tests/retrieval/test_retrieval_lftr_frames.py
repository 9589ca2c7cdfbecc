"""LFTR's prefix frame selection (``frames``: all | last | K | spaced:K), the last-frame-only ablation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from eval.benchmark import Benchmark


def _cfg(**kw):
    from retrieval.lftr.config import LFTRConfig

    base = dict(target_space="pixels", prefix_space="pixels", d_model=32, n_layers=1, n_heads=2, n_samples=4,
                epochs=1, batch_size=64, lr=1e-3, n_random_negatives=64, n_hard_negatives=16, threads=1)
    return LFTRConfig(**{**base, **kw})


def test_frames_config_yaml_cli_round_trip_and_errors(tmp_path):
    from retrieval.lftr.config import LFTRConfig, load_config

    assert LFTRConfig().frames == "all" and LFTRConfig().frame_index == tuple(range(8))
    p = tmp_path / "c.yaml"
    p.write_text("frames: 3\n")  # a YAML integer K: the K last frames
    cfg = load_config([p])
    assert (cfg.frames, cfg.frame_index) == ("last:3", (5, 6, 7))
    cfg.save(tmp_path / "saved.yaml")
    assert LFTRConfig.from_yaml(tmp_path / "saved.yaml") == cfg
    assert yaml.safe_load((tmp_path / "saved.yaml").read_text())["frames"] == "last:3"
    assert load_config([p], ["frames=last"]).frame_index == (7,)  # --set beats the file
    assert load_config([p], frames="spaced:3").frame_index == (0, 4, 7)  # --frames: K evenly spaced, last kept
    assert load_config([], ["frames=all"]).frames == "all"
    for bad in ("first", "0", "spaced:0", "last:-1", "", True, 2.5):
        with pytest.raises(ValueError, match="frames must be"):
            LFTRConfig(frames=bad)
    p.write_text("frames: none\n")
    with pytest.raises(ValueError, match=r"c.yaml: frames must be all, last, K"):
        load_config([p])
    # runs with different frames are different trainings; the default keeps the hash it had without the key
    hashes = {f: _cfg(frames=f).training_hash() for f in ("all", "last", "3", "spaced:3")}
    assert len(set(hashes.values())) == 4
    assert _cfg(frames="last").training_hash() == _cfg(frames="last:1").training_hash()


def _context(model, prefix, prep, rows):
    d = prep.data
    q = torch.from_numpy(d.question[rows]) if d.question is not None else None
    with torch.no_grad():
        return model.context(prefix, torch.from_numpy(d.qtype[rows]), torch.from_numpy(d.horizon[rows]), q)


@pytest.mark.parametrize(("frames", "read"), [("all", range(8)), ("last", [7]), ("3", [5, 6, 7])])
def test_frames_select_the_prefix_tokens_the_head_reads(synth_sem_dir, tmp_path, frames, read):
    """The tokens entering the head are exactly the selected frames' features; changing any other frame's
    features changes nothing, changing a selected one changes the context."""
    from retrieval.lftr.train import build_model, prepare

    bench = Benchmark.load(synth_sem_dir)
    cfg = _cfg(frames=frames, question_space="minilm")
    prep = prepare(bench, cfg, tmp_path, "cpu")
    torch.manual_seed(0)
    model = build_model(cfg, prep.dims).eval()
    rows = prep.data.rows("test")[:6]
    prefix = torch.from_numpy(prep.data.prefix[prep.data.prefix_row[rows]].copy())  # (6, 8, d_in)
    seen = []
    handle = model.in_proj.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    base = _context(model, prefix, prep, rows)
    handle.remove()
    assert torch.equal(seen[0], prefix[:, list(read)])
    noise = torch.randn_like(prefix[:, 0])
    for f in range(8):
        moved = prefix.clone()
        moved[:, f] += noise
        changed = not torch.allclose(_context(model, moved, prep, rows), base, atol=1e-6)
        assert changed == (f in read), (frames, f)


def test_last_frame_training_records_frames_and_refuses_other_frames(synth_sem_dir, tmp_path):
    """`retrieval lftr train --frames last` then `lftr predict`: the checkpoint, its config.yaml and the run's
    config record the selection; an 8-frame training into the same folder is refused (different training)."""
    from cli_run import run_cli

    from eval.runs import read_run

    ck, run = tmp_path / "ck", tmp_path / "run.parquet"
    common = ["--data", synth_sem_dir, "--space", "pixels", "--prefix-space", "pixels", "--out", ck]
    sets = [x for kv in ("d_model=32", "n_layers=1", "n_heads=2", "n_samples=4", "epochs=1", "threads=1",
                         "n_random_negatives=64", "n_hard_negatives=16") for x in ("--set", kv)]
    r = run_cli("retrieval", "lftr", "train", *common, "--frames", "last", *sets)
    assert r.code == 0, r.text
    assert yaml.safe_load((ck / "config.yaml").read_text())["frames"] == "last:1"
    assert torch.load(ck / "best.pt", weights_only=False)["config"]["frames"] == "last:1"
    r = run_cli("retrieval", "lftr", "predict", "--data", synth_sem_dir, "--ckpt", ck, "--out", run)
    assert r.code == 0, r.text
    assert read_run(run).config["frames"] == "last:1"
    r = run_cli("retrieval", "lftr", "train", *common, *sets)  # frames: all
    assert r.code != 0 and "different training config" in r.text
    r = run_cli("retrieval", "lftr", "train", *common, "--frames", "first", *sets)
    assert r.code == 2 and "frames must be all, last, K" in r.text


@pytest.mark.slow
def test_demo_reports_eight_against_one_prefix_frame(synth_demo):
    full, last = synth_demo["lftr-pixels"], synth_demo["lftr-pixels-last"]
    assert (full.config["frames"], last.config["frames"]) == ("all", "last:1")
    assert "last frame" in last.method and last.method != full.method
    assert full.query_ids == last.query_ids
    assert not np.array_equal(full.topk_scores, last.topk_scores)
