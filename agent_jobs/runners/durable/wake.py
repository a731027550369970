"""The durable runner's wake: what the broker is told once a command has committed.

A run whose new state is written needs a worker to drive it: a `coordinate` message, or
the steps to run. A broker that cannot be reached is a logged warning, never an error:
what the command recorded stands, and the sweep re-drives a run that has something to do
(an error would invite a retry that records the same request twice). A run another
runner drives (an inline run of the same database) is left to its own process, which
reads the database at its next look.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from ... import controls
from ...approvals.reconcile import Recorded
from ...dispatch import BROKER_ERRORS, CeleryDispatcher
from ...errors import ConfigurationError
from ...runs import RunRequest
from ...store import Store
from ...store import journal as journal_rows
from ...store.runs import RunStatus

log = logging.getLogger(__name__)

QUEUED = "it is recorded and queued, and the sweep starts it once the broker is back"
DECIDED = "what it waited for is recorded, and the sweep re-drives it once the broker is back"
CANCEL_RECORDED = "the cancel is recorded; the run stops when a worker next drives it"
CONTROL_RECORDED = "it is recorded, and takes effect when a worker next drives the run"


class DurableWake:
    """Wakes runs through the broker (`dispatcher`; None: a process with no broker, which
    records decisions and controls and leaves the waking to the sweep, and refuses what
    only a worker can start)."""

    runner: Literal["durable", "inline"] = "durable"
    new_status: RunStatus = "queued"

    def __init__(self, store: Store, dispatcher: CeleryDispatcher | None) -> None:
        self.store = store
        self.dispatcher = dispatcher

    def broker(self) -> CeleryDispatcher:
        """The dispatcher; `ConfigurationError` in a process without a broker."""
        if self.dispatcher is None:
            raise ConfigurationError(
                "no broker: set AGENT_JOBS_BROKER_URL to use the durable runner"
            )
        return self.dispatcher

    @contextmanager
    def admission(self, request: RunRequest | None) -> Iterator[None]:
        self.broker()  # no broker: refused before anything is looked at
        yield

    def started(self, run_id: str) -> None:
        # The row is written, so a re-drive is all a worker needs: no start_run.
        self._send(self.broker(), run_id, QUEUED)

    def stopping(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            self.wake(run_id, CANCEL_RECORDED)

    def cancelled(self, run_id: str, affected: list[str]) -> list[str]:
        self.stopping(affected)
        return affected

    def decided(self, run_id: str, key: str, value: Any) -> None:
        self.wake(run_id, DECIDED)

    def woken(self, run_id: str) -> None:
        self.wake(run_id, DECIDED)

    def paused(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            self.wake(run_id, CONTROL_RECORDED)

    def resumed(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            self._resend(run_id)
            self.wake(run_id, CONTROL_RECORDED)

    def retried(self, run_id: str, sends: Sequence[tuple[str, str]]) -> None:
        # The rows are `scheduled`: the sweep sends them if this send is lost.
        self._steps(self.broker(), run_id, list(sends), DECIDED)

    def reconciled(self, run_id: str, recorded: Recorded) -> None:
        if recorded.resend is not None and self.dispatcher is not None:
            # The step is `scheduled` again: the sweep sends it if this send is lost.
            self._steps(self.dispatcher, run_id, [recorded.resend], DECIDED)
        self.wake(run_id, DECIDED)

    # --- sending ---------------------------------------------------------------------------

    def wake(self, run_id: str, then: str = DECIDED) -> None:
        """Ask a worker to re-drive a durable run (harmless to repeat); a broker that cannot
        be reached is a warning saying what happens `then`."""
        if self.dispatcher is not None and self.store.get_run(run_id).runner == "durable":
            self._send(self.dispatcher, run_id, then)

    def _send(self, dispatcher: CeleryDispatcher, run_id: str, then: str) -> None:
        try:
            dispatcher.coordinate(run_id)
        except BROKER_ERRORS as exc:
            log.warning("run %s: the broker could not be reached (%s); %s", run_id, exc, then)

    def _steps(
        self, dispatcher: CeleryDispatcher, run_id: str, steps: list[tuple[str, str]], then: str
    ) -> None:
        if not steps:
            return
        try:
            dispatcher.steps(run_id, steps)
        except BROKER_ERRORS as exc:
            log.warning("run %s: the broker could not be reached (%s); %s", run_id, exc, then)

    def _resend(self, run_id: str) -> None:
        """Send the run's scheduled steps again: one a worker left alone while the run
        was paused (a person had it run again meanwhile) waits for it."""
        if self.dispatcher is None:
            return
        with self.store.connect() as conn:
            waiting = [r for r in journal_rows.in_flight(conn, run_id) if r.state == "scheduled"]
        steps = [(controls.task_of(row.intent), row.step) for row in waiting if not row.holder]
        self._steps(self.dispatcher, run_id, steps, CONTROL_RECORDED)
