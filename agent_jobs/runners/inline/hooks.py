"""The inline runner's loop hooks: each step of a turn executed at once on the turn's
thread, its journal row written in the step's transaction; a model call retried as the
request-error waterfall says, waiting on this thread; a delegated agent a nested turn; a
parallel block's reads on a thread pool; a person's decision or answers waited for here
(runners/inline/human_waits.py).

A retried or forked run is driven from its start with the steps its journal holds read
back instead of run, each step's last attempt as a durable retry left it, checked by name
and position as a durable replay checks them (runners/cursor.py); what the journal lacks
runs, numbered after its last row.
"""

from __future__ import annotations

import contextvars
import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection

from ... import checkpoints as names
from ... import timers
from ...app import AgentApp
from ...checkpoints import Decision, DelegationOutcome
from ...errors import ModelError, Sleeping
from ...executor import StepEnv, execute_local, execute_remote
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
from ...observability import genai, observe
from ...ratelimits.gate import ModelGate
from ...settings import Settings
from ...steps import ModelTurn, dump
from ...store import RunView, Store, model_requests
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...streams.base import RunStream
from .. import waits
from ..cursor import JournalCursor, Marker
from ..turn import ask_waterfall, create_child, delegation_intent, delegation_outcome
from .boundary import Boundary
from .human_waits import HumanWaits
from .signals import Signals
from .stops import Stops

T = TypeVar("T")


class InlineHooks(LoopHooks):
    """The loop's hooks for one turn driven here, on the parts of the runner they are
    given; `nested` drives a delegated run's turn on this thread to its end."""

    def __init__(
        self,
        run: RunView,
        stream: RunStream,
        *,
        app: AgentApp,
        store: Store,
        settings: Settings,
        limits: ModelGate | None,
        signals: Signals,
        stops: Stops,
        boundary: Boundary,
        poll_interval: float,
        nested: Callable[[RunView], object],
    ) -> None:
        self.run = run
        self.stream = stream
        self.app = app
        self.store = store
        self.settings = settings
        self.limits = limits
        self.stops = stops
        self.boundary = boundary
        self.nested = nested
        # A retried or forked run's journal holds steps already: read back, not run,
        # each checked against its position as a durable replay checks it.
        with store.connect() as conn:
            self.cursor = JournalCursor(journal_rows.load_for_replay(conn, run.run_id))
        # (step, whole intent) of the last model step this turn journaled: the next one is
        # journaled as what it adds, as the durable runner's are (store/model_requests.py).
        self.last_model: tuple[str, Any] | None = None
        self.humans = HumanWaits(
            run,
            stream,
            self.cursor,
            app=app,
            store=store,
            signals=signals,
            stops=stops,
            poll_interval=poll_interval,
        )

    def request_approvals(self, requests: ApprovalRequests) -> None:
        self.humans.request_approvals(requests)

    def await_approval(self, wait: ApprovalWait) -> Decision:
        return self.humans.await_approval(wait)

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        return self.humans.await_answers(wait)

    def await_timer(self, wait: TimerWait) -> dict[str, Any]:
        """Sleep on a `wait` call (agent_jobs/timers.py): record it, then wake now (its time
        came, or a message for the next step did) or end this thread with `Sleeping`; the
        runner's waiter drives the run again, and this is asked again."""
        call, run_id, store = wait.call, wait.run_id, self.store
        step = names.timer(call.id)
        slot = self.cursor.take(step)
        if (journaled := self.cursor.done(step, slot.row)) is not None:
            result: dict[str, Any] = journaled.result
            return result
        self.boundary.check(run_id)  # a sleeper driven again for a cancel or a pause
        if slot.row is None:
            # Its bound was checked with the call (`persist:toolcall:`): not again here.
            described = waits.sleeping(call, timers.wake_time(call.args, utcnow(), math.inf))
            with store.begin() as conn:
                journal_rows.insert_pending(
                    conn,
                    run_id=run_id,
                    step=step,
                    seq=slot.seq,
                    intent=described.intent,
                    state="waiting",
                )
            self.cursor.put(Marker(step, slot.seq, "waiting", None))
            self.stream.emit_many(list(described.frames))
        with store.begin() as conn:
            run = RunView.from_row(run_rows.lock_run(conn, run_id, touch=True))
            found = journal_rows.get(conn, run_id, step)
            described, wake_at = waits.recorded_sleep(found.intent if found else None, call)
            woke = timers.woke(conn, run, wake_at, utcnow())
            if woke is not None:
                timers.settle(conn, run_id, step, woke)
                run_rows.set_status(conn, run_id, "running")
            else:
                timers.start(conn, run_id, wake_at)
                run_rows.set_status(conn, run_id, "sleeping", waiting_on=described.label)
        if woke is None:
            raise Sleeping(run_id, wake_at)
        self.cursor.put(Marker(step, slot.seq, "done", woke))
        self.stream.emit_many([waits.RESUMED])
        return woke

    def _env(self, step: str | None = None, attempt: int = 1) -> StepEnv:
        """Each step (and each parallel task) gets its own env: buffers never cross
        threads. A remote step's frames are tagged with the step and its attempt, as a
        step task's are."""
        stream = self.stream
        if step is not None:
            stream = RunStream(stream.backend, stream.stream_id, stream.run_id)
            stream.extra = {"step": step, "attempt": attempt}
        return StepEnv(app=self.app, stream=stream, limits=self.limits)

    def step(self, call: StepCall) -> Any:
        slot = self.cursor.take(call.name)
        if (recorded := self.cursor.done(call.name, slot.row)) is not None:
            return recorded.result
        self.boundary.check(self.run.run_id)  # every step boundary: a stop, a pause
        seq = slot.seq
        intent = call.intent
        store = self.store
        if intent.remote:
            env = self._env(call.name)
            started = utcnow()
            if isinstance(intent, ModelTurn):
                result = self._model_turn(intent, env, call.name)
            else:
                result = dump(execute_remote(intent, env, call.name))
            with store.begin() as conn:
                self._journal(conn, env, call, seq, result, started)
            attempt = env.stream.extra["attempt"]
            traced = genai.attributes(self.app, intent, result)
            observe.remote_step(self.run, call.name, started, attempt, genai=traced)
            return result
        env = self._env()
        started_ns = observe.clock()
        with store.begin() as conn:
            result = dump(execute_local(intent, conn, env, call.name))
            observe.local_step(env, self.run, call.name, started_ns)
            self._journal(conn, env, call, seq, result, None)
        env.flush()
        return result

    def _journal(
        self,
        conn: Connection,
        env: StepEnv,
        call: StepCall,
        seq: int,
        result: Any,
        started: datetime | None,
    ) -> None:
        """The step's events and its journal row, in the step's transaction."""
        env.flush_events(conn)
        intent = dump(call.intent)
        if isinstance(call.intent, ModelTurn):
            whole, intent = intent, model_requests.slim(intent, self.last_model)
            self.last_model = (call.name, whole)
        journal_rows.insert_done(
            conn,
            run_id=self.run.run_id,
            step=call.name,
            seq=seq,
            intent=intent,
            result=result,
            started_at=started,
        )

    def _model_turn(self, intent: ModelTurn, env: StepEnv, step: str) -> Any:
        """Call the model, asking the request-error waterfall after each failure.

        Waiting between attempts is fine here: this is the run's own thread, not a
        worker's (the durable runner waits through Celery's retry countdown instead).
        """
        settings = self.settings
        thread_id = self.run.thread_id
        attempt = 1
        while True:
            if attempt > 1:
                env.stream.extra["attempt"] = attempt
                env.stream.emit("status", status="retrying", step=step, attempt=attempt)
            if self.limits is not None:  # capacity under the provider's rate limits
                wait = functools.partial(self.stops.sleep, self.run.run_id)
                self.limits.wait(intent.request, f"{self.run.run_id}:{step}", wait)
            try:
                result = dump(execute_remote(intent, env, step))
            except ModelError as error:
                action, event = ask_waterfall(
                    self.app,
                    settings,
                    error,
                    run_id=self.run.run_id,
                    thread_id=thread_id,
                    step=step,
                    retry_count=attempt - 1,
                    attempt=attempt,
                )
                env.events.append(event)
                with self.store.begin() as conn:  # visible while the turn waits
                    env.flush_events(conn)
                if action.kind == "abort":
                    raise ModelError(action.reason, kind=error.kind) from error
                self.stops.sleep(self.run.run_id, action.delay)
                attempt += 1
                continue
            env.event(
                thread_id,
                self.run.run_id,
                "agent/request",
                step=step,
                attempt=attempt,
                outcome="ok",
            )
            return result

    def run_agent(self, delegation: Delegation) -> DelegationOutcome:
        """A nested turn on a transient sub-thread, as a child run of its own: it parks on
        a person exactly as a top-level run does, its frames in the ancestor's stream."""
        store = self.store
        name = names.delegation(delegation.call.id)
        slot = self.cursor.take(name)
        if (recorded := self.cursor.done(name, slot.row)) is not None:
            return DelegationOutcome.model_validate(recorded.result)
        self.boundary.check(self.run.run_id)
        with store.begin() as conn:
            child_id = create_child(
                conn, self.app, self.run, delegation, runner="inline", status="running"
            )
        self.nested(store.get_run(child_id))
        ended = store.get_run(child_id)
        outcome = delegation_outcome(child_id, ended.status, ended.output, ended.error)
        with store.begin() as conn:
            journal_rows.insert_done(
                conn,
                run_id=self.run.run_id,
                step=name,
                seq=slot.seq,
                intent=delegation_intent(delegation, child_id),
                result=outcome.model_dump(mode="json"),
            )
        return outcome

    def parallel(self, block: ParallelBlock[T]) -> list[Settled[T]]:
        if self.cursor.in_block:
            return [settle(task) for task in block.tasks]
        with self.cursor.fan_out():  # its steps are found by name (runners/cursor.py)
            if len(block.tasks) < 2:
                return [settle(task) for task in block.tasks]
            with ThreadPoolExecutor(len(block.tasks), thread_name_prefix="read") as pool:
                # Each read in a copy of this context: whose payloads it writes goes along
                # (agent_jobs/encryption/keyring.py).
                futures = [
                    pool.submit(contextvars.copy_context().run, settle, task)
                    for task in block.tasks
                ]
                return [future.result() for future in futures]

    def patched(self, patch: Patch) -> bool:
        """As the journal answers it (runners/cursor.py); at the frontier the patch is taken
        and its row recorded, as a durable run's is: a replay of this run takes it there."""
        name = names.patch(patch.id)
        if (taken := self.cursor.patched(name)) is not None:
            return taken
        seq, intent = self.cursor.pos, {"patch": patch.id}
        with self.store.begin() as conn:
            journal_rows.insert_done(
                conn, run_id=self.run.run_id, step=name, seq=seq, intent=intent, result=True
            )
        self.cursor.put(Marker(name, seq, "done", True))
        return True
