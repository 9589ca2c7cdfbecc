"""A script run as a file imports the toolkit's packages from its own checkout.

`python scripts/X.py` puts ``scripts/`` first on ``sys.path``, not the checkout; the packages would then come from
wherever the environment's editable install points (another checkout sharing the venv, say) or from a stray
``PYTHONPATH`` entry. Each script that imports them puts its checkout first."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"eval", "retrieval", "distill", "forecasters", "prompts"}


def _imports_toolkit(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n.split(".")[0] in PACKAGES for n in names):
            return True
    return False


SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py") if _imports_toolkit(p))


def test_scripts_that_import_the_toolkit_are_found():
    assert {"demo.py", "compare_predictors.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_script_puts_its_checkout_first(script):
    text = script.read_text(encoding="utf-8")
    assert "sys.path.insert(0" in text or "sys.path[:0]" in text, (
        f"{script.name} imports the toolkit without putting its checkout first on sys.path")


@pytest.mark.parametrize("name", ["demo.py", "compare_predictors.py"])
def test_another_checkout_on_the_path_is_not_imported(name, tmp_path):
    """A decoy ``eval`` package earlier on the path than site-packages (as another checkout's would be): the script's
    module code runs, and ``eval`` then resolves to this checkout."""
    decoy = tmp_path / "other" / "eval"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy checkout was imported')\n")
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='not_main'); import eval; "
            "print(eval.__file__)")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts" / name)], cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path / "other"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert Path(res.stdout.strip()).resolve() == ROOT / "eval" / "__init__.py"
