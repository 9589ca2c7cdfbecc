"""The threshold sweep and the re-keying of a benchmark (``canon sweep``, ``canon apply``)."""

from __future__ import annotations

import json
import re

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


def _flat(text: str) -> str:
    """Text without whitespace and the frame of rich's error panel (which wraps long messages anywhere)."""
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


@pytest.mark.slow
def test_sweep_on_the_synthetic_benchmark(synth_dir, text_encoder, tmp_path):
    out = tmp_path / "sweep"
    doc = run_sweep(SweepConfig(out=str(out), data=str(synth_dir), thresholds=[0.5, 0.85, 1.0], model=PACKAGED_MINILM),
                    progress=False, log=_quiet, encoder=text_encoder)
    vocab = doc["vocabulary"]
    rows = {r["threshold"]: r for r in doc["thresholds"]}
    assert rows[1.0]["clusters"] == vocab["phrases"] and rows[1.0]["purity"] == 1.0  # nothing reaches cosine 1
    assert rows[0.5]["clusters"] < rows[0.85]["clusters"] <= vocab["phrases"]
    assert rows[0.5]["inverse_purity"] > rows[1.0]["inverse_purity"]
    v = from_benchmark(Benchmark.load(synth_dir))
    assert vocab["true_classes"] == len(set(v.truth))
    # scored against the simulator's true states, not against the canonical states this very clustering made
    assert rows[0.85]["purity"] < 1.0 and rows[0.85]["ari"] < 1.0
    for f in ("sweep.md", "sweep.csv", "sweep.tex", "sweep.json", "config.json", "cluster_sizes.png"):
        assert (out / f).stat().st_size > 0
    counts = dict(zip(v.phrases, v.counts.tolist(), strict=True))
    clusters = read_jsonl(out / "clusters_t0.50.jsonl")
    assert len(clusters) == rows[0.5]["clusters"]
    assert sorted(p for c in clusters for p in c["phrases"]) == sorted(counts)
    for c in clusters:  # the seed (the state's text) is the most frequent phrasing, visited first
        assert c["text"] == c["phrases"][0] and counts[c["text"]] == max(counts[p] for p in c["phrases"])
    sizes = np.bincount([len(c["phrases"]) for c in clusters])
    assert {int(k): int(v) for k, v in enumerate(sizes) if v} == {int(k): v for k, v in rows[0.5]["size_histogram"].items()}
    # the per-phrase map: every phrase once, in first-seen order, with its state, seed and cosine to the seed
    per_phrase = read_jsonl(out / "phrases_t0.50.jsonl")
    assert [r["phrase"] for r in per_phrase] == v.phrases
    state_of = {p: c["id"] for c in clusters for p in c["phrases"]}
    text_of = {c["id"]: c["text"] for c in clusters}
    for r in per_phrase:
        assert r["state_id"] == state_of[r["phrase"]] and r["seed"] == text_of[r["state_id"]]
        assert r["count"] == counts[r["phrase"]] and r["similarity"] >= 0.5 and "query_ids" not in r
        assert r["label"] == v.truth[v.index[r["phrase"]]]
    assert all(r["similarity"] == pytest.approx(1, abs=1e-5) for r in per_phrase if r["phrase"] == r["seed"])


def test_sweep_cli_on_a_phrase_list(tmp_path, tiny_st_model):
    (tmp_path / "p.tsv").write_text("phrase\tcount\tlabel\nfalling\t5\ta\nfalling down\t3\ta\n"
                                    "rolling across the table\t2\tb\n")
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


def test_close_thresholds_get_their_own_files_and_repeats_are_refused(tmp_path, tiny_st_model):
    (tmp_path / "p.txt").write_text("falling\nfalling down\nrolling across the table\n")
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["canon", "sweep", "--phrases", str(tmp_path / "p.txt"), "--out", str(out),
                                 "--thresholds", "0.85,0.854,0.8", "--model", str(tiny_st_model)])
    assert r.exit_code == 0, r.output
    for label in ("0.85", "0.854", "0.80"):
        assert (out / f"clusters_t{label}.jsonl").exists() and (out / f"phrases_t{label}.jsonl").exists()
    assert len(list(out.glob("clusters_t*.jsonl"))) == 3
    md = (out / "sweep.md").read_text()
    assert "| 0.85 |" in md and "| 0.854 |" in md and "| 0.80 |" in md
    # the same threshold twice (in any spelling) is refused before anything is written
    r = CliRunner().invoke(app, ["canon", "sweep", "--phrases", str(tmp_path / "p.txt"), "--out", str(tmp_path / "o2"),
                                 "--thresholds", "0.85,0.850", "--model", str(tiny_st_model)])
    assert r.exit_code != 0 and "given twice" in r.output and not (tmp_path / "o2").exists()


def test_the_tie_rule_through_the_cli(tmp_path, text_encoder):
    # two synonyms of equal count: the first in the file seeds the state by default, the first by text with --ties text
    (tmp_path / "p.csv").write_text("phrase,count\nfalling down,2\nfalling,2\nrolling away,1\n")
    seeds = {}
    for ties in ("first", "text"):
        out = tmp_path / ties
        args = ["canon", "sweep", "--phrases", str(tmp_path / "p.csv"), "--out", str(out), "--thresholds", "0.5",
                "--model", PACKAGED_MINILM] + (["--ties", ties] if ties == "text" else [])
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        rows = {x["phrase"]: x for x in read_jsonl(out / "phrases_t0.50.jsonl")}
        assert rows["falling"]["state_id"] == rows["falling down"]["state_id"]  # synonyms at cosine >= 0.5
        seeds[ties] = rows["falling"]["seed"]
        assert json.loads((out / "sweep.json").read_text())["config"]["ties"] == ties
    assert seeds == {"first": "falling down", "text": "falling"}
    r = CliRunner().invoke(app, ["canon", "sweep", "--phrases", str(tmp_path / "p.csv"), "--out", str(tmp_path / "x"),
                                 "--ties", "random"])
    assert r.exit_code != 0 and "--ties" in r.output


def test_sweep_refuses_bad_inputs_with_one_clear_message(tmp_path):
    cases = [(["--phrases", str(tmp_path / "missing.txt")], "does not exist"),
             (["--phrases", str(tmp_path)], "is a directory"),
             (["--data", str(tmp_path / "nobench")], "does not exist")]
    (tmp_path / "p.xlsx").write_text("x")
    cases.append((["--phrases", str(tmp_path / "p.xlsx")], "unknown suffix"))
    (tmp_path / "big.tsv").write_text(f"phrase\tcount\nfalling\t{2**63}\n")
    cases.append((["--phrases", str(tmp_path / "big.tsv")], "big.tsv:2 field 'count'"))
    (tmp_path / "empty.txt").write_text("")
    cases.append((["--phrases", str(tmp_path / "empty.txt")], "holds no phrases"))
    for args, msg in cases:
        r = CliRunner().invoke(app, ["canon", "sweep", "--out", str(tmp_path / "o"), *args])
        assert r.exit_code == 2 and _flat(msg) in _flat(r.output), (args, r.output)
        assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    assert not (tmp_path / "o").exists()


def _truth_canonical(bench) -> tuple:
    vocab = from_benchmark(bench, truth="state_id")
    sidx = bench.state_index
    texts = bench.states_ds["text"][:]
    members = [list(m) for m in bench.states_ds["members"][:]]
    grid = np.eye(len(texts), 8, dtype=np.float32) + 0.01  # only the bge_similar tier depends on it
    return vocab, Canonical(list(texts), members, grid, np.array([sidx[t] for t in vocab.truth]))


def test_rekeying_with_the_true_synonym_sets_reproduces_the_pools(synth_bench):
    """Re-keyed to its own canonical states (each raw phrase in exactly one), without a mining budget, every query
    keeps its target and transcript, and its tiers become every segment of the target state (the tier definitions),
    which contain the source's mined-and-verified pools."""
    vocab, canon = _truth_canonical(synth_bench)
    out = rekey(synth_bench, vocab, canon, None, ApplyConfig(data="", out="", threshold=0.85))
    assert out["stats"]["targets_by_text"] == 0 and out["stats"]["transcript_by_text"] == 0
    segs = {s.id: s for s in synth_bench.segments()}
    by_state: dict[str, list[str]] = {}
    for s in segs.values():
        by_state.setdefault(s.state_id, []).append(s.id)
    for old, new in zip(synth_bench.queries(), out["queries"], strict=True):
        assert new["target_state"] == old.target_state
        same = by_state[old.target_state_id]
        for tier in ("in_dataset", "cross_dataset"):
            assert set(new["gt_pools"][tier]) >= set(old.gt_pools.tier(tier)), (old.id, tier)
        assert sorted(new["gt_pools"]["in_video"] + new["gt_pools"]["in_dataset"] + new["gt_pools"]["cross_dataset"]) \
            == sorted(same)
        assert [e["state"] for e in new["transcript"]] == [e.state for e in old.transcript]
    assert [s["n_segments"] for s in out["states"]] == synth_bench.states_ds["n_segments"][:]


@pytest.mark.slow
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
    from eval.segments import SegmentTimeline

    timeline = SegmentTimeline.of(b)  # the target is the segment holding the target time
    for q in b.queries():
        assert segs[timeline.active(q.video_id, q.object_id, q.target_time)].state_id == q.target_state_id
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


@pytest.mark.slow
def test_canonicalizing_a_canonicalized_benchmark_again_reads_its_phrases_embeddings(synth_copy, text_encoder,
                                                                                     tmp_path, monkeypatch):
    """`canon apply` keeps the grid embeddings of its vocabulary in its source's cache and its output's, as
    `make demo`'s probes canonicalize the benchmark the build canonicalized: the same phrases are embedded once."""
    import retrieval.canon.grid as grid

    calls = []
    real = grid.grid_embeddings
    monkeypatch.setattr(grid, "grid_embeddings", lambda enc, texts, **kw: calls.append(len(texts)) or
                        real(enc, texts, **kw))

    def apply(src, name):
        cfg = ApplyConfig(data=str(src), out=str(tmp_path / name), threshold=0.85, model=PACKAGED_MINILM)
        apply_canonicalization(cfg, progress=False, log=_quiet, encoder=text_encoder)
        return read_jsonl(tmp_path / name / "states.jsonl"), read_jsonl(tmp_path / name / "phrase_map.jsonl")

    first = apply(synth_copy, "once")
    assert calls == [len(first[1])]
    stored = sorted((tmp_path / "once" / ".cache" / "canon-grid").glob("*.npy"))
    assert len(stored) == 1 and (synth_copy / ".cache" / "canon-grid" / stored[0].name).is_file()
    assert apply(tmp_path / "once", "twice") == first and calls == [len(first[1])]  # read, not embedded
    (synth_copy / ".cache" / "canon-grid" / stored[0].name).write_bytes(b"damaged")
    assert apply(synth_copy, "again") == first and len(calls) == 2  # embedded again, the same states
