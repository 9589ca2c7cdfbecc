"""Canonicalize-then-retrieve (the snap), and the decomposition / robust-read report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.io import write_json, write_jsonl
from eval.metrics import RankStats, recall_at_k
from eval.runs import read_run
from retrieval.canon.report import CanonReportConfig, write_report
from retrieval.canon.snap import CanonicalIndex, canonicalize_phrases, snap_scores
from retrieval.cli import app
from retrieval.methods import method_query_vectors
from retrieval.queries import QueryVectors
from retrieval.runs import score_query_vectors
from retrieval.search import phrase_query_vectors
from retrieval.spaces import Space


def r5(path, row=False):
    st = RankStats.from_run(read_run(path), "type2-all")
    return recall_at_k(st, 5, "row" if row else "expected")


@pytest.fixture(scope="module")
def runs(canon_bench_dir, text_encoder, tmp_path_factory):
    """Test-split runs on the benchmark copy: exact-string oracle, the synonym paraphrase read plainly, snapped with
    every phrasing indexed, snapped with the held-out states' phrasings left out, and question-only."""
    d = tmp_path_factory.mktemp("canon-runs")
    bench = Benchmark.load(canon_bench_dir)
    sp = Space.load(bench, "minilm")
    rows = bench.query_rows("test")
    members = dict(zip(bench.state_ids, bench.states_ds["members"][:], strict=True))
    qs = bench.queries("test")
    # another member phrasing of the target state where it has one (a paraphrase that is in the index)
    write_jsonl(d / "para.jsonl", ({"query_id": q.id, "phrase": members[q.target_state_id][-1]} for q in qs))
    held = sorted({q.target_state_id for q in qs})[::2]
    write_json(d / "holdout.json", {"train_states": [s for s in bench.state_ids if s not in held],
                                    "heldout_states": held})
    out = {"dir": d, "bench": bench, "space": sp, "held": held}

    def score(name, qv):
        score_query_vectors(bench, qv, sp, d / f"{name}.parquet", method=name, progress=False)
        out[name] = d / f"{name}.parquet"

    score("exact", method_query_vectors(bench, "semantic-text", sp, rows))
    score("question-only", method_query_vectors(bench, "question-only", sp, rows))
    qv, _ = phrase_query_vectors(bench, d / "para.jsonl", rows, "minilm", text_encoder)
    score("plain", qv)
    snapped, out["snap_summary"] = canonicalize_phrases(bench, sp, text_encoder, qv, 3)
    score("snap", snapped)
    snapped_h, out["snap_holdout_summary"] = canonicalize_phrases(bench, sp, text_encoder, qv, 3, d / "holdout.json")
    score("snap_holdout", snapped_h)
    out["qv"] = qv
    return out


def test_snap_scores_by_hand():
    e = np.eye(4, dtype=np.float32)
    index = CanonicalIndex(["a", "a2", "b", "c"], np.array([0, 0, 1, 2]), e, n_states=3)
    q = np.zeros((3, 2, 4), np.float32)
    q[0, 0] = [0.0, 0.8, 0.6, 0.0]  # closest to a2 (state 0), then b (state 1)
    q[1, 0] = [0.0, 0.0, 0.0, 1.0]
    q[1, 1] = [0.0, 0.0, 0.6, 0.8]  # two phrases: state 2 at 1.0 (first phrase), state 1 at 0.6
    states, scores = snap_scores(index, q, top_m=2)  # query 2 has no phrase: a miss
    assert states.tolist() == [[0, 1], [2, 1], [-1, -1]]
    assert np.allclose(scores, [[0.8, 0.6], [1.0, 0.6], [0.0, 0.0]])
    q2 = np.zeros((1, 1, 4), np.float32)
    q2[0, 0] = [0.0, 0.0, 0.0, 0.0]
    q2[0, 0, :2] = [0.6, 0.0]
    q2[0, 0, 2] = 0.6  # tie between states 0 and 1: the lower state row first
    assert snap_scores(index, q2, 3)[0].tolist() == [[0, 1, 2]]



def _snap_reference(index, vectors, top_m):
    """The snap's definition in torch, all at once: per query and state, the best cosine of a live phrase with a
    phrasing of the state; states by score desc, row asc."""
    import torch

    v = torch.from_numpy(vectors)
    live = (v != 0).any(dim=2)
    sim = torch.einsum("bkd,md->bkm", v, torch.from_numpy(index.emb))
    best = torch.where(live[:, :, None], sim, torch.tensor(-np.inf)).amax(dim=1)
    per_state = torch.full((len(v), index.n_states), -np.inf)
    per_state.scatter_reduce_(1, torch.from_numpy(index.state_rows).expand(len(v), -1), best, reduce="amax")
    order = torch.argsort(-per_state, dim=1, stable=True)[:, :top_m]
    return order.numpy(), torch.gather(per_state, 1, order).numpy(), live.any(dim=1).numpy()


def test_snap_scores_equal_the_reference_across_member_chunks(monkeypatch):
    """Phrasings in no state order, a member chunk boundary inside a state's phrasings, query blocks, dead phrases
    and states without phrasings: the chunked NumPy snap gives the reference's states and scores."""
    import retrieval.canon.snap as S

    rng = np.random.default_rng(0)
    n_states, d = 40, 16
    rows = rng.integers(0, n_states - 3, 300)  # the last 3 states have no phrasing
    emb = rng.normal(size=(300, d)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    index = CanonicalIndex([f"p{i}" for i in range(300)], rows, emb, n_states=n_states)
    q = rng.normal(size=(50, 3, d)).astype(np.float32)
    q[rng.random((50, 3)) < 0.3] = 0  # dead phrases, some queries with none
    q[7] = 0
    monkeypatch.setattr(S, "_MEMBER_CHUNK", 7)
    monkeypatch.setattr(S, "_QK_ROWS", 33)
    states, scores = snap_scores(index, q, top_m=5)
    ref_states, ref_scores, ok = _snap_reference(index, q, 5)
    assert not ok[7] and states[7].tolist() == [-1] * 5
    assert (states[ok] == ref_states[ok]).all() and (states[~ok] == -1).all()
    np.testing.assert_allclose(scores[ok], ref_scores[ok], rtol=1e-6, atol=1e-6)

@pytest.mark.slow
def test_the_snap_recovers_the_exact_oracle_when_the_phrasing_is_in_the_index(runs):
    exact, plain, snap = r5(runs["exact"], row=True), r5(runs["plain"], row=True), r5(runs["snap"], row=True)
    ok = np.isfinite(exact)
    assert np.nanmean(plain) <= np.nanmean(exact)  # the paraphrase oracle cannot beat the exact-string oracle
    assert np.array_equal(snap[ok], exact[ok])
    assert runs["snap_summary"]["mean_top1_snap_score"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_a_held_out_state_snaps_through_similarity_only(runs, text_encoder):
    bench, held = runs["bench"], set(runs["held"])
    index = CanonicalIndex.from_benchmark(bench, text_encoder, exclude_members_of=held)
    by_state = {}
    for t, r in zip(index.texts, index.state_rows, strict=True):
        by_state.setdefault(bench.state_ids[r], []).append(t)
    assert all(by_state[s] == [bench.state(s).text] for s in held)
    n_members = dict(zip(bench.state_ids, (len(set(m)) for m in bench.states_ds["members"][:]), strict=True))
    assert all(len(by_state[s]) == n_members[s] for s in bench.state_ids if s not in held)
    assert runs["snap_holdout_summary"]["index_excluded_states"] == len(held)
    # with every state's phrasings left out, the snap's first state is the nearest canonical text
    allheld = CanonicalIndex.from_benchmark(bench, text_encoder, exclude_members_of=set(bench.state_ids))
    states, _ = snap_scores(allheld, runs["qv"].vectors, 1)
    texts = text_encoder.encode_items(bench.states_ds["text"][:])
    want = (runs["qv"].vectors[:, 0] @ texts.T).argmax(1)
    assert np.array_equal(states[:, 0], want)


@pytest.mark.slow
def test_search_cli_canonicalize(runs, canon_bench_dir, tmp_path):
    out = tmp_path / "snap.parquet"
    r = CliRunner().invoke(app, ["search", "--data", str(canon_bench_dir), "--phrases", str(runs["dir"] / "para.jsonl"),
                                 "--space", "minilm", "--out", str(out), "--canonicalize", "2"])
    assert r.exit_code == 0, r.output
    run = read_run(out)
    assert run.method == "para+snap2[minilm]" and run.config["canonicalize_top_m"] == 2
    assert np.array_equal(r5(out, row=True), r5(runs["exact"], row=True), equal_nan=True)
    bad = CliRunner().invoke(app, ["search", "--data", str(canon_bench_dir), "--phrases",
                                   str(runs["dir"] / "para.jsonl"), "--space", "pixels", "--out", str(tmp_path / "x"),
                                   "--canonicalize", "2"])
    assert bad.exit_code != 0


@pytest.mark.slow
def test_snap_keeps_misses(runs):
    qv = runs["qv"]
    v = qv.vectors.copy()
    v[:3] = 0
    snapped, summary = canonicalize_phrases(runs["bench"], runs["space"], _Enc(runs["space"]),
                                            QueryVectors(qv.query_ids, v, qv.space), 2)
    assert not snapped.vectors[:3].any() and snapped.vectors[3:].any()
    assert summary["snapped_queries"] == len(qv.query_ids) - 3


class _Enc:
    """Index phrasings embedded as the space's own state vectors (no model needed for this check)."""

    def __init__(self, space):
        self.space = space

    def encode_items(self, texts, progress=False):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(len(texts), self.space.dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.slow
def test_report_numbers(runs, canon_bench_dir, tmp_path):
    d = runs["dir"]
    cfg = CanonReportConfig(data=str(canon_bench_dir), out=str(tmp_path / "rep"), exact=str(runs["exact"]),
                            paraphrase=str(runs["plain"]), predictors=[str(runs["question-only"])],
                            robust=[f"snap3={runs['snap']}", f"snap3-holdout={runs['snap_holdout']}"],
                            holdout=str(d / "holdout.json"), n_resamples=500)
    doc = write_report(cfg)
    for f in ("report.md", "report.json", "decomposition.md", "decomposition.csv", "decomposition.tex", "robust.md",
              "decomposition.png", "config.json"):
        assert (tmp_path / "rep" / f).stat().st_size > 0
    dec = {d["role"]: d for d in doc["decomposition"]}
    exact, plain = np.nanmean(r5(runs["exact"])), np.nanmean(r5(runs["plain"]))
    assert dec["exact"]["r_at_k"] == pytest.approx(exact) and dec["exact"]["name"] == "exact"
    assert dec["paraphrase"]["r_at_k"] == pytest.approx(plain)
    ch = doc["channels"]["canonicalization_channel"]["bootstrap"]
    assert ch["delta"] == pytest.approx(exact - plain) and ch["ci_low"] <= ch["delta"] <= ch["ci_high"]
    assert doc["best_predictor"] == "question-only"
    rob = doc["robust"]
    assert rob["seen states"]["n"] + rob["held-out states"]["n"] == rob["all"]["n"]
    # the snap returns the exact state of every member phrasing: it reads like the exact-string oracle
    assert rob["all"]["reads"]["snap3"]["r_at_k"] == pytest.approx(rob["all"]["exact"])
    # gap closed and McNemar against a plain read that leaves a gap (question-only; the synonym read barely differs
    # from the exact oracle here: most open-vocabulary states of the fixture have a single phrasing)
    cfg2 = CanonReportConfig(data=str(canon_bench_dir), out=str(tmp_path / "rep2"), exact=str(runs["exact"]),
                             paraphrase=str(runs["question-only"]), robust=[f"snap3={runs['snap']}"], n_resamples=200)
    rob2 = write_report(cfg2)["robust"]["all"]
    assert rob2["exact"] > rob2["plain"] and rob2["reads"]["snap3"]["gap_closed"] == pytest.approx(1.0)
    hit_exact, hit_plain = r5(runs["exact"], row=True), r5(runs["question-only"], row=True)
    ok = np.isfinite(hit_exact)
    mc = rob2["reads"]["snap3"]["mcnemar"]
    assert mc["b"] == int(np.sum(hit_exact[ok] * (1 - hit_plain[ok])))
    assert mc["c"] == int(np.sum(hit_plain[ok] * (1 - hit_exact[ok])))
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["queries"] == len(runs["qv"].query_ids)
