"""A saved clustering (``canon cluster``), new phrases against it (``canon assign``) and a forecaster's phrase file
re-keyed to it (``canon apply --phrases``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.errors import InputError, OutputRefused
from eval.io import read_jsonl
from eval.phrases import read_phrases
from retrieval.canon.assign import AssignConfig, apply_phrase_file, resolve_phrases, run_assign
from retrieval.canon.cluster import exact_dots, unit_rows
from retrieval.canon.store import ClusterConfig, SavedClustering, run_cluster
from retrieval.cli import app
from retrieval.encoders import PACKAGED_MINILM

#: Hand-placed embeddings: at threshold 0.9 "falling" and "dropping" are one state; "tumbling" is close to
#: "falling", "twirling" to "spinning"; "sliding" is far from every seed and "gliding" close to "sliding".
VECTORS = {
    "falling": [1.0, 0.0, 0.0], "dropping": [0.95, 0.31, 0.0], "rolling": [0.0, 1.0, 0.0],
    "spinning": [0.0, 0.0, 1.0], "tumbling": [0.99, 0.14, 0.0], "twirling": [0.0, 0.2, 0.98],
    "sliding": [0.5, 0.5, 0.707], "gliding": [0.52, 0.5, 0.69],
}


class HandEncoder:
    """A text encoder of `VECTORS` (the embedding step is not what these tests test); records what it embeds."""

    def __init__(self):
        self.seen: list[str] = []

    def encode_items(self, texts, progress=False):
        self.seen += list(texts)
        return unit_rows(np.array([VECTORS[t] for t in texts], np.float32))


def _quiet(*_a, **_k):
    return None


def _flat(text: str) -> str:
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


@pytest.fixture()
def saved(tmp_path):
    (tmp_path / "base.csv").write_text("phrase,count,query_id\nfalling,5,q1\ndropping,3,q2\nrolling,4,q3\n"
                                       "spinning,1,q4\n")
    out = tmp_path / "clustering"
    info = run_cluster(ClusterConfig(out=str(out), phrases=str(tmp_path / "base.csv"), threshold=0.9, model="hand"),
                       progress=False, log=_quiet, encoder=HandEncoder())
    assert info["states"] == 3 and info["phrases"] == 4
    return SavedClustering.load(out)


def test_cluster_writes_states_the_per_phrase_map_and_the_seed_vectors(saved):
    assert saved.texts == ["falling", "rolling", "spinning"] and saved.threshold == 0.9 and saved.model == "hand"
    rows = {r["phrase"]: r for r in read_jsonl(saved.root / "phrases.jsonl")}
    assert list(rows) == ["falling", "dropping", "rolling", "spinning"]  # input order
    assert rows["dropping"]["state_id"] == "c000000" and rows["dropping"]["seed"] == "falling"
    units = unit_rows(np.array([VECTORS[p] for p in ("dropping", "falling")], np.float32))
    assert rows["dropping"]["similarity"] == exact_dots(units, [0], [1])[0]
    assert rows["rolling"]["query_ids"] == ["q3"] and rows["spinning"]["state_id"] == "c000002"
    assert np.array_equal(saved.seeds, unit_rows(np.array([VECTORS[t] for t in saved.texts], np.float32)))
    states = read_jsonl(saved.root / "states.jsonl")
    assert states[0] == {"id": "c000000", "text": "falling", "phrases": ["falling", "dropping"], "counts": [5, 3],
                         "count": 8}


def test_new_phrases_join_found_or_stay_out(saved):
    phrases = ["dropping", "tumbling", "twirling", "sliding", "gliding"]
    counts = [1, 1, 1, 2, 1]  # "sliding" is visited before "gliding": it founds the state "gliding" joins
    enc = HandEncoder()
    res = resolve_phrases(saved, phrases, counts, enc)
    assert enc.seen == ["tumbling", "twirling", "sliding", "gliding"]  # members are not embedded again
    assert res.status == ["member", "joined", "joined", "new", "joined"]
    assert res.state.tolist() == [0, 0, 2, 3, 3] and res.texts[3] == "sliding"
    assert res.row(4) == {"state_id": "c000003", "seed": "sliding", "similarity": res.similarity[4],
                          "status": "joined"}
    # without new states the far phrases keep no state
    res = resolve_phrases(saved, phrases, counts, HandEncoder(), new_states=False)
    assert res.status == ["member", "joined", "joined", "none", "none"] and res.state.tolist()[3:] == [-1, -1]
    assert res.row(3) == {"state_id": None, "seed": None, "similarity": None, "status": "none"}
    assert res.text(3) == "sliding" and res.text(1) == "falling"
    # count ties: the first in the input founds the state, or the first by text
    tie = resolve_phrases(saved, ["sliding", "gliding"], [1, 1], HandEncoder())
    assert tie.status == ["new", "joined"]
    tie = resolve_phrases(saved, ["sliding", "gliding"], [1, 1], HandEncoder(), ties="text")
    assert tie.status == ["joined", "new"] and tie.texts[3] == "gliding"


def test_assign_writes_one_row_per_phrase(saved, tmp_path):
    (tmp_path / "new.txt").write_text("tumbling\nsliding\nsliding\ngliding\nfalling\n")
    out = tmp_path / "assigned.jsonl"
    cfg = AssignConfig(clustering=str(saved.root), phrases=str(tmp_path / "new.txt"), out=str(out))
    tally = run_assign(cfg, log=_quiet, encoder=HandEncoder())
    assert tally == {"member": 1, "joined": 2, "new": 1, "none": 0}
    rows = read_jsonl(out)
    assert [(r["phrase"], r["count"], r["state_id"], r["status"]) for r in rows] == [
        ("tumbling", 1, "c000000", "joined"), ("sliding", 2, "c000003", "new"), ("gliding", 1, "c000003", "joined"),
        ("falling", 1, "c000000", "member")]
    with pytest.raises(OutputRefused, match="exists"):  # never replaced silently
        run_assign(cfg, log=_quiet, encoder=HandEncoder())
    cfg.overwrite = True
    run_assign(cfg, log=_quiet, encoder=HandEncoder())
    with pytest.raises(OutputRefused, match="input"):  # never an input, even with overwrite
        run_assign(AssignConfig(clustering=str(saved.root), phrases=str(tmp_path / "new.txt"),
                                out=str(saved.root / "phrases.jsonl"), overwrite=True), log=_quiet,
                   encoder=HandEncoder())
    with pytest.raises(InputError, match="not a directory"):
        SavedClustering.load(tmp_path / "nothing")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "clustering.json").write_text("{}")
    with pytest.raises(InputError, match="lacks states.jsonl"):
        SavedClustering.load(tmp_path / "half")


def _phrase_file(path):
    lines = [
        {"query_id": "q1", "phrase": "tumbling", "phrases": ["tumbling", "dropping"], "model": "m", "flags": []},
        {"query_id": "q2", "phrase": None, "error": "timeout"},
        {"query_id": "q3", "phrase": None, "error": "timeout"},
        {"query_id": "q3", "phrase": " sliding ", "phrases": [" sliding "]},
        {"query_id": "q4", "phrase": "gliding"},
    ]
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))


def test_apply_rekeys_a_forecasters_phrase_file(saved, tmp_path):
    _phrase_file(tmp_path / "pred.jsonl")
    out = tmp_path / "pred-canon.jsonl"
    cfg = AssignConfig(clustering=str(saved.root), phrases=str(tmp_path / "pred.jsonl"), out=str(out))
    tally = apply_phrase_file(cfg, log=_quiet, encoder=HandEncoder())
    assert tally == {"member": 1, "joined": 2, "new": 1, "none": 0}
    rows = read_jsonl(out)
    assert [r["query_id"] for r in rows] == ["q1", "q2", "q3", "q4"]  # one line per query, rerun's answer kept
    q1, q2, q3, q4 = rows
    assert q1["phrase"] == "falling" and q1["phrases"] == ["falling", "falling"] and q1["model"] == "m"
    assert q1["canon"]["phrase"]["text"] == "tumbling" and q1["canon"]["phrase"]["status"] == "joined"
    assert [p["status"] for p in q1["canon"]["phrases"]] == ["joined", "member"]
    assert q1["canon"]["threshold"] == 0.9 and q1["canon"]["clustering"] == str(saved.root)
    assert q2 == {"query_id": "q2", "phrase": None, "error": "timeout"}  # failed lines unchanged
    assert q3["phrase"] == "sliding" and q3["canon"]["phrase"]["state_id"] == "c000003"
    assert q4["phrase"] == "sliding" and q4["canon"]["phrase"]["status"] == "joined"
    recs = read_phrases(out)  # still a phrase file
    assert recs["q1"].samples == ["falling", "falling"] and not recs["q2"].ok
    # a plain phrase list is not a phrase file
    (tmp_path / "plain.txt").write_text("falling\n")
    with pytest.raises(InputError, match="not a forecaster's phrase file"):
        apply_phrase_file(AssignConfig(clustering=str(saved.root), phrases=str(tmp_path / "plain.txt"),
                                       out=str(tmp_path / "x.jsonl")), log=_quiet, encoder=HandEncoder())


def test_cluster_assign_and_apply_through_the_cli(tmp_path, text_encoder):
    run = CliRunner().invoke
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(d) + "\n" for d in (
        {"phrase": "falling", "count": 4}, {"phrase": "falling down", "count": 2},
        {"phrase": "rolling across the table", "count": 3})))
    cl = tmp_path / "cl"
    r = run(app, ["canon", "cluster", "--phrases", str(tmp_path / "base.jsonl"), "--threshold", "0.6",
                  "--model", PACKAGED_MINILM, "--out", str(cl)])
    assert r.exit_code == 0, r.output
    saved = SavedClustering.load(cl)
    assert saved.texts == ["falling", "rolling across the table"] and saved.model == PACKAGED_MINILM
    (tmp_path / "new.txt").write_text("falling down\ntumbling down\nrolling over the table\n")
    r = run(app, ["canon", "assign", "--clustering", str(cl), "--phrases", str(tmp_path / "new.txt"),
                  "--out", str(tmp_path / "a.jsonl")])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(tmp_path / "a.jsonl")
    assert rows[0]["status"] == "member" and rows[2]["seed"] == "rolling across the table"
    # the same resolution through the Python API, with the encoder loaded once
    res = resolve_phrases(saved, [x["phrase"] for x in rows], [1, 1, 1], text_encoder)
    assert [x["state_id"] for x in rows] == [res.row(i)["state_id"] for i in range(3)]
    assert [x["similarity"] for x in rows] == [res.row(i)["similarity"] for i in range(3)]
    _phrase_file(tmp_path / "pred.jsonl")
    (tmp_path / "pred.jsonl").write_text((tmp_path / "pred.jsonl").read_text().replace("tumbling", "falling down"))
    r = run(app, ["canon", "apply", "--phrases", str(tmp_path / "pred.jsonl"), "--clustering", str(cl),
                  "--out", str(tmp_path / "pred-canon.jsonl")])
    assert r.exit_code == 0, r.output
    assert read_phrases(tmp_path / "pred-canon.jsonl")["q1"].phrase == "falling"
    # refusals: one message each, exit 2, nothing replaced
    before = (tmp_path / "a.jsonl").read_bytes()
    for args, msg in (
        (["assign", "--clustering", str(cl), "--phrases", str(tmp_path / "new.txt"), "--out", str(tmp_path / "a.jsonl")],
         "exists"),
        (["assign", "--clustering", str(tmp_path / "nope"), "--phrases", str(tmp_path / "new.txt"),
          "--out", str(tmp_path / "b.jsonl")], "not a directory"),
        (["assign", "--clustering", str(cl), "--phrases", str(tmp_path / "new.txt"), "--out", str(tmp_path / "b.csv")],
         "expected a .jsonl"),
        (["apply", "--phrases", str(tmp_path / "pred.jsonl"), "--out", str(tmp_path / "c.jsonl")], "needs --clustering"),
        (["apply", "--phrases", str(tmp_path / "pred.jsonl"), "--clustering", str(cl), "--out",
          str(tmp_path / "pred.jsonl"), "--overwrite"], "is an input"),
    ):
        r = run(app, ["canon", *args])
        assert r.exit_code == 2 and _flat(msg) in _flat(r.output), (args, r.output)
    assert (tmp_path / "a.jsonl").read_bytes() == before and not (tmp_path / "b.jsonl").exists()
