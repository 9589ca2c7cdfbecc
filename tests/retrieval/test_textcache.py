"""Query-text embeddings cached by content hash (`retrieval.textcache`): the same vectors as the encoder, each
distinct text encoded once, no encoder at all when every text is cached, a new store for other weights."""

from __future__ import annotations

import shutil

import numpy as np

from retrieval.textcache import CachedQueryEncoder, cached_query_encoder, encoder_key


def test_cached_vectors_are_the_encoders_and_each_text_is_encoded_once(tiny_bench, text_encoder, tmp_path):
    meta = tiny_bench.space_meta("minilm")
    texts = ["the red ball rolls", "a box rests", "the red ball rolls", "a cup tips over"]
    enc = cached_query_encoder(tiny_bench, meta, cache_dir=tmp_path)
    got = enc.encode_queries(texts)
    np.testing.assert_allclose(got, text_encoder.encode_queries(texts), rtol=1e-5, atol=1e-6)
    assert (enc.misses, enc.hits) == (3, 0)  # three distinct texts encoded once each
    again = cached_query_encoder(tiny_bench, meta, cache_dir=tmp_path)
    more = again.encode_queries(["a cup tips over", "the red ball rolls"])
    assert again._encoder is None and (again.misses, again.hits) == (0, 2)  # never loaded the model
    assert more.tobytes() == got[[3, 0]].tobytes()
    mixed = again.encode_queries(["a new phrase", "a box rests"])
    assert (again.misses, again.hits) == (1, 3)
    np.testing.assert_allclose(mixed[0], text_encoder.encode_queries(["a new phrase"])[0], rtol=1e-5, atol=1e-6)
    assert again.encode_queries([]).shape == (0, got.shape[1])


def test_the_question_only_baseline_reuses_the_store(tiny_bench, monkeypatch):
    import retrieval.encoders as encoders
    from retrieval.methods import method_query_vectors
    from retrieval.spaces import Space

    sp = Space.load(tiny_bench, "minilm")
    rows = tiny_bench.query_rows("test")
    first = method_query_vectors(tiny_bench, "question-only", sp, rows)
    built = []
    real = encoders.query_text_encoder
    monkeypatch.setattr(encoders, "query_text_encoder", lambda *a, **k: built.append(1) or real(*a, **k))
    second = method_query_vectors(tiny_bench, "question-only", sp, rows)
    assert built == [] and second.vectors.tobytes() == first.vectors.tobytes()


def test_other_weights_in_the_same_folder_get_another_store(tmp_path):
    from retrieval.encoders import PACKAGED_MINILM, resolve_model

    model = tmp_path / "model"
    shutil.copytree(resolve_model(PACKAGED_MINILM), model)
    meta = {"kind": "semantic", "model": str(model)}
    before = encoder_key(meta)
    assert encoder_key(meta) == before and encoder_key({**meta, "query_prompt": "q: "}) != before
    weights = next(p for p in model.rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b"\0")  # retrained in place
    assert encoder_key(meta) != before
    assert CachedQueryEncoder(meta, tmp_path).path.name == f"{encoder_key(meta)}.npz"


def test_corpus_side_texts_have_their_own_store_and_snap_reuses_it(tiny_bench, text_encoder, tmp_path):
    """``encode_items`` (the canonical index that ``--canonicalize`` snaps to) is cached apart from the query side: the
    same vectors as the encoder's corpus side, a second index built without loading the model."""
    from retrieval.canon.snap import CanonicalIndex

    meta = tiny_bench.space_meta("minilm")
    enc = cached_query_encoder(tiny_bench, meta, cache_dir=tmp_path)
    first = CanonicalIndex.from_benchmark(tiny_bench, enc)
    np.testing.assert_allclose(first.emb, text_encoder.encode_items(first.texts), rtol=1e-5, atol=1e-6)
    assert enc.items_path != enc.path and enc.items_path.exists() and not enc.path.exists()
    assert enc.items_path.name == f"{encoder_key(meta, side='items')}.npz"
    assert encoder_key(meta, side="items") == encoder_key({**meta, "query_prompt": "q: "}, side="items")
    again = cached_query_encoder(tiny_bench, meta, cache_dir=tmp_path)
    second = CanonicalIndex.from_benchmark(tiny_bench, again)
    assert again._encoder is None and again.misses == 0 and again.hits == len(first.texts)
    assert second.emb.tobytes() == first.emb.tobytes() and second.texts == first.texts
    # a query-side lookup of the same texts is not served from the corpus side's store
    again.encode_queries(first.texts[:2])
    assert again.misses == 2
