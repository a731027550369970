"""Task events for the steps a chain runs inside a task, so Flower shows each step as the
task it is: its name, arguments, state, runtime and worker, as if it had been delivered."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery, current_task
from celery.utils.saferepr import saferepr

from agent_jobs.dispatch import step_reprs
from agent_jobs.runners.durable import StepOutcome, summary

log = logging.getLogger(__name__)

BUFFER_LIMIT = 64  # events held back at most (a chain's steps flush far sooner)


class ChainEvents:
    """`DurableRunner.eager_events` for a worker process: task-received, task-started,
    then task-succeeded or task-failed, under a task id of the step's own, its arguments
    and result shown as a delivered step task's are (agent_jobs.dispatch.step_reprs,
    `StepOutcome.summary`); a step that failed shows failed, with its reason.

    They go out in one message a step: a step's end waits for the next step's start
    (or for the end of the task that ran the chain: `flush`), as a worker's main process
    batches the events of delivered tasks.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._dispatcher: Any = None
        self._pid: int | None = None
        self._hostname: str | None = None  # the worker's node name, as its tasks say

    @contextmanager
    def __call__(
        self, task: str, task_id: str, run_id: str, step: str, tool: str | None = None
    ) -> Iterator[Callable[[str], None]]:
        request = getattr(current_task, "request", None)
        parent = getattr(request, "id", None)
        self._hostname = getattr(request, "hostname", None)
        argsrepr, kwargsrepr = step_reprs(task, run_id, step, tool)
        self._send(
            "task-received",
            task_id,
            name=task,
            args=argsrepr,
            kwargs=kwargsrepr,
            root_id=getattr(request, "root_id", None) or parent,
            parent_id=parent,
            retries=0,
            eta=None,
            expires=None,
        )
        self._send("task-started", task_id)
        self.flush()
        started = time.monotonic()
        outcome: list[str] = [""]
        try:
            yield lambda text: outcome.__setitem__(0, text)
        except BaseException as exc:
            self._send("task-failed", task_id, exception=repr(exc), traceback="")
            raise
        if isinstance(outcome[0], StepOutcome) and outcome[0].failed:
            # As a delivered step task that failed shows: the reason, no traceback.
            self._send("task-failed", task_id, exception=outcome[0].summary, traceback="")
            return
        self._send(
            "task-succeeded",
            task_id,
            result=saferepr(summary(outcome[0])),  # as Celery shows a task's result
            runtime=time.monotonic() - started,
        )

    def task_ran(
        self, task: str, task_id: str, result: str, *, received: float, runtime: float
    ) -> None:
        """A task that sends no events of its own (`Task.send_events` off: the sweep) ran
        and did something worth watching: it shows as if it had sent them, at once."""
        request = getattr(current_task, "request", None)
        self._hostname = getattr(request, "hostname", None)
        self._send(
            "task-received",
            task_id,
            name=task,
            args="()",
            kwargs="{}",
            root_id=getattr(request, "root_id", None) or task_id,
            parent_id=None,
            retries=0,
            eta=None,
            expires=None,
            timestamp=received,
        )
        self._send("task-started", task_id, timestamp=received)
        self._send("task-succeeded", task_id, result=saferepr(result), runtime=runtime)
        self.flush()

    def flush(self) -> None:
        """Send the events still held back (the task that ran the chain has ended)."""
        dispatcher = self._dispatcher
        if dispatcher is None or self._pid != os.getpid():
            return
        try:
            dispatcher.flush(errors=False)
        except Exception as exc:  # an event is for watching
            log.warning("could not send the task events of a chain: %s", exc)

    def _send(self, kind: str, task_id: str, **fields: Any) -> None:
        if not self.app.conf.worker_send_task_events:
            return
        try:
            self._events().send(kind, uuid=task_id, **fields)
        except Exception as exc:  # an event is for watching: the step goes on without it
            log.warning("could not send %s for task %s: %s", kind, task_id, exc)

    def _events(self) -> Any:
        with self._lock:
            if self._dispatcher is None or self._pid != os.getpid():
                connection = self.app.connection_for_write()
                # The pid and the worker's node name go on every event (as on a
                # delivered task's events: the pool process's pid, the worker's name).
                self._dispatcher = self.app.events.Dispatcher(
                    connection,
                    hostname=self._hostname,
                    enabled=True,
                    buffer_group={"task"},
                    buffer_limit=BUFFER_LIMIT,
                )
                self._pid = os.getpid()
            return self._dispatcher
