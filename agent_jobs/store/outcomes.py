"""Calls whose outcome nobody knows, and how they are settled.

A non-idempotent action's handler is marked as begun on its call's row
(`handler_started_at`), in a transaction of its own, before it runs; the mark goes when
the call's result is recorded. A delivery of the step that finds the mark and no result
knows the handler began and not how it ended: the step's journal row then waits
(`waiting`) for the tool's `reconcile` or a person, who records the result, a failure,
or has it run again (`scheduled`, the mark cleared).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from .. import checkpoints as names
from . import driver
from .db import utcnow
from .schema import journal, tool_calls

IN_FLIGHT = ("scheduled", "started")

_CALL = (
    tool_calls.c.run_id == bindparam("b_run_id"),
    tool_calls.c.call_id == bindparam("b_call_id"),
)
_BEGIN = (
    update(tool_calls)
    .where(*_CALL, tool_calls.c.handler_started_at.is_(None))
    .values(handler_started_at=bindparam("b_now"))
)
_STARTED = select(tool_calls.c.handler_started_at).where(*_CALL)
_CLEAR = (
    update(tool_calls)
    .where(*_CALL, tool_calls.c.handler_started_at.is_not(None))
    .values(handler_started_at=None)
)


def begin_handler(conn: Connection, run_id: str, call_id: str) -> bool:
    """Mark the call's handler as begun now; False when it had begun before (a worker
    that ran it died before its result was recorded: the outcome is unknown)."""
    call = {"b_run_id": run_id, "b_call_id": call_id}
    if driver.rowcount(conn, _BEGIN, call | {"b_now": utcnow()}) == 1:
        return True
    # Nothing marked: the mark was there, or the call has no row (nothing to guard).
    return driver.first(conn, _STARTED, call) is None


def handler_started(conn: Connection, run_id: str, call_id: str) -> datetime | None:
    """When the call's handler began, if its result is not recorded yet."""
    found = driver.first(conn, _STARTED, {"b_run_id": run_id, "b_call_id": call_id})
    return None if found is None else found.handler_started_at


def clear_handler(conn: Connection, run_id: str, call_id: str) -> None:
    """The call's outcome is known now (recorded in this transaction): its handler may be
    begun again (a tool that asked questions runs again with the answers). Sent with the
    transaction's next statement or its commit."""
    driver.later(conn, _CLEAR, {"b_run_id": run_id, "b_call_id": call_id})


def park(conn: Connection, run_id: str, step: str) -> bool:
    """A step in flight whose outcome is unknown waits for a decision; False when it is
    in flight no more (another delivery settled it)."""
    result = conn.execute(
        update(journal)
        .where(
            journal.c.run_id == run_id,
            journal.c.step == step,
            journal.c.state.in_(IN_FLIGHT),
        )
        .values(state="waiting", lease_until=None, holder=None)
    )
    return result.rowcount == 1


def unknown(conn: Connection, run_id: str) -> list[Any]:
    """The run's tool steps whose outcome is unknown, waiting for a decision (step,
    intent), in the order they ran."""
    rows = conn.execute(
        select(journal.c.step, journal.c.intent)
        .where(journal.c.run_id == run_id, journal.c.state == "waiting")
        .order_by(journal.c.seq)
    ).all()
    found = []
    for row in rows:
        parsed = names.parse(names.attempted(row.step))
        if parsed is not None and parsed.kind == "tool":
            found.append(row)
    return found


def waiting_step(conn: Connection, run_id: str, call_id: str) -> Any | None:
    """The call's tool step that waits for a decision on its outcome, if one does (the
    call's first run, or a later round after a person's answers)."""
    rows = conn.execute(
        select(journal.c.step, journal.c.intent).where(
            journal.c.run_id == run_id, journal.c.state == "waiting"
        )
    ).all()
    first = names.tool(call_id)
    for row in rows:
        step = names.attempted(row.step)  # a retry row waits in its failed step's place
        if step == first or step.startswith(first + ":"):
            parsed = names.parse(step)
            if parsed is not None and parsed.kind == "tool":
                return row
    return None


def settle(conn: Connection, run_id: str, step: str, result: Any) -> bool:
    """Record the waiting step's result as decided; False when it waits no more (another
    decision came first). The first decision wins."""
    done = conn.execute(
        update(journal)
        .where(journal.c.run_id == run_id, journal.c.step == step, journal.c.state == "waiting")
        .values(state="done", result=result, error=None, finished_at=utcnow())
    )
    return done.rowcount == 1


def reschedule(conn: Connection, run_id: str, step: str) -> bool:
    """Have the waiting step run again, its attempts counted afresh; False when it waits
    no more. The first decision wins."""
    again = conn.execute(
        update(journal)
        .where(journal.c.run_id == run_id, journal.c.step == step, journal.c.state == "waiting")
        .values(
            state="scheduled",
            attempts=0,
            started_at=None,
            lease_until=None,
            holder=None,
            finished_at=None,
        )
    )
    return again.rowcount == 1


def forget_handler(conn: Connection, run_id: str, call_id: str) -> None:
    """Clear the mark now (a person's `retry`: the handler runs again)."""
    conn.execute(
        update(tool_calls)
        .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id)
        .values(handler_started_at=None, updated_at=utcnow())
    )
