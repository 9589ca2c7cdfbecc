"""Spaces (state expansion, prototypes), FAISS top-k against eval's streaming scorer, query-vector sidecars."""

from __future__ import annotations

import numpy as np
import pytest

from eval.io import FormatError


def test_semantic_space_expands_states_to_segments(tiny_bench):
    from retrieval.spaces import Space

    sp = Space.load(tiny_bench, "minilm")
    assert sp.kind == "semantic" and sp.items.shape == (len(tiny_bench.state_ids), 384)
    seg = sp.segment_features()
    assert seg.shape == (len(tiny_bench.corpus_ids), 384)
    for c in (0, 7, 33):  # a segment's vector is its state's
        s = tiny_bench.segment(c)
        assert np.array_equal(seg[c], sp.items[sp.item_ids.index(s.state_id)])


def test_visual_prototypes_are_state_means(tiny_bench):
    from retrieval.spaces import Space

    sp = Space.load(tiny_bench, "pixels")
    assert sp.item_rows is None  # corpus table in benchmark order
    protos = sp.state_prototypes()
    states = np.asarray(tiny_bench.corpus_ds["state_id"][:])
    for i, sid in enumerate(tiny_bench.state_ids):
        members = sp.items[states == sid]
        want = members.mean(0) / np.linalg.norm(members.mean(0))
        assert np.allclose(protos[i], want, atol=1e-5)


def test_space_missing_rows_is_a_clear_error(tiny_copy):
    from eval.benchmark import Benchmark
    from eval.features import load_table, write_table
    from retrieval.spaces import Space

    t = load_table(tiny_copy, "pixels", "corpus")
    write_table(tiny_copy, "pixels", "corpus", t.ids[:-1], np.asarray(t.array[:-1]))
    with pytest.raises(FormatError, match=r"corpus_ids.txt.*1 segment id\(s\)"):
        Space.load(Benchmark.load(tiny_copy), "pixels")


def test_an_unknown_space_lists_the_spaces_and_how_to_make_one(tiny_bench):
    from eval.errors import InputError
    from retrieval.spaces import Space

    with pytest.raises(InputError, match=r"no space 'dinov2'.*its spaces: minilm, pixels") as e:
        Space.load(tiny_bench, "dinov2")
    assert "python -m retrieval encode" in e.value.fix and "--space dinov2" in e.value.fix


@pytest.mark.parametrize("n_samples", [1, 3])
def test_faiss_topk_agrees_with_streaming_scorer(n_samples):
    from eval.scoring import DenseSource, score_stream
    from retrieval.index import FlatIPIndex

    rng = np.random.default_rng(0)
    items = rng.normal(size=(3000, 16)).astype(np.float32)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    q = rng.normal(size=(37, n_samples, 16)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    scores, rows = FlatIPIndex(items, use_gpu=False).search(q, 20)
    res = score_stream(DenseSource(q, items), {}, None, k=20, c_chunk=700, progress=False)
    assert np.array_equal(rows, res.topk_rows)
    assert np.allclose(scores, res.topk_scores, atol=1e-5)
    brute = (np.einsum("qkd,nd->qkn", q, items).max(1))
    assert np.array_equal(rows[:, 0], brute.argmax(1))


def test_faiss_state_expansion_matches_streaming_scorer(tiny_bench, text_encoder):
    from eval.scoring import DenseSource, score_stream
    from retrieval.index import FlatIPIndex, expand_states_topk
    from retrieval.spaces import Space

    sp = Space.load(tiny_bench, "minilm")
    q = text_encoder.encode_queries(["falling down", "rolling", "lying flat on its side"])
    s, r = FlatIPIndex(sp.items, use_gpu=False).search(q, 8)
    s, r = expand_states_topk(s, r, sp.item_rows, 25)
    res = score_stream(DenseSource(q, sp.items, sp.item_rows), {}, None, k=25, progress=False)
    assert np.array_equal(r, res.topk_rows)
    assert np.allclose(s, res.topk_scores, atol=1e-5)


def test_query_vector_sidecar_roundtrip(tmp_path):
    from retrieval.queries import QueryVectors, load_query_vectors, save_query_vectors, sidecar_path

    v = np.zeros((3, 2, 4), np.float32)
    v[0, :, 0] = 1
    v[2, 0, 1] = 1
    qv = QueryVectors(["a", "b", "c"], v, "sp")
    assert qv.miss.tolist() == [False, True, False]
    p = save_query_vectors(sidecar_path(tmp_path / "run.parquet"), qv)
    assert p.name == "run.qvec.npz"
    back = load_query_vectors(p)
    assert back.query_ids == qv.query_ids and np.array_equal(back.vectors, v) and back.n_misses == 1
    with pytest.raises(FormatError, match="cannot be fused"):
        load_query_vectors(tmp_path / "other.qvec.npz")


def test_runs_whose_names_differ_after_a_dot_keep_their_own_sidecars(tmp_path):
    from retrieval.queries import sidecar_path

    names = ["lftr-f0.125-s0.parquet", "lftr-f0.125-s1.parquet", "lftr-f0.5-s0.parquet", "m3.parquet", "m3"]
    got = [sidecar_path(tmp_path / n).name for n in names]
    assert got == ["lftr-f0.125-s0.qvec.npz", "lftr-f0.125-s1.qvec.npz", "lftr-f0.5-s0.qvec.npz", "m3.qvec.npz",
                   "m3.qvec.npz"]
