"""Retrieval on CUDA: LFTR trains and predicts on the GPU like on the CPU; the FAISS GPU index agrees with the CPU one.

Skipped without CUDA (run with ``scripts/gpu_tests.sh`` on a GPU node).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_lftr_trains_on_cuda_and_matches_cpu_inference(synth_bench, tmp_path):
    from retrieval.lftr.config import LFTRConfig
    from retrieval.lftr.predict import step_vectors, validation_recall
    from retrieval.lftr.train import load_checkpoint, prepare, train

    cfg = LFTRConfig(target_space="pixels", prefix_space="pixels", d_model=64, n_layers=2, n_heads=4, n_samples=4,
                     epochs=2, batch_size=64, lr=1e-3, n_random_negatives=64, n_hard_negatives=16, device="cuda")
    res = train(synth_bench, cfg, tmp_path, validate=validation_recall, progress=False, log=lambda s: None)
    assert res["epochs_done"] == 2 and res["best_val"] >= 0
    info = (tmp_path / "train_info.json").read_text()
    assert '"device": "cuda"' in info
    gpu_model, cfg2, _ = load_checkpoint(tmp_path, "cuda")
    cpu_model, _, _ = load_checkpoint(tmp_path, "cpu")
    prep = prepare(synth_bench, cfg2, tmp_path, "cpu")
    rows = prep.data.rows("test")
    a = step_vectors(gpu_model, prep, rows, seed=0)
    b = step_vectors(cpu_model, prep, rows, seed=0)
    assert np.allclose(a, b, atol=1e-3)


def test_lftr_trains_on_cuda_in_auto_precision(synth_bench, tmp_path):
    """`precision: auto` on a GPU with bf16 trains under bfloat16 autocast (recorded) and saves float32 weights; its
    first-epoch loss is the float32 run's to within bf16's rounding."""
    import json

    from retrieval.encoders import resolve_precision
    from retrieval.lftr.config import LFTRConfig
    from retrieval.lftr.predict import validation_recall
    from retrieval.lftr.train import load_checkpoint, train

    loss = {}
    for p in ("fp32", "auto"):
        cfg = LFTRConfig(target_space="pixels", prefix_space="pixels", d_model=64, n_layers=2, n_heads=4,
                         n_samples=4, epochs=1, batch_size=64, lr=1e-3, n_random_negatives=64, n_hard_negatives=16,
                         device="cuda", precision=p)
        train(synth_bench, cfg, tmp_path / p, validate=validation_recall, progress=False, log=lambda s: None)
        info = json.loads((tmp_path / p / "train_info.json").read_text())
        assert info["precision"] == resolve_precision(p, "cuda")
        loss[p] = json.loads((tmp_path / p / "history.jsonl").read_text().splitlines()[0])["loss"]
        model, _, _ = load_checkpoint(tmp_path / p, "cuda")
        assert all(t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point())
    assert resolve_precision("auto", "cuda") == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    assert np.isfinite(loss["auto"]) and abs(loss["auto"] - loss["fp32"]) < 0.05 * abs(loss["fp32"])


def test_validation_cut_on_cuda_agrees_with_every_sample_on_cpu(synth_bench, tmp_path):
    """The validation cut on the GPU drops only queries that miss the top k in the CPU's full counts too, and gives
    the same per-query R@k elsewhere (but for float near-ties between the two devices' products)."""
    from retrieval.lftr.config import LFTRConfig
    from retrieval.lftr.model import LFTR
    from retrieval.lftr.predict import recall_at_k_per_query, step_vectors, torch_main_pool_stats
    from retrieval.lftr.train import prepare

    cfg = LFTRConfig(target_space="pixels", prefix_space="pixels", d_model=64, n_layers=2, n_heads=4, n_samples=8)
    prep = prepare(synth_bench, cfg, tmp_path, "cpu")
    torch.manual_seed(0)
    model = LFTR(cfg, prep.data.prefix.shape[-1], prep.data.items.shape[1], 0)
    rows = prep.data.rows("val")
    vec = step_vectors(model, prep, rows)
    full = torch_main_pool_stats(prep, rows, vec)
    part = torch_main_pool_stats(prep, rows, vec, device="cuda", cut=5)
    dropped = (part["n_above"] == 5) & (part["n_tie_neg"] == 0) & (part["n_tie_pos"] == 0) & (full["n_pos"] > 0)
    assert dropped.mean() > 0.5 and (full["n_above"][dropped] >= 5).all()
    a, b = recall_at_k_per_query(full, 5), recall_at_k_per_query(part, 5)
    assert np.mean(np.nan_to_num(a, nan=-1) == np.nan_to_num(b, nan=-1)) > 0.99


def test_faiss_gpu_index_agrees_with_cpu():
    pytest.importorskip("faiss", reason="faiss is not installed in this interpreter (the toolkit's install has it)")
    from retrieval.index import FlatIPIndex, faiss_gpus

    if faiss_gpus() == 0:
        pytest.skip("faiss has no GPU support here (install faiss-gpu-cu12, the gpu extra)")
    rng = np.random.default_rng(0)
    items = rng.normal(size=(50_000, 64)).astype(np.float32)
    q = rng.normal(size=(100, 4, 64)).astype(np.float32)
    s_cpu, r_cpu = FlatIPIndex(items, use_gpu=False).search(q, 20)
    gpu = FlatIPIndex(items, use_gpu=True)
    assert gpu.on_gpu
    s_gpu, r_gpu = gpu.search(q, 20)
    assert np.allclose(s_cpu, s_gpu, atol=1e-4)
    assert (r_cpu == r_gpu).mean() > 0.99  # near-ties may swap between the two kernels
