"""The perception probe (`retrieval.perception`): how much of the present state a prefix space reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.benchmark import Benchmark
from eval.errors import InputError


@pytest.fixture(scope="module")
def bench(synth_dir):
    return Benchmark.load(synth_dir)


def _add_space(root, name, ids, tokens):
    """A prefix space ``name`` of ``tokens`` ``(n, frames, d)`` for the prefixes ``ids``, written as encode does."""
    from eval.features import write_meta, write_table

    write_table(root, name, "prefixes", list(ids), np.asarray(tokens, np.float32))
    write_meta(root, name, kind="prefix", dim=tokens.shape[-1], model=f"test-{name}", normalized=False)


def _one_hot_present(present):
    """Tokens that hold the present's five attributes exactly (one-hot per attribute), in every frame."""
    blocks = []
    for k in range(present.labels.shape[1]):
        values = sorted(set(present.labels[:, k]))
        blocks.append(np.eye(len(values))[[values.index(v) for v in present.labels[:, k]]])
    x = np.concatenate(blocks, axis=1)
    return np.repeat(x[:, None, :], 3, axis=1)


def test_the_present_is_the_segment_active_at_the_prefix_end(bench):
    from eval.segments import SegmentTimeline
    from retrieval.perception import ATTRIBUTES, present_states

    present = present_states(bench)
    assert len(present.prefix_ids) == len(set(present.prefix_ids)) > 50
    qd = bench.queries_ds
    first = {}
    for i, p in enumerate(qd["prefix_id"][:]):
        first.setdefault(p, i)
    timeline, sim = SegmentTimeline.of(bench), bench.corpus_ds["sim_state"][:]
    for j in range(0, len(present.prefix_ids), 17):
        i = first[present.prefix_ids[j]]
        row = timeline.active(qd[i]["video_id"], qd[i]["object_id"], qd[i]["prefix_end"])
        assert "|".join(present.labels[j]) == sim[row]
        assert present.split[j] == qd[i]["split"]
        assert present.boxes[j].tolist() == qd[i]["prefix_boxes"][-2:]
    assert present.labels.shape[1] == len(ATTRIBUTES)


def test_a_space_holding_the_present_reads_it_and_a_constant_one_reads_the_majority(synth_copy):
    from retrieval.perception import BOX, MAJORITY, perception, present_states

    b = Benchmark.load(synth_copy)
    present = present_states(b)
    _add_space(synth_copy, "exact", present.prefix_ids, _one_hot_present(present))
    _add_space(synth_copy, "blank", present.prefix_ids, np.ones((len(present.prefix_ids), 3, 4)))
    res = perception(Benchmark.load(synth_copy), ["exact", "blank", "sim"])
    rows = {r["name"]: r for r in res["rows"]}
    assert [r["name"] for r in res["rows"]] == [MAJORITY, BOX, "exact", "blank", "sim"]
    assert rows["exact"]["all"] == 1.0 and set(rows["exact"]["accuracy"].values()) == {1.0}
    assert rows["blank"]["accuracy"] == rows[MAJORITY]["accuracy"]  # reads nothing: predicts the majority
    assert rows[MAJORITY]["all"] < 0.2
    # the simulator's state (its labels are the per-frame attributes, before smoothing) reads most of the present
    assert rows["sim"]["all"] > rows[MAJORITY]["all"] + 0.3
    assert rows["exact"]["dim"] == 2 * _one_hot_present(present).shape[-1]  # last token and its change
    assert res["n_fit"] + res["n_test"] < len(present.prefix_ids)  # the val split is neither fitted nor scored


def test_box_features_are_the_last_centre_size_and_displacement():
    from retrieval.perception import box_features

    boxes = np.array([[[10, 20, 14, 30], [12, 22, 18, 34]]], np.float64)
    assert box_features(boxes).tolist() == [[15.0, 28.0, 6.0, 12.0, 3.0, 3.0]]


def test_refusals_name_what_is_wrong(synth_copy, tiny_bench):
    from retrieval.perception import perception, present_states

    with pytest.raises(InputError, match="sim_state"):
        perception(tiny_bench, ["pixels"])
    b = Benchmark.load(synth_copy)
    with pytest.raises(InputError, match="two different splits"):
        perception(b, ["sim"], fit_split="test", split="test")
    with pytest.raises(InputError, match="no prefix of split 'nope'"):
        perception(b, ["sim"], split="nope")
    present = present_states(b)
    tokens = np.zeros((len(present.prefix_ids), 2, 3))
    tokens[5, -1, 1] = np.nan
    _add_space(synth_copy, "holey", present.prefix_ids, tokens)
    with pytest.raises(InputError, match="NaN or inf") as e:  # the space's file and the prefix are named
        perception(Benchmark.load(synth_copy), ["holey"])
    assert present.prefix_ids[5] in str(e.value) and "features/holey/prefixes.npy" in str(e.value)


def test_cli_writes_the_table_and_its_json(synth_dir, tmp_path):
    from retrieval.cli import app

    r = CliRunner().invoke(app, ["perception", "--data", str(synth_dir), "--out", str(tmp_path), "pixels"])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "perception.json").read_text())
    assert [x["name"] for x in res["rows"]] == ["majority", "box", "pixels"]
    md = (tmp_path / "perception.md").read_text()
    assert "| `pixels` | 1152 |" in md and "all five" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["perception.json", "perception.md"]


def test_a_sim_state_of_other_parts_is_named(synth_copy):
    from eval.segments import SegmentTimeline
    from retrieval.perception import present_states

    b = Benchmark.load(synth_copy)
    q = b.queries_ds[0]
    row = SegmentTimeline.of(b).active(q["video_id"], q["object_id"], q["prefix_end"])
    path = synth_copy / "corpus.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[row])
    rec["sim_state"] = "rolling|floor"
    lines[row] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=f"corpus row {row}: sim_state 'rolling\\|floor' has 2 parts"):
        present_states(Benchmark.load(synth_copy))
