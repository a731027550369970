"""What a step task is made of, apart from the runner: the step's outcome as the pass it
wakes writes it, when a delivery must leave a row alone, the heartbeat of a running step,
and how a step run in a chain is reported."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import redis

from ..leases import Holder, Leases
from ..steps import parse_intent
from ..store import Store
from ..store import events as event_rows
from ..store import journal as journal_rows
from ..store import runs as run_rows
from .replay import task_for

log = logging.getLogger(__name__)

IN_FLIGHT = frozenset({"scheduled", "started"})


@dataclass(frozen=True)
class Kept:
    """A step a pass kept back to run at once, with its row as the pass wrote it: the
    pass held the run's lock and nothing else knows of the step yet, so the task that
    runs it need not read the row again."""

    task: str
    step: str
    row: Any

    @property
    def send(self) -> tuple[str, str]:
        """The step as the broker takes it."""
        return self.task, self.step


# (task, task id, run id, step) -> a context that reports the step's outcome, or failure.
EagerEvents = Callable[[str, str, str, str], AbstractContextManager[Callable[[str], None]]]


@contextmanager
def quiet_events(
    task: str, task_id: str, run_id: str, step: str
) -> Iterator[Callable[[str], None]]:
    yield lambda outcome: None


def refusal(row: Any, step: str, task: str) -> str | None:
    """Why a step task must leave this journal row alone, or None to run it."""
    if row is None:
        return f"unknown step {step}"
    if row.run_status in run_rows.TERMINAL:
        return f"run already {row.run_status}"
    if row.state in ("done", "failed"):
        return f"{step} already {row.state}"
    if row.state not in IN_FLIGHT:
        return f"{step} is {row.state}, not a remote step"
    try:
        kind = task_for(parse_intent(row.intent))
    except (TypeError, ValueError):
        return f"{step} is not a remote step"
    if kind != task:
        return f"{step} is carried out by {kind}, not {task}"
    return None


@dataclass(frozen=True)
class Completion:
    """A remote step's outcome, written under the run's lock by the pass it wakes."""

    step: str
    state: Literal["done", "failed"]
    result: Any = None
    error: str | None = None
    attempt: int | None = None
    started_at: datetime | None = None
    events: tuple[event_rows.PendingEvent, ...] = ()


@contextmanager
def heartbeat(
    leases: Leases,
    store: Store,
    lease: float,
    run_id: str,
    step: str,
    holder: Holder,
    attempt: int,
    started: datetime,
) -> Iterator[None]:
    """While the step runs: keep its lease alive, and show it `started` once it
    has run for a moment (short steps go from scheduled to done in one commit)."""
    stop = threading.Event()
    beat = min(lease / 3, 1.0)

    def keep() -> None:
        while not stop.wait(beat):
            try:
                if not leases.refresh(run_id, step, holder, lease):
                    return  # another delivery holds it now
            except redis.RedisError as exc:
                log.warning("could not renew the lease of %s/%s: %s", run_id, step, exc)
            # Postgres too: while Redis is away, this keeps the sweep off the step.
            try:
                with store.begin() as conn:
                    journal_rows.mark_started(
                        conn, run_id, step, attempt=attempt, started_at=started, lease=lease
                    )
            except Exception as exc:  # the step goes on; the sweep is the backstop
                log.warning("heartbeat of %s/%s failed: %s", run_id, step, exc)

    keeper = threading.Thread(target=keep, name=f"lease-{step}", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()
