"""The modules of `retrieval.canon` import each other without a circle, counting imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import retrieval.canon

PACKAGE = Path(retrieval.canon.__file__).parent


def _imports(path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``path`` imports anywhere (module level or inside a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out & known


def _graph() -> dict[str, set[str]]:
    files = {"retrieval.canon." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts): p
             for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    return {m: _imports(p, set(files)) - {m} for m, p in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_canon_modules_import_without_a_circle():
    graph = _graph()
    assert "retrieval.canon.sweep" not in graph["retrieval.canon.store"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_a_circle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
