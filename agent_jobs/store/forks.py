"""What a fork copies of its source run (agent_jobs/controls/fork.py): journal rows, the
thread's history, tool-call records. Each a small query; the caller owns the
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, insert, or_, select

from ..messages import Message
from .db import utcnow
from .schema import journal, messages, runs, tool_calls
from .threads import message_row


def copy_journal(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert journal rows as given (every column)."""
    if rows:
        conn.execute(insert(journal), list(rows))


def history_before(conn: Connection, thread_id: str, run_id: str, created_at: Any) -> list[Any]:
    """The thread's messages from before run `run_id`: those older than the first message
    of that run or of any run of the thread after it (all of them, if none wrote one)."""
    later = select(runs.c.id).where(runs.c.thread_id == thread_id, runs.c.created_at >= created_at)
    first = (
        select(func.min(messages.c.id))
        .where(
            messages.c.thread_id == thread_id,
            or_(messages.c.run_id == run_id, messages.c.run_id.in_(later)),
        )
        .scalar_subquery()
    )
    query = (
        select(messages)
        .where(messages.c.thread_id == thread_id, or_(first.is_(None), messages.c.id < first))
        .order_by(messages.c.id)
    )
    return list(conn.execute(query).all())


def copy_messages(conn: Connection, thread_id: str, rows: Sequence[Any]) -> None:
    """Copy messages (rows of `messages`) to `thread_id`, in order, each with the run that
    wrote it and when."""
    values = [
        {
            "thread_id": thread_id,
            "run_id": row.run_id,
            "role": row.role,
            "content": row.content,
            "tool_calls": row.tool_calls,
            "tool_call_id": row.tool_call_id,
            "name": row.name,
            "is_error": row.is_error,
            "created_at": row.created_at,
        }
        for row in rows
    ]
    if values:
        conn.execute(insert(messages), values)


def add_messages(conn: Connection, thread_id: str, run_id: str, written: list[Message]) -> None:
    """Append messages stamped with `run_id`, in order."""
    if written:
        conn.execute(insert(messages), [message_row(thread_id, run_id, m) for m in written])


def copy_calls(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert tool-call records as given (every column)."""
    if rows:
        now = utcnow()
        conn.execute(insert(tool_calls), [{**row, "updated_at": now} for row in rows])
