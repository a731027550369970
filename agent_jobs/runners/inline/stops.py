"""A turn's stop: whether a run here must stop now (a cancel asked for here or by another
process, or its deadline passed), the `Cancelled` that ends its turn, and what a stop
wakes: the run's waits, the queued runs, and the runs whose process is gone.

The look is the step boundary's first gate (runners/boundary.py); a turn that waits (for a
person, a retry's back-off) looks between its waits too, as nothing tells it of a cancel
another process records.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NoReturn

from ...app import AgentApp
from ...errors import Cancelled
from ...store import RunView, Store
from ...store import runs as run_rows
from ...streams.base import MemoryStreams
from .. import boundary
from . import abandoned
from .queue import QueuedRuns
from .signals import Signals


class Stops:
    """Stops the turns of one runner, and wakes what a stop concerns."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        streams: MemoryStreams,
        *,
        signals: Signals,
        queued: QueuedRuns,
        poll_interval: float,
    ) -> None:
        self.app = app
        self.store = store
        self.streams = streams
        self.signals = signals
        self.queued = queued
        self.poll_interval = poll_interval

    def look(self, run_id: str) -> RunView | None:
        """Raise `Cancelled` if a cancel was asked for here, elsewhere, or the deadline
        passed (the boundary's first gate, looked at between waits too); else the run as
        it stands."""
        with self.store.connect() as conn:
            row = run_rows.get_run(conn, run_id)
        if row is None:
            return None
        run = RunView.from_row(row)
        if boundary.stops(run):  # the look only reads; the stop may write (a deadline's)
            with self.store.begin() as conn:
                stopped = boundary.stop(conn, run)
            if stopped is not None:
                self.stop(run_id, stopped)
        return run

    def stop(self, run_id: str, stop: boundary.Stop) -> NoReturn:
        """The run stops at a boundary: raise `Cancelled`. When the boundary recorded the
        cancel (its deadline passed), what a cancel's wake does follows (`cancelled`)."""
        if stop.asked:
            self.cancelled(run_id, list(stop.asked))
        raise Cancelled(stop.cause)

    def sleep(self, run_id: str, seconds: float) -> None:
        """Wait before a retry, waking early to stop if the run is cancelled."""
        flag = self.signals.stop_event(run_id)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            flag.wait(min(left, self.poll_interval))
            self.look(run_id)

    def stopping(self, run_ids: Sequence[str]) -> None:
        """Runs were asked to stop: wake their waits (a retry's, a queued run's)."""
        self.signals.stop(run_ids)
        self.queued.nudge()

    def cancelled(self, run_id: str, affected: list[str]) -> list[str]:
        """A cancel of `run_id` was recorded (`affected`: the runs asked to stop): wake
        them; returns the runs it stops, the ones asked first."""
        self.stopping(affected)
        # An inline run whose process is gone has none to see the cancel: it ends here
        # (one cancelled before too: its cancel was recorded, and nothing saw it).
        ended = abandoned.end(self.store, self.app, [run_id, *affected], streams=self.streams)
        return affected + [target for target in ended if target not in affected]
