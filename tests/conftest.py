"""Shared fixtures. Nothing here downloads: models are built tiny into temp dirs, data is synthesised."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

#: Size of the session's synthetic benchmark: big enough for every tier, horizon and question type.
SYNTH_VIDEOS = int(os.environ.get("PSR_TEST_SYNTH_VIDEOS", "40"))


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory):
    """A small synthetic PSR benchmark (built once per test session; treat as read-only)."""
    from eval.synth import build_benchmark

    out = tmp_path_factory.mktemp("psr-synth")
    return build_benchmark(out, videos=SYNTH_VIDEOS, seed=0, progress=False)


@pytest.fixture(scope="session")
def synth_bench(synth_dir):
    from eval.benchmark import Benchmark

    return Benchmark.load(synth_dir)
