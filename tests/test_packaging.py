"""Packaging: the core installs without extras, the ranges admit the tested set, constraints.txt is that set."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
#: Extras a core install lacks; their modules are blocked below. (`gpu` replaces faiss-cpu's module; `dev` is tests.)
JOB_EXTRAS = ("synth", "train", "serve")
#: Modules every core install must import, and whose command lines must answer --help.
CORE_MODULES = ("eval", "retrieval", "forecasters", "distill", "prompts", "eval.cli", "retrieval.cli",
                "retrieval.canon.cli", "forecasters.cli", "distill.cli", "eval.console", "eval.environment",
                "retrieval.canon.apply", "retrieval.canon.mining", "retrieval.oracles", "forecasters.runner",
                "forecasters.probes", "forecasters.backends.hf", "distill.predicates", "distill.sft", "distill.train")
#: A fresh interpreter that refuses to import the given top-level modules, imports CORE_MODULES, runs every
#: package's --help through `psr`, and prints "ok".
BLOCKED_RUN = """
import importlib, importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: installed by an extra)")
sys.meta_path.insert(0, Missing())
for m in sys.argv[2].split(","):
    importlib.import_module(m)
from eval.console import main
for package in ("eval", "retrieval", "forecasters", "distill"):
    assert main([package, "--help"]) == 0, package
loaded = {m.split(".")[0] for m, mod in sys.modules.items() if mod is not None}  # None: an import kept out
assert not BLOCKED & loaded, BLOCKED & loaded
print("ok")
"""


def _requirements(extras=None) -> list[Requirement]:
    groups = [PROJECT["dependencies"]] if extras is None else [PROJECT["optional-dependencies"][e] for e in extras]
    return [Requirement(r) for g in groups for r in g if not r.startswith(PROJECT["name"])]


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _extra_modules() -> list[str]:
    """Top-level modules installed by the job extras' distributions (and by nothing in the core)."""
    dists = {canonicalize_name(r.name) for r in _requirements(JOB_EXTRAS)}
    core = {canonicalize_name(r.name) for r in _requirements()}
    by_module = metadata.packages_distributions()
    return sorted(m for m, ds in by_module.items()
                  if {canonicalize_name(d) for d in ds} & dists and not {canonicalize_name(d) for d in ds} & core)


@pytest.mark.slow
def test_core_imports_and_answers_help_without_the_job_extras():
    blocked = _extra_modules()
    assert {"pymunk", "trl", "peft", "httpx", "tenacity", "sklearn"} <= set(blocked)
    res = subprocess.run([sys.executable, "-c", BLOCKED_RUN, ",".join(blocked), ",".join(CORE_MODULES)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


@pytest.mark.parametrize("group", ["core", *JOB_EXTRAS, "gpu", "dev"])
def test_every_requirement_is_a_lower_bounded_range_admitting_the_pinned_version(group):
    pins = _constraints()
    for req in _requirements(None if group == "core" else [group]):
        lower = [s for s in req.specifier if s.operator == ">="]
        assert lower and not [s for s in req.specifier if s.operator == "=="], f"{group}: {req} is not a range"
        pinned = pins.get(canonicalize_name(req.name))
        assert pinned is not None, f"{req.name} is missing from constraints.txt"
        assert req.specifier.contains(pinned, prereleases=True), f"{group}: {req} excludes the tested {pinned}"
        assert Version(lower[0].version) == Version(pinned), f"{group}: {req}: lower bound is not the tested {pinned}"


def test_constraints_are_the_installed_set():
    """constraints.txt pins what this environment runs (local labels such as +cpu aside)."""
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version).public for d in metadata.distributions()}
    for name, version in _constraints().items():
        if name.startswith("faiss-") and name not in installed:
            continue  # faiss-cpu or the gpu extra's faiss-gpu-cu12: one of the two is installed
        assert installed.get(name) == version, f"constraints.txt pins {name}=={version}, installed {installed.get(name)}"


def test_requires_python_admits_this_interpreter_and_the_ruff_target():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(PROJECT["requires-python"])
    assert spec.contains(".".join(map(str, sys.version_info[:3])))
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["target-version"]
    assert spec.contains(f"{target[2]}.{target[3:]}.0") and not spec.contains(f"{target[2]}.{int(target[3:]) - 1}.99")
