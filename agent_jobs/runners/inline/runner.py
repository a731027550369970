"""The inline runner: the loop in-process, each step executed at once.

`start` returns a run id immediately and drives the turn on a background thread.
Approvals are futures keyed by run and call, resolved by `signal` (or by a decision
another process recorded in the database, which the waiting turn polls for). Reads
overlap on a thread pool. A cancel, a steering message or a model switch posted by
another process reaches the turn through the database at its next boundary. Single
process, no broker: the embedded default.

A retried or forked run is driven from its start with the steps its journal holds read
back instead of run, each step's last attempt as a durable retry left it, checked by name
and position as a durable replay checks them (runners/cursor.py); what the journal lacks
runs, numbered after its last row.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection

from ... import checkpoints as names
from ... import controls, session
from ...admission import IfBusy
from ...app import AgentApp
from ...approvals.reconcile import Reconciliation
from ...checkpoints import Decision, DelegationOutcome
from ...commands import Commands
from ...errors import AgentJobsError, Cancelled, ModelError
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
    settle,
)
from ...loop import run_agent_loop
from ...notify.webhook import check as check_webhook
from ...observability import observe
from ...processes import this_process
from ...ratelimits.gate import ModelGate
from ...runs import RunRequest
from ...settings import Settings, get_settings
from ...steps import ModelTurn, dump
from ...store import RunView, Store
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...streams.base import Frame, MemoryStreams, RunStream
from ..cursor import JournalCursor, Marker
from ..turn import (
    Ending,
    announce_end,
    ask_waterfall,
    create_child,
    delegation_intent,
    delegation_outcome,
    finish_turn,
    start_turn,
    turn_for,
)
from .boundary import Boundary
from .human_waits import HumanWaits
from .queue import QueuedRuns
from .signals import Signals
from .stops import Stops
from .wake import InlineWake

T = TypeVar("T")
log = logging.getLogger(__name__)


class InlineHooks(LoopHooks):
    def __init__(self, runner: InlineRunner, run: RunView, stream: RunStream) -> None:
        self.runner = runner
        self.run = run
        self.stream = stream
        # A retried or forked run's journal holds steps already: read back, not run,
        # each checked against its position as a durable replay checks it.
        with runner.store.connect() as conn:
            self.cursor = JournalCursor(journal_rows.load_for_replay(conn, run.run_id))
        self.humans = HumanWaits(
            run,
            stream,
            self.cursor,
            app=runner.app,
            store=runner.store,
            signals=runner.signals,
            stops=runner.stops,
            poll_interval=runner.poll_interval,
        )

    def request_approvals(self, requests: ApprovalRequests) -> None:
        self.humans.request_approvals(requests)

    def await_approval(self, wait: ApprovalWait) -> Decision:
        return self.humans.await_approval(wait)

    def await_answers(self, wait: AnswersWait) -> dict[str, Any]:
        return self.humans.await_answers(wait)

    def _env(self, step: str | None = None, attempt: int = 1) -> StepEnv:
        """Each step (and each parallel task) gets its own env: buffers never cross
        threads. A remote step's frames are tagged with the step and its attempt, as a
        step task's are."""
        stream = self.stream
        if step is not None:
            stream = RunStream(stream.backend, stream.stream_id, stream.run_id)
            stream.extra = {"step": step, "attempt": attempt}
        return StepEnv(app=self.runner.app, stream=stream, limits=self.runner.limits)

    def step(self, call: StepCall) -> Any:
        slot = self.cursor.take(call.name)
        if (recorded := self.cursor.done(call.name, slot.row)) is not None:
            return recorded.result
        self.runner.boundary.check(self.run.run_id)  # every step boundary: a stop, a pause
        seq = slot.seq
        intent = call.intent
        store = self.runner.store
        if intent.remote:
            env = self._env(call.name)
            started = utcnow()
            if isinstance(intent, ModelTurn):
                result = self._model_turn(intent, env, call.name)
            else:
                result = dump(execute_remote(intent, env, call.name))
            with store.begin() as conn:
                self._journal(conn, env, call, seq, result, started)
            observe.remote_step(self.run, call.name, started, env.stream.extra["attempt"])
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
        journal_rows.insert_done(
            conn,
            run_id=self.run.run_id,
            step=call.name,
            seq=seq,
            intent=dump(call.intent),
            result=result,
            started_at=started,
        )

    def _model_turn(self, intent: ModelTurn, env: StepEnv, step: str) -> Any:
        """Call the model, asking the request-error waterfall after each failure.

        Waiting between attempts is fine here: this is the run's own thread, not a
        worker's (the durable runner waits through Celery's retry countdown instead).
        """
        runner = self.runner
        settings = runner.settings
        thread_id = self.run.thread_id
        attempt = 1
        while True:
            if attempt > 1:
                env.stream.extra["attempt"] = attempt
                env.stream.emit("status", status="retrying", step=step, attempt=attempt)
            if runner.limits is not None:  # capacity under the provider's rate limits
                wait = functools.partial(runner.stops.sleep, self.run.run_id)
                runner.limits.wait(intent.request, f"{self.run.run_id}:{step}", wait)
            try:
                result = dump(execute_remote(intent, env, step))
            except ModelError as error:
                action, event = ask_waterfall(
                    runner.app,
                    settings,
                    error,
                    run_id=self.run.run_id,
                    thread_id=thread_id,
                    step=step,
                    retry_count=attempt - 1,
                    attempt=attempt,
                )
                env.events.append(event)
                with runner.store.begin() as conn:  # visible while the turn waits
                    env.flush_events(conn)
                if action.kind == "abort":
                    raise ModelError(action.reason, kind=error.kind) from error
                runner.stops.sleep(self.run.run_id, action.delay)
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
        runner = self.runner
        name = names.delegation(delegation.call.id)
        slot = self.cursor.take(name)
        if (recorded := self.cursor.done(name, slot.row)) is not None:
            return DelegationOutcome.model_validate(recorded.result)
        runner.boundary.check(self.run.run_id)
        with runner.store.begin() as conn:
            child_id = create_child(
                conn, runner.app, self.run, delegation, runner="inline", status="running"
            )
        child = runner.store.get_run(child_id)
        runner._turn(child, RunStream(runner.streams, child.root_run_id, child_id))
        ended = runner.store.get_run(child_id)
        outcome = delegation_outcome(child_id, ended.status, ended.output, ended.error)
        with runner.store.begin() as conn:
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
                futures = [pool.submit(settle, task) for task in block.tasks]
                return [future.result() for future in futures]

    def patched(self, patch: Patch) -> bool:
        """As the journal answers it (runners/cursor.py); at the frontier the patch is taken
        and its row recorded, as a durable run's is: a replay of this run takes it there."""
        name = names.patch(patch.id)
        if (taken := self.cursor.patched(name)) is not None:
            return taken
        seq, intent = self.cursor.pos, {"patch": patch.id}
        with self.runner.store.begin() as conn:
            journal_rows.insert_done(
                conn, run_id=self.run.run_id, step=name, seq=seq, intent=intent, result=True
            )
        self.cursor.put(Marker(name, seq, "done", True))
        return True


class InlineRunner:
    """Drives turns in this process. `start` returns at once; `wait` blocks for the end."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        *,
        settings: Settings | None = None,
        streams: MemoryStreams | None = None,
        poll_interval: float = 0.5,
        runs_per_actor: int | None = None,
    ) -> None:
        """`runs_per_actor`: how many runs one actor may have going here at once (a
        server's limit: each holds a thread until it ends); None, no limit."""
        self.app = app
        self.store = store
        self.settings = settings or get_settings()
        self.streams = streams or MemoryStreams()
        self.poll_interval = poll_interval
        # Provider rate limits: in Redis with a Redis URL set, else in this process.
        self.limits = ModelGate.inline(app, self.settings)
        self.signals = Signals()  # what its turns wait on, set from other threads
        self._lock = threading.Lock()
        self._finished: dict[str, threading.Event] = {}
        self.queued = QueuedRuns(app, store, self.streams)  # runs waiting for a place
        self.stops = Stops(
            app,
            store,
            self.streams,
            signals=self.signals,
            queued=self.queued,
            poll_interval=poll_interval,
        )
        self.boundary = Boundary(
            app,
            store,
            self.streams,
            signals=self.signals,
            stops=self.stops,
            poll_interval=poll_interval,
        )
        self.wake = InlineWake(self, runs_per_actor)
        self.commands = Commands(store, app, self.wake)
        check_webhook(self.settings)  # a webhook without a secret: refused before a run

    # --- starting and waiting ----------------------------------------------------------

    def start(
        self,
        agent: str,
        input: str,
        *,
        actor: str = "anonymous",
        thread_id: str | None = None,
        run_id: str | None = None,
        persona: str | None = None,
        metadata: dict[str, Any] | None = None,
        if_busy: IfBusy | None = None,
    ) -> str:
        """Create the run and drive it in the background; returns its id at once. On a
        thread whose turn has not ended it waits for that turn (`if_busy="enqueue"`), is
        refused (`"reject"`: `ThreadBusyError`), or cancels it and runs next
        (`"interrupt"`)."""
        request = RunRequest.of(
            agent,
            input,
            actor=actor,
            thread_id=thread_id,
            run_id=run_id,
            persona=persona,
            metadata=metadata,
            if_busy=if_busy,
        )
        return self.commands.admit(request)[0]

    def run(
        self, agent: str, input: str, *, timeout: float | None = None, **kwargs: Any
    ) -> RunView:
        """Start a run and wait for it to end."""
        return self.wait(self.start(agent, input, **kwargs), timeout=timeout)

    def wait(self, run_id: str, timeout: float | None = None) -> RunView:
        """Block until the run ends (or `timeout` passes); returns its current view."""
        with self._lock:
            done = self._finished.get(run_id)
        if done is not None:
            done.wait(timeout)
        return self.store.get_run(run_id)

    def frames(self, run_id: str, after: str | None = None) -> Iterator[Frame]:
        """The run's live frames from the start (or after entry `after`) to its end."""
        for _entry, frame in self.streams.read(run_id, after):
            yield frame

    # --- decisions, steering, cancellation ---------------------------------------------

    def signal(
        self,
        run_id: str,
        call_id: str,
        decision: Literal["approve", "reject"],
        *,
        actor: str,
        reason: str | None = None,
        args_sha256: str | None = None,
    ) -> bool:
        """Record a decision and release the waiting turn; False if one was already made."""
        return self.commands.decide(
            run_id, call_id, decision, actor=actor, reason=reason, args_sha256=args_sha256
        )

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        """Record a person's answers and release the waiting turn; False if answered."""
        return self.commands.answer(run_id, request_id, answers, actor=actor)

    def reconcile(self, run_id: str, call_id: str, decision: Reconciliation) -> bool:
        """Record how a call whose outcome is unknown ended. An inline run dies with its
        process and never waits on one: this refuses, unless the call is a durable run's
        (which the sweep then wakes)."""
        return self.commands.reconcile(run_id, call_id, decision)

    def post_message(self, run_or_thread: str, text: str, *, target: str = "next-step") -> str:
        """Queue a message on the thread's inbox; returns the thread id.

        A `next-turn` message to an idle thread starts its turn at once.
        """
        return self.commands.post_message(run_or_thread, text, target=target)

    def select_model(self, run_or_thread: str, selection: session.ModelSelection) -> str:
        """Switch a thread's model from its next prompt; returns the thread id."""
        return self.commands.select_model(run_or_thread, selection)

    def cancel(self, run_id: str, cause: str = "user", *, keep_inbox: bool = False) -> list[str]:
        """Ask the run (and its children) to stop at the next boundary."""
        return self.commands.cancel(run_id, cause, keep_inbox=keep_inbox)

    # --- operator controls (docs/operating.md, "Operator controls") ----------------------

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        """Ask the run (and its delegated runs) to pause at its next step boundary;
        returns the ids asked (`ControlRefusedError` for a run that cannot pause)."""
        return self.commands.pause(run_id, actor=actor)

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        """Let the paused run (and its delegated runs) go on; returns the ids resumed."""
        return self.commands.resume(run_id, actor=actor)

    def retry(self, run_id: str, *, actor: str) -> controls.Retried:
        """Run a run of this runner that failed on a step again, in this process, from its
        failed step on."""
        return self.commands.retry(run_id, actor=actor)

    def fork(
        self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False
    ) -> controls.Forked:
        """Fork any run at step `at` into a new run on a new thread, driven in this
        process (`agent_jobs.controls.fork` says what it copies, asks again and
        refuses)."""
        return self.commands.fork(run_id, at, actor=actor, keep_decisions=keep_decisions)

    # --- the background turn -----------------------------------------------------------

    def _drive(self, run_id: str) -> None:
        done = threading.Event()
        with self._lock:
            self._finished[run_id] = done
        threading.Thread(
            target=self._background, args=(run_id, done), name=f"run-{run_id[:8]}", daemon=True
        ).start()

    def _background(self, run_id: str, done: threading.Event) -> None:
        next_run: str | None = None
        try:
            run = self.store.get_run(run_id)
            stream = RunStream(self.streams, run.root_run_id, run_id)
            try:  # a queued run waits for its thread's turn, or a place of its key
                began = self.queued.admitted(run, stream) if run.status == "queued" else run
                next_run = self._turn(began, stream) if began is not None else None
            finally:
                if run.root_run_id == run_id:
                    stream.end()
        finally:
            done.set()
            self.queued.nudge()  # this one ended: a run waiting here may begin
        if next_run is not None:
            self._drive(next_run)

    def _turn(self, run: RunView, stream: RunStream) -> str | None:
        hooks = InlineHooks(self, run, stream)
        env = StepEnv(app=self.app, stream=stream)
        with self.store.begin() as conn:
            run_rows.set_driver(conn, [run.run_id], this_process())  # retried, forked, delegated
            start_turn(env, run, conn)
            env.flush_events(conn)
        env.flush()
        try:
            turn, deps = turn_for(self.app, run, self.settings)
            result = run_agent_loop(turn, deps, hooks)
        except Cancelled as signal:
            current = self.store.get_run(run.run_id)
            ending = Ending.cancelled(signal.cause, current.cancel_keep_inbox)
        except Exception as exc:
            if not isinstance(exc, AgentJobsError):
                log.exception("run %s failed", run.run_id)
            ending = Ending.failed(exc)
        else:
            ending = Ending.completed(result.output)
        with self.store.begin() as conn:
            next_run = finish_turn(conn, env, self.app, run, ending).next_run
        env.flush()  # committed: what the end reports (metrics)
        announce_end(stream, ending)
        return next_run
