"""The durable runner: the same loop, replayed against a Postgres journal.

`coordinate(run_id)` takes the run's row lock (re-drives of one run are serialised;
a wake-up that arrives meanwhile blocks and then sees everything the holder missed),
loads the journal in one query and replays the loop. Finished steps return their
recorded result with no I/O. A new local step runs inside this transaction with its
journal row. A new remote step is inserted `scheduled`; after the commit it is
enqueued with `(run_id, step)` alone, and the pass suspends. `execute_step` is what a
step task does: claim the row, run the intent, write the result (first writer wins),
and re-drive the run in-process instead of through the broker.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any

import redis
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ... import diagnostics, observe
from ...app import AgentApp
from ...dispatch import Dispatcher, ResendingDispatcher, tools_of
from ...errors import AgentJobsError, ModelError, RetryLater, Suspend
from ...executor import StepEnv, execute_remote
from ...leases import Holder, Leases
from ...logs import log_context
from ...loop import run_agent_loop
from ...ratelimits.gate import ModelGate
from ...runs import RunRequest, admit
from ...settings import Settings
from ...steps import ModelTurn, dump, parse_intent
from ...store import RunView, Store
from ...store import events as event_rows
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...streams.base import RunStream, StreamBackend
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
from . import journal_cache, reconcile, recovery
from .liveness import Liveness, working_on
from .replay import DurableHooks, drive, hooks_for, sent_as
from .running import RUNNING, Running, heartbeat
from .step_tasks import (
    IN_FLIGHT,
    Completion,
    EagerEvents,
    Kept,
    claim,
    dead_letter,
    give_back,
    hold_back,
    late_delivery,
    model_failed,
    on_own_queue,
    quiet_events,
    refusal,
)
from .sticky import StickyLoops

log = logging.getLogger(__name__)


class DurableRunner:
    """Coordinates runs from their journal and carries out their remote steps."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        dispatcher: Dispatcher,
        streams: StreamBackend,
        settings: Settings,
        leases: Leases,
    ) -> None:
        self.app = app
        self.store = store
        # Every send here follows a commit: a broker outage must delay the run, never
        # fail it (the run's step is safely `scheduled` in Postgres).
        self.dispatcher = (
            dispatcher
            if isinstance(dispatcher, ResendingDispatcher)
            else ResendingDispatcher(dispatcher)
        )
        self.streams = streams
        self.settings = settings
        self.leases = leases
        self.limits = ModelGate.of(app, settings, leases.client)  # provider rate limits
        # Test seams: after the journal is loaded, the run's lock held; and before a
        # step task takes the step's lease.
        self.before_replay: Callable[[str], None] | None = None
        self.before_lease: Callable[[str, str], None] | None = None
        # How a step run in a chain is reported (the worker sends it to Flower as the
        # task it is); by default, not at all.
        self.eager_events: EagerEvents = quiet_events
        self.journal_cache = journal_cache.JournalCache()
        # Runs whose loop waits in this process between passes (runners/durable/sticky.py).
        self.loops = StickyLoops(256 if settings.sticky_loops else 0, settings.sticky_idle)
        # A worker's: this process's beat, so another recovers its runs if it dies.
        self.liveness: Liveness | None = None
        diagnostics.set_enabled(settings.diagnostics)

    # --- starting ----------------------------------------------------------------------

    def create(self, request: RunRequest, run_id: str) -> bool:
        """Validate the request and write the run row (queued); False if it exists. The
        runs an `if_busy="interrupt"` asked to stop are woken to stop."""
        made = admit(
            self.store, self.app, request, runner="durable", status="queued", run_id=run_id
        )
        for interrupted in made.interrupted:
            self.dispatcher.coordinate(interrupted)
        return made.created

    # --- the coordinator ---------------------------------------------------------------

    def coordinate(self, run_id: str, completion: Completion | None = None) -> str:
        """Replay the run's loop against its journal; returns where the run stands.

        With a `completion`, the step's outcome is written first, in the same
        transaction: a step task pays one commit for its result and the re-drive.
        Every step the pass schedules is sent.
        """
        return self._drive(run_id, completion, keep=False)[0]

    def continue_run(self, run_id: str) -> str:
        """`coordinate`, in a worker's task: the step the pass schedules runs here at once
        (of a fan-out, the first member; the others are sent)."""
        with working_on(self.liveness, run_id):
            outcome, kept = self._drive(run_id, None, keep=self._eager)
            if kept is not None:
                self._chain(run_id, kept)
            else:
                self._adopt_orphans(run_id)  # this may be the message of a task that died
        return outcome

    @property
    def _eager(self) -> bool:
        """Whether a task's own pass may keep the step it schedules (see `_chain`)."""
        return self.settings.eager_steps and self.settings.eager_max_steps > 0

    def _drive(
        self, run_id: str, completion: Completion | None, *, keep: bool
    ) -> tuple[str, Kept | None]:
        """A pass, and the remote step it kept back from the broker (with `keep`)."""
        try:
            return self._coordinate(run_id, completion, keep)
        except (DBAPIError, PoolTimeout):
            raise  # transient: the task is retried, or the sweep re-drives the run
        except Exception as exc:  # a bug must end the run visibly, not loop in the sweep
            log.exception("coordinating run %s failed", run_id)
            return self._fail(run_id, exc), None

    def _coordinate(
        self, run_id: str, completion: Completion | None, keep: bool
    ) -> tuple[str, Kept | None]:
        ending: Ending | None = None
        finished = Finished()
        hooks: DurableHooks | None = None
        kept: Kept | None = None
        wake_at_deadline: datetime | None = None
        try:
            with self.store.begin() as conn:
                read = journal_cache.lock_and_read(self.journal_cache, conn, run_id, completion)
                row = read.run
                if row is None:
                    return f"unknown run {run_id}", None
                run = RunView.from_row(row)
                stream = RunStream(self.streams, run.root_run_id, run_id)
                env = StepEnv(app=self.app, stream=stream, inbox=read.inbox)
                if completion is not None:
                    completion.into(env, run, conn)
                if run.finished:  # the completion is written: it changes nothing more
                    self.journal_cache.drop(run_id, run.created_at)
                    self.loops.drop(run_id)
                    if completion is not None and run.status == "cancelled":
                        account_discarded_usage(conn, run)  # its tokens were still spent
                    env.flush_events(conn)
                    return run.status, None
                if completion is not None and any(r.state in IN_FLIGHT for r in read.loaded):
                    # A sibling of a fan-out is still out: a replay would stop at it, and its
                    # own result re-drives the run. Record this one and spare the replay.
                    outcome, verdict = f"{completion.step} recorded; waiting for its siblings", None
                else:
                    verdict = boundary.decide(conn, env, self.app, run, read.loaded)
                if isinstance(verdict, boundary.Stop):
                    ending = Ending.cancelled(verdict.cause, run.cancel_keep_inbox)
                    outcome = f"cancelled: {verdict.cause}"
                    finished = finish_turn(conn, env, self.app, run, ending)
                elif isinstance(verdict, boundary.Hold | boundary.Queue):
                    outcome = verdict.outcome  # paused, or queued behind its thread or key
                elif isinstance(verdict, boundary.Go):
                    if verdict.admitted:  # it begins, and wakes who may too
                        start_turn(env, run, conn)
                        wake_at_deadline, finished = run.deadline, Finished(woken=verdict.woken)
                    if self.before_replay is not None:
                        self.before_replay(run_id)
                    disabled = self.settings.disabled_patch_ids
                    hooks = hooks_for(self.loops, conn, run, read, env, disabled)
                    hooks.known_model = self.journal_cache.last_model(run_id, run.created_at)
                    try:
                        turn, deps = turn_for(self.app, run, self.settings)
                        body = partial(run_agent_loop, turn, deps, hooks)
                        result = drive(hooks, self.loops, body)
                    except Suspend:
                        outcome = hooks.park()
                    except AgentJobsError as exc:
                        ending = Ending.failed(exc)
                        outcome = f"failed: {exc}"
                    else:
                        ending = Ending.completed(result.output)
                        outcome = "completed"
                    if keep and ending is None:
                        kept = claim(run, hooks, self.settings.step_lease)
                    if ending is None:  # the pass's rows and events in one statement
                        journal_rows.insert_many(conn, hooks.new_rows, env.take_events())
                    else:
                        journal_rows.insert_many(conn, hooks.new_rows)
                        finished = finish_turn(conn, env, self.app, run, ending)
                env.flush_events(conn)
        except BaseException:
            if hooks is not None and hooks.sticky is not None:  # what it knows is not so
                hooks.sticky.abandon()
            raise
        # Committed: now the world may hear of it, and the journal as read stays known.
        self._remember(run, read, hooks, ending)
        env.flush()
        if hooks is not None:
            self.dispatcher.steps(run_id, hooks.to_dispatch, tools=tools_of(hooks.new_rows))
            for child in hooks.children:
                self.dispatcher.coordinate(child)
        if ending is not None:
            announce_end(stream, ending)
        for woken in (finished.next_run, finished.parent, *finished.woken):
            if woken is not None:
                self.dispatcher.coordinate(woken)
        wake = [] if wake_at_deadline is None else [wake_at_deadline]
        if hooks is not None:  # approvals' deadlines, within a step's time limit (less
            # than the broker's visibility timeout, which a delayed message must not outlive)
            horizon = utcnow() + timedelta(seconds=self.settings.step_time_limit)
            wake += [m for m in hooks.wakeups if m <= horizon]  # later: the sweep's
        for moment in sorted(set(wake)) if ending is None else ():
            # Be there when a deadline passes, even if the run is then parked.
            left = (moment - utcnow()).total_seconds()
            self.dispatcher.coordinate(run_id, countdown=max(0.0, left) + 0.05)
        if hooks is not None and hooks.sticky is not None:  # the pass is done with them
            self.loops.keep(hooks.sticky)  # the loop, parked where the pass suspended
        return outcome, kept

    def _remember(
        self,
        run: RunView,
        read: journal_cache.Read,
        hooks: DurableHooks | None,
        ending: Ending | None,
    ) -> None:
        if ending is not None:
            self.journal_cache.drop(run.run_id, run.created_at)
            self.loops.drop(run.run_id)
            return
        new = [SimpleNamespace(**row) for row in hooks.new_rows] if hooks is not None else []
        self.journal_cache.keep(run.run_id, run.created_at, [*read.loaded, *new], read.known)
        for step, intent in hooks.whole.items() if hooks is not None else ():
            self.journal_cache.keep_model(run.run_id, run.created_at, step, intent)

    def _fail(self, run_id: str, exc: Exception) -> str:
        message, error_type = f"internal error: {exc}", type(exc).__name__
        with self.store.begin() as conn:
            row = run_rows.get_run(conn, run_id)
            finished = run_rows.finish_run(
                conn, run_id, "failed", error=message, error_type=error_type
            )
        if finished and row is not None:
            observe.run_finished(None, row, "failed")
            stream = RunStream(self.streams, row.root_run_id, run_id)
            stream.emit("error", error=message, error_type=error_type)
            stream.end()
        return f"failed: {message}"

    # --- step tasks --------------------------------------------------------------------

    def execute_step(self, run_id: str, step: str, *, task: str, retries: int = 0) -> str:
        """Carry out one remote step, then write its result and re-drive the run at once;
        the step that pass schedules runs next in this task (see `_chain`).

        `task` is the Celery task that delivered it: a step task acts only on a remote
        step in flight whose intent is of its kind, so a forged or stray task changes
        nothing and counts no attempt. `retries` is how often the step was deliberately
        retried (Celery's count). A model error the waterfall wants retried raises
        `RetryLater`: the task adapter hands it to Celery's retry countdown, so no
        worker sleeps.
        """
        with working_on(self.liveness, run_id):
            outcome, kept = self._step(run_id, step, task=task, retries=retries, keep=self._eager)
            if kept is not None:
                self._chain(run_id, kept)
        return outcome

    def _chain(self, run_id: str, kept: Kept) -> None:
        """Run the steps passes keep back, one after another, in this task: the next step
        runs where the last one ended, with no broker round trip.

        The pass that keeps a step writes its row claimed by this process (`claim`): its
        first attempt, leased in the row itself, which the heartbeat extends while it
        runs. A delivery of the step meanwhile leaves it alone; if this process dies, the
        message of the task that began the chain comes back and sends the steps whose
        claimant is gone (`_adopt_orphans`), or the sweep sends them once the claim
        lapses. A pass keeps no step after `eager_budget` seconds or `eager_max_steps`
        steps of a chain (the task's time limit allows one more step after the budget),
        and any failure on the way gives the step back and sends it.
        """
        settings = self.settings
        deadline = time.monotonic() + settings.eager_budget
        for ran in itertools.count(1):
            task, step = kept.send
            more = ran < settings.eager_max_steps and time.monotonic() < deadline
            task_id = str(uuid.uuid4())  # the step's own, as if it had been delivered
            try:
                with (
                    log_context(task=task, task_id=task_id, run_id=run_id, step=step),
                    self.eager_events(task, task_id, run_id, step, kept.tool) as report,
                ):
                    started = time.monotonic()
                    outcome, following = self._step(
                        run_id, step, task=task, retries=0, keep=more, kept=kept
                    )
                    report(outcome)
                    log.info(
                        "Step %s of run %s ran where the last one ended, in %.3fs: %s",
                        step,
                        run_id,
                        time.monotonic() - started,
                        outcome,
                    )
            except RetryLater as later:  # the waterfall wants the model asked again later
                self.dispatcher.steps(run_id, [kept.send], countdown=later.delay)
                return
            except Exception:
                log.warning("step %s of run %s goes to the broker", step, run_id, exc_info=True)
                if give_back(self.store, run_id, kept):  # not if it is no longer this process's
                    self.dispatcher.steps(run_id, [kept.send])
                return
            if following is None:
                return
            kept = following

    def _step(
        self,
        run_id: str,
        step: str,
        *,
        task: str,
        retries: int,
        keep: bool,
        kept: Kept | None = None,
    ) -> tuple[str, Kept | None]:
        """One step, by a delivered task or (`kept` by the pass before) in a chain."""
        settings = self.settings
        holder = Holder.me() if kept is None else kept.holder
        if self.before_lease is not None:
            self.before_lease(run_id, step)
        # The lease first, then the step's state: a duplicate that read the state before
        # the first delivery finished would otherwise run the step again once the lease
        # is free. A kept step's lease is the claim its row was written with.
        if kept is None and not self.leases.take(run_id, step, holder, settings.step_lease):
            return f"{step} already running", None  # a duplicate delivery
        taken = time.monotonic()
        fence: int | None = None
        try:
            if kept is not None:
                row, refused = kept.row, None  # written by the pass just now, under its lock
            else:
                with self.store.connect() as conn:  # the model step before, if known here
                    known = functools.partial(self.journal_cache.last_model, run_id)
                    row = journal_rows.get_with_whole_intent(conn, run_id, step, known)
                refused = refusal(row, step, task)
            fence = getattr(row, "fence", None)
            if refused is not None:
                if (
                    row is not None
                    and row.state in ("done", "failed")
                    and row.run_status not in run_rows.TERMINAL
                ):
                    self._adopt_orphans(run_id)
                return refused, None
            if self.limits is not None:  # no capacity for a model call: Deferred, no attempt
                self.limits.admit(row.intent, run_id, step)
            if kept is not None:
                attempt = 1
            else:  # a claimed attempt that died was counted in its row, not in Redis
                attempt = self.leases.count_attempt(run_id, step, row.attempts)
            guard = reconcile.guarded(self.app, row)  # a non-idempotent action's call
            try:
                # Deliberate retries do not count against the attempts a crashing step gets.
                if attempt > settings.step_max_attempts + retries:
                    reconcile.check(self.store, guard)  # an unknown outcome is not given up
                    completion = dead_letter(step, attempt)
                else:
                    if kept is None and (
                        late := late_delivery(self.store, settings, run_id, step, fence, taken)
                    ):
                        return late, None
                    reconcile.begin(self.store, guard)  # committed before the handler runs
                    completion = self._run_step(
                        row, step, holder, attempt, retries, claimed=kept is not None
                    )
                    if RUNNING.fenced(holder):  # over the hard time limit: sent again
                        return f"{step} given up on: over its time limit", None
            except reconcile.HandlerBegan:  # and its worker died: never run blindly again
                assert guard is not None
                found = reconcile.settle(self.store, self.leases, guard)
                if found is None:  # parked until a person says how it ended
                    return f"{step} outcome unknown; {self.coordinate(run_id)}", None
                completion = Completion(step, "done", found, attempt=attempt)
            completion = replace(completion, fence=fence)  # written while the step is ours
            if guard is not None:  # its outcome is known once this is written
                completion = replace(completion, call_id=guard.call_id)
            keep = keep and not on_own_queue(row)
            outcome, following = self._drive(run_id, completion, keep=keep)
            return completion.reported(outcome), following
        except RetryLater as later:  # held back (journal.not_before) until it is due
            if not hold_back(self.store, later, settings.step_lease, run_id, step, kept, fence):
                return f"{step} no longer this delivery's: not retried from here", None
            raise
        finally:
            try:
                if kept is None:
                    self.leases.release(run_id, step, holder)
            except redis.RedisError as exc:  # it expires; the step's outcome is recorded
                log.warning("could not release the lease of %s/%s: %s", run_id, step, exc)

    def _adopt_orphans(self, run_id: str) -> None:
        recovery.adopt_orphans(self.store, self.leases, self.dispatcher, run_id)

    def _run_step(
        self, row: Any, step: str, holder: Holder, attempt: int, retries: int, *, claimed: bool
    ) -> Completion:
        run_id = row.run_id
        stream = RunStream(self.streams, row.root_run_id, run_id)
        # Tag the step's frames, so a reader can tell attempts apart even if they overlap.
        stream.extra = {"step": step, "attempt": attempt}
        if attempt > 1:
            # A reader drops what an earlier, failed attempt of this step streamed.
            stream.emit("status", status="retrying", step=step, attempt=attempt)
        env = StepEnv(app=self.app, stream=stream, limits=self.limits)
        intent = parse_intent(row.intent)
        started = utcnow()
        running = Running(run_id, step, sent_as(intent), holder, claimed, row.fence)
        lease = self.settings.step_lease
        with (
            heartbeat(self.leases, self.store, lease, running, attempt, started) as beat,
            RUNNING.track(running, beat),
        ):
            try:
                result = dump(execute_remote(intent, env, step))
            except ModelError as failure:
                return model_failed(
                    self.app, self.settings, row, step, failure, attempt, retries, started
                )
            except Exception as exc:
                log.info("step %s of run %s failed: %s", step, run_id, exc)
                message = (
                    str(exc) if isinstance(exc, AgentJobsError) else f"{type(exc).__name__}: {exc}"
                )
                return Completion(
                    step, "failed", error=message, attempt=attempt, started_at=started
                )
        events: tuple[event_rows.PendingEvent, ...] = ()
        if isinstance(intent, ModelTurn):
            request = {"step": step, "attempt": attempt, "outcome": "ok"}
            events = ((row.thread_id, run_id, "agent/request", request),)
        return Completion(
            step, "done", result=result, attempt=attempt, started_at=started, events=events
        )

    # --- recovery ----------------------------------------------------------------------

    def sweep(self) -> int:
        """Decide the approvals past their deadline, re-drive the runs that made no
        progress for a while (runners/durable/recovery.py); returns how many runs it re-drove."""
        return recovery.sweep(self)
