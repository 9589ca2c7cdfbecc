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
    # truth = the simulator's true state (the canonical ids are the clustering's output): the most frequent one of
    # the segments a phrase describes; a description that leaves out qualifiers fits several (counted as ambiguous)
    seen: dict[str, Counter] = {}
    for r, s, sim in zip(ds["raw"][:], ds["state"][:], ds["sim_state"][:], strict=True):
        seen.setdefault(r or s, Counter())[sim] += 1
    for p, t in zip(v.phrases, v.truth, strict=True):
        top = max(seen[p].values())
        assert seen[p][t] == top and t == min(k for k, n in seen[p].items() if n == top)
    assert v.ambiguous == sum(len(c) > 1 for c in seen.values()) > 0


def test_vocab_from_files(tmp_path):
    (tmp_path / "a.txt").write_text("falling\ndropping\nfalling\n\n")
    v = from_file(tmp_path / "a.txt")
    assert v.phrases == ["falling", "dropping"] and v.counts.tolist() == [2, 1] and v.truth is None
    assert v.query_ids is None
    (tmp_path / "b.tsv").write_text("phrase\tcount\tlabel\nfalling\t3\ts1\ndropping\t2\ts1\nrolling\t1\ts2\n")
    v = from_file(tmp_path / "b.tsv")
    assert v.counts.tolist() == [3, 2, 1] and v.truth == ["s1", "s1", "s2"]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(d) for d in (
        {"query_id": "q1", "phrase": "falling"}, {"query_id": "q2", "phrase": None, "error": "timeout"},
        {"query_id": "q3", "phrase": "falling"})) + "\n")
    v = from_file(tmp_path / "c.jsonl")
    assert v.phrases == ["falling"] and v.counts.tolist() == [2] and v.query_ids == [["q1", "q3"]]


def test_vocab_csv_with_a_header_quotes_and_extra_columns(tmp_path):
    # a header names the columns (any order, any case); quoted fields may hold commas; other columns are ignored
    (tmp_path / "p.csv").write_text('id,Count,phrase\n1,4,"putting something, then dropping it"\n2,2,rolling\n'
                                    '3,1,"putting something, then dropping it"\n')
    v = from_file(tmp_path / "p.csv")
    assert v.phrases == ["putting something, then dropping it", "rolling"] and v.counts.tolist() == [5, 2]
    (tmp_path / "q.csv").write_text("phrase,query_id\nfalling,q7\nfalling,q9\nrolling,\n")
    v = from_file(tmp_path / "q.csv")
    assert v.counts.tolist() == [2, 1] and v.query_ids == [["q7", "q9"], []]


def test_vocab_json_arrays_and_phrase_files(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(["falling", "rolling", {"phrase": "falling", "count": 3}]))
    v = from_file(tmp_path / "a.json")
    assert v.phrases == ["falling", "rolling"] and v.counts.tolist() == [4, 1]
    # a forecaster's phrase file: samples of answered queries; a rerun's last answered line wins; a torn tail is cut
    lines = [{"query_id": "q1", "phrase": "falling", "phrases": ["falling", "tumbling"]},
             {"query_id": "q2", "phrase": "", "parse_ok": False, "phrases": []},
             {"query_id": "q1", "phrase": None, "error": "timeout"},
             {"query_id": "q3", "phrase": "rolling"}]
    (tmp_path / "pf.jsonl").write_text("\n".join(json.dumps(d) for d in lines) + '\n{"query_id": "q4", "phr')
    v = from_file(tmp_path / "pf.jsonl")
    assert v.phrases == ["falling", "tumbling", "rolling"] and v.counts.tolist() == [1, 1, 1]
    assert v.query_ids == [["q1"], ["q1"], ["q3"]]


def test_a_byte_order_mark_is_not_part_of_the_first_phrase(tmp_path):
    for name, body in (("a.txt", "falling\nrolling\n"), ("a.csv", "phrase\nfalling\nrolling\n"),
                       ("a.tsv", "phrase\tcount\nfalling\t1\nrolling\t1\n"),
                       ("a.jsonl", '{"phrase": "falling"}\n{"phrase": "rolling"}\n'),
                       ("a.json", '["falling", "rolling"]')):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + body.encode())
        assert from_file(tmp_path / name).phrases == ["falling", "rolling"], name


@pytest.mark.parametrize("name,text,line,field", [
    ("bad.tsv", "phrase\tcount\nfalling\t3\nrolling\tmany\n", 3, "count"),
    ("bad2.tsv", "phrase\tcount\tlabel\nfalling\t3\ts1\nrolling\t1\t\n", 3, "label"),
    ("bad3.tsv", "phrase\tcount\tlabel\nfalling\t3\ts1\nfalling\t1\ts2\n", 3, "label"),
    ("bad4.tsv", "phrase\tcount\nfalling\t-2\n", 2, "count"),
    ("bad5.tsv", f"phrase\tcount\nfalling\t{2**63}\n", 2, "count"),
    ("bad6.csv", f"phrase,count\nfalling,{2**62}\nrolling,{2**62}\n", 3, "count"),  # the total overflows int64
    ("bad7.csv", "phrase,count\nfalling,1.5\n", 2, "count"),
    ("bad.jsonl", '{"phrase": "falling"}\n{"phrase": ""}\n', 2, "phrase"),
    ("bad2.jsonl", '{"phrase": "falling", "count": 0}\n', 1, "count"),
    ("bad3.jsonl", f'{{"phrase": "falling", "count": {2**63}}}\n', 1, "count"),
    ("bad4.jsonl", '{"phrase": "falling"}\n[1, 2]\n', 2, None),
    ("bad5.jsonl", '{"phrase": "falling"}\n{"phrase": \n{"phrase": "x"}\n', 2, None),
    ("bad.json", '["falling", {"phrase": "x", "count": -1}]', None, "[1].count"),
    ("bad2.json", '["falling", 3]', None, "[1]"),
])
def test_vocab_file_errors_name_line_and_field(tmp_path, name, text, line, field):
    (tmp_path / name).write_text(text)
    with pytest.raises(FormatError) as e:
        from_file(tmp_path / name)
    assert e.value.line == line and e.value.field == field and name in str(e.value)


@pytest.mark.parametrize("name,text,match", [
    ("empty.txt", "\n  \n", "holds no phrases"),
    ("empty.csv", "phrase,count\n", "holds no phrases"),
    ("failed.jsonl", '{"query_id": "q1", "phrase": null, "error": "timeout"}\n', r"holds no phrases \(0 answered"),
    ("nohead.csv", "falling,3\nrolling,2\n", "header line naming a 'phrase' column"),
    ("nohead.tsv", "falling\t3\n", "header line naming a 'phrase' column"),
    ("ragged.csv", "phrase,count\nfalling,3,extra\n", "expected 2 columns"),
    ("latin1.txt", "caf\xe9\n".encode("latin-1"), "not valid UTF-8"),
    ("obj.json", '{"phrase": "falling"}', "expected a JSON array"),
])
def test_malformed_or_empty_phrase_files_are_format_errors(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(FormatError, match=match) as e:
        from_file(path)
    assert str(path) in str(e.value)


def test_missing_paths_directories_and_unknown_suffixes_are_input_errors(tmp_path):
    from eval.errors import InputError

    with pytest.raises(InputError, match="does not exist"):
        from_file(tmp_path / "nope.txt")
    (tmp_path / "dir.txt").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        from_file(tmp_path / "dir.txt")
    for name in ("phrases", "phrases.xlsx", "phrases.md"):
        (tmp_path / name).write_text("phrase\nfalling\n")
        with pytest.raises(InputError, match="unknown suffix") as e:
            from_file(tmp_path / name)
        assert ".csv" in str(e.value)  # the fix names the formats


def test_a_vocabulary_is_embedded_once_per_model_and_a_given_encoder_is_not_cached(tmp_path, monkeypatch):
    """`embed_vocab` with a store: the sweep and the canonicalization at its threshold embed a vocabulary once; a
    call whose phrases are all stored does not build the model; new phrases are the only ones encoded."""
    import hashlib

    import retrieval.encoders as encoders
    from retrieval.canon.vocab import PhraseVocab, embed_vocab
    from retrieval.encoders import PACKAGED_MINILM

    built, encoded = [], []

    def vec(t: str) -> np.ndarray:
        v = np.frombuffer(hashlib.sha256(t.encode()).digest(), np.uint8)[:8].astype(np.float32) + 1
        return v / np.linalg.norm(v)

    class Counting:
        def __init__(self, model, device=None, batch_size=128):
            built.append((model, batch_size))

        def encode_items(self, texts, progress=None):
            encoded.append(list(texts))
            return np.stack([vec(t) for t in texts])

    monkeypatch.setattr(encoders, "TextEncoder", Counting)
    store = tmp_path / "store"
    v = PhraseVocab(["rolling left", "resting on the floor", "falling"], [3, 2, 1], None, "test")
    first = embed_vocab(v, PACKAGED_MINILM, batch_size=7, progress=False, cache_dir=store)
    assert built == [(PACKAGED_MINILM, 7)] and encoded == [v.phrases]
    again = embed_vocab(v, PACKAGED_MINILM, progress=False, cache_dir=store)
    assert len(built) == 1 and np.array_equal(first, again)  # all stored: no model
    more = PhraseVocab(["falling", "pushed right", "rolling left"], [1, 1, 1], None, "test")
    out = embed_vocab(more, PACKAGED_MINILM, progress=False, cache_dir=store)
    assert encoded[-1] == ["pushed right"]
    assert np.array_equal(out, np.stack([vec(t) for t in more.phrases]))
    own = Counting("mine")
    n_files = sorted(store.iterdir())
    embed_vocab(v, "some/other-model", encoder=own, progress=False, cache_dir=store)
    assert encoded[-1] == v.phrases and sorted(store.iterdir()) == n_files  # a given encoder: encoded, not stored


@pytest.mark.slow
def test_the_sweeps_store_is_the_one_search_reads_for_a_space_of_the_same_model(tmp_path):
    """With the packaged MiniLM: the vocabulary's embeddings land in the corpus-side store that a semantic space of
    that model reads (`search --canonicalize` snaps through it), so search serves them without loading the model."""
    from retrieval.canon.vocab import PhraseVocab, embed_vocab
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.textcache import CachedQueryEncoder

    v = PhraseVocab(["rolling left", "resting on the floor", "falling"], [3, 2, 1], None, "test")
    emb = embed_vocab(v, PACKAGED_MINILM, progress=False, cache_dir=tmp_path)
    assert emb.shape == (3, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    space = {"space": "minilm", "kind": "semantic", "model": PACKAGED_MINILM, "dim": 384, "normalized": True,
             "encoder": "sentence-transformers", "query_prompt": None}  # a built space's meta.json
    search = CachedQueryEncoder(space, tmp_path)
    got = search.encode_items(list(reversed(v.phrases)))
    assert search.hits == 3 and search.misses == 0 and search._encoder is None
    assert np.array_equal(got, emb[::-1])
