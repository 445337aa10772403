"""The conformance package's import graph is a tree: no module imports itself round a circle.

The graph is built from the source with :mod:`ast`, so imports that only type checkers see
(``if TYPE_CHECKING:``) and imports inside functions count as much as the ones that run at
import time: a circle of annotations is still a circle for a reader.  One edge is allowed and
named: :func:`conformance.model.all_cases` imports :mod:`conformance.suites` inside the function,
because importing the suites is what registers their cases (the registry lives in the model,
the suites fill it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import conformance

PACKAGE = Path(conformance.__file__).parent

ALLOWED = {("conformance.model", "conformance.suites")}
"""Edges left out of the cycle check (see the module docstring)."""

HARNESS_SIDE = {"conformance.harness", "conformance.peers", "conformance.store_peer",
                "conformance.iut", "conformance.runner", "conformance.net"}
"""What the case model must not import: the harness and what it plays and runs."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The conformance modules ``name`` imports anywhere in its source (``from conformance
    import x`` counts as importing ``conformance.x`` when that is a module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the conformance modules it imports."""
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if (node, nxt) in ALLOWED:
                continue
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_graph_is_built_from_real_imports() -> None:
    """Guards the checker: it sees plain, from-, relative and TYPE_CHECKING imports."""
    edges = graph()
    assert "conformance.model" in edges["conformance.harness"]
    assert "conformance.suites" in edges["conformance.model"]  # inside all_cases()
    assert "conformance.suites.source" in edges["conformance.suites.flight_size"]
    assert "conformance.store_peer" in edges["conformance.peers"]  # under TYPE_CHECKING
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_conformance_modules() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_case_context_does_not_import_the_harness() -> None:
    """The protocol describes the harness; it must not lean on it."""
    assert not graph()["conformance.context"] & {"conformance.harness", "conformance.runner"}


def test_model_imports_no_harness_side_module() -> None:
    """The case model knows cases and verdicts, not the harness that runs them."""
    assert not graph()["conformance.model"] & HARNESS_SIDE, graph()["conformance.model"]
