"""Learned image towers: the SSL encoder (pixels only), the LiT tower (locked text side), encode round trips."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from retrieval_tiny_bench import TINY_TOWER

from eval.benchmark import Benchmark


def _tower_weights(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path)).state_dict()


def _ssl(bench, out, *extra):
    from retrieval.ssl import SSLConfig, train_ssl
    from retrieval.towers import load_dataclass

    cfg = load_dataclass(SSLConfig, [], TINY_TOWER + ["optim.epochs=1", "max_frames=64", *extra])
    return train_ssl(bench, cfg, out, log=lambda s: None, progress=False)


def test_ssl_frames_are_the_train_split_only(synth_bench):
    from retrieval.towers import split_videos, train_frames

    frames = train_frames(synth_bench)
    train = split_videos(synth_bench, "train")
    # views (frames/<video_id>/fNNNN.jpg, object box): the object window of a train video's frame, never another's
    assert frames and all(path.split("/")[1] in train for path, _ in frames)
    assert all(box is not None and len(box) == 4 for _, box in frames)
    for other in ("val", "test"):
        assert not set(train_frames(synth_bench, other)) & set(frames)


@pytest.mark.slow
def test_ssl_objective_never_sees_labels_or_text(synth_dir, tmp_path):
    """Shuffling every state label, description, question and subject of the benchmark must not change one bit
    of the trained weights (it would if any of them reached the objective); another seed does change them."""
    poisoned = shutil.copytree(synth_dir, tmp_path / "poisoned", ignore=shutil.ignore_patterns("sim", ".cache"))
    rng = np.random.default_rng(0)
    corpus = [json.loads(x) for x in (poisoned / "corpus.jsonl").read_text().splitlines()]
    perm = rng.permutation(len(corpus))
    fields = ("state", "state_id", "state_type1", "raw", "subject")
    shuffled = [{**c, **{f: corpus[p][f] for f in fields}} for c, p in zip(corpus, perm, strict=True)]
    (poisoned / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in shuffled))
    queries = [json.loads(x) for x in (poisoned / "queries.jsonl").read_text().splitlines()]
    for q in queries:
        q["question"] = "what is " + q["question"][::-1]
        q["target_state"] = "poisoned"
    (poisoned / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    a = _ssl(Benchmark.load(synth_dir), tmp_path / "a")
    b = _ssl(Benchmark.load(poisoned), tmp_path / "b")
    assert a["frames_fingerprint"] == b["frames_fingerprint"]
    wa, wb = _tower_weights(tmp_path / "a"), _tower_weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # deterministic, and blind to labels and text
    _ssl(Benchmark.load(synth_dir), tmp_path / "c", "optim.seed=1")
    wc = _tower_weights(tmp_path / "c")
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_ssl_tower_is_reused_resumed_and_guards_foreign_folders(synth_bench, tmp_path):
    from eval.errors import OutputRefused

    logs: list[str] = []
    from retrieval.ssl import SSLConfig, train_ssl
    from retrieval.towers import load_dataclass

    cfg = load_dataclass(SSLConfig, [], TINY_TOWER + ["optim.epochs=2", "max_frames=64"])
    part = train_ssl(synth_bench, cfg, tmp_path / "t", log=logs.append, progress=False, stop_after=1)
    assert part["finished"] is False and not (tmp_path / "t" / "config.json").exists()
    done = train_ssl(synth_bench, cfg, tmp_path / "t", log=logs.append, progress=False)
    assert done["finished"] and any("resumed" in s for s in logs)
    train_ssl(synth_bench, cfg, tmp_path / "full", log=lambda s: None, progress=False)
    wa, wb = _tower_weights(tmp_path / "t"), _tower_weights(tmp_path / "full")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)  # resume == uninterrupted
    again = train_ssl(synth_bench, cfg, tmp_path / "t", log=logs.append, progress=False)
    assert again["training_hash"] == done["training_hash"] and "reusing" in logs[-1]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(OutputRefused):
        train_ssl(synth_bench, cfg, tmp_path / "mine", log=lambda s: None, progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.fixture(scope="module")
def tower_world(tmp_path_factory):
    """A towers' pretraining world: a 4-video simulator-truth build (step 1 only) of the seed the demo's towers use
    beside a seed-0 benchmark (`retrieval.towers.pretraining_world_seed`)."""
    from eval.synth import build_benchmark
    from retrieval.towers import pretraining_world_seed

    out = tmp_path_factory.mktemp("tower-world") / "world"
    return Benchmark.load(build_benchmark(out, videos=4, seed=pretraining_world_seed(0), progress=False))


def test_towers_pretrain_on_a_disjoint_world_and_the_guard_refuses_the_benchmark(synth_bench, tower_world, tmp_path):
    """`split=all` trains on every frame of the world and records which videos (and seed) it read; `check_disjoint`
    passes a world tower for the benchmark, and refuses it for the world itself, a tower trained on the benchmark's
    own train split (transductive), a LiT tower started from such a tower, and a record that lists no videos."""
    from eval.errors import InputError
    from eval.images import prefix_views, segment_views
    from retrieval.encoders import PACKAGED_MINILM, TextEncoder
    from retrieval.lit import LiTConfig, train_lit
    from retrieval.towers import (
        TRAIN_RECORD,
        check_disjoint,
        load_dataclass,
        pretraining_world_seed,
        split_videos,
        train_frames,
    )

    views = set(segment_views(tower_world)) | {v for fr in prefix_views(tower_world)[1] for v in fr}
    assert set(train_frames(tower_world, "all")) == views  # every corpus and prefix view of every video
    rec = _ssl(tower_world, tmp_path / "ssl", "split=all", "max_frames=0")
    data = rec["data"]
    assert rec["frames"] == len(views) and data["split"] == "all" and data["seed"] == pretraining_world_seed(0)
    assert set(data["video_ids"]) == split_videos(tower_world, "all") and data["n_videos"] == 4
    assert check_disjoint(tmp_path / "ssl", synth_bench)["shared"] == 0
    with pytest.raises(InputError, match="trained on 4 of the 4 videos"):
        check_disjoint(tmp_path / "ssl", tower_world)

    _ssl(synth_bench, tmp_path / "transductive")  # the benchmark's own train split
    n_train = len(split_videos(synth_bench, "train"))
    with pytest.raises(InputError, match=f"trained on {n_train} of the"):
        check_disjoint(tmp_path / "transductive", synth_bench)
    enc = TextEncoder(PACKAGED_MINILM)
    for init, name in ((tmp_path / "ssl", "lit-ok"), (tmp_path / "transductive", "lit-leaky")):
        cfg = load_dataclass(LiTConfig, [], TINY_TOWER + ["optim.epochs=1", "max_pairs=32", "split=all"],
                             init=str(init))
        train_lit(tower_world, cfg, tmp_path / name, log=lambda s: None, progress=False, text_encoder=enc)
    assert check_disjoint(tmp_path / "lit-ok", synth_bench)["tower_videos"] == 4
    with pytest.raises(InputError, match=f"trained on {n_train} of the"):
        check_disjoint(tmp_path / "lit-leaky", synth_bench)  # its image tower started from the transductive one

    record = json.loads((tmp_path / "ssl" / TRAIN_RECORD).read_text())
    del record["data"]  # a tower of a toolkit that did not record its data
    (tmp_path / "ssl" / TRAIN_RECORD).write_text(json.dumps(record))
    with pytest.raises(InputError, match="does not list the videos"):
        check_disjoint(tmp_path / "ssl", synth_bench)


def test_vicreg_and_barlow_terms_on_known_batches():
    """A collapsed batch pays the full variance hinge (VICReg) and misses Barlow's unit diagonal; decorrelated
    unit-variance views that agree pay (almost) nothing; correlated dimensions pay the covariance term."""
    from retrieval.ssl import SSLConfig, barlow_loss, variance_covariance, vicreg_loss

    g = torch.Generator().manual_seed(0)
    white = torch.randn(4096, 8, generator=g)
    v, c = variance_covariance(torch.ones(64, 8))
    assert v.item() == pytest.approx(1 - 1e-2, abs=1e-6) and c.item() == 0.0
    v, c = variance_covariance(white)
    assert v.item() < 0.03 and c.item() < 0.01
    _, c_corr = variance_covariance(torch.cat([white[:, :4], white[:, :4]], 1))
    assert c_corr.item() == pytest.approx(1.0, abs=0.1)  # 8 off-diagonal pairs of covariance ~1, divided by d = 8
    cfg = SSLConfig()
    loss, parts = vicreg_loss([white, white], cfg)
    assert parts["inv"] == 0.0 and loss.item() < 1.0
    collapsed, _ = vicreg_loss([torch.ones(64, 8), torch.ones(64, 8)], cfg)
    assert collapsed.item() == pytest.approx(cfg.var_weight * (1 - 1e-2), rel=1e-4)
    agree, _ = barlow_loss([white, white], cfg)
    noise, _ = barlow_loss([white, torch.randn(4096, 8, generator=g)], cfg)
    assert agree.item() < 0.05 and noise.item() > 7.0  # the diagonal sum of (1 - C_ii)^2 is ~8 for unrelated views


def _encoded_geometry(tower, bench: Benchmark) -> dict:
    """Effective dimension and anisotropy of the corpus frames as the saved tower encodes them (a space's items)."""
    from eval.images import load_view, segment_views
    from retrieval.complementarity import geometry
    from retrieval.encoders import ImageEncoder

    images = [load_view(bench.root / path, box) for path, box in segment_views(bench)]
    return geometry(ImageEncoder(str(tower), device="cpu").encode_images(images, progress=False))


@pytest.mark.slow
def test_ssl_space_is_not_collapsed(synth_bench, tmp_path):
    """A tower trained for a few steps stores a space, not a few directions around a common offset: the encoded
    corpus frames reach an effective dimension of at least a quarter of the width and point in no common direction.
    Without the centring and whitening folded into the pooler the same tower stores ~2 of 32 dimensions around a
    common offset (anisotropy ~0.8)."""
    from retrieval.towers import TRAIN_RECORD

    rec = _ssl(synth_bench, tmp_path / "ssl", "optim.epochs=2", "max_frames=256")
    width = rec["config"]["tower"]["out_dim"]
    g = _encoded_geometry(tmp_path / "ssl", synth_bench)
    assert g["effective_dim"] >= 0.25 * width and g["anisotropy"] < 0.3, g
    std = json.loads((tmp_path / "ssl" / TRAIN_RECORD).read_text())["standardized"]
    assert std["effective_dim_after"] > 2 * std["effective_dim_before"]
    raw = _ssl(synth_bench, tmp_path / "raw", "optim.epochs=2", "max_frames=256", "center=false")
    assert raw["standardized"] is None and raw["centred_by"] is None
    assert _encoded_geometry(tmp_path / "raw", synth_bench)["effective_dim"] < g["effective_dim"]


def test_standardized_pooler_centres_and_whitens_the_training_frames():
    """`standardize_pooler` folds mean and ZCA map into the linear pooler: the training frames' outputs have mean 0
    and covariance eigenvalues l / (l + floor * max l) (at most 1), for any tower."""
    from retrieval.ssl import SSLConfig, pooler_outputs, standardize_pooler
    from retrieval.towers import build_vit, load_dataclass

    cfg = load_dataclass(SSLConfig, [], TINY_TOWER)
    torch.manual_seed(0)
    tower = build_vit(cfg.tower)
    frames = torch.randint(0, 256, (300, 3, 36, 48), dtype=torch.uint8)
    before = pooler_outputs(tower, frames, cfg)
    lam = torch.linalg.eigvalsh(torch.cov(before.T)).clamp(min=0)
    out = standardize_pooler(tower, frames, cfg)
    after = pooler_outputs(tower, frames, cfg)
    assert after.mean(0).abs().max().item() < 1e-3
    expect = lam / (lam + cfg.whiten * lam.max())
    assert torch.allclose(torch.linalg.eigvalsh(torch.cov(after.T)), expect, atol=1e-3)
    assert out["mean_norm"] == pytest.approx(float(before.mean(0).norm()))


@pytest.mark.slow
def test_ssl_tower_round_trips_through_encode(synth_towers_dir):
    """The stored `ssl` features equal the saved tower's own forward on the processed object window (AutoModel +
    AutoImageProcessor, pooler_output, L2-normalised): the tower loads like any hub encoder."""
    from transformers import AutoImageProcessor, AutoModel

    from eval.features import load_table, read_meta
    from eval.images import load_view, segment_views

    d, towers = synth_towers_dir
    bench = Benchmark.load(d)
    meta = read_meta(d, "ssl")
    assert meta["kind"] == "visual" and meta["encoder"] == "vit" and meta["text_tower"] is False
    model, proc = AutoModel.from_pretrained(str(towers["ssl"])).eval(), AutoImageProcessor.from_pretrained(str(towers["ssl"]))
    table = load_table(d, "ssl", "corpus")
    rows = [0, 7, len(bench.corpus_ids) - 1]
    with torch.no_grad():
        views = segment_views(bench)  # the object window the tower saw at encode time (--crop auto)
        pv = proc(images=[load_view(bench.path(views[r][0]), views[r][1]) for r in rows], return_tensors="pt")
        direct = torch.nn.functional.normalize(model(**pv).pooler_output, dim=-1).numpy()
    # encode's batches and this forward of 3 images take other float32 kernels: on an AVX2-only CPU they differ by
    # up to ~3e-5 through the ViT's layers (1e-5 held on an AVX-512 Xeon); another tower or processor differs by ~0.1
    assert np.allclose(table.array[rows], direct, atol=2e-4)
    assert load_table(d, "ssl", "prefixes").array.shape[1:] == (8, 32)


@pytest.mark.slow
def test_lit_text_tower_stays_locked(synth_towers_dir, tmp_path):
    """The text model's parameters are bitwise unchanged by training, none of them is optimised, and the image
    tower learns: after training, a description ranks its own frame above chance."""
    from retrieval.encoders import PACKAGED_MINILM, TextEncoder
    from retrieval.lit import LiTConfig, train_lit
    from retrieval.towers import load_dataclass

    d, _ = synth_towers_dir
    enc = TextEncoder(PACKAGED_MINILM)
    before = {k: v.clone() for k, v in enc.model.state_dict().items()}
    seen: list[set[int]] = []
    orig = torch.optim.AdamW.__init__

    def spy(self, params, *a, **kw):
        params = list(params)
        seen.append({id(p) for p in params})
        orig(self, params, *a, **kw)

    torch.optim.AdamW.__init__ = spy
    try:
        cfg = load_dataclass(LiTConfig, [], TINY_TOWER + ["optim.epochs=3", "max_pairs=96", "optim.lr=3e-3"])
        rec = train_lit(Benchmark.load(d), cfg, tmp_path / "lit", log=lambda s: None, progress=False, text_encoder=enc)
    finally:
        torch.optim.AdamW.__init__ = orig
    after = enc.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    text_ids = {id(p) for p in enc.model.parameters()}
    assert seen and not (seen[0] & text_ids)
    losses = [h["loss"] for h in rec["history"]]
    assert losses[-1] < losses[0]
    assert json.loads((tmp_path / "lit" / "psr_text_tower.json").read_text())["text_model"] == PACKAGED_MINILM


@pytest.mark.slow
def test_lit_space_plugs_into_text_to_image_search(synth_towers_dir, tmp_path):
    """`encode` records the locked text model; phrases and oracle texts are embedded by it (the packaged MiniLM,
    the same vectors as the semantic space's queries) and ranked against the LiT frame features."""
    from typer.testing import CliRunner

    from eval.features import read_meta
    from eval.runs import read_run
    from retrieval.cli import app
    from retrieval.encoders import PACKAGED_MINILM, TextEncoder, query_text_encoder
    from retrieval.queries import load_query_vectors, sidecar_path

    d, _ = synth_towers_dir
    meta = read_meta(d, "lit")
    assert meta["text_tower"] and meta["text_model"] == PACKAGED_MINILM and meta["dim"] == 384
    enc = query_text_encoder(meta)
    assert isinstance(enc, TextEncoder)
    bench = Benchmark.load(d)
    q = bench.query_ids[int(bench.query_rows("test")[0])]
    (tmp_path / "p.jsonl").write_text(json.dumps({"query_id": q, "phrase": "falling off the table"}) + "\n")
    res = CliRunner().invoke(app, ["search", "--data", str(d), "--phrases", str(tmp_path / "p.jsonl"), "--space",
                                   "lit", "--out", str(tmp_path / "lit.parquet")])
    assert res.exit_code == 0, res.output
    qv = load_query_vectors(sidecar_path(tmp_path / "lit.parquet"))
    assert np.allclose(qv.vectors[qv.query_ids.index(q), 0], enc.encode_queries(["falling off the table"])[0],
                       atol=1e-5)
    res = CliRunner().invoke(app, ["oracle", "semantic-text", "--data", str(d), "--space", "lit", "--out",
                                   str(tmp_path / "oracle.parquet")])
    assert res.exit_code == 0, res.output
    assert read_run(tmp_path / "oracle.parquet").n == len(bench.query_rows("test"))
    # the space's geometry names the text model it maps into, as the semantic space of that model names its own
    from retrieval.complementarity import space_geometry

    geo = {s: space_geometry(bench, s) for s in ("lit", "minilm", "ssl")}
    assert geo["lit"]["text_model"] == geo["minilm"]["text_model"] == PACKAGED_MINILM and "text_model" not in geo["ssl"]


def test_lit_loss_masks_shared_frames_and_texts():
    from retrieval.lit import lit_loss

    v = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    t = v.clone()
    t[1] = t[0]  # pairs 0 and 1 share a description
    frame_ids, text_ids = torch.tensor([0, 1, 2, 3]), torch.tensor([5, 5, 6, 7])
    masked = lit_loss(v, t, torch.tensor(50.0), frame_ids, text_ids)
    # pair 1's image is not a negative of pair 0's text (same text): removing pair 1 leaves pair 0's terms unchanged
    keep = [0, 2, 3]
    sub = lit_loss(v[keep], t[keep], torch.tensor(50.0), frame_ids[keep], text_ids[keep])
    assert masked.item() < lit_loss(v, t, torch.tensor(50.0), torch.arange(4), torch.arange(4)).item()
    assert sub.item() == pytest.approx(lit_loss(v[keep], t[keep], torch.tensor(50.0), torch.arange(3),
                                                torch.arange(3)).item())


@pytest.mark.slow
def test_demo_in_the_learned_spaces_with_fusion_and_complementarity(synth_towers_dir, tmp_path):
    """`retrieval demo --visual-space ssl --extra-space lit --compare-space pixels`: baselines and LFTR in the
    learned spaces, the LiT zero-shot oracle, the three-space fusion and the complementarity analysis; from the `sim`
    space, both perfect-perception forecasters (`lftr-sim` and the state classifier, whose run records its fit); from
    the perceiver's prefix space (`--perceived-space`), LFTR into the semantic space, outside the fusions."""
    import yaml

    from eval.runs import read_run
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.lftr.jobs import DemoPlan, main_recall, run_demo

    d, _ = synth_towers_dir
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"d_model": 32, "n_layers": 1, "n_heads": 2, "n_samples": 4, "epochs": 1,
                                   "batch_size": 64, "n_random_negatives": 64, "n_hard_negatives": 16, "threads": 1}))
    out = tmp_path / "runs"
    plan = DemoPlan(visual="ssl", extra=["lit"], compare="pixels", perceived="perceiver")
    paths = run_demo(Benchmark.load(d), out, text_model=PACKAGED_MINILM, plan=plan, configs=[cfg],
                     log=lambda s: None, progress=False)
    names = {p.name.removesuffix(".parquet") for p in paths}
    assert {"persistence", "lftr-ssl", "lftr-lit", "lftr-pixels", "persistence-pixels", "oracle-semantic-text-lit",
            "question-only-lit", "oracle-state-prototype-pixels", "lftr-fusion-minilm+ssl+lit+pixels",
            "lftr-sim-minilm", "state-classifier-sim", "lftr-perceiver-minilm"} <= names
    perceived = yaml.safe_load((out / "lftr-perceiver-minilm" / "config.yaml").read_text())
    assert (perceived["prefix_space"], perceived["target_space"]) == ("perceiver", "minilm")
    assert read_run(out / "lftr-perceiver-minilm.parquet").method == "lftr-perceiver[minilm]"
    assert not any("perceiver" in n for n in names if n.startswith("lftr-fusion"))
    classifier = read_run(out / "state-classifier-sim.parquet")
    assert classifier.method == "state-classifier-sim[minilm]" and classifier.config["fit"]["prefix_space"] == "sim"
    assert yaml.safe_load((out / "lftr-sim-minilm" / "config.yaml").read_text())["prefix_space"] == "sim"
    sel = json.loads((out / "fusion_selection.json").read_text())
    chosen = sel["chosen"]
    assert chosen in {"ssl", "lit", "pixels"} and f"lftr-fusion-minilm+{chosen}" in names
    assert chosen == max(sel["val_R@5"], key=sel["val_R@5"].get)
    # the headline is the better on validation of the chosen pair and the stack of every target space (fewer spaces
    # on a tie), and each was fused from the val runs, which the test split never enters
    fusions = sel["fusions_val_R@5"]
    assert set(fusions) == {f"minilm+{chosen}", "minilm+ssl+lit+pixels"}
    assert sel["headline"] == max(fusions, key=lambda f: (fusions[f], -f.count("+"))).split("+")
    for label, v in fusions.items():
        val_run = read_run(out / "val" / f"lftr-fusion-{label}.parquet")
        assert set(val_run.config["spaces"]) == set(label.split("+"))
        assert main_recall(Benchmark.load(d), val_run) == pytest.approx(v)
    assert set(sel["singles_val_R@5"]) == {"minilm", "ssl", "lit", "pixels"}
    assert all(p.exists() for p in paths)
    assert read_run(out / "lftr-fusion-minilm+ssl+lit+pixels.parquet").config["spaces"] == ["minilm", "ssl", "lit",
                                                                                           "pixels"]
    # the compare space is its own pipeline (pixels prefixes -> pixels corpus); the extra space reads the visual one
    trained = {n: yaml.safe_load((out / f"lftr-{n}" / "config.yaml").read_text()) for n in ("pixels", "lit", "ssl")}
    assert {n: c["prefix_space"] for n, c in trained.items()} == {"pixels": "pixels", "lit": "ssl", "ssl": "ssl"}
    comp = json.loads((out / "complementarity.json").read_text())
    assert set(comp["recall"]) == {"lftr-minilm", "lftr-ssl", "lftr-lit", "lftr-pixels"}
    # the perception probe reads every space holding prefix tokens, the perfect-perception one last
    probe = json.loads((out / "perception.json").read_text())
    assert [r["name"] for r in probe["rows"]] == ["majority", "box", "ssl", "lit", "pixels", "perceiver", "sim"]
    assert (out / "perception.md").exists()


@pytest.mark.slow
def test_demo_fuses_lftr_through_the_perceiver_on_a_target_chosen_on_validation(synth_towers_dir, tmp_path):
    """With a perceiver's prefix space the demo also trains LFTR from it into every visual target space (first seed,
    with validation runs), chooses the one whose fusion with its semantic head is best on validation, trains that one
    for the later seeds (queued in the running pool) and fuses each seed's pair; a second call redoes nothing."""
    import yaml

    from eval.runs import read_run
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.lftr.jobs import DemoPlan, main_recall, run_demo
    from retrieval.runs import fuse_runs

    d, _ = synth_towers_dir
    bench = Benchmark.load(d)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"d_model": 32, "n_layers": 1, "n_heads": 2, "n_samples": 4, "epochs": 1,
                                   "batch_size": 64, "n_random_negatives": 64, "n_hard_negatives": 16, "threads": 1}))
    out = tmp_path / "runs"
    plan = DemoPlan(visual="ssl", compare="pixels", perceived="perceiver", perfect="")
    logs: list[str] = []
    paths = run_demo(bench, out, text_model=PACKAGED_MINILM, plan=plan, configs=[cfg], seeds=[0, 1],
                     log=logs.append, progress=False, workers=2)
    sel = json.loads((out / "fusion_selection_perceiver.json").read_text())
    chosen = sel["chosen"]
    other = ({"ssl", "pixels"} - {chosen}).pop()
    assert set(sel["val_R@5"]) == {"ssl", "pixels"} and chosen == max(sel["val_R@5"], key=sel["val_R@5"].get)
    for n, v in sel["val_R@5"].items():  # fused from the validation runs, which the test split never enters
        assert main_recall(bench, read_run(out / "val" / f"lftr-perceiver-fusion-minilm+{n}.parquet")) == \
            pytest.approx(v)
    names = {p.name.removesuffix(".parquet") for p in paths}
    assert {f"lftr-perceiver-{chosen}-seed0", f"lftr-perceiver-{chosen}-seed1", f"lftr-perceiver-{other}-seed0",
            f"lftr-perceiver-fusion-minilm+{chosen}-seed0", f"lftr-perceiver-fusion-minilm+{chosen}-seed1"} <= names
    assert f"lftr-perceiver-{other}-seed1" not in names and not (out / f"lftr-perceiver-{other}-seed1").exists()
    late = yaml.safe_load((out / f"lftr-perceiver-{chosen}-seed1" / "config.yaml").read_text())
    assert (late["prefix_space"], late["target_space"], late["seed"]) == ("perceiver", chosen, 1)
    fused = read_run(out / f"lftr-perceiver-fusion-minilm+{chosen}-seed1.parquet")
    assert fused.method == f"lftr-perceiver-fusion[minilm+{chosen}]-seed1"
    pair = [out / "lftr-perceiver-minilm-seed1.parquet", out / f"lftr-perceiver-{chosen}-seed1.parquet"]
    again = fuse_runs(bench, pair, tmp_path / "again.parquet", method="again")
    assert again.topk_ids == fused.topk_ids
    np.testing.assert_array_equal(again.topk_scores, fused.topk_scores)
    assert any(m.startswith(f"lftr-perceiver-{chosen}-seed1/test: ") for m in logs)  # the pool ran it
    logs.clear()
    assert run_demo(bench, out, text_model=PACKAGED_MINILM, plan=plan, configs=[cfg], seeds=[0, 1], log=logs.append,
                    progress=False, workers=2) == paths
    assert not any("processes" in m or "chosen on validation" in m for m in logs)
