"""One coordinator pass of the durable runner: the loop replayed against the journal.

Finished steps return their recorded result with no I/O. A new local step runs in the
pass's transaction and its row is inserted with the pass; a new remote step is
recorded `scheduled` and the pass suspends (the runner sends it once the pass has
committed). A human wait is recorded `waiting` and the pass suspends on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection

from ... import checkpoints as names
from ... import timers
from ...approvals import deadlines
from ...checkpoints import Decision, DelegationOutcome
from ...dispatch import INVOKE_TOOL, MODEL_TURN
from ...errors import StepFailedError, Suspend
from ...executor import StepEnv, execute_local
from ...hooks import (
    AnswersWait,
    ApprovalRequests,
    ApprovalWait,
    Delegation,
    LoopHooks,
    ParallelBlock,
    Patch,
    Settled,
    StepCall,
    TimerWait,
    settle,
)
from ...messages import ToolCall
from ...observability import observe
from ...steps import Intent, InvokeTool, ListMcpTools, ModelTurn, Summarize, dump, parse_intent
from ...store import RunView, model_requests
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...store.journal import ReplayRow
from .. import waits
from ..cursor import JournalCursor, Marker
from ..turn import child_run_id, create_child, delegation_intent, delegation_label
from . import reconcile
from .journal_cache import Read
from .sticky import ParkedLoop, StickyLoops

T = TypeVar("T")


def task_for(intent: Intent) -> str:
    """The Celery task that carries out a remote intent."""
    if isinstance(intent, ModelTurn | Summarize):
        return MODEL_TURN
    if isinstance(intent, InvokeTool | ListMcpTools):  # an MCP server's list: a tool's work
        return INVOKE_TOOL
    raise TypeError(f"{type(intent).__name__} is not a remote step")


def sent_as_journaled(intent: Any) -> str:
    """`sent_as`, of an intent as the journal holds it (a model step's may be partial)."""
    if model_requests.is_model_turn(intent):
        return MODEL_TURN
    return sent_as(parse_intent(intent))


def sent_as(intent: Intent) -> str:
    """The task name a remote intent is sent as: with `@queue` when it has a queue of its
    own (dispatch.own_queue)."""
    queue = getattr(intent, "queue", None)
    return f"{task_for(intent)}@{queue}" if queue else task_for(intent)


@dataclass
class _Parked:
    """Where a suspended pass left the run."""

    status: run_rows.RunStatus = "running"
    labels: list[str] = field(default_factory=list)


class DurableHooks(LoopHooks):
    """One coordinator pass: replays the journal, runs new local steps in `conn`."""

    def __init__(
        self,
        conn: Connection,
        run: RunView,
        rows: list[ReplayRow],
        env: StepEnv,
        disabled_patches: frozenset[str],
    ) -> None:
        self.disabled_patches = disabled_patches
        self.cursor = JournalCursor()
        self.last_model: tuple[int, str | None] = (0, None)
        self.rebind(conn, run, rows, env)
        # Where the loop parks instead of suspending, when it runs in a greenlet of its own
        # that outlives the pass (runners/durable/sticky.py); the rows its last pass read as
        # final, which never change.
        self.sticky: ParkedLoop | None = None
        self.seen_final = 0
        # The tools of the calls the loop asked decisions on so far (a parked loop's,
        # across the passes that resume it): does a deadline concern the run?
        self.asked_tools: set[str] = set()

    def rebind(self, conn: Connection, run: RunView, rows: list[ReplayRow], env: StepEnv) -> None:
        """Serve a pass: its connection, run row, journal and events (a parked loop's
        hooks serve each pass that resumes it)."""
        self.conn = conn
        self.run = run
        self.env = env
        model = names.model_prefix()
        self.cursor.read(rows)
        for row in rows:
            if row.step.startswith(model) and row.seq > self.last_model[0]:
                self.last_model = (row.seq, row.step)  # the journal's latest model step
        self.to_dispatch: list[tuple[str, str]] = []
        self.children: list[str] = []  # delegated runs to start once this pass commits
        self.new_rows: list[dict[str, Any]] = []  # inserted in one statement before commit
        self.parked = _Parked()
        self.resumed = False  # whether this pass resumed the run from a human wait
        self.whole: dict[str, dict[str, Any]] = {}  # new model steps' whole intents
        # Approval deadlines: when to wake the run to honour them (sent once the pass has
        # committed).
        self.wakeups: list[datetime] = []
        # (step, whole intent) of the last model step this process scheduled, if known.
        self.known_model: tuple[str, Any] | None = None

    def _suspend(self, signal: Suspend, *, keep: bool = True) -> None:
        """Suspend the pass: raise `signal`, or, for a loop that outlives its pass, park
        until a later pass resumes it (then the caller looks at its step again). With
        `keep=False` (a sleeping run: nothing of it stays in a worker) it is raised."""
        if self.sticky is None or self.cursor.in_block or not keep:
            raise signal
        self.sticky.park(signal)

    def park(self) -> str:
        """The pass suspended: record what the run now waits on; returns the outcome."""
        run, parked = self.run, self.parked
        waiting_on = " ".join(parked.labels) if parked.status != "running" else None
        if run.status != parked.status or run.waiting_on != waiting_on:
            run_rows.note_status(self.conn, run.run_id, parked.status, waiting_on=waiting_on)
        # A human wait streams its own `status` frame, and so does the wait a person
        # released the run from; a run released some other way (its wait's row completed
        # by a repair) says so here.
        if parked.status == "running" and run.status in waits.PARKED and not self.resumed:
            kind, fields = waits.RESUMED
            self.env.emit_after_commit(kind, **fields)
        if parked.status == "running":
            return "waiting " + " ".join(parked.labels)
        return " ".join(parked.labels)

    def whole_intent(self, step: str) -> Any:
        """A new step's intent, whole (a model step's is journaled against the one
        before)."""
        if step in self.whole:
            return self.whole[step]
        return next(r["intent"] for r in self.new_rows if r["step"] == step)

    def _last_model_turn(self) -> tuple[str, Any] | None:
        """(step, whole intent) of the run's latest model step before this one: as this
        process scheduled it, or from the journal."""
        step = self.last_model[1]
        if step is None:
            return None
        if self.known_model is not None and self.known_model[0] == step:
            return self.known_model
        intent = journal_rows.whole_model_intent(self.conn, self.run.run_id, step)
        return (step, intent) if intent is not None else None

    # --- positions ---------------------------------------------------------------------

    @property
    def pos(self) -> int:
        """The position of the loop's latest request (runners/cursor.py)."""
        return self.cursor.pos

    @property
    def by_seq(self) -> dict[int, ReplayRow]:
        """The journal's rows as this pass knows them, by position."""
        return self.cursor.by_seq

    @property
    def by_name(self) -> dict[str, ReplayRow]:
        """The journal's rows as this pass knows them, by name."""
        return self.cursor.by_name

    def _recorded(self, name: str) -> ReplayRow | None:
        """The journal row at the next position, checked against the step asked for."""
        return self.cursor.take(name).row

    def _record(
        self, name: str, state: journal_rows.StepState, intent: Any, result: Any = None
    ) -> None:
        self.new_rows.append(
            journal_rows.row(
                run_id=self.run.run_id,
                step=name,
                seq=self.pos,
                state=state,
                intent=intent,
                result=result,
            )
        )
        self.cursor.put(Marker(name, self.pos, state, result))

    def _wait(self, label: str, status: run_rows.RunStatus = "running") -> Suspend:
        self.parked.labels.append(label)
        if status != "running":
            self.parked.status = status
        return Suspend(label)

    # --- hooks -------------------------------------------------------------------------

    def step(self, call: StepCall) -> Any:
        row = self._recorded(call.name)
        if row is None:
            intent = call.intent
            if not intent.remote:
                started = observe.clock()
                result = dump(execute_local(intent, self.conn, self.env, call.name))
                observe.local_step(self.env, self.run, call.name, started)
                self._record(call.name, "done", dump(intent), result)
                return result
            row = self._schedule(call.name, intent)
        while True:
            row = self.cursor.attempt(call.name, row)
            if row.state == "done":
                if self.run.status == reconcile.STATUS:  # it may have waited on this call
                    self._settled(call)
                return row.result
            if row.state == "failed":
                raise StepFailedError(call.name, row.error or "failed")
            # A call whose outcome nobody knows waits for a person (runners/durable/reconcile.py).
            self._suspend(self._wait(*reconcile.waiting_on(self.run, self.env, call, row)))
            row = self.by_name[call.name]  # as the pass that resumed the loop read it

    def _settled(self, call: StepCall) -> None:
        """The run waited for a person to say how this call ended, and it is recorded."""
        parked = reconcile.settled(self.run, call)
        if parked is not None:
            self._resumed(parked)

    def _schedule(self, name: str, intent: Intent) -> ReplayRow:
        """Record a new remote step `scheduled`, to be sent once the pass commits."""
        if isinstance(intent, InvokeTool) and intent.call.name in self.env.app.registry:
            queue = self.env.app.registry.get(intent.call.name).queue
            if queue is not None:  # recorded, so that every re-send goes there too
                intent = intent.model_copy(update={"queue": queue})
        recorded = dump(intent)
        if isinstance(intent, ModelTurn):  # journaled as what changed since the last
            self.whole[name] = recorded
            recorded = model_requests.slim(recorded, self._last_model_turn())
        self._record(name, "scheduled", recorded)
        self.to_dispatch.append((sent_as(intent), name))
        return self.by_name[name]

    def request_approvals(self, requests: ApprovalRequests) -> None:
        """Record every decision the turn needs, each at its position, and stream each
        request now; the calls then wait for theirs one by one (`await_approval`)."""
        for wait in requests.waits:
            self.asked_tools.add(wait.call.name)
            if self._recorded(names.approval(wait.call.id)) is None:
                described, given = self._asked(wait)
                result = given()
                self._record(
                    described.step, "done" if result else "waiting", described.intent, result
                )
                self._announce(described)

    def await_approval(self, wait: ApprovalWait) -> Decision:
        self.asked_tools.add(wait.call.name)
        if not wait.requested:
            described, given = self._asked(wait)
            return waits.recorded_decision(self._await(described, given, self._timed_out))
        # Asked with the turn's other calls: its row is recorded at an earlier position.
        described = waits.approval(wait)
        row = self.by_name[described.step]
        while row.state != "done" and not self._timed_out(described.step):
            self._suspend(self._wait(described.label, described.status))
            row = self.by_name[described.step]
        self._resumed(described)
        return waits.recorded_decision(self.by_name[described.step].result)

    def _asked(
        self, wait: ApprovalWait
    ) -> tuple[waits.HumanWait, Callable[[], dict[str, Any] | None]]:
        """The wait as it is streamed (with its deadline, if its tool has one), and what
        puts the request on the call's record: a decision already made, or none."""
        now = utcnow()
        deadline = deadlines.deadline_for(self.env.app, wait.call.name, now)

        def given() -> dict[str, Any] | None:
            decided = waits.decided(self.conn, self.run.run_id, wait)
            if decided is not None:
                return waits.decision_result(decided)
            deadlines.request(
                self.conn, self.env.app, self.run.run_id, wait.call.id, wait.call.name, now
            )
            if deadline is not None:
                self.wakeups.append(deadline)
            return None

        return waits.approval(wait, deadline), given

    def _timed_out(self, step: str) -> bool:
        """Whether the run's calls past their deadline decided `step` (in this pass, under
        the run's lock): a pass woken at a deadline decides what is due, and goes on."""
        app = self.env.app
        if not any(deadlines.deadline_for(app, tool, utcnow()) for tool in self.asked_tools):
            return False  # none of the calls it waits on times out
        for timed_out in deadlines.expire_run(self.conn, self.env.app, self.run.run_id):
            for kind, fields in timed_out.frames:
                self.env.emit_after_commit(kind, **fields)
            if timed_out.deadline is not None:
                self.wakeups.append(timed_out.deadline)
            if timed_out.decision is not None:
                name = names.approval(timed_out.call_id)
                row = self.by_name.get(name)
                if row is not None:  # requested: its row is this run's to complete
                    result = waits.decision_result(timed_out.decision)
                    self.cursor.put(Marker(name, row.seq, "done", result))
        state: str = self.by_name[step].state
        return state == "done"

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        def given() -> dict[str, Any] | None:
            answers = waits.ask(self.conn, self.run.run_id, wait)
            return None if answers is None else waits.answers_result(answers)

        return waits.recorded_answers(self._await(waits.answers(wait), given))

    def _await(
        self,
        wait: waits.HumanWait,
        given: Callable[[], dict[str, Any] | None],
        settled: Callable[[str], bool] = lambda step: False,
    ) -> Any:
        """The wait's recorded result, or suspend on it. `given` is what a person already
        said (recorded before this pass reached the wait), and puts the ask on record;
        `settled` whether something other than a person settled it in this pass."""
        row = self._recorded(wait.step)
        if row is None:
            result = given()
            self._record(wait.step, "waiting" if result is None else "done", wait.intent, result)
            self._announce(wait)
            if result is not None:
                self._resumed(wait)
                return result
            row = self.by_name[wait.step]
        while row.state != "done" and not settled(wait.step):
            self._suspend(self._wait(wait.label, wait.status))
            row = self.by_name[wait.step]
        self._resumed(wait)
        return self.by_name[wait.step].result

    def _announce(self, wait: waits.HumanWait) -> None:
        for kind, fields in wait.frames:
            self.env.emit_after_commit(kind, **fields)

    def _resumed(self, wait: waits.HumanWait) -> None:
        """A person answered the wait the run was parked on: it runs again from here."""
        if self.resumed or self.run.status != wait.status:
            return  # replaying a wait the run left in an earlier pass
        self.resumed = True
        kind, fields = waits.RESUMED
        self.env.emit_after_commit(kind, **fields)

    def await_timer(self, wait: TimerWait) -> dict[str, Any]:
        """Sleep on a `wait` call (agent_jobs/timers.py): record its `timer:` row with the
        wake time and suspend, holding nothing; a pass that finds its time come (beat's
        timers tick sends it) or a message for the next step posted wakes it here."""
        call = wait.call
        step = names.timer(call.id)
        row = self._recorded(step)
        if row is None:
            now = utcnow()
            # Its bound was checked with the call (`persist:toolcall:`): not again here.
            wake_at = timers.wake_time(call.args, now, math.inf)
            described = waits.sleeping(call, wake_at)
            result = timers.woke(self.conn, self.run, wake_at, now)
            self._record(step, "waiting" if result is None else "done", described.intent, result)
            self._announce(described)
            if result is not None:  # nothing to sleep for
                kind, fields = waits.RESUMED
                self.env.emit_after_commit(kind, **fields)
                return result
            timers.start(self.conn, self.run.run_id, wake_at)
            row = self.by_name[step]
        elif row.state == "done":  # woke in an earlier pass
            done: dict[str, Any] = row.result
            return done
        else:
            described, wake_at = self._asleep(step, call)
        while row.state != "done" and not self._woke(step, wake_at):
            self._suspend(self._wait(described.label, described.status), keep=False)
            row = self.by_name[step]
        self._resumed(described)
        result = self.by_name[step].result
        assert isinstance(result, dict)
        return result

    def _asleep(self, step: str, call: ToolCall) -> tuple[waits.HumanWait, datetime]:
        """A recorded timer row's wait and wake time (its intent keeps it)."""
        found = journal_rows.get(self.conn, self.run.run_id, step)
        return waits.recorded_sleep(found.intent if found is not None else None, call)

    def _woke(self, step: str, wake_at: datetime) -> bool:
        """Whether the sleeping run wakes in this pass (its time came, or a message), under
        the run's lock; if so its row is done."""
        if any(row["step"] == step for row in self.new_rows):
            return False  # it went to sleep in this very pass
        result = timers.woke(self.conn, self.run, wake_at, utcnow())
        if result is None:
            return False
        timers.settle(self.conn, self.run.run_id, step, result)
        self.cursor.put(Marker(step, self.by_name[step].seq, "done", result))
        return True

    def run_agent(self, delegation: Delegation) -> DelegationOutcome:
        """Start the delegated agent as a child run; the parent waits until it ends."""
        name = names.delegation(delegation.call.id)
        child_id = child_run_id(self.run.run_id, delegation.call.id)
        label = delegation_label(delegation, child_id)
        row = self._recorded(name)
        if row is None:
            create_child(
                self.conn, self.env.app, self.run, delegation, runner="durable", status="queued"
            )
            self._record(name, "waiting", delegation_intent(delegation, child_id))
            self.children.append(child_id)
            row = self.by_name[name]
        while row.state != "done":
            self._suspend(self._wait(label))
            row = self.by_name[name]
        return DelegationOutcome.model_validate(row.result)

    def parallel(self, block: ParallelBlock[T]) -> list[Settled[T]]:
        """The members one after the other; each settles, a suspended one included."""
        if self.cursor.in_block:
            return [settle(task) for task in block.tasks]
        start = self.pos
        while True:
            with self.cursor.fan_out(start):
                settled = [settle(task) for task in block.tasks]
            waiting = next((s.error for s in settled if isinstance(s.error, Suspend)), None)
            if waiting is None or self.sticky is None:
                return settled
            # A loop that outlives its pass parks after the block; resumed, it runs the
            # members again (what they finished returns its recorded result).
            self._suspend(waiting)

    def patched(self, patch: Patch) -> bool:
        if patch.id in self.disabled_patches:
            return False  # as if this code predated the patch: no position is used
        name = names.patch(patch.id)
        taken = self.cursor.patched(name)
        if taken is None:  # at the frontier: the new shape, recorded where it was taken
            self._record(name, "done", {"patch": patch.id}, True)
            return True
        return taken


def hooks_for(
    loops: StickyLoops,
    conn: Connection,
    run: RunView,
    read: Read,
    env: StepEnv,
    disabled_patches: frozenset[str],
) -> DurableHooks:
    """The pass's hooks: those of the run's loop parked in this process if the journal
    is what it knows (see runners/durable/sticky.py), else new ones that replay it."""
    loop = loops.take(run.run_id, run.created_at, read)
    if loop is None:
        hooks = DurableHooks(conn, run, read.rows, env, disabled_patches)
    else:  # the rows it knew of, as they are now: those that may have changed
        hooks = loop.hooks
        hooks.rebind(conn, run, loops.changed(hooks, read), env)
    hooks.seen_final = len(read.known)
    return hooks


def drive(hooks: DurableHooks, loops: StickyLoops, body: Callable[[], T]) -> T:
    """Run the loop (`body`) for the pass: the parked loop resumed, or the loop from its
    start, in a greenlet of its own when loops outlive their passes (`loops` keeps any)."""
    if hooks.sticky is not None:
        result: T = hooks.sticky.resume()
        return result
    if not loops.capacity:
        return body()
    hooks.sticky = ParkedLoop(hooks.run.run_id, hooks.run.created_at, hooks)
    started: T = hooks.sticky.start(body)
    return started
