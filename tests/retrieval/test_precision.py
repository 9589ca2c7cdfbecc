"""Training precision (config key ``precision`` of LFTR, ``optim.precision`` of the towers): float32, bfloat16
autocast, or ``auto`` (bf16 where the device computes it natively). The step's matrix products change dtype; the
weights, the optimizer and everything after training stay float32."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from retrieval_tiny_bench import TINY_PERCEIVER

from eval.benchmark import Benchmark
from eval.errors import InputError
from retrieval.encoders import PRECISIONS, autocast, native_bf16, resolve_precision


def test_auto_takes_bf16_exactly_where_the_device_has_it_natively(monkeypatch):
    assert resolve_precision("fp32", "cpu") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
    assert resolve_precision("auto", "cpu") == ("bf16" if native_bf16("cpu") else "fp32")
    for native in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda n=native: n, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
        assert resolve_precision("auto", "cpu") == ("bf16" if native else "fp32")
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp16", "cpu")


def test_the_autocast_context_computes_products_in_the_resolved_dtype():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with autocast("bf16", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast("fp32", "cpu"):
        assert (a @ b).dtype == torch.float32


def test_lftr_precision_is_checked_and_fp32_keeps_the_hash_of_configs_without_it():
    from retrieval.lftr.config import LFTRConfig

    with pytest.raises(InputError, match="precision must be one of"):
        LFTRConfig(precision="half")
    base = LFTRConfig()
    assert base.precision == "fp32" and set(PRECISIONS) == {"fp32", "bf16", "auto"}
    d = base.to_dict()
    del d["precision"]  # a config written before the key: its checkpoints resume
    assert LFTRConfig(**d).training_hash() == base.training_hash()
    assert LFTRConfig(precision="bf16").training_hash() != base.training_hash()


def test_tower_precision_is_checked_where_the_config_is_read():
    from retrieval.perceiver import PerceiverConfig
    from retrieval.towers import load_dataclass

    assert load_dataclass(PerceiverConfig, [], ["optim.precision=auto"]).optim.precision == "auto"
    with pytest.raises(InputError, match="optim.precision must be one of"):
        load_dataclass(PerceiverConfig, [], ["optim.precision=fp16"])


def test_an_lftr_head_trains_in_bf16_and_stays_float32(synth_sem_dir, tmp_path):
    """The same seed in float32 and in bf16: both train, the bf16 run says so in train_info.json, its saved weights
    are float32, and its first-epoch loss is the float32 one to within bf16's rounding."""
    from retrieval.lftr.config import LFTRConfig
    from retrieval.lftr.predict import validation_recall
    from retrieval.lftr.train import load_checkpoint, train

    bench = Benchmark.load(synth_sem_dir)
    cfg = dict(target_space="minilm", prefix_space="pixels", d_model=32, n_layers=1, n_heads=2, n_samples=4,
               epochs=1, batch_size=64, n_random_negatives=32, n_hard_negatives=8, threads=1)
    loss = {}
    for p in ("fp32", "bf16"):
        out = tmp_path / p
        train(bench, LFTRConfig(**cfg, precision=p), out, validate=validation_recall, progress=False,
              log=lambda s: None)
        info = json.loads((out / "train_info.json").read_text())
        assert info["precision"] == p
        loss[p] = json.loads((out / "history.jsonl").read_text().splitlines()[0])["loss"]
        model, _, _ = load_checkpoint(out / "best.pt")
        assert all(t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point())
    assert np.isfinite(loss["bf16"]) and abs(loss["bf16"] - loss["fp32"]) < 0.05 * abs(loss["fp32"])


def test_a_perceiver_trains_in_bf16_and_records_it(perceiver_world, tmp_path):
    """`optim.precision: bf16` reaches the shared tower loop: every epoch records it, the weights stay float32."""
    from retrieval.perceiver import PerceiverConfig, train_perceiver
    from retrieval.towers import load_dataclass

    cfg = load_dataclass(PerceiverConfig, [], TINY_PERCEIVER + ["optim.epochs=1", "optim.precision=bf16"])
    train_perceiver(perceiver_world, cfg, tmp_path / "p", progress=False, log=lambda s: None)
    hist = [json.loads(x) for x in (tmp_path / "p" / "train" / "history.jsonl").read_text().splitlines()]
    assert [h["precision"] for h in hist] == ["bf16"] and np.isfinite(hist[0]["loss"])
    state = torch.load(tmp_path / "p" / "psr_perceiver.pt", weights_only=False)["state_dict"]
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point())
