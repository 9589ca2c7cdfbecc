"""Phrase search (several phrases per query by max, misses), the search / baseline / fuse CLIs end to end."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.runs import read_run


def _phrase_file(path, bench):
    test = [bench.query_ids[r] for r in bench.query_rows("test")]
    lines = [
        {"query_id": test[0], "phrase": "falling", "phrases": ["falling", "resting on the floor"]},
        {"query_id": test[1], "phrase": None, "error": "timeout", "parse_ok": False},
        {"query_id": test[2], "phrase": "", "raw": "I cannot tell", "parse_ok": False},
        {"query_id": test[4], "phrase": "rolling down the ramp"},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return test


def test_phrase_vectors_max_over_samples_and_misses(tiny_bench, text_encoder, tmp_path):
    from eval.scoring import DenseSource
    from retrieval.search import phrase_query_vectors
    from retrieval.spaces import Space

    test = _phrase_file(tmp_path / "p.jsonl", tiny_bench)
    rows = tiny_bench.query_rows("test")
    qv, stats = phrase_query_vectors(tiny_bench, tmp_path / "p.jsonl", rows, "minilm", text_encoder)
    assert qv.query_ids == test and qv.vectors.shape == (len(test), 2, 384)
    assert stats.failed == 2 and stats.missing_lines == len(test) - 4
    assert qv.miss.tolist() == [False, True, True, True, False] + [True] * (len(test) - 5)
    sp = Space.load(tiny_bench, "minilm")
    both = DenseSource(qv.vectors[:1], sp.items, sp.item_rows).scores(slice(0, 1), slice(0, sp.item_rows.size))
    singles = [DenseSource(text_encoder.encode_queries([p]), sp.items, sp.item_rows)
               .scores(slice(0, 1), slice(0, sp.item_rows.size)) for p in ("falling", "resting on the floor")]
    assert np.allclose(both, np.maximum(*singles), atol=1e-6)
    # the padded slot of a one-phrase query repeats its phrase, so the max is that phrase's score
    assert np.allclose(qv.vectors[4, 0], qv.vectors[4, 1])


def test_search_cli_scores_failed_phrases_as_misses(tiny_dir, tmp_path):
    from retrieval.cli import app
    from retrieval.queries import load_query_vectors, sidecar_path

    bench = Benchmark.load(tiny_dir)
    test = _phrase_file(tmp_path / "m3.jsonl", bench)
    out = tmp_path / "runs" / "m3.parquet"
    res = CliRunner().invoke(app, ["search", "--data", str(tiny_dir), "--phrases", str(tmp_path / "m3.jsonl"),
                                   "--space", "minilm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = read_run(out)
    assert run.query_ids == test and run.method == "m3[minilm]" and run.config["misses"] == len(test) - 2
    st = run.stats["type2-all"]
    video = np.asarray(bench.corpus_ds["video_id"][:])
    for i, q in enumerate(test):
        if i in (1, 2, 3) or i >= 5:  # a miss: every positive is ranked after every other item
            own = int((video == bench.query(q).video_id).sum())
            assert run.missed[i] and st["n_tie_neg"][i] == 0 and st["n_tie_pos"][i] == st["n_pos"][i]
            assert st["n_above"][i] + st["n_pos"][i] == len(video) - own
            assert all(x == "" for x in run.topk_ids[i])
        else:
            assert not run.missed[i]
    assert load_query_vectors(sidecar_path(out)).n_misses == len(test) - 2
    assert len(run.config["query_vectors_sha1"]) == 40
    assert sorted(p.name for p in out.parent.iterdir()) == ["m3.parquet", "m3.qvec.npz"]  # scoring checkpoint removed


def test_baseline_oracle_and_fuse_cli(tiny_dir, tmp_path):
    from retrieval.cli import app

    runner = CliRunner()
    a, b, f = tmp_path / "oracle.parquet", tmp_path / "persist.parquet", tmp_path / "fused.parquet"
    for args in (["oracle", "semantic-text", "--space", "minilm", "--out", str(a)],
                 ["baseline", "persistence", "--space", "pixels", "--out", str(b)],
                 ["fuse", "--run", str(a), "--run", str(b), "--weight", "1", "--weight", "0.5", "--out", str(f)]):
        res = runner.invoke(app, [args[0], *args[1:], "--data", str(tiny_dir)] if args[0] == "fuse" else
                            [*args, "--data", str(tiny_dir)])
        assert res.exit_code == 0, res.output
    bench = Benchmark.load(tiny_dir)
    fused = read_run(f)
    assert fused.config["weights"] == [1.0, 0.5] and fused.config["spaces"] == ["minilm", "pixels"]
    # recompute the z-score fusion densely (the tiny corpus allows it) and compare the top of each ranking
    from retrieval.queries import load_query_vectors, sidecar_path
    from retrieval.spaces import Space

    dense = []
    for p, name in ((a, "minilm"), (b, "pixels")):
        sp = Space.load(bench, name)
        v = load_query_vectors(sidecar_path(p)).vectors[:, 0]
        s = (v @ sp.items.T)[:, sp.item_rows] if sp.item_rows is not None else v @ sp.items.T
        dense.append((s - s.mean(1, keepdims=True)) / s.std(1, keepdims=True))
    manual = dense[0] + 0.5 * dense[1]
    video = np.asarray(bench.corpus_ds["video_id"][:])
    for i, q in enumerate(fused.query_ids):
        s = manual[i][video != bench.query(q).video_id]
        assert np.allclose(fused.topk_scores[i, :10], np.sort(s)[::-1][:10], atol=1e-4)
    # the fused ranking is neither input ranking
    assert [x[:5] for x in fused.topk_ids] != [x[:5] for x in read_run(b).topk_ids]


def test_fuse_rejects_foreign_runs(tiny_dir, tmp_path):
    from retrieval.cli import app

    (tmp_path / "x.parquet").write_bytes(b"")
    res = CliRunner().invoke(app, ["fuse", "--data", str(tiny_dir), "--run", str(tmp_path / "x.parquet"), "--run",
                                   str(tmp_path / "x.parquet"), "--out", str(tmp_path / "f.parquet")])
    assert res.exit_code != 0 and "cannot be fused" in res.output
    assert not (tmp_path / "f.parquet").exists()
