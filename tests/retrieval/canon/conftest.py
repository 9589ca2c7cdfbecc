"""Fixtures of the canonicalization tests: a writable copy of the synthetic benchmark with a MiniLM semantic space,
and a tiny random sentence-transformers model (for the fine-tune)."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def canon_bench_dir(synth_dir, tmp_path_factory, text_encoder):
    """The session's synthetic benchmark, its records copied and its frames / pixels linked, plus a ``minilm``
    semantic space (the packaged MiniLM, written as `retrieval encode` writes it). Treat as read-only."""
    from eval.features import write_meta, write_table
    from eval.io import read_jsonl
    from retrieval.encoders import PACKAGED_MINILM

    d = tmp_path_factory.mktemp("canon-bench") / "bench"
    d.mkdir()
    for f in ("manifest.json", "queries.jsonl", "corpus.jsonl", "states.jsonl"):
        shutil.copy2(synth_dir / f, d / f)
    os.symlink(synth_dir / "frames", d / "frames")
    (d / "features").mkdir()
    os.symlink(synth_dir / "features" / "pixels", d / "features" / "pixels")
    states = read_jsonl(d / "states.jsonl")
    emb = text_encoder.encode_items([s["text"] for s in states])
    write_table(d, "minilm", "states", [s["id"] for s in states], emb)
    write_meta(d, "minilm", kind="semantic", dim=emb.shape[1], model=PACKAGED_MINILM, encoder="sentence-transformers")
    return d


@pytest.fixture(scope="session")
def tiny_st_model(tmp_path_factory, synth_dir):
    """A random 2-layer BERT (hidden 128) with a WordPiece vocabulary of the synthetic states, wrapped as a
    sentence-transformers model (mean pooling, normalised): ~1 MB, trains in well under a second a step."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import WordPiece
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from eval.io import read_jsonl

    root = tmp_path_factory.mktemp("tiny-st")
    texts = [m for s in read_jsonl(synth_dir / "states.jsonl") for m in s["members"]]
    tk = Tokenizer(WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.train_from_iterator(texts * 3, trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok = BertTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", model_max_length=32)
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=256, max_position_embeddings=64))
    hf = root / "hf"
    bert.save_pretrained(hf)
    tok.save_pretrained(hf)
    word = Transformer(str(hf), max_seq_length=32)
    st = SentenceTransformer(modules=[word, Pooling(128, "mean"), Normalize()], device="cpu")
    st.save(str(root / "st"))
    return root / "st"
