"""The package's layout rules, read from the source: the import floors.

- The runners sit on top, below the doors that start them: no module of `agent_jobs/`
  outside `agent_jobs/runners/`, `agent_jobs/cli/`, `agent_jobs/client.py` (the durable
  runner's wake), `agent_jobs/serving.py` and `agent_jobs/__init__.py` imports
  `agent_jobs.runners`.
- `tasks/` (the Celery adapters) sits above everything: no module of `agent_jobs/`
  imports `tasks`.
- `agent_jobs/http/` is a door: it imports neither `agent_jobs.cli` nor the runners
  (`agent_jobs/serving.py` joins it to one).
- Each runner is a wing (`agent_jobs/runners/durable/`, `agent_jobs/runners/inline/`)
  whose modules are private: outside `agent_jobs/runners/`, code imports `agent_jobs.runners`
  (and `tasks/` the durable wing's face, `agent_jobs.runners.durable`), never a module
  inside a wing. Neither wing imports the other.

Imports are parsed with `ast`: absolute and relative, at module level or inside
functions (and `importlib.import_module("…")` with a literal name).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agent_jobs"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted and absolute
    line: int

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def modules(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py"))


def dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, *, is_package: bool) -> list[Import]:
    """Every module `source` imports, resolved to absolute dotted names.

    `from a import b` yields both `a` and `a.b` (b may be a submodule).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base_parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.append(Import(module, base, node.lineno))
            found += [
                Import(module, f"{base}.{alias.name}", node.lineno)
                for alias in node.names
                if alias.name != "*"
            ]
        elif (
            isinstance(node, ast.Call)
            and _is_dynamic_import(node.func)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(Import(module, node.args[0].value, node.lineno))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def package_imports() -> list[Import]:
    found: list[Import] = []
    for path in modules(PACKAGE):
        source = path.read_text(encoding="utf-8")
        found += imports_of(source, dotted(path), is_package=path.name == "__init__.py")
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# --- the parser itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import agent_jobs.runners.durable", "agent_jobs.x", False, "agent_jobs.runners.durable"),
        ("from ..runners import turn", "agent_jobs.store.db", False, "agent_jobs.runners.turn"),
        ("from .. import runners", "agent_jobs.store.db", False, "agent_jobs.runners"),
        ("from .runners.inline import X", "agent_jobs", True, "agent_jobs.runners.inline"),
        ("from . import journal", "agent_jobs.store", True, "agent_jobs.store.journal"),
        ("def f():\n    from tasks import app\n", "agent_jobs.x", False, "tasks"),
        ("importlib.import_module('tasks.steps')", "agent_jobs.x", False, "tasks.steps"),
    ],
)
def test_imports_are_resolved_to_absolute_names(
    source: str, module: str, is_package: bool, expected: str
) -> None:
    targets = [i.target for i in imports_of(source, module, is_package=is_package)]
    assert expected in targets, targets


# --- the rules ------------------------------------------------------------------------------


def test_only_the_doors_above_the_runners_import_them() -> None:
    allowed = ("agent_jobs.runners", "agent_jobs.cli")
    doors = ("agent_jobs", "agent_jobs.client", "agent_jobs.serving")
    offenders = [
        found
        for found in package_imports()
        if within(found.target, "agent_jobs.runners")
        and found.module not in doors
        and not any(within(found.module, top) for top in allowed)
    ]
    assert not offenders, "imports agent_jobs.runners from below it:\n" + "\n".join(
        sorted({str(o) for o in offenders})
    )


WINGS = ("agent_jobs.runners.durable", "agent_jobs.runners.inline")


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def tasks_imports() -> list[Import]:
    found: list[Import] = []
    for path in modules(ROOT / "tasks"):
        source = path.read_text(encoding="utf-8")
        found += imports_of(source, dotted(path), is_package=path.name == "__init__.py")
    return found


def test_nothing_outside_a_wing_reaches_inside_it() -> None:
    offenders = []
    for found in package_imports() + tasks_imports():
        for wing in WINGS:
            if not within(found.target, wing) or within(found.module, wing):
                continue
            target = found.target if is_module(found.target) else found.target.rpartition(".")[0]
            if target == wing and (
                within(found.module, "agent_jobs.runners") or within(found.module, "tasks")
            ):
                continue  # the wing's face
            offenders.append(found)
    assert not offenders, "reaches inside a runner's wing:\n" + "\n".join(
        sorted({str(o) for o in offenders})
    )


def test_the_http_door_imports_neither_the_cli_nor_the_runners() -> None:
    offenders = [
        found
        for found in package_imports()
        if within(found.module, "agent_jobs.http")
        and (within(found.target, "agent_jobs.cli") or within(found.target, "agent_jobs.runners"))
    ]
    assert not offenders, "the HTTP door imports past its layer:\n" + "\n".join(
        sorted({str(o) for o in offenders})
    )


def test_row_locks_are_taken_only_in_the_store() -> None:
    """`agent_jobs/store/locks.py` keeps the order: a lock taken elsewhere would escape it."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in modules(PACKAGE, ROOT / "tasks")
        if not path.is_relative_to(PACKAGE / "store")
        and any(
            needle in path.read_text(encoding="utf-8")
            for needle in ("with_for_update", "for_update=", "FOR UPDATE", "FOR NO KEY UPDATE")
        )
    ]
    assert not offenders, "locks rows outside agent_jobs/store: " + ", ".join(offenders)


def test_nothing_in_agent_jobs_imports_tasks() -> None:
    offenders = [found for found in package_imports() if within(found.target, "tasks")]
    assert not offenders, "agent_jobs imports tasks:\n" + "\n".join(
        sorted({str(o) for o in offenders})
    )
