"""Baselines and oracles: each builds the query the paper's appendix describes (checked by brute force)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.features import l2_normalize


@pytest.fixture(scope="module")
def spaces(tiny_bench):
    from retrieval.spaces import Space

    return Space.load(tiny_bench, "minilm"), Space.load(tiny_bench, "pixels")


def test_persistence_and_zero_shot_use_prefix_tokens(tiny_bench, spaces):
    from retrieval.baselines import persistence, zero_shot

    _, vis = spaces
    rows = tiny_bench.query_rows("test")
    tokens = np.stack([vis.prefixes.array[vis.prefixes.ids.index(tiny_bench.query(int(r)).prefix_id)] for r in rows])
    assert np.allclose(persistence(tiny_bench, rows, vis).vectors[:, 0], l2_normalize(tokens[:, -1]), atol=1e-6)
    assert np.allclose(zero_shot(tiny_bench, rows, vis).vectors[:, 0], l2_normalize(tokens.mean(1)), atol=1e-6)


def test_knn_future_takes_the_nearest_training_query_of_the_same_type_and_horizon(tiny_bench, spaces):
    from retrieval.baselines import knn_future, knn_neighbours

    sem, vis = spaces
    rows = tiny_bench.query_rows("test")
    nb = knn_neighbours(tiny_bench, rows, vis)
    train = [tiny_bench.query(int(r)) for r in tiny_bench.query_rows("train")]
    train_rows = tiny_bench.query_rows("train")
    pooled = {p: l2_normalize(vis.prefixes.array[i].mean(0)) for i, p in enumerate(vis.prefixes.ids)}
    for r, n in zip(rows, nb, strict=True):
        q = tiny_bench.query(int(r))
        cand = [(float(pooled[q.prefix_id] @ pooled[t.prefix_id]), tr) for t, tr in zip(train, train_rows, strict=True)
                if (t.qtype, t.horizon) == (q.qtype, q.horizon) and t.video_id != q.video_id]
        assert n == max(cand)[1]
    qv = knn_future(tiny_bench, rows, vis, sem)
    for i, n in enumerate(nb):  # the prediction is the neighbour's target state embedding
        sid = tiny_bench.query(int(n)).target_state_id
        assert np.allclose(qv.vectors[i, 0], sem.items[sem.item_ids.index(sid)])


def test_oracles(tiny_bench, spaces, text_encoder):
    from retrieval.oracles import independent_appearance, semantic_text, state_prototype

    sem, vis = spaces
    rows = tiny_bench.query_rows("val")
    queries = [tiny_bench.query(int(r)) for r in rows]
    st = semantic_text(tiny_bench, rows, sem, text_encoder).vectors[:, 0]
    assert np.allclose(st, text_encoder.encode_queries([q.target_state for q in queries]), atol=1e-6)
    protos = vis.state_prototypes()
    sp = state_prototype(tiny_bench, rows, vis).vectors[:, 0]
    assert np.allclose(sp, protos[[tiny_bench.state_index[q.target_state_id] for q in queries]])
    rows = tiny_bench.query_rows()
    queries = [tiny_bench.query(int(r)) for r in rows]
    first = independent_appearance(tiny_bench, rows, vis).vectors[:, 0]
    mean = independent_appearance(tiny_bench, rows, vis, reduce="mean")
    assert mean.n_misses == 0
    segs = tiny_bench.segments()
    for q, v, m in zip(queries, first, mean.vectors[:, 0], strict=True):
        target = [i for i, s in enumerate(segs) if (s.video_id, s.object_id, s.start) ==
                  (q.video_id, q.object_id, q.target_time)]
        assert len(target) == 1
        assert np.allclose(v, vis.items[target[0]])  # the queried object's own future frame
        t = segs[target[0]]
        own = [i for i, s in enumerate(segs) if (s.video_id, s.object_id, s.state_id) ==
               (t.video_id, t.object_id, t.state_id)]
        assert np.allclose(m, l2_normalize(vis.items[own].mean(0)), atol=1e-6)


def test_independent_appearance_without_own_segment_is_a_miss(tiny_copy):
    import json

    from retrieval.oracles import independent_appearance
    from retrieval.spaces import Space

    lines = (tiny_copy / "queries.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["target_time"] = 1.0e4  # after the video: no segment of its object holds it (the target is not in the corpus)
    (tiny_copy / "queries.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    bench = Benchmark.load(tiny_copy)
    qv = independent_appearance(bench, np.arange(3), Space.load(bench, "pixels"))
    assert qv.miss.tolist() == [True, False, False]


def test_method_errors_name_the_problem(tiny_dir, tmp_path):
    from retrieval.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["baseline", "persistence", "--data", str(tiny_dir), "--space", "minilm", "--out",
                              str(tmp_path / "x.parquet")])
    assert res.exit_code != 0 and "visual space" in res.output
    res = runner.invoke(app, ["oracle", "semantic-text", "--data", str(tiny_dir), "--space", "pixels", "--out",
                              str(tmp_path / "x.parquet")])
    assert res.exit_code != 0 and "has no text encoder" in res.output
    res = runner.invoke(app, ["baseline", "mystery", "--data", str(tiny_dir), "--out", str(tmp_path / "x.parquet")])
    assert res.exit_code != 0 and "unknown baseline" in res.output
    assert not (tmp_path / "x.parquet").exists()


def test_oracle_runs_are_named_oracle(tiny_dir, tmp_path):
    from eval.runs import read_run
    from retrieval.cli import app
    from retrieval.method_names import BASELINES, ORACLES, run_label

    assert all(run_label(n, "s").startswith("oracle-") for n in ORACLES)
    assert not any(run_label(n, "s").startswith("oracle") for n in BASELINES)
    assert run_label("random", "s") == "random" and run_label("persistence", "pixels") == "persistence[pixels]"
    out = tmp_path / "proto.parquet"
    res = CliRunner().invoke(app, ["oracle", "state-prototype", "--data", str(tiny_dir), "--space", "pixels",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert read_run(out).method == "oracle-state-prototype[pixels]"


@pytest.mark.slow
def test_lftr_cli_train_predict_seeds(synth_sem_dir, tmp_path):
    import json

    from eval.runs import read_run
    from retrieval.cli import app

    runner = CliRunner()
    small = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "n_samples=4",
             "--set", "epochs=2", "--set", "threads=1", "--set", "batch_size=128"]
    res = runner.invoke(app, ["lftr", "train", "--data", str(synth_sem_dir), "--space", "pixels", "--out",
                              str(tmp_path / "ck"), *small])
    assert res.exit_code == 0, res.output
    assert "trainable parameters" in res.output and "val R@5" in res.output
    res = runner.invoke(app, ["lftr", "predict", "--data", str(synth_sem_dir), "--ckpt", str(tmp_path / "ck"),
                              "--out", str(tmp_path / "lftr.parquet"), "--read-rule", "fixed1"])
    assert res.exit_code == 0, res.output
    run = read_run(tmp_path / "lftr.parquet")
    assert run.method == "lftr[pixels]/fixed1" and run.config["read_rule"] == "fixed1" and run.config["epochs"] == 2
    res = runner.invoke(app, ["lftr", "seeds", "--data", str(synth_sem_dir), "--space", "pixels", "--seeds", "0,1",
                              "--out", str(tmp_path / "seeds"), *small])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "seeds" / "summary.json").read_text())
    r5 = [summary["per_seed"][s]["R@5"] for s in ("0", "1")]
    assert summary["mean"]["R@5"] == pytest.approx(np.mean(r5)) and summary["std"]["R@5"] == pytest.approx(
        np.std(r5, ddof=1))
    assert read_run(tmp_path / "seeds" / "seed1" / "run.parquet").method == "lftr[pixels]-seed1"
