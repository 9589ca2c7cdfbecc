"""LFTR to the paper's letter: per-positive hard negatives outside every GT pool (on the synthetic `pixels` space,
hundreds of items, where hard negatives are used), torch validation, ablation switches, the calibrated read, the
LoRA encoder baseline and the complementarity analysis."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eval.benchmark import Benchmark


def _cfg(**kw):
    from retrieval.lftr.config import LFTRConfig

    base = dict(target_space="pixels", prefix_space="pixels", question_space="minilm", d_model=32, n_layers=1,
                n_heads=2, n_samples=4, epochs=1, batch_size=64, lr=1e-3, n_random_negatives=64, n_hard_negatives=16,
                threads=1)
    return LFTRConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def pixels_prep(synth_sem_dir, tmp_path_factory):
    from retrieval.lftr.train import prepare

    cfg = _cfg()
    return cfg, prepare(Benchmark.load(synth_sem_dir), cfg, tmp_path_factory.mktemp("prep"), "cpu")


def _excluded_sets(prep, rows):
    """Per query: item rows that may never be its negatives, from the raw benchmark records (Python sets)."""
    bench, space = prep.bench, prep.target
    cidx = bench.corpus_index
    out = []
    for r in rows:
        q = bench.query(int(r))
        ids = [x for t in ("in_video", "in_dataset", "cross_dataset", "bge_similar", "consensus")
               for x in getattr(q.gt_pools, t)] + list(q.gt_type1)
        ids += [x for x in (bench.queries_ds[int(r)].get("gt_sim_exact") or [])]  # the simulator-truth GT
        items = set(space.corpus_rows_to_items(np.asarray([cidx[x] for x in ids], np.int64)).tolist()) if ids else set()
        same = set(np.flatnonzero(space.item_state == prep.data.target_state[r]).tolist())
        out.append(items | same)
    return out


def test_hard_negatives_are_nearest_neighbours_of_the_positive_outside_every_pool(pixels_prep):
    from retrieval.lftr.batches import TrainBatches
    from retrieval.lftr.data import mine_hard_negatives

    cfg, prep = pixels_prep
    data = prep.data
    rows = data.rows("train")
    assert data.items.shape[0] > 1 + cfg.n_random_negatives + cfg.n_hard_negatives  # not a full softmax: they matter
    hard = mine_hard_negatives(data, rows, cfg.n_hard_candidates, None, progress=False)
    tr = TrainBatches(cfg, data, hard, rows, "cpu")
    assert tr.hard_nb is not None and not tr.full_softmax
    b = tr.batch(rows[:64], torch.Generator().manual_seed(0))
    excl = _excluded_sets(prep, rows[:64])
    dropped_beyond_state = 0
    for i in range(64):
        p = int(b.positive[i])
        got = [x for x in b.hard[i].tolist() if x >= 0]
        assert got and not set(got) & excl[i]
        # brute force: p's neighbours by cosine, other states only, then the query's exclusions
        sims = data.items @ data.items[p]
        order = [int(x) for x in np.argsort(-sims, kind="stable") if data.item_state[x] != data.item_state[p]]
        cand = order[:cfg.n_hard_candidates]
        allowed = [x for x in cand if x not in excl[i]]
        want = allowed[:cfg.n_hard_negatives]
        assert len(got) == len(want)  # the first n_hard allowed neighbours, best first (order up to float near-ties)
        assert np.allclose(sims[got], sims[want], atol=1e-5) and np.all(np.diff(sims[got]) <= 1e-5)
        dropped_beyond_state += sum(1 for x in cand if x in excl[i])
    assert dropped_beyond_state > 0  # some nearest neighbours were GT (bge_similar) items and were dropped


def test_exclusion_mask_matches_the_records(pixels_prep):
    from retrieval.lftr.batches import TrainBatches

    cfg, prep = pixels_prep
    rows = prep.data.rows("train")[:40]
    tr = TrainBatches(cfg, prep.data, None, prep.data.rows("train"), "cpu")
    cand = torch.randint(0, prep.data.items.shape[0], (len(rows), 200), generator=torch.Generator().manual_seed(1))
    excl = _excluded_sets(prep, rows)
    # force some candidates into the excluded sets so both outcomes are tested
    for i, e in enumerate(excl):
        forced = sorted(e)[:5]
        cand[i, :len(forced)] = torch.tensor(forced, dtype=cand.dtype)
    got = tr.never_negative(torch.from_numpy(rows), torch.from_numpy(prep.data.target_state[rows]), cand)
    want = torch.tensor([[int(c) in excl[i] for c in cand[i]] for i in range(len(rows))])
    assert torch.equal(got, want) and want.any() and (~want).any()


def test_a_second_head_on_the_same_benchmark_reuses_its_gt_pools_and_a_changed_benchmark_does_not(
        pixels_prep, synth_sem_dir, tmp_path, monkeypatch):
    """A pool worker trains several heads of one benchmark: the per-query GT pools and intermediate states are read
    once per process (keyed by the benchmark's files), and each head's arrays are those read afresh."""
    import shutil

    from retrieval.lftr import data as D
    from retrieval.spaces import Space

    _, prep = pixels_prep
    bench = Benchmark.load(synth_sem_dir)
    target, prefix = Space.load(bench, "minilm"), Space.load(bench, "pixels")
    calls = []
    real = D._gt_groups
    monkeypatch.setattr(D, "_LAST_PER_QUERY", {})
    monkeypatch.setattr(D, "_gt_groups", lambda b: calls.append(b.root) or real(b))
    first = D.build_data(bench, target, prefix)
    again = D.build_data(Benchmark.load(synth_sem_dir), target, prefix)
    assert len(calls) == 1
    D._LAST_PER_QUERY.clear()
    fresh = D.build_data(bench, target, prefix)
    for f in ("pos_ptr", "pos_items", "excl_ptr", "excl_items", "inter_ptr", "inter_state", "centroid"):
        np.testing.assert_array_equal(getattr(again, f), getattr(fresh, f))
        np.testing.assert_array_equal(getattr(first, f), getattr(fresh, f))
    # the pixels head of the same benchmark read the same pools
    np.testing.assert_array_equal(prep.data.inter_state, fresh.inter_state)
    # another benchmark's files (here a copy, whose records have other inodes) are read again
    other = shutil.copytree(synth_sem_dir, tmp_path / "copy", symlinks=True, ignore=shutil.ignore_patterns(".cache"))
    ob = Benchmark.load(other)
    D.build_data(ob, Space.load(ob, "minilm"), Space.load(ob, "pixels"))
    assert len(calls) == 3


def test_n_hard_negatives_zero_on_a_space_where_they_are_used(pixels_prep):
    from retrieval.lftr.batches import TrainBatches
    from retrieval.lftr.data import mine_hard_negatives
    from retrieval.lftr.losses import LFTRLoss
    from retrieval.lftr.model import LFTR

    cfg, prep = pixels_prep
    rows = prep.data.rows("train")
    dims = (prep.data.prefix.shape[-1], prep.data.items.shape[1], prep.data.question.shape[1])
    losses = {}
    for n in (0, 16):
        c = cfg.with_overrides({"n_hard_negatives": n})
        hard = mine_hard_negatives(prep.data, rows, c.n_hard_candidates, None, progress=False) if n else None
        tr = TrainBatches(c, prep.data, hard, rows, "cpu")
        assert (tr.hard_nb is None) == (n == 0) and not tr.full_softmax
        torch.manual_seed(0)
        model = LFTR(c, *dims)
        gen = torch.Generator().manual_seed(0)
        b = tr.batch(rows[:64], gen)
        assert (b.hard is None) == (n == 0)
        torch.manual_seed(1)
        losses[n] = LFTRLoss(model, tr, c)(b, gen)[1]["nce"]
    assert losses[16] > losses[0]  # more (and harder) candidates in the softmax


def _near_tied(prep, rows, vec) -> np.ndarray:
    """Per query: does a negative score within float32 rounding of the best positive's without being equal to it?
    Scores are exact enough in float64; a float32 product of ``d`` terms errs by ~``sqrt(d) u |v| |x|`` (``u =
    2^-24``; rounding errors add up like a random walk, whatever the summation order), so two scorers may order a
    negative and the best positive differently only when their float64 scores are that close (taken 8x, both
    scorers' errors, with margin). A state space's equal scores are exact in both: one item's score, expanded."""
    bench, space = prep.bench, prep.target
    pos = bench.gt_rows([bench.query(int(r)) for r in rows], "type2-all")
    video = np.asarray(bench.corpus_ds["video_id"][:])
    q_video = np.asarray(bench.queries_ds["video_id"][:])[rows]
    items = space.items.astype(np.float64)
    x_norm = np.linalg.norm(items, axis=1).max()
    out = np.zeros(len(rows), bool)
    for i, p in enumerate(pos):
        if not len(p):
            continue
        v = vec[i].astype(np.float64)
        s = (v @ items.T).max(0)
        s = s if space.item_rows is None else s[space.item_rows]
        t = s[p].max()
        neg = np.ones(len(s), bool)
        neg[p] = False
        neg &= video != q_video[i]
        gap = np.abs(s[neg] - t)
        bound = 8 * np.sqrt(items.shape[1]) * 2.0 ** -24 * np.linalg.norm(v, axis=1).max() * x_norm
        out[i] = bool(((gap > 0) & (gap <= bound)).any())
    return out


def test_torch_validation_equals_the_streaming_scorer(synth_sem_dir, tmp_path):
    """The torch validation scorer and eval's streaming scorer count the same ranks: exactly, on every query whose
    best positive is not within float rounding of a negative (those are the only ones two matmul paths may rank
    differently on another CPU or thread count), and within one item elsewhere on the few near-tied queries."""
    from retrieval.lftr.model import LFTR
    from retrieval.lftr.predict import main_pool_stats, step_vectors, torch_main_pool_stats
    from retrieval.lftr.train import prepare

    bench = Benchmark.load(synth_sem_dir)
    keys = ("n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")
    for space in ("pixels", "minilm"):
        cfg = _cfg(target_space=space)
        prep = prepare(bench, cfg, tmp_path, "cpu")
        torch.manual_seed(0)
        model = LFTR(cfg, prep.data.prefix.shape[-1], prep.data.items.shape[1], prep.data.question.shape[1])
        rows = prep.data.rows("val")
        vec = step_vectors(model, prep, rows)
        a = main_pool_stats(prep, rows, vec)
        b = torch_main_pool_stats(prep, rows, vec, chunk=7)
        assert np.array_equal(a["n_pos"], b["n_pos"])
        near = _near_tied(prep, rows, vec)
        assert near.mean() < 0.25, (space, near.mean())  # the comparison covers most queries
        for k in keys:
            assert np.array_equal(np.asarray(a[k])[~near], np.asarray(b[k])[~near]), (space, k)
        if space == "minilm":  # a state space: the positives share the target state's one score, in both scorers
            assert np.array_equal(np.asarray(a["n_tie_pos"])[~near], a["n_pos"][~near])


def test_validation_cut_scores_fewer_samples_for_the_same_recall(synth_sem_dir, tmp_path):
    """Validation wants only R@val_k: a query stops being scored once ``val_k`` negatives certainly beat its best
    positive. Every query it drops has R@k 0 in the full counts too (no exception: the bound holds for any
    rounding); the others get the full counts, so per-query R@k is the same, and the validation R@k with it.
    An untrained head misses most queries, so most are dropped early. In a semantic space the negatives above the
    best positive are counted from the state scores (the same numbers: the expansion is a gather), so its kept
    queries' counts are bit for bit the full ones."""
    from retrieval.lftr.model import LFTR
    from retrieval.lftr.predict import recall_at_k, recall_at_k_per_query, step_vectors, torch_main_pool_stats
    from retrieval.lftr.train import prepare

    bench = Benchmark.load(synth_sem_dir)
    keys = ("n_pos", "n_above", "n_tie_neg", "n_tie_pos", "n_tie_neg_first")
    for space in ("pixels", "minilm"):
        cfg = _cfg(target_space=space, n_samples=8)
        prep = prepare(bench, cfg, tmp_path, "cpu")
        torch.manual_seed(0)
        model = LFTR(cfg, prep.data.prefix.shape[-1], prep.data.items.shape[1], prep.data.question.shape[1])
        rows = prep.data.rows("val")
        vec = step_vectors(model, prep, rows)
        full = torch_main_pool_stats(prep, rows, vec, chunk=7)
        near = _near_tied(prep, rows, vec)
        for k in (1, 5, 20):
            part = torch_main_pool_stats(prep, rows, vec, chunk=7, cut=k)
            dropped = (part["n_above"] == k) & (part["n_tie_neg"] == 0) & (part["n_tie_pos"] == 0) & (full["n_pos"] > 0)
            assert (full["n_above"][dropped] >= k).all(), (k, "a dropped query could have been a hit")
            if space == "minilm":  # dropped exactly where the full counts have k or more above
                assert np.array_equal(dropped, (full["n_above"] >= k) & (full["n_pos"] > 0)), k
                assert all(np.array_equal(full[f][~dropped], part[f][~dropped]) for f in keys), k
                assert recall_at_k(full, k) == recall_at_k(part, k)
                if k == 5:
                    assert dropped.mean() > 0.5, dropped.mean()
                continue
            # the kept queries' products cover fewer rows than the full chunk's: the same counts, up to rounding
            kept = ~dropped & ~near
            assert all(np.array_equal(full[f][kept], part[f][kept]) for f in keys), k
            a, b = recall_at_k_per_query(full, k), recall_at_k_per_query(part, k)
            assert np.array_equal(np.nan_to_num(a, nan=-1)[~near], np.nan_to_num(b, nan=-1)[~near])
            if not near.any():
                assert recall_at_k(full, k) == recall_at_k(part, k)
            if k == 5:
                assert dropped.mean() > 0.5, dropped.mean()
    with pytest.raises(Exception, match="cut"):
        torch_main_pool_stats(prep, rows, vec, cut=0)


def test_intermediate_states_and_grounding_switches(pixels_prep):
    from retrieval.lftr.batches import TrainBatches
    from retrieval.lftr.losses import LFTRLoss
    from retrieval.lftr.model import LFTR

    cfg, prep = pixels_prep
    data, bench = prep.data, prep.bench
    # the states a query's object passes through: its segments after the prefix and before the target
    n_inter = np.diff(data.inter_ptr)
    single = np.asarray([q == "Q1" for q in bench.queries_ds["qtype"][:]])
    assert (n_inter[single] == 0).all()  # next state: nothing in between
    ok = n_inter == data.horizon - 1
    assert ok.mean() > 0.95, ok.mean()  # horizon = index in the object's future trajectory
    r = int(np.flatnonzero((n_inter >= 2) & ok)[0])
    q = bench.query(r)
    segs = [s for s in bench.segments() if s.video_id == q.video_id and s.object_id == q.object_id
            and q.prefix_end < s.start < q.target_time]
    assert [bench.state_index[s.state_id] for s in sorted(segs, key=lambda s: s.start)] == \
        data.inter_state[data.inter_ptr[r]:data.inter_ptr[r + 1]].tolist()
    rows = data.rows("train")[:64]
    dims = (data.prefix.shape[-1], data.items.shape[1], data.question.shape[1])
    proto = TrainBatches(cfg.with_overrides({"grounding_target": "prototype"}), data, None, rows, "cpu")
    assert np.allclose(proto.ground[rows].numpy(), data.state_proto[data.target_state[rows]])
    cen = TrainBatches(cfg, data, None, rows, "cpu")
    assert np.allclose(cen.ground[rows].numpy(), data.centroid[rows])
    inter = TrainBatches(cfg.with_overrides({"intermediate_weight": 0.5}), data, None, rows, "cpu")
    torch.manual_seed(0)
    model = LFTR(cfg, *dims)
    gen = torch.Generator().manual_seed(0)
    loss, parts = LFTRLoss(model, inter, inter.cfg)(inter.batch(rows, gen), gen)
    assert parts["inter"] > 0 and torch.isfinite(loss)


@pytest.mark.slow
def test_calibrated_read_uses_the_validation_step_map(synth_sem_dir, tmp_path):
    import json

    from retrieval.lftr.predict import predict_query_vectors, step_vectors, validation_recall
    from retrieval.lftr.train import load_checkpoint, prepare, train

    bench = Benchmark.load(synth_sem_dir)
    train(bench, _cfg(epochs=2), tmp_path, validate=validation_recall, progress=False, log=lambda s: None)
    model, cfg, _ = load_checkpoint(tmp_path)
    prep = prepare(bench, cfg, tmp_path, "cpu")
    rows = prep.data.rows("test")
    vec = predict_query_vectors(model, prep, rows, rule="calibrated", ckpt_dir=tmp_path).vectors
    cal = json.loads((tmp_path / "calibration.json").read_text())
    steps = {int(h): t for h, t in cal["steps"].items()}
    assert set(steps) == set(np.unique(prep.data.horizon[prep.data.rows("val")]).tolist())
    for h, t in steps.items():  # the chosen step has the best validation recall of its horizon
        assert cal["val_recall_by_step"][str(h)][t] == max(cal["val_recall_by_step"][str(h)])
    all_steps = step_vectors(model, prep, rows, steps="all")
    matched = np.minimum(prep.data.horizon[rows], cfg.rollout_depth) - 1
    want = np.asarray([steps.get(int(h), int(m)) for h, m in zip(prep.data.horizon[rows], matched, strict=True)])
    assert np.allclose(vec, all_steps[np.arange(len(rows)), want], atol=1e-6)


@pytest.mark.slow
def test_lora_baseline_trains_only_adapters_and_its_frozen_control_is_plain_lftr(synth_towers_dir, tmp_path):
    from eval.metrics import RankStats, recall_at_k
    from eval.runs import read_run
    from retrieval.lftr.jobs import predict_run
    from retrieval.lftr.predict import validation_recall
    from retrieval.lftr.train import prepare, train
    from retrieval.lora import LoRAConfig, LoRAPrefixEncoder, run_lora_baseline

    d, towers = synth_towers_dir
    bench = Benchmark.load(d)
    cfg = _cfg(target_space="ssl", prefix_space="ssl", batch_size=64, epochs=1)
    # at initialisation (LoRA B = 0) the adapted encoder reproduces the stored prefix table
    prep = prepare(bench, cfg, tmp_path / "p", "cpu")
    enc = LoRAPrefixEncoder(prep, "cpu", LoRAConfig(with_out=True))
    trainable = [n for n, p in enc.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable if "lora_A" in n} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    enc.module.eval()
    with torch.no_grad():
        tok = enc.tokens(torch.arange(5)).numpy()
    assert np.allclose(tok, prep.data.prefix[:5], atol=1e-5)

    res = run_lora_baseline(bench, cfg, LoRAConfig(), tmp_path / "lora", log=lambda s: None, progress=False,
                            resamples=200)
    # only adapters trained: every base weight of the tower equals the saved tower
    from transformers import AutoModel

    base = AutoModel.from_pretrained(str(towers["ssl"])).state_dict()
    ck = torch.load(tmp_path / "lora" / "lora" / "last.pt", weights_only=False)
    adapted = ck["adapter"]
    lora_keys = [k for k in adapted if "lora_" in k]
    assert lora_keys and any(float(adapted[k].abs().sum()) > 0 for k in lora_keys if "lora_B" in k)
    for k, v in adapted.items():
        if "lora_" not in k:
            name = k.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(v, base[name]), k
    # the frozen control reproduces plain LFTR: same seed, same data, same number
    train(bench, cfg, tmp_path / "plain", validate=validation_recall, progress=False, log=lambda s: None)
    plain = predict_run(bench, tmp_path / "plain", tmp_path / "plain.parquet", progress=False)
    frozen = read_run(tmp_path / "lora" / "frozen" / "run.parquet")
    r = lambda run: recall_at_k(RankStats.from_run(run, "type2-all"), 5)  # noqa: E731
    assert np.array_equal(r(plain), r(frozen), equal_nan=True)
    c = res["comparison"]
    assert c["n"] > 0 and 0 <= c["bootstrap"]["p_value"] <= 1 and c["cost_ratio"] > 1
    assert res["frozen"]["R@5"] == pytest.approx(np.nanmean(r(frozen)))
    assert (tmp_path / "lora" / "comparison.md").read_text().startswith("| run | R@5")


@pytest.mark.slow
def test_complementarity_of_runs(synth_demo_out, synth_sem_dir, tmp_path):
    from typer.testing import CliRunner

    from eval.evaluate import Population
    from eval.runs import read_run
    from eval.schema import MAIN_QTYPES
    from retrieval.cli import app
    from retrieval.complementarity import complementarity, run_hits

    bench = Benchmark.load(synth_sem_dir)
    paths = {n: synth_demo_out / f"{n}.parquet" for n in ("lftr-minilm", "lftr-pixels")}
    res = complementarity(bench, paths, fused=synth_demo_out / "lftr-fusion-minilm+pixels.parquet")
    h = {n: run_hits(read_run(p)) for n, p in paths.items()}
    every = set(h["lftr-minilm"]) & set(h["lftr-pixels"])
    # the main table's population (fair test queries of Q1-Q4), not every query with a GT: Q5 is left out
    qtype = dict(zip(bench.queries_ds["id"][:], bench.queries_ds["qtype"][:], strict=True))
    assert any(qtype[q] not in MAIN_QTYPES for q in every)
    common = sorted(every & set(Population().query_ids(bench)))
    assert common and all(qtype[q] in MAIN_QTYPES for q in common)
    assert complementarity(bench, paths, population=None)["queries"] == len(every) > len(common)
    a = np.asarray([h["lftr-minilm"][q] for q in common])
    b = np.asarray([h["lftr-pixels"][q] for q in common])
    assert res["queries"] == len(common) and res["spaces"] == {"lftr-minilm": "minilm", "lftr-pixels": "pixels"}
    assert res["union"] == pytest.approx((1 - (1 - a) * (1 - b)).mean()) and res["union"] >= max(res["recall"].values())
    assert res["only"]["lftr-minilm"] == pytest.approx((a * (1 - b)).mean())
    assert res["recall"]["lftr-minilm"] == pytest.approx(a.mean())
    assert sum(res["pairs"]["lftr-minilm~lftr-pixels"].values()) == pytest.approx(1.0)
    ss = res["state_similarity"]
    assert ss["states"] > 10 and -1 <= ss["r"]["minilm~pixels"] <= 1
    out = CliRunner().invoke(app, ["complementarity", "--data", str(synth_sem_dir), "--run", str(paths["lftr-minilm"]),
                                   "--run", str(paths["lftr-pixels"]), "--out", str(tmp_path / "c")])
    assert out.exit_code == 0, out.output
    assert "union (any space right)" in (tmp_path / "c" / "complementarity.md").read_text()
    twice = CliRunner().invoke(app, ["complementarity", "--data", str(synth_sem_dir), "--run",
                                     str(paths["lftr-minilm"]), "--run", str(paths["lftr-minilm"]), "--out",
                                     str(tmp_path / "c2")])
    assert twice.exit_code != 0 and "same name 'lftr-minilm'" in twice.output + str(twice.exception)
    g = res["geometry"]
    assert set(g) == {"minilm", "pixels"} and g["pixels"]["kind"] == "visual" and g["minilm"]["kind"] == "semantic"
    assert all(1 <= v["effective_dim"] <= v["dim"] for v in g.values())


def test_geometry_effective_dimension_and_anisotropy():
    from retrieval.complementarity import geometry

    rng = np.random.default_rng(0)
    iso = geometry(rng.standard_normal((20_000, 8)))  # isotropic around the origin: d directions, no common one
    assert iso["effective_dim"] == pytest.approx(8, rel=0.02) and abs(iso["anisotropy"]) < 0.1
    line = np.outer(rng.standard_normal(500), np.ones(8))  # every item on one line: one direction
    assert geometry(line)["effective_dim"] == pytest.approx(1.0)
    offset = np.array([10.0, 0, 0, 0]) + 0.1 * rng.standard_normal((1000, 4))  # all point one way
    g = geometry(offset)
    assert g["effective_dim"] == pytest.approx(4, rel=0.05) and g["anisotropy"] > 0.99  # the spread spans 4 dims
    two = np.diag([3.0, 1.0]) @ rng.standard_normal((2, 50_000))  # variances 9 and 1: (9 + 1)^2 / (81 + 1)
    assert geometry(two.T)["effective_dim"] == pytest.approx(100 / 82, rel=0.02)
    with pytest.raises(ValueError, match="two items"):
        geometry(np.ones((1, 3)))


def test_state_similarity_of_a_space_with_itself_is_one(synth_sem_dir, tmp_path):
    import shutil

    from retrieval.complementarity import state_similarity_correlation

    d = shutil.copytree(synth_sem_dir, tmp_path / "b", ignore=shutil.ignore_patterns(".cache"))
    shutil.copytree(d / "features" / "pixels", d / "features" / "pixels-twin")
    res = state_similarity_correlation(Benchmark.load(d), ["pixels", "pixels-twin", "minilm"])
    assert res["r"]["pixels~pixels-twin"] == pytest.approx(1.0)
    assert res["r"]["pixels~minilm"] < 0.99
