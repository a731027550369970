"""The inline runner's human waits: a decision on an action, answers to a tool's
questions. The turn parks its run, streams the request, and waits on a future that a
decision or answers recorded here resolve (runners/inline/signals.py), polling the
database between waits for what another process recorded (`agent-jobs approve`, the
listener), a cancel, and the deadlines of the run's calls (approvals/deadlines.py),
which it decides itself.

What is recorded and streamed is `runners/waits.py`'s, as in the durable runner.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from sqlalchemy import Connection

from ... import checkpoints as names
from ...app import AgentApp
from ...approvals import deadlines
from ...checkpoints import Decision
from ...hooks import AnswersWait, ApprovalRequests, ApprovalWait
from ...store import RunView, Store
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...streams.base import RunStream
from .. import waits
from ..cursor import JournalCursor
from .signals import Signals
from .stops import Stops

T = TypeVar("T")


class HumanWaits:
    """A turn's waits for a person, which its hooks (`InlineHooks`) hand on here."""

    def __init__(
        self,
        run: RunView,
        stream: RunStream,
        cursor: JournalCursor,
        *,
        app: AgentApp,
        store: Store,
        signals: Signals,
        stops: Stops,
        poll_interval: float,
    ) -> None:
        self.run = run
        self.stream = stream
        self.cursor = cursor  # the turn's: what a retried or forked run's journal holds
        self.app = app
        self.store = store
        self.signals = signals
        self.stops = stops
        self.poll_interval = poll_interval

    def request_approvals(self, requests: ApprovalRequests) -> None:
        """Put every decision the turn needs on record and stream its request, at once."""
        for wait in requests.waits:
            step = names.approval(wait.call.id)
            slot = self.cursor.take(step)
            if self.cursor.done(step, slot.row) is not None:
                continue  # decided already, in the journal
            with self.store.begin() as conn:
                described = self._requested(conn, wait)
                self._journal_wait(conn, described, slot.seq)
            self._announce(described.frames)

    def await_approval(self, wait: ApprovalWait) -> Decision:
        step = names.approval(wait.call.id)
        # Asked with the turn's other calls, its row is at an earlier position.
        slot = self.cursor.earlier(step) if wait.requested else self.cursor.take(step)
        if (journaled := self.cursor.done(step, slot.row)) is not None:
            return waits.recorded_decision(journaled.result)
        run_id, store = wait.run_id, self.store

        def recorded() -> Decision | None:
            with store.connect() as conn:
                return waits.decided(conn, run_id, wait)

        # Before the request can be seen: a decision from now on resolves it.
        future: Future[Decision] = self.signals.expect(run_id, wait.call.id)
        if wait.requested:  # on record and streamed with the turn's other calls
            described = waits.approval(wait)
            decided = recorded()
            if decided is not None:  # decided before the turn came to it: no wait
                self.signals.forget(run_id, wait.call.id)
                self._complete(described, waits.decision_result(decided))
                return decided
            with store.begin() as conn:
                self._lock(conn)
                self._park(conn, described)
        else:
            with store.begin() as conn:
                self._lock(conn)
                described = self._requested(conn, wait)
                self._journal_wait(conn, described, slot.seq)
                self._park(conn, described)
            self._announce(described.frames)
        decision = self._wait_for(future, run_id, wait.call.id, recorded)
        self._resume(described, waits.decision_result(decision))
        return decision

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        step = names.answers(wait.request_id)
        slot = self.cursor.take(step)
        if (journaled := self.cursor.done(step, slot.row)) is not None:
            return waits.recorded_answers(journaled.result)
        run_id, store = wait.run_id, self.store

        def recorded() -> dict[str, Any] | None:
            with store.connect() as conn:
                return waits.answered(conn, run_id, wait.request_id)

        described = waits.answers(wait)
        future: Future[dict[str, Any]] = self.signals.expect(run_id, wait.request_id)
        with store.begin() as conn:
            self._lock(conn)
            waits.ask(conn, run_id, wait)
            self._journal_wait(conn, described, slot.seq)
            self._park(conn, described)
        self._announce(described.frames)
        given = self._wait_for(future, run_id, wait.request_id, recorded)
        self._resume(described, waits.answers_result(given))
        return given

    def _requested(self, conn: Connection, wait: ApprovalWait) -> waits.HumanWait:
        """The request on the call's record, with its deadline if its tool has one."""
        call, now = wait.call, utcnow()
        deadline = deadlines.request(conn, self.app, self.run.run_id, call.id, call.name, now)
        return waits.approval(wait, deadline)

    def _journal_wait(self, conn: Connection, wait: waits.HumanWait, seq: int) -> None:
        journal_rows.insert_pending(
            conn,
            run_id=self.run.run_id,
            step=wait.step,
            seq=seq,
            intent=wait.intent,
            state="waiting",
        )

    def _lock(self, conn: Connection) -> None:
        """The run's row first, as a person's decision or answers take it before the call's
        or the question's row: a request written first, then the run parked, deadlocked
        with a decision that came in between."""
        run_rows.lock_run(conn, self.run.run_id, touch=True)

    def _park(self, conn: Connection, wait: waits.HumanWait) -> None:
        """Under the run's lock (`_lock`)."""
        run_rows.note_status(conn, self.run.run_id, wait.status, waiting_on=wait.label)

    def _announce(self, frames: tuple[waits.FrameSpec, ...]) -> None:
        self.stream.emit_many(list(frames))

    def _complete(self, wait: waits.HumanWait, result: dict[str, Any]) -> None:
        with self.store.begin() as conn:
            journal_rows.complete(conn, self.run.run_id, wait.step, state="done", result=result)

    def _resume(self, wait: waits.HumanWait, result: dict[str, Any]) -> None:
        with self.store.begin() as conn:
            journal_rows.complete(conn, self.run.run_id, wait.step, state="done", result=result)
            run_rows.set_status(conn, self.run.run_id, "running")
        self._announce((waits.RESUMED,))

    def _wait_for(
        self, future: Future[T], run_id: str, key: str, recorded: Callable[[], T | None]
    ) -> T:
        """Wait for a person. Another process may record the decision or the answers
        (`agent-jobs approve`, the listener) or cancel the run, and the run's calls may
        pass their deadline, so look at the database between waits on the future."""
        try:
            while True:
                try:
                    return future.result(timeout=self.poll_interval)
                except FutureTimeout:
                    self.stops.look(run_id)
                    self._expire()
                    found = recorded()
                    if found is not None:
                        return found
        finally:
            self.signals.forget(run_id, key)

    def _expire(self) -> None:
        """Decide the run's calls past their deadline, and stream what was escalated."""
        if not self.app.registry.deadlined:
            return
        with self.store.begin() as conn:
            timed_out = deadlines.expire_run(conn, self.app, self.run.run_id)
        for found in timed_out:
            self._announce(found.frames)
