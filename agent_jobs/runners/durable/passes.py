"""A coordinator pass: one run's loop replayed against its journal, under the run's lock.

A pass goes through named stages. It reads the run (locked) and its journal, a step's
completion written first; the gate then decides whether the loop may run (a fan-out's
sibling still out, then the step boundary of runners/boundary.py); the replay drives the
loop until it suspends or ends, and what it did is written: its new rows and events, or
the run's end. Then the transaction commits, and only then the sends: the frames, the
steps and the children, the end's last frame, the runs its end wakes, the wake-ups at
deadlines, and the loop kept in this process (runners/durable/sticky.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from ...dispatch import tools_of
from ...errors import AgentJobsError, Suspend
from ...executor import StepEnv
from ...loop import run_agent_loop
from ...store import RunView
from ...store import journal as journal_rows
from ...store.db import utcnow
from ...store.holds import IN_FLIGHT
from ...store.journal import ReplayRow
from ...streams.base import RunStream
from .. import boundary
from ..turn import (
    Ending,
    Finished,
    account_discarded_usage,
    announce_end,
    finish_turn,
    start_turn,
    turn_for,
)
from . import journal_cache
from .completion import Completion
from .kept import Kept, claim
from .replay import DurableHooks, drive, hooks_for

if TYPE_CHECKING:
    from .runner import DurableRunner


class Pass:
    """One pass over a run: `carry_out()` says where the run stands, and gives the remote
    step it kept back from the broker (with `keep`, for the task to run at once)."""

    # What the read found: the run's row and journal, its view, stream and env.
    read: journal_cache.Read
    run: RunView
    stream: RunStream
    env: StepEnv

    def __init__(
        self, runner: DurableRunner, run_id: str, completion: Completion | None, keep: bool
    ) -> None:
        self.runner = runner
        self.run_id = run_id
        self.completion = completion
        self.keep = keep
        # What the stages decide, for the sends once the pass has committed.
        self.outcome = ""
        self.ending: Ending | None = None
        self.finished = Finished()
        self.hooks: DurableHooks | None = None
        self.kept: Kept | None = None
        self.wake_at_deadline: datetime | None = None

    def carry_out(self) -> tuple[str, Kept | None]:
        """Read, gate, replay and write in one transaction; after its commit, the sends."""
        try:
            with self.runner.store.begin() as conn:
                if not self._read(conn):
                    return self.outcome, None
                self._gate(conn)
                self.env.flush_events(conn)
        except BaseException:
            if self.hooks is not None and self.hooks.sticky is not None:
                self.hooks.sticky.abandon()  # what the kept loop knows is not so
            raise
        self._send()
        return self.outcome, self.kept

    # --- read ------------------------------------------------------------------------

    def _read(self, conn: Connection) -> bool:
        """Lock the run and read its journal, the completion written first; False when the
        pass ends here (an unknown run, or one that has finished)."""
        runner, completion = self.runner, self.completion
        self.read = journal_cache.lock_and_read(runner.journal_cache, conn, self.run_id, completion)
        if self.read.run is None:
            self.outcome = f"unknown run {self.run_id}"
            return False
        self.run = run = RunView.from_row(self.read.run)
        self.stream = RunStream(runner.streams, run.root_run_id, self.run_id)
        self.env = StepEnv(app=runner.app, stream=self.stream, inbox=self.read.inbox)
        if completion is not None:
            completion.into(self.env, run, conn)
        if not run.finished:
            return True
        # The completion is written: it changes nothing more.
        runner.journal_cache.drop(self.run_id, run.created_at)
        runner.loops.drop(self.run_id)
        if completion is not None and run.status == "cancelled":
            account_discarded_usage(conn, run)  # its tokens were still spent
        self.env.flush_events(conn)
        self.outcome = run.status
        return False

    # --- gate ------------------------------------------------------------------------

    def _gate(self, conn: Connection) -> None:
        """Whether the loop runs now: not while a sibling is out, nor when the step
        boundary stops, holds or queues the run; else it is replayed."""
        completion = self.completion
        if completion is not None and any(r.state in IN_FLIGHT for r in self.read.loaded):
            # A sibling of a fan-out is still out: a replay would stop at it, and its own
            # result re-drives the run. Record this one and spare the replay.
            self.outcome = f"{completion.step} recorded; waiting for its siblings"
            return
        run = self.run
        verdict = boundary.decide(conn, self.env, self.runner.app, run, self.read.loaded)
        if isinstance(verdict, boundary.Stop):
            self._end(conn, Ending.cancelled(verdict.cause, run.cancel_keep_inbox))
            self.outcome = f"cancelled: {verdict.cause}"
        elif isinstance(verdict, boundary.Hold | boundary.Queue):
            self.outcome = verdict.outcome  # paused, or queued behind its thread or key
        else:
            if verdict.admitted:  # it begins, and wakes who may too
                start_turn(self.env, run, conn)
                self.wake_at_deadline = run.deadline
                self.finished = Finished(woken=verdict.woken)
            self._replay(conn)
            self._write(conn)

    # --- replay ----------------------------------------------------------------------

    def _replay(self, conn: Connection) -> None:
        """Drive the loop against the journal until it suspends (the run parks) or ends."""
        runner, run = self.runner, self.run
        if runner.before_replay is not None:
            runner.before_replay(self.run_id)
        disabled = runner.settings.disabled_patch_ids
        self.hooks = hooks = hooks_for(runner.loops, conn, run, self.read, self.env, disabled)
        hooks.known_model = runner.journal_cache.last_model(self.run_id, run.created_at)
        try:
            turn, deps = turn_for(runner.app, run, runner.settings)
            result = drive(hooks, runner.loops, partial(run_agent_loop, turn, deps, hooks))
        except Suspend:
            self.outcome = hooks.park()
        except AgentJobsError as exc:
            self.ending = Ending.failed(exc)
            self.outcome = f"failed: {exc}"
        else:
            self.ending = Ending.completed(result.output)
            self.outcome = "completed"

    def _write(self, conn: Connection) -> None:
        """What the replay did: its new rows with the pass's events in one statement (the
        first step kept back, with `keep`), or its rows and the run's end."""
        hooks = self.hooks
        assert hooks is not None
        if self.ending is not None:
            journal_rows.insert_many(conn, hooks.new_rows)
            self._end(conn, self.ending)
            return
        if self.keep:
            self.kept = claim(self.run, hooks, self.runner.settings.step_lease)
        journal_rows.insert_many(conn, hooks.new_rows, self.env.take_events())

    def _end(self, conn: Connection, ending: Ending) -> None:
        self.ending = ending
        self.finished = finish_turn(conn, self.env, self.runner.app, self.run, ending)

    # --- sends, once committed -------------------------------------------------------

    def _send(self) -> None:
        """Committed: now the world may hear of it, and the journal as read stays known."""
        runner, hooks = self.runner, self.hooks
        self._remember()
        self.env.flush()
        if hooks is not None:
            runner.dispatcher.steps(self.run_id, hooks.to_dispatch, tools=tools_of(hooks.new_rows))
            for child in hooks.children:
                runner.dispatcher.coordinate(child)
        if self.ending is not None:
            announce_end(self.stream, self.ending)
        finished = self.finished
        for woken in (finished.next_run, finished.parent, *finished.woken):
            if woken is not None:
                runner.dispatcher.coordinate(woken)
        if self.ending is None:
            self._wake_at_deadlines()
        if hooks is not None and hooks.sticky is not None:  # the pass is done with them
            runner.loops.keep(hooks.sticky)  # the loop, parked where the pass suspended

    def _remember(self) -> None:
        """Keep the journal as this pass knows it (and its model steps' whole intents) for
        the run's next pass here; forget the run once it has ended or sleeps."""
        cache, run, hooks = self.runner.journal_cache, self.run, self.hooks
        # A run that ended, or went to sleep: nothing of it is kept in this worker (a
        # sleeper's next pass may be hours away, in any process).
        if self.ending is not None or (hooks is not None and hooks.parked.status == "sleeping"):
            cache.drop(run.run_id, run.created_at)
            self.runner.loops.drop(run.run_id)
            return
        new = [ReplayRow.from_mapping(row) for row in hooks.new_rows] if hooks is not None else []
        cache.keep(run.run_id, run.created_at, [*self.read.loaded, *new], self.read.known)
        for step, intent in hooks.whole.items() if hooks is not None else ():
            cache.keep_model(run.run_id, run.created_at, step, intent)

    def _wake_at_deadlines(self) -> None:
        """Be there when a deadline passes, even if the run is then parked: the run's own
        (a run that began now), and its approvals' within a step's time limit (less than
        the broker's visibility timeout, which a delayed message must not outlive)."""
        runner = self.runner
        wake = [] if self.wake_at_deadline is None else [self.wake_at_deadline]
        if self.hooks is not None:
            horizon = utcnow() + timedelta(seconds=runner.settings.step_time_limit)
            wake += [m for m in self.hooks.wakeups if m <= horizon]  # later: the sweep's
        for moment in sorted(set(wake)):
            left = (moment - utcnow()).total_seconds()
            runner.dispatcher.coordinate(self.run_id, countdown=max(0.0, left) + 0.05)
