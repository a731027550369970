"""What both runners do around the loop: its inputs, a turn's start and end, delegation
bookkeeping, discarded usage, and asking the request-error waterfall."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection

from .. import admission, controls, session
from .. import checkpoints as names
from ..app import AgentApp
from ..checkpoints import DelegationOutcome
from ..errors import ModelError, StepRejectedError
from ..executor import StepEnv
from ..hooks import Delegation
from ..loop import LoopDeps, TurnInput
from ..messages import Usage
from ..observability import diagnostics, observe, tracing
from ..request_errors import RequestErrorAction, RequestErrorPayload, resolve
from ..runs import RunRequest, create_run, start_next_turn
from ..settings import Settings
from ..store import RunView
from ..store import events as event_rows
from ..store import journal as journal_rows
from ..store import runs as run_rows
from ..store import usage as usage_rows
from ..store.db import utcnow
from ..streams.base import RunStream


def turn_for(app: AgentApp, run: RunView, settings: Settings) -> tuple[TurnInput, LoopDeps]:
    """The loop's input and dependencies for a stored run."""
    agent = app.get_agent(run.agent)
    persona = app.get_persona(run.persona)
    turn = TurnInput(
        run_id=run.run_id,
        thread_id=run.thread_id,
        actor=run.actor,
        text=run.input,
        persona=run.persona,
        depth=run.depth,
    )
    deps = LoopDeps(
        app=app,
        agent=agent,
        persona=persona,
        system_prompt=app.system_prompt(agent, persona),
        day=run.day,
        quota_limit=app.quota_limit(run.actor, settings.daily_token_quota),
    )
    return turn, deps


def start_turn(env: StepEnv, run: RunView, conn: Connection) -> None:
    """The thread's agent goes from idle to running (events with the caller's
    transaction, the `running` frame after its commit). With tracing on, a run created
    with no trace context (by a process that traces nothing) takes a root of its own."""
    if run.trace_context is None and tracing.enabled():
        run.trace_context = tracing.context_for_run(run.run_id, run.agent, None)
        if run.trace_context is not None:
            run_rows.note_trace_context(conn, run.run_id, run.trace_context)
    env.event(run.thread_id, run.run_id, "turn/start", request=run.input, agent=run.agent)
    env.event(run.thread_id, run.run_id, "agent/status", status="running")
    env.emit_after_commit("status", status="running")
    observe.run_started(env, run)
    diagnostics.publish("run.started", lambda: {"run_id": run.run_id, "agent": run.agent})


def announce_end(stream: RunStream, ending: Ending) -> None:
    """Once the end is committed: the stream's last frame, and the diagnostic."""
    kind, fields = ending.frame
    stream.emit(kind, **fields)
    stream.end()
    diagnostics.publish(
        "run.finished",
        lambda: {"run_id": stream.run_id, "status": ending.status, "error": ending.error},
    )


def overdue(run: RunView) -> bool:
    """The deadline rule: a run past its deadline is stopped as a `timeout` cancel."""
    return run.deadline is not None and utcnow() >= run.deadline


@dataclass(frozen=True)
class Finished:
    """What a run's end sets moving: the next turn's run, the parent waiting on it, the
    queued runs its thread or key let begin now (agent_jobs/admission.py)."""

    next_run: str | None = None
    parent: str | None = None
    woken: tuple[str, ...] = ()


def finish_turn(
    conn: Connection,
    env: StepEnv,
    app: AgentApp,
    run: RunView,
    ending: Ending,
) -> Finished:
    """Record the run's end and the turn's; name the queued runs that may begin now; start
    the next turn if one is queued (runs waiting for the thread go first); hand a
    delegated run's answer to its parent's waiting step."""
    run_rows.finish_run(
        conn,
        run.run_id,
        ending.status,
        output=ending.output,
        error=ending.error,
        error_type=ending.error_type,
        run=run,  # its notification needs no read of the row
    )
    observe.run_finished(env, run, ending.status)
    if ending.status == "cancelled":
        account_discarded_usage(conn, run, env)
    opened = controls.opened_turn(conn, run)  # one cancelled before it began opened none
    # The thread's inbox belongs to the turn that runs: a run cancelled while it still
    # waited for its place leaves it to that turn.
    if ending.status == "cancelled" and not ending.keep_inbox and opened:
        env.flush_events(conn)  # keep the log in order: this pass's earlier events first
        session.clear(conn, run.thread_id, run.run_id)
    if opened:
        data: dict[str, Any] = {"reason": ending.reason}
        if ending.cause:
            data["cause"] = ending.cause
        env.event(run.thread_id, run.run_id, "turn/end", **data)
        env.event(run.thread_id, run.run_id, "agent/status", status="idle")
    env.flush_events(conn)
    # After the events: they took the thread's row, which a run waiting for it reads under.
    released = admission.release(conn, app, run)
    if run.parent_run_id is not None:
        call_id = run.metadata.get("parent_call_id")
        if call_id is None:
            return Finished()
        outcome = delegation_outcome(run.run_id, ending.status, ending.output, ending.error)
        journal_rows.complete(
            conn,
            run.parent_run_id,
            names.delegation(str(call_id)),
            state="done",
            result=outcome.model_dump(mode="json"),
        )
        return Finished(parent=run.parent_run_id)
    if ending.status != "completed" or released.thread_waits:
        return Finished(woken=released.woken)
    next_run = start_next_turn(conn, app, run, runner=run.runner)
    return Finished(next_run=next_run, woken=released.woken)


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The same delegation always gets the same child run (a replay finds it again)."""
    return hashlib.sha256(f"{parent_run_id}\0{call_id}".encode()).hexdigest()[:32]


def child_request(parent: RunView, delegation: Delegation, child_id: str) -> RunRequest:
    """The child's run request: a transient sub-thread of its own, the parent's actor."""
    return RunRequest(
        agent=delegation.agent,
        input=delegation.task,
        actor=parent.actor,
        thread_id=child_id,
        metadata={"parent_call_id": delegation.call.id},
    )


def delegation_outcome(
    child_run_id: str, status: str, output: str | None, error: str | None
) -> DelegationOutcome:
    """What the parent's tool call gets back from a child run that ended."""
    if status == "completed":
        return DelegationOutcome(ok=True, output=output, child_run_id=child_run_id)
    what = "was cancelled" if status == "cancelled" else "failed"
    return DelegationOutcome(
        ok=False, error=f"the delegated agent {what}: {error}", child_run_id=child_run_id
    )


def create_child(
    conn: Connection,
    app: AgentApp,
    parent: RunView,
    delegation: Delegation,
    *,
    runner: str,
    status: run_rows.RunStatus,
) -> str:
    """Write the delegated run (unless a replay already did); returns its id."""
    child_id = child_run_id(parent.run_id, delegation.call.id)
    create_run(
        conn,
        child_request(parent, delegation, child_id),
        run_id=child_id,
        runner=runner,
        status=status,
        app=app,
        parent_run_id=parent.run_id,
        root_run_id=parent.root_run_id,
        depth=delegation.depth,
        trace_context=parent.trace_context,  # the delegated run's steps: the same trace
    )
    diagnostics.publish(
        "delegation.started",
        lambda: {"run_id": parent.run_id, "child_run_id": child_id, "agent": delegation.agent},
    )
    return child_id


def delegation_label(delegation: Delegation, child_run_id: str) -> str:
    """How a parent waiting on a delegated run says where it stands."""
    return f"agent {delegation.agent} {child_run_id}"


def delegation_intent(delegation: Delegation, child_run_id: str) -> dict[str, Any]:
    return {"agent": delegation.agent, "task": delegation.task, "child_run_id": child_run_id}


def account_discarded_usage(conn: Connection, run: RunView, env: StepEnv | None = None) -> None:
    """Record the tokens of model calls whose results a cancellation discarded (and count
    them in the metrics with `env`'s commit).

    A model step that finished after (or just as) its run was cancelled never reaches
    its `usage:<n>` step, but the provider was paid: the ledger and the quota say so.
    """
    rows = {row.step: row for row in journal_rows.load_for_replay(conn, run.run_id)}
    for step, row in rows.items():
        if row.state != "done" or not isinstance(row.result, dict):
            continue
        recording = names.usage_of(step)
        if recording is None:
            continue
        usage_step, kind = recording
        if usage_step in rows or usage_rows.usage_recorded(conn, run.run_id, step):
            continue
        spent = Usage.model_validate(row.result.get("usage") or {})
        if env is not None:
            observe.tokens(env, row.result.get("model"), spent)
        usage_rows.charge(
            conn,
            run_id=run.run_id,
            thread_id=run.thread_id,
            actor=run.actor,
            day=run.day,
            step=step,
            kind=kind,
            model=row.result.get("model"),
            spent=spent,
        )


@dataclass(frozen=True)
class Ending:
    """How a run ended, and so how its turn ended."""

    status: Literal["completed", "failed", "cancelled"]
    reason: session.TurnEndReason
    output: str | None = None
    error: str | None = None
    error_type: str | None = None
    cause: str | None = None
    keep_inbox: bool = False

    @classmethod
    def completed(cls, output: str) -> Ending:
        return cls("completed", "completed", output=output)

    @classmethod
    def failed(cls, exc: BaseException) -> Ending:
        reason: session.TurnEndReason = "blocked" if isinstance(exc, StepRejectedError) else "error"
        return cls("failed", reason, error=str(exc), error_type=type(exc).__name__)

    @classmethod
    def cancelled(cls, cause: str, keep_inbox: bool) -> Ending:
        return cls(
            "cancelled",
            session.end_reason(cause),
            error=f"cancelled ({cause})",
            error_type="Cancelled",
            cause=cause,
            keep_inbox=keep_inbox,
        )

    @property
    def frame(self) -> tuple[str, dict[str, Any]]:
        """The stream's last frame for this ending."""
        if self.status == "completed":
            return "done", {"output": self.output}
        return "error", {"error": self.error, "error_type": self.error_type}


def ask_waterfall(
    app: AgentApp,
    settings: Settings,
    error: ModelError,
    *,
    run_id: str,
    thread_id: str,
    step: str,
    retry_count: int,
    attempt: int,
) -> tuple[RequestErrorAction, event_rows.PendingEvent]:
    """What to do about a failed model request, and the `agent/request` event saying so."""
    payload = RequestErrorPayload(
        error=error,
        run_id=run_id,
        step=step,
        retry_count=retry_count,
        max_retries=settings.model_max_retries,
    )
    action = resolve(
        app.request_error_chain,
        payload,
        base_delay=settings.model_retry_base_delay,
        max_delay=settings.model_retry_max_delay,
    )
    data = {
        "step": step,
        "attempt": attempt,
        "outcome": "error",
        "kind": error.kind,
        "action": action.kind,
        "delay": action.delay,
        "reason": action.reason,
    }
    return action, (thread_id, run_id, "agent/request", data)
