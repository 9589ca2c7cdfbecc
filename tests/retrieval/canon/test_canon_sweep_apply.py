"""The threshold sweep and the re-keying of a benchmark (``canon sweep``, ``canon apply``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.io import read_jsonl
from eval.validate import validate
from retrieval.canon.apply import ApplyConfig, Canonical, apply_canonicalization, rekey
from retrieval.canon.sweep import SweepConfig, run_sweep
from retrieval.canon.vocab import from_benchmark
from retrieval.cli import app
from retrieval.encoders import PACKAGED_MINILM


def _quiet(*_a, **_k):
    return None


def test_sweep_on_the_synthetic_benchmark(synth_dir, text_encoder, tmp_path):
    out = tmp_path / "sweep"
    doc = run_sweep(SweepConfig(out=str(out), data=str(synth_dir), thresholds=[0.5, 0.85, 1.0], model=PACKAGED_MINILM),
                    progress=False, log=_quiet, encoder=text_encoder)
    vocab = doc["vocabulary"]
    rows = {r["threshold"]: r for r in doc["thresholds"]}
    assert rows[1.0]["clusters"] == vocab["phrases"] and rows[1.0]["purity"] == 1.0  # nothing reaches cosine 1
    assert rows[0.5]["clusters"] < rows[0.85]["clusters"] <= vocab["phrases"]
    assert rows[0.5]["inverse_purity"] > rows[1.0]["inverse_purity"]
    assert vocab["true_classes"] == len(set(Benchmark.load(synth_dir).corpus_ds["state_id"][:]))
    for f in ("sweep.md", "sweep.csv", "sweep.tex", "sweep.json", "config.json", "cluster_sizes.png"):
        assert (out / f).stat().st_size > 0
    v = from_benchmark(Benchmark.load(synth_dir))
    counts = dict(zip(v.phrases, v.counts.tolist(), strict=True))
    clusters = read_jsonl(out / "clusters_t0.50.jsonl")
    assert len(clusters) == rows[0.5]["clusters"]
    assert sorted(p for c in clusters for p in c["phrases"]) == sorted(counts)
    for c in clusters:  # the seed (the state's text) is the most frequent phrasing, visited first
        assert c["text"] == c["phrases"][0] and counts[c["text"]] == max(counts[p] for p in c["phrases"])
    sizes = np.bincount([len(c["phrases"]) for c in clusters])
    assert {int(k): int(v) for k, v in enumerate(sizes) if v} == {int(k): v for k, v in rows[0.5]["size_histogram"].items()}


def test_sweep_cli_on_a_phrase_list(tmp_path, tiny_st_model):
    (tmp_path / "p.tsv").write_text("falling\t5\ta\nfalling down\t3\ta\nrolling across the table\t2\tb\n")
    r = CliRunner().invoke(app, ["canon", "sweep", "--phrases", str(tmp_path / "p.tsv"), "--out", str(tmp_path / "o"),
                                 "--thresholds", "0.01,1.0", "--model", str(tiny_st_model)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert doc["config"]["model"] == str(tiny_st_model) and doc["vocabulary"]["true_classes"] == 2
    assert [t["clusters"] for t in doc["thresholds"]] == [1, 3]  # the random model puts every pair far above 0.01
    assert [t["ari"] for t in doc["thresholds"]] == [0.0, 0.0] and doc["thresholds"][0]["purity"] == pytest.approx(2 / 3)
    from cli_run import run_cli  # python -m retrieval's entry point: one error line, exit code 2

    r = run_cli("retrieval", "canon", "sweep", "--out", tmp_path / "o2")
    assert r.code == 2 and "exactly one of --data" in r.err


def _truth_canonical(bench) -> tuple:
    vocab = from_benchmark(bench)
    sidx = bench.state_index
    texts = bench.states_ds["text"][:]
    members = [list(m) for m in bench.states_ds["members"][:]]
    grid = np.eye(len(texts), 8, dtype=np.float32) + 0.01  # only the bge_similar tier depends on it
    return vocab, Canonical(list(texts), members, grid, np.array([sidx[t] for t in vocab.truth]))


def test_rekeying_with_the_true_synonym_sets_reproduces_the_pools(synth_bench):
    vocab, canon = _truth_canonical(synth_bench)
    out = rekey(synth_bench, vocab, canon, None, ApplyConfig(data="", out="", threshold=0.85))
    assert out["stats"]["targets_by_text"] == 0 and out["stats"]["transcript_by_text"] == 0
    for old, new in zip(synth_bench.queries(), out["queries"], strict=True):
        assert new["target_state"] == old.target_state
        for tier in ("in_video", "in_dataset", "cross_dataset", "consensus"):
            assert set(new["gt_pools"][tier]) == set(old.gt_pools.tier(tier)), (old.id, tier)
        assert set(new["gt_type1"]) == set(old.gt_type1) and new["fair"] == old.fair
        assert [e["state"] for e in new["transcript"]] == [e.state for e in old.transcript]
    assert [s["n_segments"] for s in out["states"]] == synth_bench.states_ds["n_segments"][:]


def test_apply_writes_a_valid_rekeyed_benchmark(synth_dir, text_encoder, tmp_path):
    out = tmp_path / "canon"
    cfg = ApplyConfig(data=str(synth_dir), out=str(out), threshold=0.85, model=PACKAGED_MINILM)
    apply_canonicalization(cfg, progress=False, log=_quiet, encoder=text_encoder)
    rep = validate(out)
    assert rep.ok, [str(p) for p in rep.errors[:5]]
    b = Benchmark.load(out)
    info = b.manifest.extra["canonicalization"]
    assert b.manifest.name == "psr-synth+canon0.85" and info["canonical_states"] == len(b.state_ids)
    phrase_state = {r["phrase"]: r["state_id"] for r in read_jsonl(out / "phrase_map.jsonl")}
    segs = b.segments()
    assert all(phrase_state[s.raw or s.state] == s.state_id for s in segs)
    by_key = {(s.video_id, s.object_id, s.start): s for s in segs}
    for q in b.queries():
        assert by_key[(q.video_id, q.object_id, q.target_time)].state_id == q.target_state_id
        state_of = {s.id: s.state_id for s in segs if s.id in q.gt_pools.main}
        assert set(state_of.values()) <= {q.target_state_id}
    states = {s.id: s for s in b.states()}
    assert all(states[s.state_id].text == s.state for s in segs)
    assert (out / "frames").is_symlink() and (out / "features" / "pixels" / "corpus.npy").exists()
    # a second run replaces its own output; a foreign directory is refused
    apply_canonicalization(cfg, progress=False, log=_quiet, encoder=text_encoder)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        apply_canonicalization(ApplyConfig(data=str(synth_dir), out=str(tmp_path / "foreign"), model=PACKAGED_MINILM),
                               progress=False, log=_quiet, encoder=text_encoder)
    assert (tmp_path / "foreign" / "keep.txt").exists()
    from cli_run import run_cli

    r = run_cli("retrieval", "canon", "apply", "--data", synth_dir, "--out", synth_dir, "--overwrite")
    assert r.code == 2 and "is an input of this job" in r.err
