"""Threads and their messages."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, exists, insert, literal_column, select, update

from ..encryption.keyring import owns
from ..messages import Message, ToolCall
from . import driver
from .db import insert_unless_exists, utcnow
from .schema import messages, runs, threads


def ensure_thread(conn: Connection, thread_id: str) -> bool:
    """Create the thread unless it exists (one statement on both dialects); True when it
    was created."""
    now = utcnow()
    values = {"id": thread_id, "created_at": now, "updated_at": now}
    return insert_unless_exists(conn, threads, values)


def thread_exists(conn: Connection, thread_id: str) -> bool:
    return conn.execute(select(threads.c.id).where(threads.c.id == thread_id)).first() is not None


APPEND = insert(messages).returning(messages.c.id)
# The columns `message_row` fills, for a statement written out (a Postgres CTE).
MESSAGE_COLUMNS = (
    "thread_id, run_id, role, content, tool_calls, tool_call_id, name, is_error, created_at"
)


def append_message(conn: Connection, thread_id: str, run_id: str | None, message: Message) -> int:
    """Append a message stamped with the run that wrote it; returns its id."""
    owns(conn, run_id, thread_id)
    return int(driver.scalar(conn, APPEND, message_row(thread_id, run_id, message)))


def add_message(conn: Connection, thread_id: str, run_id: str | None, message: Message) -> None:
    """`append_message` for a caller that needs no id: sent with the transaction's next
    statement or its commit (store/driver.py)."""
    owns(conn, run_id, thread_id)
    driver.later(conn, _ADD, message_row(thread_id, run_id, message))


_ADD = insert(messages)


def message_row(thread_id: str, run_id: str | None, message: Message) -> dict[str, Any]:
    """A message as `APPEND` takes it."""
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "role": message.role,
        "content": message.content,
        "tool_calls": [c.model_dump() for c in message.tool_calls] or None,
        "tool_call_id": message.tool_call_id,
        "name": message.name,
        "is_error": message.is_error,
        "created_at": utcnow(),
    }


_TURN_COLUMNS = (
    messages.c.id,
    messages.c.role,
    messages.c.content,
    messages.c.tool_calls,
    messages.c.tool_call_id,
    messages.c.name,
    messages.c.is_error,
)


def _to_message(row: Any) -> Message:
    return Message(
        role=row.role,
        content=row.content,
        tool_calls=[ToolCall.model_validate(c) for c in row.tool_calls or []],
        tool_call_id=row.tool_call_id,
        name=row.name,
        is_error=bool(row.is_error),
    )


_THREAD = (
    select(*_TURN_COLUMNS)
    .where(messages.c.thread_id == bindparam("thread_id"))
    .order_by(messages.c.id)
)


_NEWEST = (
    select(*_TURN_COLUMNS)
    .where(messages.c.thread_id == bindparam("thread_id"))
    .order_by(messages.c.id.desc())
    .limit(bindparam("limit"))
)


def thread_messages(conn: Connection, thread_id: str, *, limit: int | None = None) -> list[Message]:
    """The thread's messages, oldest first: all of them, or the newest `limit` rows,
    bounded by the database and projected to the columns a model turn needs."""
    [rows] = driver.batch(conn, [_messages_query(thread_id, limit)])
    return _in_order(rows, limit)


def turn_snapshot(
    conn: Connection, thread_id: str, *, limit: int | None = None
) -> tuple[str | None, bool, list[Message]]:
    """What a turn starts from, in one round trip: the thread's title, whether it was
    ever answered (asked of the whole thread, not the window), and its messages as
    `thread_messages` gives them."""
    title_rows, rows = driver.batch(
        conn,
        [(_TITLE_AND_ANSWERED, {"thread_id": thread_id}), _messages_query(thread_id, limit)],
    )
    title, answered = (
        (title_rows[0].title, bool(title_rows[0].answered)) if title_rows else (None, False)
    )
    return title, answered, _in_order(rows, limit)


def _messages_query(thread_id: str, limit: int | None) -> tuple[Any, dict[str, Any]]:
    if limit is None:
        return _THREAD, {"thread_id": thread_id}
    return _NEWEST, {"thread_id": thread_id, "limit": limit}


def _in_order(rows: list[Any], limit: int | None) -> list[Message]:
    return [_to_message(row) for row in (rows if limit is None else rows[::-1])]


_TITLE_AND_ANSWERED = select(
    threads.c.title,
    exists()
    .where(messages.c.thread_id == bindparam("thread_id"))
    .where(messages.c.role == literal_column("'assistant'"))
    .label("answered"),
).where(threads.c.id == bindparam("thread_id"))


def thread_title(conn: Connection, thread_id: str) -> str | None:
    return conn.execute(select(threads.c.title).where(threads.c.id == thread_id)).scalar()


def has_other_actor(conn: Connection, thread_id: str, actor: str) -> bool:
    """Whether a run of another actor than `actor` is on the thread."""
    other = exists().where(runs.c.thread_id == thread_id, runs.c.actor != actor)
    return bool(conn.execute(select(other)).scalar())


def set_title(conn: Connection, thread_id: str, title: str) -> None:
    """Give the thread its title unless it has one."""
    driver.later(conn, _SET_TITLE, {"b_id": thread_id, "b_title": title, "b_now": utcnow()})


_SET_TITLE = (
    update(threads)
    .where(threads.c.id == bindparam("b_id"), threads.c.title.is_(None))
    .values(title=bindparam("b_title"), updated_at=bindparam("b_now"))
)


def has_assistant_message(conn: Connection, thread_id: str, *, before_run: str | None) -> bool:
    """Whether the thread was ever answered (by a run other than `before_run`)."""
    query = messages.c.thread_id == thread_id, messages.c.role == "assistant"
    where = [*query]
    if before_run is not None:
        where.append(messages.c.run_id != before_run)
    return bool(conn.execute(select(exists().where(*where))).scalar())
