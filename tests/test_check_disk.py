"""scripts/check_disk.sh: a venv install that cannot fit stops before pip starts, saying what is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_disk.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("df") is None,
                                reason="needs bash and df")


def _run(venv: Path, need_mb: int, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(venv), str(need_mb)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **env})


def _free_mb(path: Path) -> int:
    return shutil.disk_usage(path).free // 2**20


def test_an_install_that_fits_passes_and_one_that_does_not_names_the_folder_and_the_shortfall(tmp_path):
    assert _run(tmp_path / ".venv", 10).returncode == 0
    r = _run(tmp_path / ".venv", _free_mb(tmp_path) + 10_000)
    assert r.returncode == 1
    assert str(tmp_path / ".venv") in r.stderr and "MB" in r.stderr and "rerun" in r.stderr
    assert not (tmp_path / ".venv").exists()  # the check creates nothing


def test_what_a_partly_installed_venv_holds_counts_towards_the_need(tmp_path):
    venv = tmp_path / ".venv"
    venv.mkdir()
    (venv / "blob").write_bytes(b"\1" * (256 * 2**20))
    need = _free_mb(tmp_path) + 128  # 128 MB more than is free, but the venv already holds 256 MB of it
    assert _run(venv, need).returncode == 0
    assert _run(tmp_path / "other", need).returncode == 1
    assert (venv / "blob").stat().st_size == 256 * 2**20  # nothing removed


def test_a_small_temporary_folder_on_another_filesystem_is_named(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's temporary folder")
    assert _run(tmp_path / ".venv", 10, TMPDIR=str(shm), CHECK_DISK_TMP_MB="1").returncode == 0
    r = _run(tmp_path / ".venv", 10, TMPDIR=str(shm), CHECK_DISK_TMP_MB=str(_free_mb(shm) + 1000))
    assert r.returncode == 1 and str(shm) in r.stderr and "TMPDIR" in r.stderr
