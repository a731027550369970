"""What a turn here waits on that another thread sets: a person's decision or answers (a
future), a stop (an event), a resume (a flag).

A command recorded in this process sets it at once (runners/inline/wake.py). One recorded
by another process sets nothing here: the waiting turn finds it at its next look at the
database, so no wait on these is longer than the runner's poll interval.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any


class Signals:
    """The futures, stop events and resume flags of one runner's turns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, str], Future[Any]] = {}
        self._stops: dict[str, threading.Event] = {}
        self._resumes: dict[str, threading.Event] = {}

    # --- a person's decision or answers --------------------------------------------------

    def expect(self, run_id: str, key: str) -> Future[Any]:
        """The future that a decision (`key`: the call) or answers (`key`: the request)
        resolve; taken before the request can be seen, so that none is missed."""
        with self._lock:
            return self._futures.setdefault((run_id, key), Future())

    def forget(self, run_id: str, key: str) -> None:
        """The turn waits no more for `key`."""
        with self._lock:
            self._futures.pop((run_id, key), None)

    def release(self, run_id: str, key: str, value: Any) -> None:
        """A decision or answers were recorded: the turn waiting for them goes on."""
        with self._lock:
            future = self._futures.get((run_id, key))
        if future is not None and not future.done():
            future.set_result(value)

    # --- a stop ------------------------------------------------------------------------

    def stop(self, run_ids: Sequence[str]) -> None:
        """Runs were asked to stop: their waits (a retry's back-off) end now."""
        with self._lock:
            for run_id in run_ids:
                self._stops.setdefault(run_id, threading.Event()).set()

    def stop_event(self, run_id: str) -> threading.Event:
        """The event a stop of the run sets."""
        with self._lock:
            return self._stops.setdefault(run_id, threading.Event())

    # --- a resume ----------------------------------------------------------------------

    def resume(self, run_id: str) -> None:
        """The run was resumed: its wait at the step boundary ends now."""
        self.resume_flag(run_id).set()

    def resume_flag(self, run_id: str) -> threading.Event:
        """The flag a resume of the run sets."""
        with self._lock:
            return self._resumes.setdefault(run_id, threading.Event())

    def forget_resume(self, run_id: str) -> None:
        """The run is paused no more."""
        with self._lock:
            self._resumes.pop(run_id, None)

    def forget_run(self, run_id: str) -> None:
        """The run's turn ended here: nothing of it waits any more (a long-lived process
        keeps no event per run it ever drove)."""
        with self._lock:
            self._stops.pop(run_id, None)
            self._resumes.pop(run_id, None)

    def held(self) -> set[str]:
        """The runs something here is kept for (a stop event, a resume flag, a future)."""
        with self._lock:
            return {*self._stops, *self._resumes, *(run_id for run_id, _ in self._futures)}
