"""Tool-call records: what the model asked, the verdict, the decision and the outcome."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Connection, Row, bindparam, insert, select, text, update

from ..encryption.keyring import owns
from ..messages import Message
from . import driver, threads
from .db import utcnow
from .runs import TERMINAL
from .schema import messages, runs, tool_calls

CallStatus = Literal[
    "auto_executed", "pending_approval", "approved", "rejected", "executed", "failed"
]


def insert_call(
    conn: Connection,
    *,
    run_id: str,
    call_id: str,
    thread_id: str,
    name: str,
    kind: str,
    args: dict[str, Any],
    status: CallStatus,
    error: str | None = None,
) -> None:
    owns(conn, run_id)
    now = utcnow()
    row = {
        "run_id": run_id,
        "call_id": call_id,
        "thread_id": thread_id,
        "name": name,
        "kind": kind,
        "args": args,
        "status": status,
        "error": error,
        "created_at": now,
        "updated_at": now,
    }
    driver.later(conn, _INSERT, row)


_INSERT = insert(tool_calls)


def get_call(conn: Connection, run_id: str, call_id: str) -> Row[Any] | None:
    return conn.execute(
        select(tool_calls).where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id)
    ).first()


def run_calls(conn: Connection, run_id: str) -> Sequence[Row[Any]]:
    return conn.execute(
        select(tool_calls).where(tool_calls.c.run_id == run_id).order_by(tool_calls.c.created_at)
    ).all()


def decided_calls(conn: Connection, run_id: str) -> Sequence[Row[Any]]:
    """The run's calls a person (or a deadline) decided, in the order they were made."""
    return conn.execute(
        select(tool_calls)
        .where(tool_calls.c.run_id == run_id, tool_calls.c.decision.is_not(None))
        .order_by(tool_calls.c.created_at)
    ).all()


def decide(
    conn: Connection,
    run_id: str,
    call_id: str,
    *,
    decision: Literal["approve", "reject"],
    actor: str,
    reason: str | None,
) -> bool:
    """Record a decision on a pending call; the first decision wins."""
    owns(conn, run_id)
    result = conn.execute(
        update(tool_calls)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.call_id == call_id,
            tool_calls.c.status == "pending_approval",
            tool_calls.c.decision.is_(None),
        )
        .values(
            decision=decision,
            decided_by=actor,
            decision_reason=reason,
            decided_at=utcnow(),
            status="approved" if decision == "approve" else "rejected",
            updated_at=utcnow(),
        )
    )
    return result.rowcount == 1


def set_outcome(
    conn: Connection,
    run_id: str,
    call_id: str,
    *,
    status: CallStatus,
    result: Any = None,
    error: str | None = None,
) -> None:
    owns(conn, run_id)
    conn.execute(_OUTCOME, _outcome(run_id, call_id, status, result, error))


def finish_call(
    conn: Connection,
    run_id: str,
    call_id: str,
    *,
    status: CallStatus,
    result: Any,
    error: str | None,
    thread_id: str,
    message: Message,
) -> None:
    """`set_outcome`, and the call's message on the thread: on Postgres one statement,
    sent with the transaction's next statement or its commit (store/driver.py)."""
    owns(conn, run_id)
    if conn.dialect.name != "postgresql":
        set_outcome(conn, run_id, call_id, status=status, result=result, error=error)
        threads.add_message(conn, thread_id, run_id, message)
        return
    values = _outcome(run_id, call_id, status, result, error)
    values |= threads.message_row(thread_id, run_id, message)
    driver.later(conn, _FINISH, values)


def _outcome(
    run_id: str, call_id: str, status: CallStatus, result: Any, error: str | None
) -> dict[str, Any]:
    return {
        "b_run_id": run_id,
        "b_call_id": call_id,
        "b_status": status,
        "b_result": result,
        "b_error": error,
        "b_now": utcnow(),
    }


_OUTCOME = (
    update(tool_calls)
    .where(
        tool_calls.c.run_id == bindparam("b_run_id"),
        tool_calls.c.call_id == bindparam("b_call_id"),
    )
    .values(
        status=bindparam("b_status"),
        result=bindparam("b_result", type_=tool_calls.c.result.type),
        error=bindparam("b_error"),
        updated_at=bindparam("b_now"),
    )
)
_FINISH = text(
    f"""
    WITH outcome AS (
        UPDATE tool_calls SET status = :b_status, result = CAST(:b_result AS jsonb),
            error = :b_error, updated_at = :b_now
        WHERE run_id = :b_run_id AND call_id = :b_call_id
    )
    INSERT INTO messages ({threads.MESSAGE_COLUMNS})
    VALUES (:{threads.MESSAGE_COLUMNS.replace(", ", ", :")})
    """
).bindparams(
    bindparam("b_result", type_=tool_calls.c.result.type),
    bindparam("content", type_=messages.c.content.type),
    bindparam("tool_calls", type_=messages.c.tool_calls.type),
)


def pending_calls(conn: Connection, *, run_id: str | None = None) -> Sequence[Row[Any]]:
    """Calls waiting for a human decision, oldest first, with their run's actor.

    A call of a run that has ended keeps its `pending_approval` status, but no one waits
    for its decision any more: it is not listed.
    """
    query = (
        select(tool_calls, runs.c.actor, runs.c.agent, runs.c.input)
        .join(runs, runs.c.id == tool_calls.c.run_id)
        .where(tool_calls.c.status == "pending_approval", runs.c.status.not_in(TERMINAL))
        .order_by(tool_calls.c.created_at)
    )
    if run_id is not None:
        query = query.where(tool_calls.c.run_id == run_id)
    return conn.execute(query).all()


def said_with(conn: Connection, calls: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """What the model wrote in the reply that made each of `calls` ((run id, call id)
    pairs): the text of its assistant message, before the calls. One query."""
    if not calls:
        return {}
    query = select(messages.c.run_id, messages.c.content, messages.c.tool_calls).where(
        messages.c.run_id.in_({run_id for run_id, _ in calls}), messages.c.role == "assistant"
    )
    found: dict[tuple[str, str], str] = {}
    for run_id, content, made in conn.execute(query).all():
        for call in made or []:
            key = (run_id, call.get("id") if isinstance(call, dict) else None)
            if key in calls:
                found[key] = content
    return found


# --- approval deadlines (approvals/deadlines.py) ---------------------------------------------


def mark_requested(
    conn: Connection, run_id: str, call_id: str, *, at: Any, deadline: Any | None
) -> None:
    """The person was asked now (once: a replay of the request changes nothing), and the
    call times out at `deadline` (None: never)."""
    conn.execute(
        update(tool_calls)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.call_id == call_id,
            tool_calls.c.requested_at.is_(None),
        )
        .values(requested_at=at, approval_deadline=deadline, updated_at=at)
    )


def due(
    conn: Connection, *, now: Any, run_id: str | None = None, limit: int = 100
) -> Sequence[Row[Any]]:
    """Undecided calls of unfinished runs past their deadline, the earliest first."""
    query = (
        select(tool_calls, runs.c.thread_id.label("run_thread_id"))
        .join(runs, runs.c.id == tool_calls.c.run_id)
        .where(
            tool_calls.c.status == "pending_approval",
            tool_calls.c.approval_deadline.is_not(None),
            tool_calls.c.approval_deadline <= now,
            runs.c.status.not_in(TERMINAL),
        )
        .order_by(tool_calls.c.approval_deadline)
        .limit(limit)
    )
    if run_id is not None:
        query = query.where(tool_calls.c.run_id == run_id)
    return conn.execute(query).all()


def escalate(
    conn: Connection,
    run_id: str,
    call_id: str,
    *,
    approvers: Sequence[str],
    deadline: Any,
    now: Any,
) -> bool:
    """Hand an undecided call to `approvers`, with a new deadline (once)."""
    owns(conn, run_id)
    result = conn.execute(
        update(tool_calls)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.call_id == call_id,
            tool_calls.c.status == "pending_approval",
            tool_calls.c.decision.is_(None),
            tool_calls.c.escalated.is_(False),
        )
        .values(
            escalated=True, approvers=sorted(approvers), approval_deadline=deadline, updated_at=now
        )
    )
    return result.rowcount == 1
