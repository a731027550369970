"""How pytest-xdist spreads the tests over its processes (`--dist loadgroup`).

A test alone goes to whichever process is free. Tests that share a fixture of module or
class scope (a stack of worker, listener and server started once for a module) go to one
process together, so that stack is started once, not once in every process.
"""

from __future__ import annotations

import pytest


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope in ("module", "class", "package")
        for defs in info.name2fixturedefs.values()
        if defs
    )


def group(items: list[pytest.Item]) -> None:
    for item in items:
        if _shares_a_fixture(item) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
