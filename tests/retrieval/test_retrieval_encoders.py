"""Encoders and the encode job: real models (packaged MiniLM, tiny random CLIP / SigLIP / DINOv2)."""

from __future__ import annotations

import numpy as np
import pytest

from eval.benchmark import Benchmark
from eval.features import load_table, read_meta


def test_text_encoder_normalised_and_semantic(text_encoder):
    items = text_encoder.encode_items(["falling", "sliced", "tumbling down"])
    q = text_encoder.encode_queries(["falling"])
    assert items.shape == (3, 384) and items.dtype == np.float32
    assert np.allclose(np.linalg.norm(items, axis=1), 1, atol=1e-5)
    sims = (q @ items.T)[0]
    assert sims[0] > 0.99  # a query equals its item without a prompt
    assert sims[2] > sims[1] + 0.2  # a synonym beats an unrelated state


def test_progress_bars_show_on_a_terminal_only(text_encoder, monkeypatch, capsys):
    import sys

    from retrieval.encoders import show_progress

    assert show_progress(True) and not show_progress(False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert show_progress(None)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not show_progress(None)
    text_encoder.encode_items(["falling", "rolling"])  # default: no terminal, no bar
    assert "Batches" not in capsys.readouterr().err
    text_encoder.encode_items(["falling", "rolling"], progress=True)
    assert "Batches" in capsys.readouterr().err


def test_text_encoder_query_prompt_changes_only_queries():
    from retrieval.encoders import BGE_QUERY_INSTRUCTION, PACKAGED_MINILM, TextEncoder

    enc = TextEncoder(PACKAGED_MINILM, query_prompt=BGE_QUERY_INSTRUCTION)
    plain = enc.encode_items(["falling"])
    prompted = enc.encode_queries(["falling"])
    assert float((plain @ prompted.T)[0, 0]) < 0.99  # the instruction is prepended to queries ...
    assert np.allclose(enc.encode_items(["falling"]), plain)  # ... never to items


@pytest.mark.parametrize("name", ["clip", "siglip", "dinov2"])
def test_image_encoder_loads_by_path(tiny_image_models, tiny_bench, name):
    from retrieval.encoders import ImageEncoder, is_vision_model

    path = str(tiny_image_models[name])
    assert is_vision_model(path)
    enc = ImageEncoder(path, batch_size=3)
    frames = [tiny_bench.path(f) for f in tiny_bench.corpus_ds["frame"][:7]]
    x = enc.encode_images(frames)
    assert x.shape == (7, enc.dim) and np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
    # deterministic, and batching does not change the result
    assert np.allclose(ImageEncoder(path, batch_size=7).encode_images(frames), x, atol=1e-5)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_clip_text_tower_matches_image_space(tiny_image_models, name):
    from retrieval.encoders import ClipTextEncoder, ImageEncoder

    path = str(tiny_image_models[name])
    t = ClipTextEncoder(path).encode_queries(["red ball falling", "a box"])
    assert t.shape == (2, ImageEncoder(path).dim)
    assert np.allclose(np.linalg.norm(t, axis=1), 1, atol=1e-5)


def test_dinov2_has_no_text_tower(tiny_image_models):
    from retrieval.encoders import ClipTextEncoder

    with pytest.raises(ValueError, match="no text tower"):
        ClipTextEncoder(str(tiny_image_models["dinov2"]))


def test_encode_cli_visual_end_to_end(tiny_copy, tiny_image_models):
    from typer.testing import CliRunner

    from retrieval.cli import app

    res = CliRunner().invoke(app, ["encode", "--data", str(tiny_copy), "--space", "clip", "--model",
                                   str(tiny_image_models["clip"]), "--batch-size", "16", "--chunk-size", "40"])
    assert res.exit_code == 0, res.output
    bench = Benchmark.load(tiny_copy)
    meta = read_meta(tiny_copy, "clip")
    assert meta["kind"] == "visual" and meta["text_tower"] is True and meta["dim"] == 24
    corpus, prefixes = load_table(tiny_copy, "clip", "corpus"), load_table(tiny_copy, "clip", "prefixes")
    assert corpus.ids == bench.corpus_ids and corpus.array.shape == (len(bench.corpus_ids), 24)
    assert prefixes.array.shape[1:] == (8, 24)
    assert not (tiny_copy / "features" / "clip" / ".partial").exists()
    # the stored row equals a direct encode of that segment's frame
    from retrieval.encoders import ImageEncoder

    direct = ImageEncoder(str(tiny_image_models["clip"])).encode_images([bench.path(bench.segment(5).frame)])
    assert np.allclose(corpus.array[5], direct[0], atol=1e-5)
    # and the validator accepts the new space
    from eval.validate import validate

    assert validate(tiny_copy, check_frames=False).ok
    # CLIP text -> image: phrases are encoded by the text tower and ranked against the image features
    import json

    from eval.runs import read_run
    from retrieval.encoders import ClipTextEncoder
    from retrieval.queries import load_query_vectors, sidecar_path

    q = bench.query_ids[int(bench.query_rows("test")[0])]
    (tiny_copy / "p.jsonl").write_text(json.dumps({"query_id": q, "phrase": "red ball falling"}) + "\n")
    res = CliRunner().invoke(app, ["search", "--data", str(tiny_copy), "--phrases", str(tiny_copy / "p.jsonl"),
                                   "--space", "clip", "--out", str(tiny_copy / "clip.parquet")])
    assert res.exit_code == 0, res.output
    qv = load_query_vectors(sidecar_path(tiny_copy / "clip.parquet"))
    text = ClipTextEncoder(str(tiny_image_models["clip"])).encode_queries(["red ball falling"])
    assert np.allclose(qv.vectors[qv.query_ids.index(q), 0], text[0], atol=1e-5)
    run = read_run(tiny_copy / "clip.parquet")
    other = np.asarray(bench.corpus_ds["video_id"][:]) != bench.query(q).video_id  # own video is excluded
    assert np.isclose(run.topk_scores[run.query_ids.index(q), 0], (corpus.array[other] @ text[0]).max(), atol=1e-5)


def test_encode_resumes_from_finished_chunks(tiny_copy):
    from retrieval.encode import _encode_chunked

    ids = [f"x{i}" for i in range(10)]
    data = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    calls: list[tuple[int, int]] = []

    def crashing(s, e):
        if len(calls) == 2:
            raise RuntimeError("killed")
        calls.append((s, e))
        return data[s:e]

    with pytest.raises(RuntimeError, match="killed"):
        _encode_chunked(tiny_copy, "sp", "corpus", ids, "fp1", 3, crashing, progress=False)
    calls_after: list[tuple[int, int]] = []

    def ok(s, e):
        calls_after.append((s, e))
        return data[s:e]

    out = _encode_chunked(tiny_copy, "sp", "corpus", ids, "fp1", 3, ok, progress=False)
    assert calls_after == [(6, 9), (9, 10)]  # the two finished chunks were not recomputed
    assert np.array_equal(out, data)
    # a different job (fingerprint) does not reuse them
    calls_after.clear()
    _encode_chunked(tiny_copy, "sp", "corpus", ids, "fp2", 3, ok, progress=False)
    assert calls_after == [(0, 3), (3, 6), (6, 9), (9, 10)]


@pytest.mark.slow
def test_encode_shards_then_assemble(tiny_copy, monkeypatch):
    """Two shards leave their chunks (no table yet); the plain run computes nothing and assembles the same table
    a single unsharded job writes."""
    from eval.features import has_table, load_table
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.encoders import TextEncoder

    base = dict(data=str(tiny_copy), model="packaged:all-MiniLM-L6-v2", kind="semantic", chunk_size=2)
    encode_space(EncodeConfig(space="whole", **base), progress=False)
    for i in (0, 1):
        encode_space(EncodeConfig(space="sharded", shard=(i, 2), **base), progress=False)
        assert not has_table(tiny_copy, "sharded", "states")
    n_states = len(load_table(tiny_copy, "whole", "states").ids)
    assert len(list((tiny_copy / "features" / "sharded" / ".partial" / "states").glob("*.npy"))) == -(-n_states // 2)

    def no_compute(self, texts, **kw):
        raise AssertionError("the assembling run must not encode anything")

    monkeypatch.setattr(TextEncoder, "encode_items", no_compute)
    encode_space(EncodeConfig(space="sharded", **base), progress=False)
    whole, sharded = load_table(tiny_copy, "whole", "states"), load_table(tiny_copy, "sharded", "states")
    assert sharded.ids == whole.ids and np.allclose(sharded.array, whole.array, atol=1e-6)
    assert not (tiny_copy / "features" / "sharded" / ".partial").exists()
    with pytest.raises(ValueError, match="shard"):
        encode_space(EncodeConfig(space="bad", shard=(2, 2), **base), progress=False)
