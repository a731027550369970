"""What both runners share: the run request, run creation, and a turn's inputs."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import Connection

from .. import diagnostics, session
from ..app import AgentApp
from ..errors import InvalidRequestError, ModelError, StepRejectedError
from ..executor import StepEnv
from ..hooks import Delegation, DelegationOutcome
from ..loop import LoopDeps, TurnInput
from ..messages import Usage
from ..retry import RequestErrorAction, RequestErrorPayload, resolve
from ..settings import Settings
from ..store import RunView, Store, threads
from ..store import events as event_rows
from ..store import journal as journal_rows
from ..store import runs as run_rows
from ..store import usage as usage_rows
from ..store.db import utcnow

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"


def new_id() -> str:
    return uuid.uuid4().hex


def today() -> str:
    """The UTC day a run is stamped with once, when it is created."""
    return datetime.now(UTC).date().isoformat()


class RunRequest(BaseModel):
    """The kwargs of `agent_jobs.start_run` (CONTRACT §3), validated."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    agent: str = Field(min_length=1, max_length=200)
    input: str = Field(min_length=1, max_length=1_000_000)
    actor: str = Field(default="anonymous", min_length=1, max_length=200)
    thread_id: str | None = Field(default=None, pattern=ID_PATTERN)
    run_id: str | None = Field(default=None, pattern=ID_PATTERN)
    persona: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, value: Any) -> Any:
        return {} if value is None else value

    @classmethod
    def of(cls, agent: str, input: str, **fields: Any) -> RunRequest:
        """A request from keyword arguments (None values mean the defaults)."""
        given = {k: v for k, v in fields.items() if v is not None}
        return cls.parse({"agent": agent, "input": input, **given})

    @classmethod
    def parse(cls, data: dict[str, Any]) -> RunRequest:
        """Validate `data`; a bad request is an `InvalidRequestError` naming each fault."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            faults = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(request)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise InvalidRequestError(f"invalid run request: {faults}") from None


def admit_run(
    store: Store, app: AgentApp, request: RunRequest, *, runner: str, status: run_rows.RunStatus
) -> tuple[str, bool]:
    """Check a request against the app and write its run row: (run id, created).

    Nothing is written for a request naming an agent or persona the app lacks.
    """
    check_request(app, request)
    run_id = request.run_id or new_id()
    with store.begin() as conn:
        created = create_run(conn, request, run_id=run_id, runner=runner, status=status, app=app)
    return run_id, created


def post_message(
    conn: Connection, app: AgentApp, run_or_thread: str, text: str, *, target: str, runner: str
) -> tuple[str, str | None]:
    """Queue a message on a thread's inbox: (thread id, the run it started, if any).

    A `next-turn` message to an idle thread whose last run belongs to `runner` starts
    that thread's next turn at once.
    """
    thread_id, _ = session.resolve_thread(conn, run_or_thread)
    active = session.active_run(conn, thread_id)
    session.push(conn, thread_id, active.id if active else None, target, text)
    if target != "next-turn" or active is not None:
        return thread_id, None
    last = session.last_run(conn, thread_id)
    if last is None or last.runner != runner:
        return thread_id, None
    return thread_id, start_next_turn(conn, app, RunView.from_row(last), runner=runner)


def check_request(app: AgentApp, request: RunRequest) -> None:
    """Refuse a request naming an agent or persona this app does not define."""
    app.get_agent(request.agent)
    app.get_persona(request.persona)


def create_run(
    conn: Connection,
    request: RunRequest,
    *,
    run_id: str,
    runner: str,
    status: run_rows.RunStatus,
    app: AgentApp | None = None,
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
) -> bool:
    """Write the thread (if new) and the run row; False when the run already exists.

    With the app at hand, an agent's `default_timeout` becomes the run's deadline.
    """
    thread_id = request.thread_id or run_id
    threads.ensure_thread(conn, thread_id)
    created = run_rows.insert_run(
        conn,
        run_id=run_id,
        thread_id=thread_id,
        agent=request.agent,
        actor=request.actor,
        persona=request.persona,
        input=request.input,
        status=status,
        runner=runner,
        day=today(),
        metadata=request.metadata,
        parent_run_id=parent_run_id,
        root_run_id=root_run_id,
        depth=depth,
    )
    timeout = app.get_agent(request.agent).options.default_timeout if app is not None else None
    if created and timeout:
        run_rows.set_deadline(conn, run_id, utcnow() + timedelta(seconds=timeout))
    return created


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


def waiting_label(tool: str, call_id: str) -> str:
    """How a parked run says where it stands, e.g. `awaiting_approval refund call_2`."""
    return f"awaiting_approval {tool} {call_id}"


# --- the turn's lifecycle, shared by both runners --------------------------------------


def start_turn(env: StepEnv, run: RunView) -> None:
    """The thread's agent goes from idle to running."""
    env.event(run.thread_id, run.run_id, "turn/start", request=run.input, agent=run.agent)
    env.event(run.thread_id, run.run_id, "agent/status", status="running")


@dataclass(frozen=True)
class Finished:
    """What a run's end sets moving: the next turn's run, the parent waiting on it."""

    next_run: str | None = None
    parent: str | None = None


def finish_turn(
    conn: Connection,
    env: StepEnv,
    app: AgentApp,
    run: RunView,
    ending: Ending,
) -> Finished:
    """Record the run's end and the turn's; start the next turn if one is queued; hand a
    delegated run's answer to its parent's waiting step."""
    run_rows.finish_run(
        conn,
        run.run_id,
        ending.status,
        output=ending.output,
        error=ending.error,
        error_type=ending.error_type,
    )
    if ending.status == "cancelled":
        account_discarded_usage(conn, run)
    if ending.status == "cancelled" and not ending.keep_inbox:
        env.flush_events(conn)  # keep the log in order: this pass's earlier events first
        session.clear(conn, run.thread_id, run.run_id)
    if run.status != "queued":  # a run cancelled before it began never opened a turn
        data: dict[str, Any] = {"reason": ending.reason}
        if ending.cause:
            data["cause"] = ending.cause
        env.event(run.thread_id, run.run_id, "turn/end", **data)
        env.event(run.thread_id, run.run_id, "agent/status", status="idle")
    env.flush_events(conn)
    if run.parent_run_id is not None:
        call_id = run.metadata.get("parent_call_id")
        if call_id is None:
            return Finished()
        outcome = delegation_outcome(run.run_id, ending.status, ending.output, ending.error)
        journal_rows.complete(
            conn,
            run.parent_run_id,
            delegation_step(str(call_id)),
            state="done",
            result=outcome.model_dump(mode="json"),
        )
        return Finished(parent=run.parent_run_id)
    if ending.status != "completed":
        return Finished()
    return Finished(next_run=start_next_turn(conn, app, run, runner=run.runner))


def delegation_step(call_id: str) -> str:
    """The parent's journal row that waits for a delegated run's answer."""
    return f"agent:{call_id}"


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


def delegation_intent(delegation: Delegation, child_run_id: str) -> dict[str, Any]:
    return {"agent": delegation.agent, "task": delegation.task, "child_run_id": child_run_id}


def delegation_started(parent_run_id: str, delegation: Delegation, child_run_id: str) -> None:
    diagnostics.publish(
        "delegation.started",
        lambda: {"run_id": parent_run_id, "child_run_id": child_run_id, "agent": delegation.agent},
    )


def account_discarded_usage(conn: Connection, run: RunView) -> None:
    """Record the tokens of model calls whose results a cancellation discarded.

    A model step that finished after (or just as) its run was cancelled never reaches
    its `usage:<n>` step, but the provider was paid: the ledger and the quota say so.
    """
    rows = {row.step: row for row in journal_rows.load_for_replay(conn, run.run_id)}
    for step, row in rows.items():
        if row.state != "done" or not isinstance(row.result, dict):
            continue
        if step.startswith("model:"):
            recorded, kind = f"usage:{step.split(':', 1)[1]}" in rows, "model"
        elif step == "history:summarize":
            recorded, kind = "usage:summary" in rows, "summary"
        else:
            continue
        if recorded or journal_rows.usage_recorded(conn, run.run_id, step):
            continue
        spent = Usage.model_validate(row.result.get("usage") or {})
        usage_rows.record_usage(
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
        usage_rows.bump_quota(conn, actor=run.actor, day=run.day, tokens=spent.total_tokens)


def start_next_turn(
    conn: Connection, app: AgentApp, previous: RunView, *, runner: str
) -> str | None:
    """Turn the first `next-turn` message of the thread into a new run (queued)."""
    run_id = new_id()
    text = session.claim_next_turn(conn, previous.thread_id, run_id)
    if text is None:
        return None
    request = RunRequest(
        agent=previous.agent,
        input=text,
        actor=previous.actor,
        thread_id=previous.thread_id,
        persona=previous.persona,
        metadata={"after_run": previous.run_id},
    )
    status: run_rows.RunStatus = "queued" if runner == "durable" else "running"
    create_run(conn, request, run_id=run_id, runner=runner, status=status, app=app)
    return run_id


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
