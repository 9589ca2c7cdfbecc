"""Shared fixtures. Nothing here downloads: models are built tiny into temp dirs, data is synthesised."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

#: Size of the session's synthetic benchmark: big enough for every tier, horizon and question type.
SYNTH_VIDEOS = int(os.environ.get("PSR_TEST_SYNTH_VIDEOS", "80"))


#: Test folders whose tiny models run fastest on one torch thread: on 2 busy cores two threads contend
#: (measured up to 7x slower forwards).
ONE_THREAD_DIRS = ("forecasters", "distill")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(request):
    if Path(str(request.module.__file__)).parent.name not in ONE_THREAD_DIRS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def synth_truth_dir(tmp_path_factory):
    """Step 1 of the synthetic construction: the simulator-truth benchmark (built once; treat as read-only)."""
    from eval.synth import build_benchmark

    out = tmp_path_factory.mktemp("psr-synth") / "psr-synth-truth"
    return build_benchmark(out, videos=SYNTH_VIDEOS, seed=0, progress=False)


@pytest.fixture(scope="session")
def synth_dir(synth_truth_dir):
    """A small synthetic PSR benchmark, built as `python -m retrieval synth` builds the default: the truth build
    canonicalized with the packaged MiniLM at 0.85, GT mined and verified (once per session; treat as read-only)."""
    from retrieval.canon.apply import ApplyConfig, apply_canonicalization
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.synth import MINE_BUDGET, NAME, THRESHOLD

    out = synth_truth_dir.parent / "psr-synth"
    cfg = ApplyConfig(data=str(synth_truth_dir), out=str(out), threshold=THRESHOLD, model=PACKAGED_MINILM,
                      mine_budget=MINE_BUDGET, verify=True, name=NAME)
    return apply_canonicalization(cfg, progress=False, log=lambda *_: None)


@pytest.fixture(scope="session")
def synth_bench(synth_dir):
    from eval.benchmark import Benchmark

    return Benchmark.load(synth_dir)
