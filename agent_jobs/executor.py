"""How each intent is carried out. Both runners execute steps here and nowhere else.

Local intents run inside a transaction the caller owns (`conn`), so the journal row
and the side effect commit together. Remote intents (a model call, a tool call) run
outside any transaction; the caller journals their result. Frames a local step
produces are buffered and sent only after the caller has committed, so a rolled-back
step never shows up on the live stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection

from . import prestep, session, timers
from .app import AgentApp, AgentSpec
from .checkpoints import (
    CallVerdict,
    Done,
    Persisted,
    Prepared,
    QuotaVerdict,
    ThreadSnapshot,
    ToolOutcome,
    attempted,
)
from .errors import ModelError, ToolError
from .mcp import listing as mcp_listing
from .mcp import servers as mcp_servers
from .messages import Message, ModelRequest, ModelResponse, ModelSettings
from .models.base import Model
from .observability import diagnostics, observe
from .settings import get_settings
from .steps import (
    Intent,
    InvokeTool,
    ListMcpTools,
    LoadThread,
    ModelTurn,
    PersistAssistant,
    PersistToolCall,
    PersistToolExec,
    PersistUserMessage,
    PrepareStep,
    QuotaCheck,
    RecordUsage,
    SetTitle,
    Summarize,
)
from .store import blobs, runs, threads, toolcalls
from .store import events as event_rows
from .store import usage as usage_store
from .store.db import utcnow
from .streams.base import RunStream
from .tools import QuestionsAsked, ToolContext

if TYPE_CHECKING:
    from .ratelimits.gate import ModelGate

log = logging.getLogger(__name__)


@dataclass
class StepEnv:
    """What executing a step may touch: the app, the run's stream, buffered frames."""

    app: AgentApp
    stream: RunStream
    frames: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events: list[event_rows.PendingEvent] = field(default_factory=list)
    # The thread's inbox events (session.INBOX), read with the pass's first statement.
    inbox: list[Any] | None = None
    # Metrics and spans of what the caller's transaction records (agent_jobs.observability.observe):
    # reported by `flush`, once it has committed.
    committed: list[Callable[[], None]] = field(default_factory=list)
    # The provider rate limits a model step's call is under (agent_jobs/ratelimits): a
    # 429 pauses its key, its usage corrects the tokens it took. None: no limits set.
    limits: ModelGate | None = None

    def emit_after_commit(self, type: str, **fields: Any) -> None:
        self.frames.append((type, fields))

    def event(self, thread_id: str, run_id: str | None, type: str, **data: Any) -> None:
        """Add an event to the session log, written with the step's transaction."""
        self.events.append((thread_id, run_id, type, data))

    def flush_events(self, conn: Connection) -> None:
        event_rows.append(conn, self.take_events())

    def take_events(self) -> list[event_rows.PendingEvent]:
        """The events added so far, for the caller to write (see `flush_events`)."""
        pending, self.events = self.events, []
        if any(kind in session.INBOX for _, _, kind, _ in pending):
            self.inbox = None  # written since it was read
        return pending

    def inbox_log(self, conn: Connection, thread_id: str) -> list[session.Event]:
        """The thread's inbox events: as read with the pass, unless this pass wrote some
        since (then read again)."""
        rows, self.inbox = self.inbox, None
        if rows is None or any(kind in session.INBOX for _, _, kind, _ in self.events):
            return session.thread_events(conn, thread_id, types=list(session.INBOX))
        return [session.Event.from_row(row) for row in rows]

    def flush(self) -> None:
        frames, self.frames = self.frames, []
        self.stream.emit_many(frames)
        if self.committed:
            reported, self.committed = self.committed, []
            observe.report(reported)


# --- local steps -------------------------------------------------------------------


def execute_local(intent: Intent, conn: Connection, env: StepEnv, step: str) -> BaseModel:
    handler = _LOCAL.get(type(intent))
    if handler is None:
        raise TypeError(f"{type(intent).__name__} is not a local step")
    return handler(intent, conn, env, step)


def _quota_check(intent: Any, conn: Connection, env: StepEnv, step: str) -> QuotaVerdict:
    if intent.limit is None:  # no budget: nothing to count against
        return QuotaVerdict(used=0, limit=None)
    used = usage_store.tokens_used(conn, actor=intent.actor, day=intent.day)
    return QuotaVerdict(used=used, limit=intent.limit)


def _persist_user(intent: Any, conn: Connection, env: StepEnv, step: str) -> Persisted:
    message = Message(role="user", content=intent.content)
    threads.add_message(conn, intent.thread_id, intent.run_id, message)
    return Persisted()


def _load_thread(intent: Any, conn: Connection, env: StepEnv, step: str) -> ThreadSnapshot:
    title, answered, messages = threads.turn_snapshot(
        conn, intent.thread_id, limit=intent.message_limit
    )
    return ThreadSnapshot(messages=messages, title=title, answered=answered)


def _record_usage(intent: Any, conn: Connection, env: StepEnv, step: str) -> Done:
    usage_store.charge(
        conn,
        run_id=intent.run_id,
        thread_id=intent.thread_id,
        actor=intent.actor,
        day=intent.day,
        step=intent.step,
        kind=intent.kind,
        model=intent.model,
        spent=intent.usage,
    )
    observe.tokens(env, intent.model, intent.usage)
    return Done()


def _persist_assistant(intent: Any, conn: Connection, env: StepEnv, step: str) -> Persisted:
    message = Message(role="assistant", content=intent.text, tool_calls=intent.tool_calls)
    threads.add_message(conn, intent.thread_id, intent.run_id, message)
    diagnostics.publish(
        "assistant.message",
        lambda: {
            "run_id": intent.run_id,
            "text": intent.text,
            "tool_calls": len(intent.tool_calls),
        },
    )
    return Persisted()


def _persist_toolcall(intent: Any, conn: Connection, env: StepEnv, step: str) -> CallVerdict:
    """Read the registry here, inside the checkpoint: a replay reads the verdict back."""
    call = intent.call
    app = env.app
    listed = intent.mcp  # an MCP tool's kind and schema, as the run's list gave them
    timer = timers.offers_wait(app.registry, intent.offered) and call.name == timers.WAIT
    if timer:
        kind = "timer"
    else:
        kind = listed.kind if listed is not None else (app.kind_of(call.name) or "read")
    status: Any = "pending_approval" if kind == "action" else "auto_executed"
    error: str | None = None
    try:
        if timer:  # its wake time is fixed where the run goes to sleep; checked here
            timers.wake_time(call.args, utcnow(), get_settings().max_sleep)
        elif kind == "agent":
            if call.name not in intent.offered:
                raise ToolError(f"agent {call.name!r} is not offered to this agent")
            task = call.args.get("task")
            if not isinstance(task, str) or set(call.args) - {"task"}:
                raise ToolError(f"delegation to {call.name!r} takes one string argument 'task'")
            run = runs.get_run(conn, intent.run_id)
            depth = max(intent.depth, run.depth if run is not None else 0)
            if depth + 1 > app.max_depth:
                raise ToolError(
                    f"delegation to {call.name!r} refused: this run is at depth {depth} and "
                    f"the budget is {app.max_depth}; answer without delegating"
                )
        else:
            tool = app.registry.authorize(call.name, intent.actor, app.roles, intent.offered)
            if listed is not None:
                mcp_servers.check_schema(call.name, listed.input_schema, call.args)
            else:
                tool.validate(call.args)
    except ToolError as exc:
        status, error = "failed", str(exc)
    toolcalls.insert_call(
        conn,
        run_id=intent.run_id,
        call_id=call.id,
        thread_id=intent.thread_id,
        name=call.name,
        kind=kind,
        args=call.args,
        status=status,
        error=error,
    )
    env.emit_after_commit(
        "tool_call", call_id=call.id, tool=call.name, args=call.args, kind=kind, status=status
    )
    env.event(
        intent.thread_id,
        intent.run_id,
        "tool/call",
        call_id=call.id,
        tool=call.name,
        kind=kind,
        status=status,
        error=error,
    )
    return CallVerdict(kind=kind, status=status, error=error)


def _persist_toolexec(intent: Any, conn: Connection, env: StepEnv, step: str) -> Persisted:
    call = intent.call
    message = Message(
        role="tool",
        content=intent.content,
        tool_call_id=call.id,
        name=call.name,
        is_error=intent.status != "executed",
    )
    toolcalls.finish_call(
        conn,
        intent.run_id,
        call.id,
        status=intent.status,
        result=intent.result,
        error=intent.error,
        thread_id=intent.thread_id,
        message=message,
    )
    env.emit_after_commit(
        "tool_result",
        call_id=call.id,
        tool=call.name,
        status=intent.status,
        result=intent.result,
        error=intent.error,
    )
    env.event(
        intent.thread_id,
        intent.run_id,
        "tool/result",
        call_id=call.id,
        tool=call.name,
        status=intent.status,
    )
    diagnostics.publish(
        f"tool.{intent.status}",
        lambda: {
            "run_id": intent.run_id,
            "call_id": call.id,
            "tool": call.name,
            "error": intent.error,
        },
    )
    return Persisted()


def _prepare(intent: Any, conn: Connection, env: StepEnv, step: str) -> Prepared:
    """The step boundary, decided once: steering, the model selection, the listeners."""
    thread_id, run_id = intent.thread_id, intent.run_id
    log = env.inbox_log(conn, thread_id)
    if session.fold_inbox(log).next_step:
        env.flush_events(conn)  # keep the log in order: this pass's earlier events first
    claimed = session.claim_next_step(conn, thread_id, run_id, log=log)
    selection = session.fold_selection(log)
    settings = intent.defaults
    if selection is not None:
        # Captured now, applied when sending: a later switch waits for a later step.
        # A selection that names no reasoning effort clears the inherited one.
        settings = settings.model_copy(
            update={
                "provider": selection.provider or settings.provider,
                "model": selection.model or settings.model,
                "reasoning_effort": selection.reasoning_effort,
            }
        )
    context = prestep.PreStepContext(
        run_id=run_id,
        thread_id=thread_id,
        agent=intent.agent,
        actor=intent.actor,
        step=intent.step,
        claimed=claimed,
    )
    decision = prestep.decide(env.app.pre_step_listeners, context)
    if decision.kind == "reject":
        reason = decision.reason or "rejected"
        return Prepared(claimed=claimed, rejected=reason, settings=settings)
    for text in [*claimed, *decision.messages]:
        threads.append_message(conn, thread_id, run_id, Message(role="user", content=text))
    env.event(thread_id, run_id, "step/start", step=intent.step, claimed=len(claimed))
    return Prepared(
        claimed=claimed,
        messages=decision.messages,
        new_series=decision.starts_request_series,
        settings=settings,
    )


def _set_title(intent: Any, conn: Connection, env: StepEnv, step: str) -> Done:
    threads.set_title(conn, intent.thread_id, intent.title)
    return Done()


_LOCAL: dict[type[Intent], Callable[[Any, Connection, StepEnv, str], BaseModel]] = {
    QuotaCheck: _quota_check,
    PersistUserMessage: _persist_user,
    LoadThread: _load_thread,
    PrepareStep: _prepare,
    RecordUsage: _record_usage,
    PersistAssistant: _persist_assistant,
    PersistToolCall: _persist_toolcall,
    PersistToolExec: _persist_toolexec,
    SetTitle: _set_title,
}


# --- remote steps ------------------------------------------------------------------


def execute_remote(intent: Intent, env: StepEnv, step: str) -> BaseModel:
    # A retry row runs its failed step again: under that step's name and idempotency key.
    step = attempted(step)
    if isinstance(intent, ModelTurn):
        return _model_turn(intent, env)
    if isinstance(intent, InvokeTool):
        return _invoke_tool(intent, env, step)
    if isinstance(intent, Summarize):
        return _summarize(intent, env)
    if isinstance(intent, ListMcpTools):
        return mcp_listing.listed(env.app, intent.wanted)
    raise TypeError(f"{type(intent).__name__} is not a remote step")


def _model_for(agent: AgentSpec, settings: ModelSettings) -> Model:
    """The agent's adapter, or another provider's when the thread switched to one."""
    wanted = settings.provider
    current = agent.model.name.split(":", 1)[0] if ":" in agent.model.name else None
    if wanted is None or wanted == current or settings.model is None:
        return agent.model
    return _resolved(f"{wanted}:{settings.model}")


@lru_cache(maxsize=32)
def _resolved(spec: str) -> Model:
    from .models.registry import resolve_model

    return resolve_model(spec)


def model_of(app: AgentApp, request: ModelRequest) -> Model:
    """The adapter a model request goes to (its agent's, or the selected provider's)."""
    return _model_for(app.get_agent(request.agent), request.settings)


def _model_turn(intent: ModelTurn, env: StepEnv) -> BaseModel:
    request = intent.request
    model = model_of(env.app, request)
    try:
        reply: object = model.run_turn(request, env.stream)
    except ModelError as error:
        if env.limits is not None:  # a 429's Retry-After pauses its key for every worker
            env.limits.refused(model, request, error)
        raise
    if not isinstance(reply, ModelResponse):
        try:  # an adapter may hand back the reply's fields as a mapping
            reply = ModelResponse.model_validate(reply)
        except ValidationError as exc:
            raise ModelError(
                f"the model adapter {model.name!r} returned a malformed reply "
                f"({type(reply).__name__}): {exc.error_count()} problem(s), first: "
                f"{exc.errors()[0]['msg']}",
                kind="invalid_response",
            ) from None
    if env.limits is not None:  # the tokens the call took, corrected by what it used
        env.limits.used(model, request, reply.usage)
    too_large = blobs.oversize([reply.text, *(c.args for c in reply.tool_calls)], "the reply")
    if too_large is not None:  # not retried: the same request would get as much again
        raise ModelError(f"the model adapter {model.name!r}: {too_large}", kind="invalid_response")
    return reply


def _summarize(intent: Summarize, env: StepEnv) -> BaseModel:
    window = env.app.get_agent(intent.agent).history
    if window is None or window.summarizer is None:
        raise ModelError(f"agent {intent.agent!r} has no summarizing history window")
    return window.summarizer.summarize(intent.run_id, intent.agent, intent.messages)


def _invoke_tool(intent: InvokeTool, env: StepEnv, step: str) -> ToolOutcome:
    """Re-check role and schema at every invocation; a failure is a result, not a crash."""
    app = env.app
    call = intent.call
    ctx = ToolContext(
        run_id=intent.run_id,
        step=step,
        call_id=call.id,
        actor=intent.actor,
        idempotency_key=f"{intent.run_id}:{step}",
        answers=intent.answers,
    )
    try:
        tool = app.registry.authorize(call.name, intent.actor, app.roles, intent.offered)
        result = tool.invoke(call.args, ctx)
        # Measured here, before it is journaled, streamed or copied: one over the maximum
        # is a failed call whose error the model reads, as any tool's.
        too_large = blobs.oversize(result, f"the result of tool {call.name!r}")
        if too_large is not None:
            del result  # the only reference: its memory goes now
            log.info("tool %s in run %s: %s", call.name, intent.run_id, too_large)
            return ToolOutcome(ok=False, error=str(too_large))
        return ToolOutcome(ok=True, result=result)
    except QuestionsAsked as asked:
        return ToolOutcome(ok=False, questions=asked.questions)
    except ToolError as exc:
        return ToolOutcome(ok=False, error=str(exc))
    except Exception as exc:  # the handler's own failure goes back to the model
        log.info("tool %s failed in run %s: %s", call.name, intent.run_id, exc)
        return ToolOutcome(ok=False, error=f"{type(exc).__name__}: {exc}")
