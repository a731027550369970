"""The inline runner's wake: what this process does once a command has committed.

A turn this process drives waits on a future (a decision, answers), on an event (a
pause, a retry's back-off, a queued run's turn), or not at all; a command recorded here
resolves or sets it at once. One recorded by another process reaches the turn at its
next look at the database. A run the command starts (a new run, a fork, a thread's next
turn) is driven here, on a thread of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from ...approvals.reconcile import Recorded
from ...errors import TooManyRunsError
from ...runs import RunRequest
from ...store import Store
from ...store import runs as run_rows
from ...store.runs import RunStatus
from .queue import QueuedRuns
from .signals import Signals
from .stops import Stops
from .turns import Turns


class InlineWake:
    """Wakes the turns of one inline runner through its parts. With `runs_per_actor` (a
    server: each run holds a thread until it ends, one parked on a person too) an actor
    may have that many going at once."""

    runner: Literal["durable", "inline"] = "inline"
    new_status: RunStatus = "running"

    def __init__(
        self,
        store: Store,
        *,
        signals: Signals,
        queued: QueuedRuns,
        stops: Stops,
        turns: Turns,
        runs_per_actor: int | None = None,
    ) -> None:
        self.store = store
        self.signals = signals
        self.queued = queued
        self.stops = stops
        self.turns = turns
        self.runs_per_actor = runs_per_actor
        # A run id is taken by the first request that names it: the check and the start
        # are one step for the requests of this process.
        self._admitting = threading.Lock()

    @contextmanager
    def admission(self, request: RunRequest | None) -> Iterator[None]:
        if request is not None and request.thread_id is not None:
            # A turn left on its thread by a process that is gone ends first.
            self.queued.clear_way(thread_id=request.thread_id)
        with self._admitting:
            if request is not None:
                self._check_room(request)
            yield

    def _check_room(self, request: RunRequest) -> None:
        store = self.store
        if self.runs_per_actor is None:
            return
        if request.run_id is not None and store.find_run(request.run_id) is not None:
            return  # found, not started: it takes no more room
        with store.connect() as conn:
            going = run_rows.unfinished_of(conn, request.actor, "inline")
        if going >= self.runs_per_actor:
            raise TooManyRunsError(
                f"actor {request.actor!r} has {going} runs going in this server, the most "
                "one actor may (AGENT_JOBS_API_INLINE_RUNS_PER_ACTOR): let one end, or "
                "serve with a broker, whose workers hold no thread for a waiting run"
            )

    def started(self, run_id: str) -> None:
        self.turns.drive(run_id)

    def stopping(self, run_ids: Sequence[str]) -> None:
        self.stops.stopping(run_ids)
        self.turns.sleepers.poke(run_ids)

    def cancelled(self, run_id: str, affected: list[str]) -> list[str]:
        stopped = self.stops.cancelled(run_id, affected)
        self.turns.sleepers.poke([run_id, *affected])
        return stopped

    def woken(self, run_id: str) -> None:
        self.turns.sleepers.poke([run_id])

    def decided(self, run_id: str, key: str, value: Any) -> None:
        self.signals.release(run_id, key, value)

    def paused(self, run_ids: Sequence[str]) -> None:
        """The turn pauses at its next step boundary, where it looks; a sleeping run is
        driven to it now."""
        self.turns.sleepers.poke(run_ids)

    def resumed(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            self.signals.resume(run_id)

    def retried(self, run_id: str, sends: Sequence[tuple[str, str]]) -> None:
        self.turns.drive(run_id)  # from its start, its journal read back

    def reconciled(self, run_id: str, recorded: Recorded) -> None:
        """Nothing to do: an inline run dies with its process and never waits on an
        unknown outcome; a durable run's call recorded here is re-driven by the sweep."""
