"""Imports: the toolkit's module-level import graph has no cycle, and every module imports on its own (as the
first toolkit module a fresh interpreter imports)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("prompts", "eval", "retrieval", "forecasters", "distill")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = p.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(path: Path, name: str, known: set[str], *, in_functions: bool = False) -> set[str]:
    """Toolkit modules ``name`` imports: statements at module level (outside functions and ``if TYPE_CHECKING:``),
    and with ``in_functions`` also those inside functions and methods (run when the function is called);
    ``from a import b`` counts ``a.b`` when that is a module, else ``a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def add(node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
            return
        base = node.module or ""
        if node.level:
            anchor = name.split(".") if is_pkg else name.split(".")[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for a in node.names:
            sub = f"{base}.{a.name}"
            out.add(sub if sub in known else base)

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.Import | ast.ImportFrom):
                add(node)
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With | ast.For | ast.While | ast.ClassDef) or (  # bodies run on import
                    in_functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)):  # ... or on a call
                visit(node.body)
    visit(tree.body)
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_between_modules():
    """A package's ``__init__`` importing its own submodules is allowed (Python resolves that); any other cycle is
    not."""
    mods = _modules()
    known = set(mods)
    graph = {m: _imports(p, m, known) for m, p in mods.items()}
    # edges into a package's own __init__ from inside the package are how Python loads packages, not a cycle
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    assert _cycles(graph) == []


def test_the_checker_sees_a_cycle(tmp_path):
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert _cycles(graph) == [["a.x", "a.y", "a.z"]]
    p = tmp_path / "m.py"
    p.write_text("import a.y\nfrom a import z\nif TYPE_CHECKING:\n    import a.w\ndef f():\n    import a.w\n")
    assert _imports(p, "a.x", {"a.x", "a.y", "a.z", "a.w", "a"}) == {"a.y", "a.z"}
    assert _imports(p, "a.x", {"a.x", "a.y", "a.z", "a.w", "a"}, in_functions=True) == {"a.y", "a.z", "a.w"}


def _subpackages() -> list[str]:
    return sorted(m for m, p in _modules().items() if p.name == "__init__.py")


def _package_graph(package: str) -> dict[str, set[str]]:
    """The modules directly inside ``package`` (its own ``.py`` files, not its ``__init__`` or subpackages) and the
    ones among them each imports, at module level or inside a function."""
    mods = _modules()
    known = set(mods)
    inside = {m for m, p in mods.items() if p.name != "__init__.py" and m.rpartition(".")[0] == package}
    return {m: _imports(mods[m], m, known, in_functions=True) & inside for m in inside}


@pytest.mark.parametrize("package", _subpackages())
def test_no_import_circle_inside_a_package(package):
    """No circle among the modules of one package (eval, eval.synth, forecasters, retrieval.canon, ...), counting
    every import statement: those at module level and those inside functions and methods (a function-level import
    only delays the circle to the first call; two modules that need each other are one module or want a third).
    Statements under ``if TYPE_CHECKING:`` are not imports at run time and do not count."""
    assert _cycles(_package_graph(package)) == []


FRESH_IMPORTS = """
import importlib, sys, traceback
ours = tuple(sys.argv[1].split(","))
failed = []
for name in sys.argv[2:]:
    for m in [m for m in sys.modules if m.split(".")[0] in ours]:
        del sys.modules[m]  # the toolkit's modules start from scratch; third-party ones stay loaded (speed)
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc(limit=-3))
print("\\n".join(failed) or "ok")
"""


@pytest.mark.slow  # eval and retrieval take ~8 s each (every module imported afresh)
@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_imports_first(package):
    """Each module of ``package`` imported as the first toolkit module of the interpreter (the others removed from
    ``sys.modules`` before each import): an import that only works after another module loaded fails here."""
    names = [m for m in _modules() if m.split(".")[0] == package and not m.endswith("__main__")]
    res = subprocess.run([sys.executable, "-c", FRESH_IMPORTS, ",".join(PACKAGES), *names], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.stdout + res.stderr)[-4000:]


HELP_IMPORTS = """
import runpy, sys
package, args = sys.argv[1], sys.argv[2:]
sys.argv = [package, *args]
try:
    if package == "psr":
        from eval.console import main
        main(args)
    else:
        runpy.run_module(package, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print("LOADED", ",".join(sorted(m for m in sys.modules if "." not in m)), file=sys.stderr)
"""
#: Libraries that cost seconds to import: a ``--help`` must not load them (docs/performance.md, issue 23).
HEAVY_MODULES = ("torch", "transformers", "sentence_transformers", "datasets", "pandas", "pyarrow", "numba",
                 "scipy", "faiss", "matplotlib", "vllm", "trl", "peft")


@pytest.mark.parametrize("argv", [("psr", "--help"), ("retrieval", "--help"), ("retrieval", "fuse", "--help"),
                                  ("retrieval", "lftr", "train", "--help"), ("eval", "--help"),
                                  ("forecasters", "--help"), ("distill", "--help")], ids=" ".join)
def test_help_imports_no_heavy_library(argv):
    """``python -m PACKAGE --help`` and ``psr --help`` load only the command-line layer: every heavy library is
    imported by the command that uses it, so asking for help costs an interpreter start, not torch's import."""
    res = subprocess.run([sys.executable, "-c", HELP_IMPORTS, *argv], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip(), res.stderr[-2000:]  # the help text was printed
    loaded = set(res.stderr.rsplit("LOADED ", 1)[1].strip().split(","))
    assert not loaded & set(HEAVY_MODULES), sorted(loaded & set(HEAVY_MODULES))
