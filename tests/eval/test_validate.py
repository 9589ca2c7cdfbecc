"""The loader and the validator on a small hand-written benchmark: clean passes, every defect kind is caught."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from eval import features as feats
from eval.benchmark import Benchmark
from eval.cli import app
from eval.io import FormatError, write_json, write_jsonl
from eval.schema import Manifest, Query
from eval.validate import validate


def _frame(root: Path, rel: str) -> str:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (10, 20, 30)).save(p)
    return rel


def _segment(root, sid, vid, domain, state_id, state, subject="red ball", start=1.0):
    return {"id": sid, "video_id": vid, "domain": domain, "object_id": f"{vid}/o0", "subject": subject,
            "state": state, "state_id": state_id, "state_type1": f"{subject} {state}", "start": start,
            "end": start + 0.5, "frame": _frame(root, f"frames/{vid}/{sid}.png"), "raw": state}


def make_benchmark(root: Path) -> Path:
    """3 videos (v1, v2 in domain A; v3 in domain B), 2 states, 6 segments, 2 queries, a pixels space."""
    root.mkdir(parents=True, exist_ok=True)
    states = [{"id": "s0", "text": "resting", "members": ["resting", "at rest", "still"], "n_segments": 3},
              {"id": "s1", "text": "falling", "members": ["falling", "dropping", "tumbling down"], "n_segments": 3}]
    corpus = [
        _segment(root, "c0", "v1", "A", "s0", "resting", start=0.0),
        _segment(root, "c1", "v1", "A", "s1", "falling", start=1.0),
        _segment(root, "c2", "v2", "A", "s1", "falling", start=1.0),
        _segment(root, "c3", "v2", "A", "s0", "resting", start=0.0),
        _segment(root, "c4", "v3", "B", "s1", "falling", start=1.0),
        _segment(root, "c5", "v3", "B", "s0", "resting", subject="blue box", start=0.0),
    ]
    frames = [_frame(root, f"frames/v1/p{i}.png") for i in range(8)]
    q = {"id": "q0", "prefix_id": "p_v1_o0", "video_id": "v1", "domain": "A", "object_id": "v1/o0", "subject": "red ball",
         "qtype": "Q1", "horizon": 1, "question": "What will the red ball do next?", "target_state": "falling",
         "target_state_id": "s1", "target_state_type1": "red ball falling", "target_time": 1.0, "prefix_start": 0.0,
         "prefix_end": 0.9, "prefix_frames": frames, "transcript": [{"t": 0.0, "state": "resting"}], "split": "test",
         "gt_pools": {"in_video": ["c1"], "in_dataset": ["c2"], "cross_dataset": ["c4"], "bge_similar": [], "consensus": ["c2"]},
         "gt_type1": ["c2", "c4"], "fair": True, "group_id": None, "k_seconds": None, "anchor_state": None}
    q2 = dict(q, id="q1", prefix_id="p_v3_o0", video_id="v3", domain="B", object_id="v3/o0", qtype="Q2", horizon=2,
              split="train", gt_pools={"in_video": ["c4"], "in_dataset": [], "cross_dataset": ["c1", "c2"],
                                       "bge_similar": [], "consensus": []},
              gt_type1=["c1", "c2"], target_time=1.0)
    write_jsonl(root / "queries.jsonl", [q, q2])
    write_jsonl(root / "corpus.jsonl", corpus)
    write_jsonl(root / "states.jsonl", states)
    write_json(root / "manifest.json", Manifest(name="tiny", version="0", counts={"queries": 2, "corpus": 6, "states": 2},
                                                domains=["A", "B"]).to_dict())
    rng = np.random.default_rng(0)
    feats.write_table(root, "pixels", "corpus", [c["id"] for c in corpus], feats.l2_normalize(rng.normal(size=(6, 12))))
    feats.write_table(root, "pixels", "prefixes", ["p_v1_o0", "p_v3_o0"], feats.l2_normalize(rng.normal(size=(2, 8, 12))))
    feats.write_meta(root, "pixels", kind="visual", dim=12, model="pixels-test")
    return root


@pytest.fixture
def bench_dir(tmp_path) -> Path:
    return make_benchmark(tmp_path / "bench")


def _edit_jsonl(path: Path, line: int, fn) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    fn(rows[line - 1])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _problem(report, kind):
    hits = [p for p in report.problems if p.kind == kind]
    assert hits, f"expected a {kind!r} problem, got {[str(p) for p in report.problems]}"
    return hits[0]


def test_clean_benchmark_is_valid_and_summarised(bench_dir):
    r = validate(bench_dir)
    assert r.ok, [str(p) for p in r.problems]
    assert r.summary["queries"] == 2 and r.summary["corpus"] == 6
    assert r.summary["by_split"] == {"test": 1, "train": 1}
    assert r.summary["by_tier"]["cross_dataset"]["queries_with_gt"] == 2


def test_loader_round_trip(bench_dir):
    b = Benchmark.load(bench_dir)
    q = b.query("q0")
    assert isinstance(q, Query) and q.gt_pools.main == ("c2", "c4") and q.transcript[0].state == "resting"
    assert Query.from_dict(q.to_dict()) == q
    assert b.segment("c4").domain == "B" and b.state("s1").members[1] == "dropping"
    assert [x.id for x in b.queries("test")] == ["q0"]
    rows = b.gt_rows([q], "type1-all")
    assert [b.corpus_ids[i] for i in rows[0]] == ["c2", "c4"]
    assert b.segment_state_rows.tolist() == [0, 1, 1, 0, 1, 0]
    assert b.features("pixels", "prefixes").array.shape == (2, 8, 12)
    with pytest.raises(KeyError, match="unknown query id"):
        b.query("nope")


def test_loader_names_missing_file(bench_dir):
    (bench_dir / "states.jsonl").unlink()
    with pytest.raises(FormatError, match="states.jsonl"):
        Benchmark.load(bench_dir)


@pytest.mark.parametrize(
    "file,line,edit,kind,field",
    [
        ("queries.jsonl", 1, lambda r: r.pop("question"), "missing_field", "question"),
        ("queries.jsonl", 1, lambda r: r.update(horizon="1"), "bad_type", "horizon"),
        ("queries.jsonl", 2, lambda r: r.update(id="q0"), "duplicate_id", "id"),
        ("queries.jsonl", 1, lambda r: r["gt_pools"]["in_dataset"].append("c99"), "gt_missing", "gt_pools.in_dataset"),
        ("queries.jsonl", 1, lambda r: r.update(horizon=9), "horizon_range", "horizon"),
        ("queries.jsonl", 1, lambda r: r.update(prefix_end=1.2), "prefix_leak", "prefix_end"),
        ("queries.jsonl", 1, lambda r: r["transcript"].append({"t": 1.0, "state": "falling"}), "transcript_leak", "transcript[1]"),
        ("queries.jsonl", 1, lambda r: r.update(qtype="Q9"), "bad_value", "qtype"),
        ("queries.jsonl", 1, lambda r: r["gt_pools"]["in_dataset"].append("c4"), "tier_mismatch", "gt_pools.in_dataset"),
        ("queries.jsonl", 1, lambda r: r["gt_pools"]["consensus"].append("c1"), "tier_mismatch", "gt_pools.consensus"),
        ("queries.jsonl", 2, lambda r: r.update(fair=False), "fair_mismatch", "fair"),
        ("queries.jsonl", 1, lambda r: r["prefix_frames"].__setitem__(3, "frames/none.png"), "missing_frame", "prefix_frames[3]"),
        ("corpus.jsonl", 3, lambda r: r.update(state_id="s7"), "unknown_id", "state_id"),
        ("corpus.jsonl", 4, lambda r: r.update(id="c0"), "duplicate_id", "id"),
        ("corpus.jsonl", 2, lambda r: r.update(end=0.1), "bad_time", "end"),
        ("states.jsonl", 1, lambda r: r.pop("text"), "missing_field", "text"),
    ],
)
def test_each_defect_is_reported_with_file_line_field(bench_dir, file, line, edit, kind, field):
    _edit_jsonl(bench_dir / file, line, edit)
    r = validate(bench_dir)
    assert not r.ok
    p = _problem(r, kind)
    assert (p.file, p.line, p.field) == (file, line, field), str(p)


def test_split_leakage(bench_dir):
    _edit_jsonl(bench_dir / "queries.jsonl", 2, lambda r: r.update(video_id="v1"))
    p = _problem(validate(bench_dir), "split_leakage")
    assert "v1" in p.message and "test" in p.message and "train" in p.message


def test_malformed_json_line(bench_dir):
    with open(bench_dir / "corpus.jsonl", "a") as f:
        f.write('{"id": "c9", \n')
    p = _problem(validate(bench_dir), "bad_json")
    assert (p.file, p.line) == ("corpus.jsonl", 7)


def test_feature_row_count_mismatch(bench_dir):
    d = feats.space_dir(bench_dir, "pixels")
    (d / "corpus_ids.txt").write_text("c0\nc1\nc2\n")
    p = _problem(validate(bench_dir), "feature_rows")
    assert "features/pixels/corpus.npy" in p.file and "6 rows" in p.message and "3 ids" in p.message


def test_feature_dimension_mismatch(bench_dir):
    feats.write_table(bench_dir, "pixels", "prefixes", ["p_v1_o0", "p_v3_o0"], np.zeros((2, 8, 10), np.float32))
    r = validate(bench_dir)
    p = _problem(r, "feature_dim")
    assert "prefixes.npy" in p.file and "10" in p.message


def test_feature_nan(bench_dir):
    arr = np.load(feats.space_dir(bench_dir, "pixels") / "corpus.npy")
    arr[4, 2] = np.nan
    feats.write_table(bench_dir, "pixels", "corpus", ["c0", "c1", "c2", "c3", "c4", "c5"], arr)
    p = _problem(validate(bench_dir), "feature_nan")
    assert p.file == "features/pixels/corpus.npy" and "row 4" in p.message


def test_feature_unknown_id(bench_dir):
    ids = ["c0", "c1", "c2", "c3", "c4", "zz"]
    feats.write_table(bench_dir, "pixels", "corpus", ids, np.ones((6, 12), np.float32))
    p = _problem(validate(bench_dir), "unknown_id")
    assert p.file == "features/pixels/corpus_ids.txt" and p.line == 6


def test_manifest_count_mismatch(bench_dir):
    m = json.loads((bench_dir / "manifest.json").read_text())
    m["counts"]["corpus"] = 7
    (bench_dir / "manifest.json").write_text(json.dumps(m))
    p = _problem(validate(bench_dir), "count_mismatch")
    assert p.field == "counts.corpus"


def test_missing_file(bench_dir):
    (bench_dir / "corpus.jsonl").unlink()
    r = validate(bench_dir)
    assert _problem(r, "missing_file").file == "corpus.jsonl"


def test_cli_exit_codes(bench_dir, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(bench_dir)])
    assert ok.exit_code == 0, ok.output
    assert "valid" in ok.output and "GT pools by tier" in ok.output
    bad = tmp_path / "bad"
    shutil.copytree(bench_dir, bad)
    _edit_jsonl(bad / "queries.jsonl", 1, lambda r: r.update(horizon=0))
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 1
    assert "queries.jsonl:1 [horizon]" in res.output


def test_synthetic_benchmark_validates(synth_dir):
    r = validate(synth_dir)
    assert r.ok, [str(p) for p in r.errors[:10]]
    assert r.summary["queries"] > 100
