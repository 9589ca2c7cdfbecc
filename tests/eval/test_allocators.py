"""`eval.allocators`: the Arrow pool and numpy's huge-page advice a toolkit process runs with, each checked in a fresh
interpreter (both are per-process settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _in_fresh_process(code: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "NUMPY_MADVISE_HUGEPAGE")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**base, "PYTHONPATH": str(REPO), **env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _settings(defrag: Path) -> str:
    return ("import json; from pathlib import Path; from eval.allocators import configure; "
            f"print(json.dumps(configure(force=True, defrag=Path({str(defrag)!r}))))")


@pytest.mark.parametrize(("mode", "advice"), [("madvise", False), ("always", False), ("defer+madvise", False),
                                               ("defer", True), ("never", True)])
def test_numpy_huge_page_advice_is_off_exactly_where_it_waits_for_compaction(tmp_path, mode, advice):
    defrag = tmp_path / "defrag"
    modes = ["always", "defer", "defer+madvise", "madvise", "never"]
    defrag.write_text(" ".join(f"[{m}]" if m == mode else m for m in modes) + "\n")
    got = _in_fresh_process(_settings(defrag))
    assert got["numpy_hugepage_advice"] is advice
    assert got["arrow_pool"] in ("jemalloc", "system")  # never pyarrow's mimalloc default


def test_a_machine_without_the_setting_keeps_numpy_s_default(tmp_path):
    got = _in_fresh_process(_settings(tmp_path / "absent"))
    assert got["numpy_hugepage_advice"] is True


def test_the_user_s_own_choices_win(tmp_path):
    defrag = tmp_path / "defrag"
    defrag.write_text("always defer defer+madvise [madvise] never\n")
    got = _in_fresh_process(_settings(defrag), ARROW_DEFAULT_MEMORY_POOL="mimalloc", NUMPY_MADVISE_HUGEPAGE="1")
    assert got == {"arrow_pool": "mimalloc", "numpy_hugepage_advice": True}


def test_loading_a_benchmark_configures_the_process():
    code = ("import json, pyarrow as pa; import eval.benchmark; "
            "print(json.dumps({'arrow_pool': pa.default_memory_pool().backend_name}))")
    assert _in_fresh_process(code)["arrow_pool"] in ("jemalloc", "system")
