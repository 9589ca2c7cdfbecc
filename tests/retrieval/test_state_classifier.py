"""The state classifier (`retrieval.classifier`): a learner from prefix tokens to the future state, beside LFTR."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.runs import read_run

QUICK = dict(epochs=6, hidden=128)


@pytest.fixture(scope="module")
def sim_sem_dir(synth_dir, synth_sem_dir, tmp_path_factory):
    """The session's benchmark with its `minilm` space and the `sim` prefix space (the perfect-perception input)."""
    import shutil

    d = tmp_path_factory.mktemp("sim-sem") / "bench"
    shutil.copytree(synth_sem_dir, d, ignore=shutil.ignore_patterns(".cache"))
    shutil.copytree(synth_dir / "features" / "sim", d / "features" / "sim")
    return d


@pytest.fixture(scope="module")
def bench(sim_sem_dir):
    return Benchmark.load(sim_sem_dir)


@pytest.fixture(scope="module")
def spaces(bench):
    from retrieval.spaces import Space

    return Space.load(bench, "sim"), Space.load(bench, "minilm")


def _states(bench):
    from eval.segments import target_states

    return target_states(bench)


def _train_rows(bench):
    """The training queries the classifier learns from: Q1-Q4 with a target state of the benchmark."""
    state, qtype = _states(bench), np.asarray(bench.queries_ds["qtype"][:])
    train = bench.query_rows("train")
    return train[(state[train] >= 0) & (qtype[train] != "Q5")]


def test_it_learns_its_training_queries_and_keeps_the_best_validation_epoch(bench, spaces):
    from retrieval.classifier import ClassifierConfig, fit_predict_states

    sim, _ = spaces
    state, train = _states(bench), _train_rows(bench)
    cfg = ClassifierConfig(epochs=25, hidden=256, dropout=0.0)
    pred, rec = fit_predict_states(bench, train, sim, seed=0, cfg=cfg, progress=False)
    majority = np.bincount(state[train]).max() / len(train)
    acc = float((pred == state[train]).mean())
    assert acc > max(0.5, 3 * majority), (acc, majority)  # it fits what it was shown, far above the prior
    assert rec["train_queries"] == len(train) and len(rec["val_top1"]) == cfg.epochs
    assert rec["kept_epoch"] == int(np.argmax(rec["val_top1"])) + 1
    again, _ = fit_predict_states(bench, train, sim, seed=0, cfg=cfg, progress=False)
    assert np.array_equal(pred, again)  # seeded


def test_the_test_split_targets_are_never_read(bench, spaces, monkeypatch):
    import retrieval.classifier as C

    sim, _ = spaces
    rows = bench.query_rows("test")
    cfg = C.ClassifierConfig(**QUICK)
    before, _ = C.fit_predict_states(bench, rows, sim, seed=1, cfg=cfg, progress=False)
    true = C.target_states(bench)
    scrambled = true.copy()
    test = bench.query_rows("test")
    scrambled[test] = np.random.default_rng(0).permutation(len(bench.state_ids))[: len(test)] % len(bench.state_ids)
    assert (scrambled[test] != true[test]).any()
    monkeypatch.setattr(C, "target_states", lambda b: scrambled)
    after, _ = C.fit_predict_states(bench, rows, sim, seed=1, cfg=cfg, progress=False)
    assert np.array_equal(before, after)


def test_a_share_of_the_training_videos_trains_on_their_queries_only(bench, spaces):
    from retrieval.classifier import ClassifierConfig, fit_predict_states
    from retrieval.lftr.train import fraction_rows

    sim, _ = spaces
    train = _train_rows(bench)
    _, rec = fit_predict_states(bench, bench.query_rows("val"), sim, cfg=ClassifierConfig(train_fraction=0.25,
                                                                                         **QUICK), progress=False)
    assert rec["train_queries"] == len(fraction_rows(bench, train, 0.25)) < len(train)
    with pytest.raises(InputError, match="train_fraction must be in"):
        ClassifierConfig(train_fraction=0)


def test_non_finite_prefix_tokens_are_named(bench, spaces):
    from types import SimpleNamespace

    from retrieval.classifier import query_features

    sim, _ = spaces
    arr = np.array(sim.prefixes.array, np.float32)
    row = int(sim.prefix_rows([bench.queries_ds["prefix_id"][3]])[0])
    arr[row, 2, 5] = np.nan
    bad = SimpleNamespace(name="sim", prefixes=SimpleNamespace(array=arr), prefix_rows=sim.prefix_rows)
    with pytest.raises(InputError, match=r"non-finite prefix tokens in space 'sim' for query"):
        query_features(bench, bad)


def test_the_cli_writes_a_run_named_by_its_prefix_space(sim_sem_dir, bench, tmp_path):
    from retrieval.cli import app

    runner = CliRunner()
    out = tmp_path / "sc.parquet"
    res = runner.invoke(app, ["baseline", "state-classifier", "--data", str(sim_sem_dir), "--space", "minilm",
                              "--prefix-space", "sim", "--train-fraction", "0.5", "--split", "val", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = read_run(out)
    assert run.method == "state-classifier-sim[minilm]"
    fit = run.config["fit"]  # the fitting is recorded in the run
    assert run.config["train_fraction"] == 0.5 and fit["config"]["train_fraction"] == 0.5
    assert fit["kept_epoch"] == int(np.argmax(fit["val_top1"])) + 1 and fit["train_queries"] > 0
    assert set(pd.read_parquet(out, columns=["query_id"])["query_id"]) == {bench.query_ids[r]
                                                                           for r in bench.query_rows("val")}
    res = runner.invoke(app, ["baseline", "lookup", "--data", str(sim_sem_dir), "--space", "minilm",
                              "--train-fraction", "0.5", "--out", str(tmp_path / "l.parquet")])
    assert res.exit_code != 0 and "--train-fraction is an option of state-classifier" in res.output
    res = runner.invoke(app, ["oracle", "semantic-text", "--data", str(sim_sem_dir), "--space", "minilm",
                              "--method", "my-method", "--out", str(tmp_path / "o.parquet")])
    assert res.exit_code != 0 and "starts with 'oracle-'" in res.output
    assert not (tmp_path / "l.parquet").exists() and not (tmp_path / "o.parquet").exists()

