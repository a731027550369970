"""The inline runner's sleeping runs: one waiter thread for all of them, none per run
(and none at all while nothing sleeps).

A turn that sleeps on a `wait` call (agent_jobs/timers.py) records it and ends its thread
(`Sleeping`); the run is kept here with its wake time. The waiter drives it again (from
its start, its journal read back, as a retry is) when its time comes, when a command of
this process concerns it (a message, a cancel, a pause), or when its look at the database
— every poll interval, one query for all the sleepers — finds that another process asked
something of it (a cancel, a pause, a message for its next step). The turn it drives
decides, at the timer's row, whether the run wakes or sleeps on.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import datetime

from ... import session
from ...store import Store
from ...store import events as event_rows
from ...store import timers as timer_rows
from ...store.db import utcnow

log = logging.getLogger(__name__)


class Sleepers:
    """The runs of one runner that sleep, and the thread that wakes them."""

    def __init__(self, store: Store, drive: Callable[[str], None], poll_interval: float) -> None:
        self.store = store
        self.drive = drive  # drives a run again, on a thread of its own
        self.poll_interval = poll_interval
        self._cond = threading.Condition()
        self._asleep: dict[str, tuple[str, datetime]] = {}  # run → (run to drive, wake_at)
        self._heap: list[tuple[datetime, str]] = []
        self._poked: set[str] = set()
        self._thread: threading.Thread | None = None

    def add(self, run_id: str, drive: str, wake_at: datetime) -> None:
        """`run_id` sleeps until `wake_at`; `drive` is the run whose turn to drive again
        (itself, or the top-level run whose thread drove it as a delegated run)."""
        with self._cond:
            self._asleep[run_id] = (drive, wake_at)
            heapq.heappush(self._heap, (wake_at, run_id))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sleepers", daemon=True)
                self._thread.start()
            self._cond.notify()

    def poke(self, run_ids: Iterable[str]) -> None:
        """A command here concerns these runs: those asleep are driven now."""
        with self._cond:
            found = [run_id for run_id in run_ids if run_id in self._asleep]
            if found:
                self._poked.update(found)
                self._cond.notify()

    def asleep(self) -> set[str]:
        with self._cond:
            return set(self._asleep)

    # --- the waiter ------------------------------------------------------------------

    def _run(self) -> None:
        looked = 0.0
        while True:
            with self._cond:
                if not self._asleep:  # none left: the thread ends, `add` starts another
                    self._thread = None
                    return
                self._cond.wait(self._timeout())
                due = self._due()
            now = utcnow().timestamp()
            if now - looked >= self.poll_interval:
                looked = now
                due |= self._looked()
            for drive in sorted(due):
                try:
                    self.drive(drive)
                except Exception:  # one run's failure must not stop the others' wakes
                    log.exception("could not wake sleeping run %s", drive)

    def _timeout(self) -> float:
        if self._poked:
            return 0.0
        if not self._heap:
            return self.poll_interval
        left = (self._heap[0][0] - utcnow()).total_seconds()
        return max(0.0, min(left, self.poll_interval))

    def _due(self) -> set[str]:
        """Under the lock: the runs to drive now (their time came, or poked), let go of."""
        now = utcnow()
        chosen = set(self._poked)
        self._poked.clear()
        while self._heap and self._heap[0][0] <= now:
            wake_at, run_id = heapq.heappop(self._heap)
            if self._asleep.get(run_id, ("", None))[1] == wake_at:
                chosen.add(run_id)
        return {self._asleep.pop(run_id)[0] for run_id in chosen if run_id in self._asleep}

    def _looked(self) -> set[str]:
        """The sleepers another process asked something of (a cancel, a pause, a message
        for the next step), or that are not asleep any more: let go of, to be driven."""
        with self._cond:
            run_ids = list(self._asleep)
        if not run_ids:
            return set()
        with self.store.connect() as conn:
            rows = timer_rows.sleepers(conn, run_ids)
            threads = {row.thread_id: row.id for row in rows}
            spliced = event_rows.of_threads(conn, list(threads), [session.SPLICED])
        stirred = {
            row.id
            for row in rows
            if row.status != "sleeping" or row.cancel_cause or row.pause_requested_by
        }
        by_thread: dict[str, list[session.Event]] = {}
        for event in spliced:
            by_thread.setdefault(event.thread_id, []).append(session.Event.from_row(event))
        stirred |= {
            threads[thread]
            for thread, log in by_thread.items()
            if session.fold_inbox(log).next_step
        }
        stirred |= set(run_ids) - {row.id for row in rows}
        with self._cond:
            return {self._asleep.pop(run_id)[0] for run_id in stirred if run_id in self._asleep}
