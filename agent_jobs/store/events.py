"""The session log: append-only events with a per-thread sequence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from .db import utcnow
from .schema import events, threads

PendingEvent = tuple[str, str | None, str, dict[str, Any]]  # thread, run, type, data

_TAKE_SEQ = (
    update(threads)
    .where(threads.c.id == bindparam("b_thread"))
    .values(event_seq=threads.c.event_seq + bindparam("b_count"))
    .returning(threads.c.event_seq)
)
_INSERT = insert(events)


def append(conn: Connection, pending: Sequence[PendingEvent]) -> None:
    """Append events in order. Taking the sequence locks the thread's row until commit,
    so the events of one thread are numbered without gaps or races."""
    by_thread: dict[str, list[PendingEvent]] = {}
    for event in pending:
        by_thread.setdefault(event[0], []).append(event)
    now = utcnow()
    rows = []
    for thread_id, batch in by_thread.items():
        last = conn.execute(_TAKE_SEQ, {"b_thread": thread_id, "b_count": len(batch)}).scalar_one()
        first = int(last) - len(batch) + 1
        for offset, (_, run_id, kind, data) in enumerate(batch):
            rows.append(
                {
                    "thread_id": thread_id,
                    "seq": first + offset,
                    "run_id": run_id,
                    "type": kind,
                    "data": data,
                    "created_at": now,
                }
            )
    if rows:
        conn.execute(_INSERT, rows)


_THREAD = (
    select(events)
    .where(events.c.thread_id == bindparam("thread_id"), events.c.seq > bindparam("after"))
    .order_by(events.c.seq)
)
_THREAD_TYPES = _THREAD.where(events.c.type.in_(bindparam("types", expanding=True)))


def for_thread(
    conn: Connection, thread_id: str, *, after: int = 0, types: Sequence[str] | None = None
) -> Sequence[Any]:
    """The thread's events after sequence `after`, oldest first (optionally of some types)."""
    params: dict[str, Any] = {"thread_id": thread_id, "after": after}
    if types is not None:
        params["types"] = list(types)
        return conn.execute(_THREAD_TYPES, params).all()
    return conn.execute(_THREAD, params).all()


def lock_thread(conn: Connection, thread_id: str) -> Any | None:
    """Take the thread's row lock (posting and turn ends serialise on it)."""
    return conn.execute(select(threads).where(threads.c.id == thread_id).with_for_update()).first()
