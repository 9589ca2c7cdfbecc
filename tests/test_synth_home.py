"""`PSR_TEST_SYNTH_DIR`: the session's benchmarks are built into a folder once and reused; a folder holding a build of
another size is refused, never replaced (`tests/conftest.py`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _conftest():
    spec = importlib.util.spec_from_file_location("psr_tests_conftest", Path(__file__).with_name("conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_kept_build_is_reused_only_when_it_is_this_sessions_size(tmp_path):
    mod = _conftest()
    truth, canon = tmp_path / "psr-synth-truth", tmp_path / "psr-synth"
    assert not mod._kept_build(truth, truth)  # nothing built yet: build it there
    truth.mkdir()
    (truth / "manifest.json").write_text(json.dumps({"extra": {"videos": mod.SYNTH_VIDEOS, "seed": 0}}))
    assert mod._kept_build(truth, truth)
    assert not mod._kept_build(canon, truth)  # the canonicalized build is still to make
    (truth / "manifest.json").write_text(json.dumps({"extra": {"videos": mod.SYNTH_VIDEOS + 1, "seed": 0}}))
    with pytest.raises(pytest.UsageError, match="another folder"):
        mod._kept_build(truth, truth)
    assert (truth / "manifest.json").exists()  # refused, not replaced
