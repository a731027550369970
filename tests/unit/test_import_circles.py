"""Import circles in `agent_jobs/` and `tasks/`: modules that import each other, directly
or around a ring. Read from the source with `ast` (tests/unit/test_layout.py's parser).

An import under `if TYPE_CHECKING:` is an annotation's, never run; every other one is an
arrow at run time, at module level or inside a function (a deferred import hides a circle,
it does not remove it). No circle of run-time arrows is allowed; circles that close only
through annotations are listed by

    .venv/bin/python -m tests.unit.test_import_circles

which prints every circle and the arrows that close it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable

import pytest

from tests.unit.test_layout import PACKAGE, ROOT, dotted, modules

pytestmark = pytest.mark.unit

Graph = dict[str, set[str]]


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of the imports under `if TYPE_CHECKING:`."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        lines.add(sub.lineno)
    return lines


def _targets(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        parts = package.split(".")
        base = ".".join(
            parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else [])
        )
    else:
        base = node.module or ""
    # `from a import b`: the module a.b if there is one, else a (b is a name in it).
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def graph(*, runtime_only: bool) -> Graph:
    paths = modules(PACKAGE, ROOT / "tasks")
    known = {dotted(path) for path in paths}
    edges: Graph = {name: set() for name in known}
    for path in paths:
        module = dotted(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        annotations = _type_checking_lines(tree) if runtime_only else set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in annotations:
                continue
            for target in _targets(node, package, known):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[module].add(target)
    return edges


def circles(edges: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(edges: Graph, found: list[list[str]]) -> list[str]:
    lines = []
    for circle in found:
        lines.append(" <-> ".join(circle))
        lines += [f"    {a} -> {b}" for a in circle for b in sorted(edges[a]) if b in circle]
    return lines


def test_the_finder_sees_a_circle_and_its_arrows() -> None:
    edges: Graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_at_run_time() -> None:
    edges = graph(runtime_only=True)
    found = circles(edges)
    assert not found, "import circles at run time:\n" + "\n".join(describe(edges, found))


def main() -> None:
    for runtime_only, title in ((True, "at run time"), (False, "counting annotations")):
        edges = graph(runtime_only=runtime_only)
        found = circles(edges)
        arrows = sum(len(edges[a] & set(c)) for c in found for a in c)
        print(f"{len(found)} circles {title} ({arrows} arrows close them):")
        print("\n".join(describe(edges, found)) or "    none")


if __name__ == "__main__":
    sys.exit(main())
