"""The inline runner: the loop in-process, each step executed at once.

`start` returns a run id immediately and drives the turn on a background thread.
Approvals are futures keyed by run and call, resolved by `signal` (or by a decision
another process recorded in the database, which the waiting turn polls for). Reads
overlap on a thread pool. Single process, no broker: the embedded default.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Literal, TypeVar

from .. import diagnostics
from ..app import AgentApp
from ..approvals import approval_step, decision_from_call, record_decision
from ..errors import AgentJobsError, UnknownRunError
from ..executor import StepEnv, execute_local, execute_remote
from ..hooks import (
    ApprovalWait,
    Decision,
    LoopHooks,
    ParallelBlock,
    Settled,
    SinkOpen,
    StepCall,
    TurnSink,
    settle,
)
from ..loop import run_agent_loop
from ..settings import Settings, get_settings
from ..steps import dump
from ..store import RunView, Store, toolcalls
from ..store import journal as journal_rows
from ..store import runs as run_rows
from ..store.db import utcnow
from ..stream import Frame, MemoryStreams, RunStream
from .common import RunRequest, check_request, create_run, new_id, turn_for, waiting_label

T = TypeVar("T")
log = logging.getLogger(__name__)


class _Output:
    """The loop closes its sink on completion; the runner sends `done` after committing."""

    def __init__(self) -> None:
        self.value: str | None = None

    def close(self, output: str) -> None:
        self.value = output


class InlineHooks(LoopHooks):
    def __init__(self, runner: InlineRunner, run: RunView, stream: RunStream) -> None:
        super().__init__(label="inline")
        self.runner = runner
        self.run = run
        self.env = StepEnv(app=runner.app, stream=stream)
        self.output = _Output()
        self._seq = 0
        self._seq_lock = threading.Lock()

    def _next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    def step(self, call: StepCall) -> Any:
        seq = self._next_seq()
        intent = call.intent
        store = self.runner.store
        # Each parallel task gets its own env so buffered frames never cross threads.
        env = StepEnv(app=self.env.app, stream=self.env.stream)
        if intent.remote:
            started = utcnow()
            result = dump(execute_remote(intent, env, call.name))
            with store.begin() as conn:
                journal_rows.insert_done(
                    conn,
                    run_id=self.run.run_id,
                    step=call.name,
                    seq=seq,
                    intent=dump(intent),
                    result=result,
                    started_at=started,
                )
        else:
            with store.begin() as conn:
                result = dump(execute_local(intent, conn, env, call.name))
                journal_rows.insert_done(
                    conn,
                    run_id=self.run.run_id,
                    step=call.name,
                    seq=seq,
                    intent=dump(intent),
                    result=result,
                )
            env.flush()
        return result

    def await_approval(self, wait: ApprovalWait) -> Decision:
        run_id, call = wait.run_id, wait.call
        store = self.runner.store
        future = self.runner._pending_future(run_id, call.id)
        with store.begin() as conn:
            journal_rows.insert_pending(
                conn,
                run_id=run_id,
                step=approval_step(call.id),
                seq=self._next_seq(),
                intent={"call_id": call.id, "tool": call.name, "args": call.args},
                state="waiting",
            )
            run_rows.set_status(
                conn, run_id, "awaiting_approval", waiting_on=waiting_label(call.name, call.id)
            )
        stream = self.env.stream
        stream.emit("status", status="awaiting_approval", call_id=call.id, tool=call.name)
        stream.emit(
            "approval_request",
            call_id=call.id,
            tool=call.name,
            args=call.args,
            args_sha256=wait.args_sha256,
        )
        decision = self._wait_for_decision(future, run_id, call.id)
        with store.begin() as conn:
            journal_rows.complete(
                conn,
                run_id,
                approval_step(call.id),
                state="done",
                result=decision.model_dump(mode="json"),
            )
            run_rows.set_status(conn, run_id, "running")
        stream.emit("status", status="running")
        return decision

    def _wait_for_decision(self, future: Future[Decision], run_id: str, call_id: str) -> Decision:
        # Another process may record the decision (`agent-jobs approve`), so poll the
        # database between waits on the in-process future.
        try:
            while True:
                try:
                    return future.result(timeout=self.runner.poll_interval)
                except FutureTimeout:
                    with self.runner.store.connect() as conn:
                        decided = decision_from_call(toolcalls.get_call(conn, run_id, call_id))
                    if decided is not None:
                        return decided
        finally:
            self.runner._forget_future(run_id, call_id)

    def open_sink(self, request: SinkOpen) -> TurnSink:
        return self.output

    def parallel(self, block: ParallelBlock[T]) -> list[Settled[T]]:
        if len(block.tasks) < 2:
            return [settle(task) for task in block.tasks]
        with ThreadPoolExecutor(max_workers=len(block.tasks), thread_name_prefix="read") as pool:
            futures = [pool.submit(settle, task) for task in block.tasks]
            return [future.result() for future in futures]


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
    ) -> None:
        self.app = app
        self.store = store
        self.settings = settings or get_settings()
        self.streams = streams or MemoryStreams()
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, str], Future[Decision]] = {}
        self._finished: dict[str, threading.Event] = {}
        diagnostics.set_enabled(self.settings.diagnostics)

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
    ) -> str:
        """Create the run and drive it in the background; returns its id at once."""
        request = RunRequest.parse(
            {
                "agent": agent,
                "input": input,
                "actor": actor,
                "thread_id": thread_id,
                "run_id": run_id,
                "persona": persona,
                "metadata": metadata or {},
            }
        )
        check_request(self.app, request)
        run_id = request.run_id or new_id()
        with self.store.begin() as conn:
            created = create_run(conn, request, run_id=run_id, runner="inline", status="running")
        if created:
            done = threading.Event()
            with self._lock:
                self._finished[run_id] = done
            threading.Thread(
                target=self._drive, args=(run_id, done), name=f"run-{run_id[:8]}", daemon=True
            ).start()
        return run_id

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

    # --- decisions ----------------------------------------------------------------------

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
        verdict = Decision(decision=decision, actor=actor, reason=reason)
        with self.store.begin() as conn:
            outcome = record_decision(
                conn, self.app, run_id, call_id, verdict, expected_args_sha256=args_sha256
            )
        if outcome != "recorded":
            return False
        with self._lock:
            future = self._futures.get((run_id, call_id))
        if future is not None and not future.done():
            future.set_result(verdict)
        return True

    def _pending_future(self, run_id: str, call_id: str) -> Future[Decision]:
        with self._lock:
            return self._futures.setdefault((run_id, call_id), Future())

    def _forget_future(self, run_id: str, call_id: str) -> None:
        with self._lock:
            self._futures.pop((run_id, call_id), None)

    # --- the background turn -----------------------------------------------------------

    def _drive(self, run_id: str, done: threading.Event) -> None:
        try:
            run = self.store.get_run(run_id)
            stream = RunStream(self.streams, run.root_run_id, run_id)
            try:
                self._turn(run, stream)
            finally:
                if run.root_run_id == run_id:
                    stream.end()
        except UnknownRunError:  # pragma: no cover - the row was written before the thread
            log.exception("run %s vanished", run_id)
        finally:
            done.set()

    def _turn(self, run: RunView, stream: RunStream) -> None:
        hooks = InlineHooks(self, run, stream)
        diagnostics.publish("run.started", lambda: {"run_id": run.run_id, "agent": run.agent})
        stream.emit("status", status="running")
        try:
            turn, deps = turn_for(self.app, run, self.settings)
            result = run_agent_loop(turn, deps, hooks)
        except Exception as exc:
            if not isinstance(exc, AgentJobsError):
                log.exception("run %s failed", run.run_id)
            message, error_type = str(exc), type(exc).__name__
            with self.store.begin() as conn:
                run_rows.finish_run(
                    conn, run.run_id, "failed", error=message, error_type=error_type
                )
            stream.emit("error", error=message, error_type=error_type)
            diagnostics.publish(
                "run.finished",
                lambda: {"run_id": run.run_id, "status": "failed", "error": message},
            )
            return
        with self.store.begin() as conn:
            run_rows.finish_run(conn, run.run_id, "completed", output=result.output)
        stream.emit("done", output=result.output)
        diagnostics.publish("run.finished", lambda: {"run_id": run.run_id, "status": "completed"})
