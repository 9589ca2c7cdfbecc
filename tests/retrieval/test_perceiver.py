"""The supervised perceiver: windows labelled by the simulator, training on a disjoint world, a prefix space."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from retrieval_tiny_bench import TINY_PERCEIVER

from eval.benchmark import Benchmark


def _train(bench, out, *extra, log=lambda s: None, **kw):
    from retrieval.perceiver import PerceiverConfig, train_perceiver
    from retrieval.towers import load_dataclass

    cfg = load_dataclass(PerceiverConfig, [], TINY_PERCEIVER + list(extra))
    return train_perceiver(bench, cfg, out, log=log, progress=False, **kw)


def test_windows_carry_the_simulators_state_of_their_object(perceiver_world, synth_bench):
    """Every corpus middle frame with its segment's `sim_state`, then every prefix's last frame with the state of the
    segment active at the prefix's end; a split keeps its own videos' windows; `max_windows` spaces a subset."""
    from eval.images import prefix_views, segment_views
    from retrieval.perceiver import labelled_windows
    from retrieval.perception import present_states

    w = perceiver_world
    win = labelled_windows(w)
    sims = w.corpus_ds["sim_state"][:]
    segs = [(v, s.split("|")) for v, s in zip(segment_views(w), sims, strict=True) if s]
    pres = present_states(w)
    last = {p: fr[-1] for p, fr in zip(*prefix_views(w), strict=True)}
    assert len(win.views) == len(segs) + len(pres.prefix_ids) and win.labels.shape == (len(win.views), 5)
    assert win.views[:len(segs)] == [v for v, _ in segs]
    assert win.labels[:len(segs)].tolist() == [lab for _, lab in segs]
    assert win.views[len(segs):] == [last[p] for p in pres.prefix_ids]
    assert win.labels[len(segs):].tolist() == pres.labels.tolist()

    assert len(labelled_windows(w, max_windows=7).views) == 7

    b = synth_bench  # a build with several splits
    train = labelled_windows(b, "train")
    vids = {v for v, s in zip(b.queries_ds["video_id"][:], b.queries_ds["split"][:], strict=True) if s == "train"}
    every = labelled_windows(b).views
    assert 0 < len(train.views) < len(every)
    assert train.views == [v for v in every if v[0].split("/")[1] in vids]  # frames/<video id>/<frame>


def test_a_build_without_simulator_truth_is_refused(tiny_bench):
    from eval.errors import InputError
    from retrieval.perceiver import labelled_windows

    with pytest.raises(InputError, match="sim_state"):
        labelled_windows(tiny_bench)


def test_training_lowers_the_loss_resumes_and_is_reused(perceiver_world, tmp_path):
    """A run stopped after one epoch is not finished and the same command resumes it; the finished perceiver records
    its data, vocabularies and training accuracy; the same config is reused without training; a foreign folder is
    refused."""
    from eval.errors import OutputRefused
    from retrieval.perceiver import labelled_windows
    from retrieval.towers import split_videos

    out = tmp_path / "p"
    part = _train(perceiver_world, out, "optim.epochs=6", stop_after=1)
    assert part == {"finished": False, "epochs_done": 1, "history": part["history"]}
    rec = _train(perceiver_world, out, "optim.epochs=6")
    assert rec["finished"] and [h["epoch"] for h in rec["history"]] == [1, 2, 3, 4, 5, 6]
    losses = [h["loss"] for h in rec["history"]]
    assert losses[-1] < losses[0]
    assert set(rec["data"]["video_ids"]) == split_videos(perceiver_world, "all")
    labels = labelled_windows(perceiver_world).labels
    assert rec["vocab"] == [sorted(set(labels[:, a])) for a in range(labels.shape[1])]
    assert rec["windows"] == len(labels)
    assert set(rec["train_accuracy"]) == {"motion", "place", "relation", "other", "pose"}
    said = []
    again = _train(perceiver_world, out, "optim.epochs=6", log=said.append)
    assert again["training_hash"] == rec["training_hash"] and "reusing" in said[0]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused):
        _train(perceiver_world, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.slow  # 4.9 s on its own (pytest --durations): 60 epochs
def test_it_learns_the_attributes_of_its_world(perceiver_world, tmp_path):
    """Trained long enough on its own windows, the perceiver reads each attribute better than its majority class
    (training accuracy: the test asks that it learns, not that it generalises)."""
    from retrieval.perceiver import labelled_windows

    rec = _train(perceiver_world, tmp_path / "p", "optim.epochs=60", "jitter=0", "flip=0", "net.channels=[16,32,64]",
                 "net.image_height=32", "net.image_width=48")
    labels = labelled_windows(perceiver_world).labels
    majority = {a: max(np.unique(labels[:, i], return_counts=True)[1]) / len(labels)
                for i, a in enumerate(("motion", "place", "relation", "other", "pose"))}
    acc = rec["train_accuracy"]
    assert all(acc[a] > majority[a] + 0.05 for a in majority), (acc, majority)
    assert acc["place"] > majority["place"] + 0.2, (acc, majority)


def test_the_space_is_the_perceivers_token_of_every_prefix_frame(synth_copy, tiny_perceiver, tmp_path):
    """`retrieval encode` with a perceiver writes a prefix space: one token per prefix frame, the perceiver's
    standardised distributions of that object window; it reloads as an input space, a rerun keeps it, and the
    perception probe reads it."""
    from eval.images import prefix_views
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.perceiver import load_perceiver
    from retrieval.perception import perception
    from retrieval.spaces import Space
    from retrieval.towers import load_frames

    model_dir, rec = tiny_perceiver
    d = encode_space(EncodeConfig(str(synth_copy), "perceiver", str(model_dir)), progress=False)
    meta = json.loads((d / "meta.json").read_text())
    dim = sum(len(v) for v in rec["vocab"])
    assert (meta["kind"], meta["normalized"], meta["dim"], meta["encoder"]) == ("prefix", False, dim, "psr-perceiver")
    bench = Benchmark.load(synth_copy)
    tokens = np.load(d / "prefixes.npy")
    pids, views = prefix_views(bench)
    assert tokens.shape == (len(pids), 8, dim) and np.isfinite(tokens).all()
    assert (d / "prefixes_ids.txt").read_text().split() == pids
    model = load_perceiver(model_dir)
    frames = load_frames(bench.root, views[3], (24, 32), progress=False)
    with torch.no_grad():
        want = model.token((frames.float() / 255 - 0.5) / 0.5).numpy()
    np.testing.assert_allclose(tokens[3], want, atol=1e-4)
    # the token is the standardised softmax of each head: undoing the standardisation gives distributions
    probs = want * model.token_std.numpy() + model.token_mean.numpy()
    sizes = np.cumsum([0] + [len(v) for v in rec["vocab"]])
    np.testing.assert_allclose([probs[:, a:b].sum(1) for a, b in zip(sizes[:-1], sizes[1:], strict=True)],
                               1, atol=1e-4)

    space = Space.load(bench, "perceiver")
    assert space.kind == "prefix" and space.has_prefixes and space.n_items == 0
    stamp = (d / "prefixes.npy").stat().st_mtime_ns
    encode_space(EncodeConfig(str(synth_copy), "perceiver", str(model_dir)), progress=False)
    np.testing.assert_array_equal(np.load(d / "prefixes.npy"), tokens)
    assert (d / "prefixes.npy").stat().st_mtime_ns >= stamp
    res = perception(bench, ["perceiver"])
    assert [r["name"] for r in res["rows"]][-1] == "perceiver"


def test_encode_refuses_a_perceiver_that_saw_the_benchmark(synth_copy, tiny_copy, tiny_perceiver, tmp_path):
    """The perceiver is trained on labels: one trained on the benchmark's own videos would be told the answers of
    the queries it encodes. `encode` refuses it and writes nothing; it refuses to show a perceiver other windows
    than it was trained on (whole frames, or a build without boxes); a folder without a finished perceiver is
    refused by name."""
    from eval.errors import InputError
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.perceiver import PERCEIVER_FILE, load_perceiver

    bench = Benchmark.load(synth_copy)
    _train(bench, tmp_path / "leaky", "optim.epochs=1", "split=train")
    with pytest.raises(InputError, match="trained on .* videos of the benchmark"):
        encode_space(EncodeConfig(str(synth_copy), "leaky", str(tmp_path / "leaky")), progress=False)
    assert not (synth_copy / "features" / "leaky" / "prefixes.npy").exists()
    model_dir, rec = tiny_perceiver
    assert rec["crop"] == "object"
    with pytest.raises(InputError, match="trained on object windows"):
        encode_space(EncodeConfig(str(synth_copy), "whole", str(model_dir), crop="frame"), progress=False)
    with pytest.raises(InputError, match="records no object box"):
        encode_space(EncodeConfig(str(tiny_copy), "perceiver", str(model_dir)), progress=False)
    assert not (tiny_copy / "features" / "perceiver").exists()
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / PERCEIVER_FILE).write_bytes(b"")
    with pytest.raises(InputError, match="no finished perceiver"):
        load_perceiver(tmp_path / "half")


def test_the_command_line_trains_it(perceiver_world, tmp_path):
    from typer.testing import CliRunner

    from retrieval.cli import app

    res = CliRunner().invoke(app, ["encoder", "perceiver", "--help"])
    assert res.exit_code == 0 and "perceiver" in res.output
    out = tmp_path / "p"
    res = CliRunner().invoke(app, ["encoder", "perceiver", "--data", str(perceiver_world.root), "--out", str(out),
                                   *[x for o in TINY_PERCEIVER + ["optim.epochs=1"] for x in ("--set", o)]])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "psr_tower.json").read_text())["trainer"] == "perceiver"


def test_the_demo_names_a_missing_perceived_space_before_any_work(synth_copy, tmp_path):
    from eval.errors import MissingInput
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.lftr.jobs import DemoPlan, run_demo

    out = tmp_path / "runs"
    with pytest.raises(MissingInput, match="no space 'perceived' for --perceived-space") as e:
        run_demo(Benchmark.load(synth_copy), out, text_model=PACKAGED_MINILM, plan=DemoPlan(perceived="perceived"),
                 log=lambda s: None, progress=False)
    assert "encoder perceiver" in str(e.value) and not out.exists()
    assert "minilm" not in Benchmark.load(synth_copy).spaces  # nothing encoded either
