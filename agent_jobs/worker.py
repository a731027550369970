"""`celery -A agent_jobs.worker worker` (and `beat`, `flower`): the Celery app of agent-jobs
at a module path no file of the working directory can take over.

`celery -A tasks` imports the top-level package `tasks` installed with agent-jobs, unless
the directory it runs in (first on `sys.path`, as Celery puts it there) has a `tasks.py`
or `tasks/` of its own: a project's own tasks module then takes its place. This module
loads the installed package by its location, beside `agent_jobs`, under its own name
(its task classes and autodiscovery name `tasks.*`), whatever the working directory
holds. `celery -A tasks` keeps working where nothing shadows it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from celery import Celery

# The installed package: beside this one, in site-packages or in a source checkout.
INSTALLED = Path(__file__).resolve().parent.parent / "tasks"


def installed_tasks() -> ModuleType:
    """The `tasks` package installed with agent-jobs, imported (once) as `tasks`."""
    found = sys.modules.get("tasks")
    origin = getattr(found, "__file__", None)
    if found is not None and origin and Path(origin).resolve().parent == INSTALLED:
        return found
    spec = importlib.util.spec_from_file_location(
        "tasks", INSTALLED / "__init__.py", submodule_search_locations=[str(INSTALLED)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"agent-jobs' Celery app is not installed at {INSTALLED}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tasks"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["tasks"]
        raise
    return module


app: Celery = installed_tasks().app

__all__ = ["app", "installed_tasks"]
