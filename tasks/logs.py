"""Worker logs: JSON lines when `AGENT_JOBS_LOG_FORMAT=json`, each tagged with its run and step."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from contextvars import Token
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_postrun,
    task_prerun,
)

from agent_jobs.dispatch import START_RUN
from agent_jobs.logs import LogSettings, bind, unbind, use_json

_bound: dict[str, Token[Mapping[str, Any] | None]] = {}


def task_fields(
    name: str, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """What a task's log lines are tagged with: the task, and the run and step it works on."""
    fields: dict[str, Any] = {"task": name, "task_id": task_id}
    if args and isinstance(args[0], str):
        fields["run_id"] = args[0]
    elif name == START_RUN:
        # Without a run_id, a started run is named after the task: its id is the task id.
        run_id = kwargs.get("run_id")
        fields["run_id"] = run_id if isinstance(run_id, str) and run_id else task_id
    if len(args) > 1 and isinstance(args[1], str):
        fields["step"] = args[1]
    return fields


def _root_logger(logger: logging.Logger, **_: Any) -> None:
    if LogSettings().log_format == "json":
        use_json(logger)


def _task_logger(logger: logging.Logger, **_: Any) -> None:
    if LogSettings().log_format == "json":
        use_json(logger)


def _bind_task(
    task_id: str | None = None,
    task: Any = None,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **_: Any,
) -> None:
    if task_id is None or task is None:
        return
    _bound[task_id] = bind(**task_fields(str(task.name), task_id, args or (), kwargs or {}))


def _unbind_task(task_id: str | None = None, **_: Any) -> None:
    token = _bound.pop(task_id, None) if task_id is not None else None
    if token is not None:
        # Bound in another context (a thread pool)? Then there is nothing to undo here.
        with contextlib.suppress(ValueError):
            unbind(token)


def install() -> None:
    """Connect the logging signals (idempotent): the app factory calls this."""
    after_setup_logger.connect(_root_logger, weak=False, dispatch_uid="agent_jobs.logs.root")
    after_setup_task_logger.connect(_task_logger, weak=False, dispatch_uid="agent_jobs.logs.task")
    task_prerun.connect(_bind_task, weak=False, dispatch_uid="agent_jobs.logs.bind")
    task_postrun.connect(_unbind_task, weak=False, dispatch_uid="agent_jobs.logs.unbind")
