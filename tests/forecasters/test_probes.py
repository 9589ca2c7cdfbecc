"""The canonicalization probes as phrase sources: the synonym paraphraser (no model), and the ``paraphrase`` /
``describe`` forecasters through the real runner and the hf backend with tiny models."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import prompts
from eval.benchmark import Benchmark
from eval.phrases import read_phrases
from forecasters.cli import app
from forecasters.media import FrameCache
from forecasters.probes import synonym_paraphrase, synonym_phrase_records, target_segment
from forecasters.registry import get_forecaster
from forecasters.runner import RunConfig, render_request, run, select_queries


def test_synonym_paraphrase_is_deterministic_and_never_the_text():
    members = ["falling", "dropping", "plummeting", "falling down"]
    got = {synonym_paraphrase(f"q{i}", "falling", members)[0] for i in range(200)}
    assert got == {"dropping", "plummeting", "falling down"}
    assert synonym_paraphrase("q1", "falling", members, seed=3) == synonym_paraphrase("q1", "falling", members, seed=3)
    assert synonym_paraphrase("q1", "resting", ["resting"]) == ("resting", ["no_synonym"])
    assert synonym_paraphrase("q1", "resting", []) == ("resting", ["no_synonym"])


def test_synonym_records_reword_the_true_state(synth_bench):
    qs = synth_bench.queries("test")
    members = dict(zip(synth_bench.state_ids, synth_bench.states_ds["members"][:], strict=True))
    # members: another phrasing of the corpus' own cluster (or the state itself, flagged, when it has one member)
    recs = synonym_phrase_records(synth_bench, "test", seed=0, phrasing="members")
    assert [r.query_id for r in recs] == [q.id for q in qs]
    for r, q in zip(recs, qs, strict=True):
        assert r.ok and r.phrase in members[q.target_state_id]
        assert (r.phrase != q.target_state) == (len(set(members[q.target_state_id])) > 1)
    assert sum(r.phrase != q.target_state for r, q in zip(recs, qs, strict=True)) > len(qs) // 4
    # held-out (the synthetic benchmark's default): a lexicon that never wrote the corpus, so never a member
    recs = synonym_phrase_records(synth_bench, "test", seed=0)
    assert [r.query_id for r in recs] == [q.id for q in qs]
    for r, q in zip(recs, qs, strict=True):
        assert r.ok and r.phrase != q.target_state and r.phrase not in members[q.target_state_id]
    other = synonym_phrase_records(synth_bench, "test", seed=1)
    assert any(a.phrase != b.phrase for a, b in zip(recs, other, strict=True))
    assert len({r.config_hash for r in recs}) == 1 and recs[0].config_hash != other[0].config_hash


def test_synonyms_cli_and_foreign_synonym_sets(synth_dir, tmp_path):
    out = tmp_path / "para.jsonl"
    r = CliRunner().invoke(app, ["probes", "synonyms", "--data", str(synth_dir), "--out", str(out), "--split", "val"])
    assert r.exit_code == 0, r.output
    recs = read_phrases(out)
    assert list(recs) == [q.id for q in Benchmark.load(synth_dir).queries("val")]
    assert json.loads(out.with_name("para.config.json").read_text())["queries"] == len(recs)
    # sets looked up by membership: a set whose first phrasing is not the target's text still applies
    target = Benchmark.load(synth_dir).queries("test")[0].target_state
    sets = tmp_path / "sets.jsonl"
    sets.write_text(json.dumps({"id": "x", "text": "plummeting", "members": ["plummeting", target]}) + "\n")
    r = CliRunner().invoke(app, ["probes", "synonyms", "--data", str(synth_dir), "--out", str(tmp_path / "p2.jsonl"),
                                 "--synonyms", str(sets)])
    assert r.exit_code == 0, r.output
    recs = read_phrases(tmp_path / "p2.jsonl")
    reworded = [q for q, rec in recs.items() if rec.phrase == "plummeting"]
    assert reworded and all(rec.flags == ["no_synonym"] for rec in recs.values() if rec.phrase != "plummeting")
    r = CliRunner().invoke(app, ["probes", "synonyms", "--data", str(synth_dir), "--out", str(tmp_path / "p4.jsonl"),
                                 "--synonyms", str(sets), "--phrasing", "held-out"])
    assert r.exit_code != 0 and "--synonyms" in r.output and not (tmp_path / "p4.jsonl").exists()
    sets.write_text('{"id": "x", "text": "a", "members": "a b"}\n')
    r = CliRunner().invoke(app, ["probes", "synonyms", "--data", str(synth_dir), "--out", str(tmp_path / "p3.jsonl"),
                                 "--synonyms", str(sets)])
    assert r.exit_code != 0 and not (tmp_path / "p3.jsonl").exists()


def test_probe_prompts_hold_the_true_state_and_the_true_frame(synth_bench):
    frames = FrameCache(synth_bench.root)
    q = synth_bench.queries("test")[0]
    para = get_forecaster("paraphrase")
    req = render_request(para, prompts.load(para.prompt), q, synth_bench, frames, sampling=para_sampling())
    assert f"State: {q.target_state}" in req.text and not req.images
    desc = get_forecaster("describe")
    req = render_request(desc, prompts.load(desc.prompt), q, synth_bench, frames, sampling=para_sampling())
    seg = target_segment(q, synth_bench)
    assert (seg.video_id, seg.object_id, seg.start) == (q.video_id, q.object_id, q.target_time)
    assert len(req.images) == 1 and req.images[0].source.endswith(seg.frame) and q.subject in req.text
    assert q.target_state not in req.text  # described from scratch


def para_sampling():
    from forecasters.backends import SamplingParams

    return SamplingParams(max_tokens=8)


@pytest.mark.parametrize("forecaster,kind", [("paraphrase", "qwen2"), ("describe", "qwen2_vl")])
def test_probe_runs_through_the_runner(forecaster, kind, tiny, synth_dir, tmp_path):
    out = tmp_path / f"{forecaster}.jsonl"
    cfg = RunConfig(data=str(synth_dir), out=str(out), forecaster=forecaster, backend="hf", model=str(tiny[kind]),
                    split="test", limit=3, max_tokens=8, device="cpu", dtype="float32", progress=False)
    summary = run(cfg)
    assert summary.attempted == 3 and summary.coverage.failed == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 3
    tpl = prompts.load(get_forecaster(forecaster).prompt)
    assert all(x["forecaster"] == forecaster and x["prompt_id"] == tpl.id and x["prompt_hash"] == tpl.hash
               for x in lines)
    assert all(isinstance(x["raw"], str) for x in lines)
    if forecaster == "describe":  # one image per query: the true target frame (loaded once per distinct frame)
        bench = Benchmark.load(synth_dir)
        assert summary.frames_loaded == len({target_segment(q, bench).frame for q in select_queries(bench, cfg)})
