"""Approval deadlines: a call nobody decided within its tool's `approval_timeout` is
rejected, approved or escalated.

The deadline is on the call's record in Postgres (`tool_calls.approval_deadline`), set
when the person is asked. Whoever finds it passed decides it here, under the run's lock:
the pass of a run parked on the call (a delayed re-drive wakes it at the deadline), the
sweep (for every run, whatever happened to the broker), the inline runner while it
waits. A timeout is a decision like a person's, recorded the same way (the call's
record, then its `approval:<call_id>` row), and the first decision wins: a person's that
came first beats the timeout, and a person's that comes after it changes nothing.

Escalation (`on_timeout="escalate"`) hands the call to the roles `escalate_to`: only they
may decide it from then on, a new `approval_request` frame marked `escalated` goes out,
and the new deadline's timeout rejects it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection

from .. import checkpoints as names
from ..app import AgentApp
from ..checkpoints import Decision
from ..messages import args_sha256
from ..observability import observe
from ..store import Store, journal, runs, toolcalls
from ..store.db import utcnow
from ..tools import Tool

TIMEOUT_ACTOR = "agent-jobs"  # who decides a call nobody decided in time
TIMEOUT_REASON = "timeout"

FrameSpec = tuple[str, dict[str, Any]]


def tool_of(app: AgentApp, name: str) -> Tool | None:
    return app.registry.get(name) if name in app.registry else None


def deadline_for(app: AgentApp, tool: str, now: datetime) -> datetime | None:
    """When a call of `tool` asked for now times out (None: it waits for ever)."""
    found = tool_of(app, tool)
    if found is None or found.approval_timeout is None:
        return None
    return now + timedelta(seconds=found.approval_timeout)


def request(
    conn: Connection, app: AgentApp, run_id: str, call_id: str, tool: str, now: datetime
) -> datetime | None:
    """Put the request on the call's record (once) with its deadline; returns it."""
    deadline = deadline_for(app, tool, now)
    toolcalls.mark_requested(conn, run_id, call_id, at=now, deadline=deadline)
    return deadline


def deadline_fields(deadline: datetime | None) -> dict[str, Any]:
    """What an `approval_request` frame says of the deadline, if the call has one."""
    return {} if deadline is None else {"deadline": deadline.isoformat()}


@dataclass(frozen=True)
class TimedOut:
    """A call whose deadline passed: decided by the timeout, or escalated."""

    run_id: str
    root_run_id: str
    call_id: str
    tool: str
    how: Literal["decided", "escalated"]
    decision: Decision | None = None  # decided
    deadline: datetime | None = None  # escalated: the new deadline
    frames: tuple[FrameSpec, ...] = ()  # streamed once the decision is committed


def expire_run(
    conn: Connection, app: AgentApp, run_id: str, now: datetime | None = None
) -> list[TimedOut]:
    """Decide the run's undecided calls past their deadline, in the caller's transaction
    (the run's lock is taken here: a person's decision is recorded under it too)."""
    now = now or utcnow()
    run = runs.lock_run(conn, run_id)
    if run is None or run.status in runs.TERMINAL:
        return []
    return [
        found
        for call in toolcalls.due(conn, now=now, run_id=run_id)
        if (found := _expire(conn, app, run, call, now)) is not None
    ]


def expire_due(
    store: Store, app: AgentApp, now: datetime | None = None, limit: int = 100
) -> list[TimedOut]:
    """The sweep's part: every run with a call past its deadline, one transaction each."""
    now = now or utcnow()
    with store.connect() as conn:
        run_ids = list(dict.fromkeys(row.run_id for row in toolcalls.due(conn, now=now)))
    timed_out: list[TimedOut] = []
    for run_id in run_ids[:limit]:
        with store.begin() as conn:
            timed_out.extend(expire_run(conn, app, run_id, now))
    return timed_out


def _expire(conn: Connection, app: AgentApp, run: Any, call: Any, now: datetime) -> TimedOut | None:
    tool = tool_of(app, call.name)
    base = {"run_id": run.id, "root_run_id": run.root_run_id, "call_id": call.call_id}
    if tool is not None and tool.on_timeout == "escalate" and not call.escalated:
        approvers = sorted(tool.escalate_to or ())
        assert tool.approval_timeout is not None  # escalate needs a timeout (tools.py)
        deadline = now + timedelta(seconds=tool.approval_timeout)
        if not toolcalls.escalate(
            conn, run.id, call.call_id, approvers=approvers, deadline=deadline, now=now
        ):
            return None
        request_frame = {
            "call_id": call.call_id,
            "tool": call.name,
            "args": call.args,
            "args_sha256": args_sha256(call.args),
            "escalated": True,
            "approvers": approvers,
            **deadline_fields(deadline),
        }
        return TimedOut(
            **base,
            tool=call.name,
            how="escalated",
            deadline=deadline,
            frames=(("approval_request", request_frame),),
        )
    # A second timeout (after an escalation) rejects, whatever the first would do.
    verdict: Literal["approve", "reject"] = (
        "approve" if tool is not None and tool.on_timeout == "approve" else "reject"
    )
    if call.escalated:
        verdict = "reject"
    decision = Decision(decision=verdict, actor=TIMEOUT_ACTOR, reason=TIMEOUT_REASON)
    if not toolcalls.decide(
        conn, run.id, call.call_id, decision=verdict, actor=TIMEOUT_ACTOR, reason=TIMEOUT_REASON
    ):
        return None
    journal.complete(
        conn,
        run.id,
        names.approval(call.call_id),
        state="done",
        result=decision.model_dump(mode="json"),
    )
    observe.decided(run, call, verdict, names.approval(call.call_id))
    return TimedOut(**base, tool=call.name, how="decided", decision=decision)
