"""A step task's delivery: one remote step carried out, by a task the broker delivered or
in the chain of the task whose pass kept it back; and when a delivery must leave the
step's row alone, has come too late to call anything, or holds the step back for later.

The delivery goes through named stages. It takes the step's lease (a kept step's lease
is the claim its row was written with); reads the row and leaves it alone if it must
(`refusal`); makes an attempt (capacity for a model call first, then the attempt
counted, and the step run, or given up on after too many); and hands the step's outcome
to the pass it wakes, in the same transaction. A step held back for later (`RetryLater`)
goes back to the broker; the lease is released whatever happens.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

import redis

from ...errors import Deferred, RetryLater
from ...leases import Holder
from ...observability import genai
from ...settings import Settings
from ...steps import parse_intent
from ...store import Store
from ...store import events as event_rows
from ...store import holds as hold_rows
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...store.holds import IN_FLIGHT
from ...store.journal import JournalRow, JournalRowWithRun
from . import reconcile
from .completion import Completion, dead_letter
from .kept import Kept, on_own_queue
from .liveness import QUICK_SHARE
from .replay import task_for
from .running import RUNNING

if TYPE_CHECKING:
    from .runner import DurableRunner

log = logging.getLogger(__name__)


class Delivery:
    """One delivery of `step` of `run_id` by `task` (`kept`: by the pass before, in a
    chain); `carry_out` says what became of it and gives the step the pass it woke kept."""

    def __init__(
        self,
        runner: DurableRunner,
        run_id: str,
        step: str,
        *,
        task: str,
        retries: int,
        kept: Kept | None,
    ) -> None:
        self.runner = runner
        self.run_id = run_id
        self.step = step
        self.task = task
        self.retries = retries  # how often the step was deliberately retried
        self.kept = kept
        self.holder = Holder.me() if kept is None else kept.holder
        self.taken = 0.0  # when the lease was taken (time.monotonic)
        self.fence: int | None = None  # the step's epoch as this delivery read it

    def carry_out(self, keep: bool) -> tuple[str, Kept | None]:
        """Take the step's lease and carry the step out under it; with `keep`, the pass
        its outcome wakes may keep the next step for this task."""
        runner, run_id, step = self.runner, self.run_id, self.step
        if runner.before_lease is not None:
            runner.before_lease(run_id, step)
        # The lease first, then the step's state: a duplicate that read the state before
        # the first delivery finished would otherwise run the step again once the lease
        # is free. A kept step's lease is the claim its row was written with.
        lease = runner.settings.step_lease
        if self.kept is None and not runner.leases.take(run_id, step, self.holder, lease):
            return f"{step} already running", None  # a duplicate delivery
        self.taken = time.monotonic()
        try:
            return self._leased(keep)
        except RetryLater as later:  # held back (journal.not_before) until it is due
            if not hold_back(runner.store, later, lease, run_id, step, self.kept, self.fence):
                return f"{step} no longer this delivery's: not retried from here", None
            raise
        finally:
            self._release()

    def _leased(self, keep: bool) -> tuple[str, Kept | None]:
        """The step under its lease: its row read, an attempt made, its outcome written by
        the pass it wakes."""
        row = self._row()
        if isinstance(row, str):
            return row, None
        completion = self._attempt(row)
        if isinstance(completion, str):
            return completion, None
        keep = keep and not on_own_queue(row)
        outcome, following = self.runner._drive(self.run_id, completion, keep=keep)
        return completion.reported(outcome), following

    # --- the row ---------------------------------------------------------------------

    def _row(self) -> JournalRowWithRun | str:
        """The step's journal row, or why this delivery must leave it alone. A kept
        step's row is the one its pass wrote just now, under the run's lock."""
        runner, run_id, step = self.runner, self.run_id, self.step
        if self.kept is not None:
            self.fence = self.kept.row.fence
            return self.kept.row
        with runner.store.connect() as conn:  # the model step before, if known here
            known = functools.partial(runner.journal_cache.last_model, run_id)
            row = journal_rows.get_with_whole_intent(conn, run_id, step, known)
        if row is None:
            return f"unknown step {step}"
        self.fence = row.fence
        refused = refusal(row, step, self.task)
        if refused is None:
            return row
        if _ended_before_its_run(row):
            runner._adopt_orphans(run_id)  # this may be the message of a chain that died
        return refused

    # --- the attempt -----------------------------------------------------------------

    def _attempt(self, row: JournalRowWithRun) -> Completion | str:
        """The step's outcome from an attempt at it, or why the delivery ends here. A
        non-idempotent action whose handler began and whose worker died is never run
        blindly again: its outcome is settled (or parked until a person says)."""
        runner, run_id, step = self.runner, self.run_id, self.step
        if runner.limits is not None:  # no capacity for a model call: Deferred, no attempt
            runner.limits.admit(row.intent, run_id, step)
        if self.kept is not None:
            attempt = 1
        else:  # a claimed attempt that died was counted in its row, not in Redis
            attempt = runner.leases.count_attempt(run_id, step, row.attempts)
        guard = reconcile.guarded(runner.app, row)  # a non-idempotent action's call
        try:
            made = self._made(row, attempt, guard)
        except reconcile.HandlerBegan:
            assert guard is not None
            found = reconcile.settle(runner.store, runner.leases, guard)
            if found is None:  # parked until a person says how it ended
                return f"{step} outcome unknown; {runner.coordinate(run_id)}"
            made = Completion(step, "done", found, attempt=attempt)
        if isinstance(made, str):
            return made
        # Written while the step is ours; its span's GenAI attributes worked out here.
        done = made.result if made.state == "done" else None
        made = replace(made, fence=self.fence, genai=genai.attributes(runner.app, row.intent, done))
        if guard is not None:  # its outcome is known once this is written
            made = replace(made, call_id=guard.call_id)
        return made

    def _made(
        self, row: JournalRowWithRun, attempt: int, guard: reconcile.Guarded | None
    ) -> Completion | str:
        """Attempt `attempt` of the step: run, or given up on (the dead letter) past the
        attempts it gets; or why the delivery ends here (it came late, or ran over its
        time limit)."""
        runner, settings, step = self.runner, self.runner.settings, self.step
        # Deliberate retries do not count against the attempts a crashing step gets.
        if attempt > settings.step_max_attempts + self.retries:
            reconcile.check(runner.store, guard)  # an unknown outcome is not given up
            return dead_letter(step, attempt)
        if self.kept is None and (
            late := late_delivery(runner.store, settings, self.run_id, step, self.fence, self.taken)
        ):
            return late
        reconcile.begin(runner.store, guard)  # committed before the handler runs
        claimed = self.kept is not None
        completion = runner._run_step(
            row, step, self.holder, attempt, self.retries, claimed=claimed
        )
        if RUNNING.fenced(self.holder):  # over the hard time limit: sent again
            return f"{step} given up on: over its time limit"
        return completion

    def _release(self) -> None:
        try:
            if self.kept is None:
                self.runner.leases.release(self.run_id, self.step, self.holder)
        except redis.RedisError as exc:  # it expires; the step's outcome is recorded
            log.warning("could not release the lease of %s/%s: %s", self.run_id, self.step, exc)


def _ended_before_its_run(row: JournalRowWithRun) -> bool:
    """Whether the step has ended while its run has not."""
    return row.state in ("done", "failed") and row.run_status not in run_rows.TERMINAL


def refusal(row: JournalRowWithRun, step: str, task: str) -> str | None:
    """Why a delivered step task must leave this journal row alone, or None to run it."""
    if row.run_status in run_rows.TERMINAL:
        return f"run already {row.run_status}"
    if row.run_status == "paused":  # no step runs while it is; a resume sends it again
        return "run paused"
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
    if _claimed(row):
        return f"{step} already running"  # in the chain of the task that kept it
    return None


def _claimed(row: JournalRow) -> bool:
    """Whether the step's row is claimed by a process that may still be running it (the
    pass that scheduled it claimed it, and the claim has neither lapsed nor lost its
    holder)."""
    if row.holder is None or row.lease_until is None or row.lease_until <= utcnow():
        return False
    holder = Holder.parse(row.holder)
    return holder is None or not holder.gone()


def late_delivery(
    store: Store, settings: Settings, run_id: str, step: str, fence: int | None, taken: float
) -> str | None:
    """Why a delivery that took long to get here since it took the step's lease at
    `taken` (its row read, its attempt counted: calls that may have hung through a
    network cut and come back with what was true before it) must not call anything after
    all: the step finished meanwhile, or was let go of and sent again (its epoch moved on
    from `fence`). None to go on. A quick delivery needs no second look: nobody takes a
    step from a process that beats."""
    if time.monotonic() - taken < settings.process_timeout * QUICK_SHARE:
        return None
    with store.connect() as conn:
        row = journal_rows.get(conn, run_id, step)
    if row is None or row.state not in IN_FLIGHT:
        state = "gone" if row is None else row.state
        log.warning("step %s of run %s was delivered late: already %s", step, run_id, state)
        return f"{step} already {state}"
    if fence is not None and row.fence != fence:
        log.warning("step %s of run %s was delivered late: sent again since", step, run_id)
        return f"{step} sent again since this delivery took it"
    return None


def hold_back(
    store: Store,
    later: RetryLater,
    lease: float,
    run_id: str,
    step: str,
    kept: Kept | None,
    fence: int | None = None,
) -> bool:
    """The step goes back to the broker for `later.delay` seconds: recovery and the sweep
    leave it alone until then (`journal.not_before`), with the event saying why. A step
    deferred for capacity made no attempt: the claim of a step a pass `kept`, which
    counted one, is given back first. False, and nothing written, when the step is no
    longer this delivery's (its epoch moved on from `fence`): it must not be sent again."""
    try:
        with store.begin() as conn:
            if kept is not None and isinstance(later, Deferred):
                hold_rows.unclaim(conn, run_id, step, str(kept.holder))
            not_before = utcnow() + timedelta(seconds=later.delay)
            if not hold_rows.hold(
                conn, run_id, step, not_before=not_before, lease=lease, fence=fence
            ):
                raise _NotOurs  # rolls back what this transaction wrote
            if later.event is not None:
                event_rows.append(conn, [later.event])
    except _NotOurs:
        return False
    return True


class _NotOurs(Exception):
    """The step's epoch moved on: this delivery writes nothing."""
