"""LFTR on a share of the training videos (``train_fraction``) and the learning curve of the perfect-perception
head (`scripts/ceiling_curve.py`) on the session's synthetic benchmark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eval.benchmark import Benchmark

REPO = Path(__file__).resolve().parents[2]


def test_fraction_videos_are_nested_the_same_for_every_call_and_never_empty():
    from retrieval.lftr.train import fraction_videos

    videos = [f"v{i:03d}" for i in range(40)] * 3  # repeated ids count once
    shares = [fraction_videos(videos, f) for f in (0.1, 0.25, 0.5, 1.0)]
    assert [len(s) for s in shares] == [4, 10, 20, 40]
    assert all(a < b for a, b in zip(shares, shares[1:], strict=False))  # nested
    assert fraction_videos(list(reversed(videos)), 0.25) == shares[1]  # the order of the input does not matter
    assert len(fraction_videos(videos, 0.001)) == 1


def test_train_fraction_is_checked_and_keeps_the_hash_of_configs_without_it():
    from retrieval.lftr.config import LFTRConfig

    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="train_fraction"):
            LFTRConfig(train_fraction=bad)
    assert LFTRConfig(train_fraction=1.0).training_hash() == LFTRConfig().training_hash()
    assert LFTRConfig(train_fraction=0.5).training_hash() != LFTRConfig().training_hash()


def test_a_head_trains_on_the_queries_of_its_share_of_the_training_videos(synth_sem_dir, tmp_path):
    from retrieval.lftr.config import LFTRConfig
    from retrieval.lftr.predict import validation_recall
    from retrieval.lftr.train import fraction_videos, train

    bench = Benchmark.load(synth_sem_dir)
    cfg = dict(target_space="minilm", prefix_space="pixels", d_model=32, n_layers=1, n_heads=2, n_samples=4,
               epochs=1, batch_size=64, n_random_negatives=32, n_hard_negatives=8, threads=1)
    seen = {}
    for f in (0.5, 1.0):
        out = tmp_path / f"f{f}"
        train(bench, LFTRConfig(**cfg, train_fraction=f), out, validate=validation_recall, progress=False,
              log=lambda s: None)
        seen[f] = json.loads((out / "train_info.json").read_text())
    q = bench.queries_ds
    fair_train = [v for v, s, fair in zip(q["video_id"][:], q["split"][:], q["fair"][:], strict=True)
                  if s == "train" and fair]
    half = fraction_videos(fair_train, 0.5)
    assert seen[1.0]["train_videos"] == len(set(fair_train))
    assert seen[0.5]["train_videos"] == len(half) < seen[1.0]["train_videos"]
    assert 0 < seen[0.5]["train_queries"] < seen[1.0]["train_queries"]
    assert seen[0.5]["val_queries"] == seen[1.0]["val_queries"]  # validation is never subsampled


@pytest.mark.slow
def test_the_curve_script_trains_each_share_scores_them_and_resumes(synth_dir, synth_sem_dir, tmp_path):
    data = tmp_path / "bench"
    shutil.copytree(synth_dir, data, symlinks=True, ignore=shutil.ignore_patterns("frames", ".cache"))
    (data / "features" / "minilm").symlink_to(synth_sem_dir / "features" / "minilm", target_is_directory=True)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("d_model: 32\nn_layers: 1\nn_heads: 2\nn_samples: 4\nepochs: 1\nbatch_size: 64\n"
                   "n_random_negatives: 32\nn_hard_negatives: 8\nthreads: 1\n")
    out, doc = tmp_path / "curve", tmp_path / "curve-doc.md"
    cmd = [sys.executable, "scripts/ceiling_curve.py", "--data", str(data), "--out", str(out), "--fractions",
           "0.5,1", "--config", str(cfg), "--doc", str(doc)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    got = json.loads((out / "curve.json").read_text())
    rows = {r["fraction"]: r for r in got["rows"]}
    assert set(rows) == {0.5, 1.0}
    assert rows[0.5]["train_queries"] < rows[1.0]["train_queries"]
    assert rows[0.5]["epochs"] == 2 and rows[1.0]["epochs"] == 1  # the same optimizer steps
    report = json.loads((out / "report" / "report.json").read_text())
    for r in rows.values():
        name = f"lftr-sim[minilm] train {r['fraction']:g} seed 0"
        assert r["r5_mean"] == pytest.approx(100 * report["runs"][name]["main"]["R@5"])
        assert r["share_of_oracle"] == pytest.approx(r["r5_mean"] / got["oracle_r5"])
        # the state classifier beside each head, on the same share
        cname = f"state-classifier-sim[minilm] train {r['fraction']:g} seed 0"
        assert r["classifier_r5_mean"] == pytest.approx(100 * report["runs"][cname]["main"]["R@5"])
    assert 0 < rows[0.5]["classifier_train_queries"] < rows[1.0]["classifier_train_queries"]
    assert "state classifier R@5" in doc.read_text()
    assert np.isfinite(got["slope_per_doubling"])
    assert doc.read_text() == (out / "curve.md").read_text() and "ceiling_curve.py" in doc.read_text()
    runs = sorted((out / "runs").glob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in runs]
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in runs] == stamps  # nothing retrained or rescored
    other = tmp_path / "other.yaml"
    other.write_text(cfg.read_text().replace("d_model: 32", "d_model: 16"))
    stale = subprocess.run([*cmd[:cmd.index("--config") + 1], str(other)], cwd=REPO, capture_output=True,
                           text=True, env=env)
    assert stale.returncode != 0 and "different training config" in stale.stderr, stale.stderr[-2000:]
    assert [p.stat().st_mtime_ns for p in runs] == stamps  # another config never reuses these heads' runs


def test_the_curve_script_names_a_missing_space(synth_sem_dir, tmp_path):
    res = subprocess.run([sys.executable, "scripts/ceiling_curve.py", "--data", str(synth_sem_dir), "--out",
                          str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True)
    assert res.returncode != 0 and "features/sim/meta.json is missing" in res.stderr
    assert not (tmp_path / "o").exists()
