"""Fixtures of the command-line tests: a tiny benchmark with a visual (`pixels`) and a semantic (`minilm`) space, a
run and a phrase file of it, per-test private copies, and a byte-level snapshot of a directory tree.

Every command runs in-process through its package's entry point (`cli_run.run_cli`), as ``python -m PACKAGE`` runs
it; `test_error_surface` also starts the real interpreter once per entry point.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for p in (TESTS, TESTS / "retrieval"):  # cli_run, retrieval_tiny_bench
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from cli_run import copy_world, run_cli  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

#: Examples per property (kept small: every example runs a command on a fresh copy of the benchmark).
#: ``PSR_FUZZ_EXAMPLES=200 PSR_FUZZ_RANDOM=1`` turns the suite into a longer, randomised fuzzing run.
settings.register_profile(
    "psr-cli", max_examples=int(os.environ.get("PSR_FUZZ_EXAMPLES", "6")), deadline=None, database=None,
    derandomize=os.environ.get("PSR_FUZZ_RANDOM", "") in ("", "0"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("PSR_DEBUG", raising=False)
    monkeypatch.setenv("COLUMNS", "1000")  # rich panels (typer's usage errors) keep a message on one line


@pytest.fixture(scope="session")
def cli_world(tmp_path_factory):
    """A read-only world: ``bench`` (tiny benchmark, spaces pixels + minilm), ``run`` (random baseline run of its
    test split), ``phrases`` (a phrase file of the test split)."""
    from retrieval_tiny_bench import build_tiny

    from eval.benchmark import Benchmark
    from retrieval.encode import EncodeConfig, encode_space
    from retrieval.encoders import PACKAGED_MINILM

    root = tmp_path_factory.mktemp("cli-world")
    bench = build_tiny(root / "bench")
    encode_space(EncodeConfig(str(bench), "minilm", PACKAGED_MINILM, kind="semantic"), progress=False)
    run = root / "runs" / "random.parquet"
    res = run_cli("retrieval", "baseline", "random", "--data", bench, "--out", run)
    assert res.code == 0, res.text
    b = Benchmark.load(bench)
    phrases = root / "phrases.jsonl"
    phrases.write_text("".join(json.dumps({"query_id": b.query_ids[int(i)], "phrase": "falling", "phrases": ["falling"],
                                           "config_hash": "h0", "model": "m"}) + "\n"
                               for i in b.query_rows("test")))
    shutil.rmtree(bench / ".cache", ignore_errors=True)
    return {"root": root, "bench": bench, "run": run, "phrases": phrases}


@pytest.fixture
def world(cli_world, tmp_path):
    return copy_world(cli_world, tmp_path / "w")
