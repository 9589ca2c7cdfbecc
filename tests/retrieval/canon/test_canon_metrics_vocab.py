"""Partition scores, vocabulary statistics, and the raw vocabulary readers."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from eval.io import FormatError
from retrieval.canon.metrics import partition_scores, vocabulary_stats
from retrieval.canon.vocab import from_benchmark, from_file


def test_partition_scores_by_hand():
    # clusters {0,1,2} {3,4,5}; classes {0,1} {2,3} {4,5}
    s = partition_scores([0, 0, 0, 1, 1, 1], ["a", "a", "b", "b", "c", "c"])
    assert s["purity"] == pytest.approx(4 / 6)
    assert s["inverse_purity"] == pytest.approx(5 / 6)
    # pairs: index 2, row pairs 6, column pairs 3, C(6,2) = 15: (2 - 1.2) / (4.5 - 1.2)
    assert s["ari"] == pytest.approx(0.8 / 3.3)


def test_partition_scores_identical_and_independent():
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 50, 5000)
    relabel = rng.permutation(50)[truth]
    assert partition_scores(relabel, truth) == {"purity": 1.0, "inverse_purity": 1.0, "ari": 1.0}
    assert abs(partition_scores(rng.integers(0, 50, 5000), truth)["ari"]) < 0.01


def test_vocabulary_stats():
    s = vocabulary_stats([0, 0, 0, 1, 2, 2])
    assert (s["clusters"], s["phrases"], s["max_size"], s["singletons"]) == (3, 6, 3, 1)
    assert s["merge_rate"] == pytest.approx(0.5) and s["mean_size"] == pytest.approx(2.0) and s["mean_size_ok"]
    assert not vocabulary_stats([0] * 6)["mean_size_ok"]


def test_vocab_from_benchmark(synth_bench):
    v = from_benchmark(synth_bench)
    ds = synth_bench.corpus_ds
    raw = Counter(r or s for r, s in zip(ds["raw"][:], ds["state"][:], strict=True))
    assert dict(zip(v.phrases, v.counts.tolist(), strict=True)) == dict(raw)
    members = {sid: set(m) for sid, m in zip(synth_bench.state_ids, synth_bench.states_ds["members"][:], strict=True)}
    assert all(p in members[t] for p, t in zip(v.phrases, v.truth, strict=True))  # truth = the synonym set
    assert v.ambiguous == 0


def test_vocab_from_files(tmp_path):
    (tmp_path / "a.txt").write_text("falling\ndropping\nfalling\n\n")
    v = from_file(tmp_path / "a.txt")
    assert v.phrases == ["falling", "dropping"] and v.counts.tolist() == [2, 1] and v.truth is None
    (tmp_path / "b.tsv").write_text("falling\t3\ts1\ndropping\t2\ts1\nrolling\t1\ts2\n")
    v = from_file(tmp_path / "b.tsv")
    assert v.counts.tolist() == [3, 2, 1] and v.truth == ["s1", "s1", "s2"]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(d) for d in (
        {"query_id": "q1", "phrase": "falling"}, {"query_id": "q2", "phrase": None, "error": "timeout"},
        {"query_id": "q3", "phrase": "falling"})) + "\n")
    v = from_file(tmp_path / "c.jsonl")
    assert v.phrases == ["falling"] and v.counts.tolist() == [2]


@pytest.mark.parametrize("name,text,line,field", [
    ("bad.tsv", "falling\t3\nrolling\tmany\n", 2, "count"),
    ("bad2.tsv", "falling\t3\ts1\nrolling\t1\n", 2, "label"),
    ("bad3.tsv", "falling\t3\ts1\nfalling\t1\ts2\n", 2, "label"),
    ("bad.jsonl", '{"phrase": "falling"}\n{"phrase": ""}\n', 2, "phrase"),
    ("bad2.jsonl", '{"phrase": "falling", "count": 0}\n', 1, "count"),
])
def test_vocab_file_errors_name_line_and_field(tmp_path, name, text, line, field):
    (tmp_path / name).write_text(text)
    with pytest.raises(FormatError) as e:
        from_file(tmp_path / name)
    assert e.value.line == line and e.value.field == field and name in str(e.value)
