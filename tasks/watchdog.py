"""Time limits on a threads pool, where Celery enforces none.

A prefork pool process gets `SoftTimeLimitExceeded` from a signal at the soft limit and
is killed at the hard one. On a threads pool the watchdog does the same to the task's
thread, as far as a thread can be made to:

- at the soft limit it raises `SoftTimeLimitExceeded` in the thread, only while the
  thread carries out a step (the model call or the tool, never in a commit): the step
  fails with it, as on prefork;
- at the hard limit it gives the step up as if its process had been killed: its claim or
  lease is let go of and the step is sent again (an attempt counted, so a step that keeps
  overrunning becomes a dead letter), and whatever the thread writes if it ever returns
  is refused. `TimeLimitExceeded` is raised in the thread too.

Python raises an exception in a thread only when the thread runs Python code: one blocked
in a single long C call (a socket read with no timeout) stays blocked until it returns,
holding its slot of the pool. Give such calls a timeout of their own.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from agent_jobs.runners.durable import RUNNING, Running

log = logging.getLogger(__name__)

CHECK_EVERY = 0.1


@dataclass
class _Watched:
    task_id: str
    started: float
    soft: float | None
    hard: float | None
    soft_raised: bool = False
    given_up: bool = False


def raise_in(thread: int, exc: type[BaseException]) -> bool:
    """Raise `exc` in the thread `thread` when it next runs Python code."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc))
    return bool(done == 1)


class Watchdog:
    """Watches the tasks of a threads pool for their time limits."""

    def __init__(self, give_up: Callable[[Running], None]) -> None:
        self.give_up = give_up
        self._lock = threading.Lock()
        self._watched: dict[int, _Watched] = {}
        self._thread: threading.Thread | None = None

    def watch(self, task_id: str, soft: float | None, hard: float | None) -> None:
        """The calling thread starts the task `task_id`."""
        if soft is None and hard is None:
            return
        with self._lock:
            self._watched[threading.get_ident()] = _Watched(task_id, time.monotonic(), soft, hard)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()

    def unwatch(self) -> None:
        """The calling thread's task has ended."""
        with self._lock:
            self._watched.pop(threading.get_ident(), None)

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_EVERY)
            try:
                self.check()
            except Exception:  # pragma: no cover - the next check tries again
                log.exception("the time-limit watchdog failed")

    def check(self) -> None:
        now = time.monotonic()
        with self._lock:
            watched = list(self._watched.items())
        for thread, task in watched:
            elapsed = now - task.started
            if task.hard is not None and elapsed >= task.hard and not task.given_up:
                task.given_up = True
                self._hard(thread, task)
            elif (
                task.soft is not None
                and elapsed >= task.soft
                and not task.soft_raised
                and RUNNING.on(thread)  # in a step's own code: never in a commit
            ):
                task.soft_raised = True
                log.warning("task %s passed its soft time limit", task.task_id)
                raise_in(thread, SoftTimeLimitExceeded)

    def _hard(self, thread: int, task: _Watched) -> None:
        running = RUNNING.give_up(thread)
        if running is None:
            log.error("task %s passed its hard time limit outside a step", task.task_id)
            return
        log.error(
            "task %s passed its hard time limit in step %s of run %s: giving the step up",
            task.task_id,
            running.step,
            running.run_id,
        )
        try:
            self.give_up(running)
        finally:
            with self._lock:
                if thread in self._watched:  # not raised into the pool's own loop
                    raise_in(thread, TimeLimitExceeded)


def limits(task: Any) -> tuple[float | None, float | None]:
    """A task's (soft, hard) time limits: its request's, its own, or the app's."""
    hard, soft = getattr(task.request, "timelimit", None) or (None, None)
    conf = task.app.conf
    hard = hard or task.time_limit or conf.task_time_limit
    soft = soft or task.soft_time_limit or conf.task_soft_time_limit
    return soft, hard
