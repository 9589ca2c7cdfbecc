"""Load a file of ``scripts/`` as a module, for the tests of the repository's scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """``scripts/<name>.py`` executed as the module ``_script_<name>`` (registered in ``sys.modules``, so that its
    dataclasses resolve their annotations)."""
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
