"""The session log: append-only events with a per-thread sequence."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    Connection,
    Text,
    TextClause,
    any_,
    bindparam,
    insert,
    select,
    text,
    update,
)

from ..encryption.keyring import own_run, own_thread
from . import driver, locks
from .db import utcnow
from .payloads import stored
from .schema import events, runs, threads

PendingEvent = tuple[str, str | None, str, dict[str, Any]]  # thread, run, type, data

_TAKE_SEQ = (
    update(threads)
    .where(threads.c.id == bindparam("b_thread"))
    .values(event_seq=threads.c.event_seq + bindparam("b_count"))
    .returning(threads.c.event_seq)
)
_INSERT = insert(events)
# Postgres: the sequence taken and the events written in one statement (one round trip),
# sent with the transaction's next statement or its commit (store/driver.py). With no
# thread row nothing is taken, the sequence comes out NULL and the insert fails: the
# transaction fails, as it must, in the database (nobody reads a count back).
_APPEND_PG = """
    WITH {before}taken AS (
        UPDATE threads SET event_seq = event_seq + :n WHERE id = :thread_id
        RETURNING event_seq
    )
    INSERT INTO events (thread_id, seq, run_id, type, data, created_at)
    SELECT :thread_id, taken.event_seq - :n + e.ord, e.run_id, e.type, e.data, :now
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
        AS e(ord bigint, run_id text, type text, data jsonb)
        LEFT JOIN taken ON true
"""
_APPEND = text(_APPEND_PG.format(before=""))
# The statements with a write ahead of the events, built once.
_WITH_BEFORE: dict[str, TextClause] = {}


def append(
    conn: Connection,
    pending: Sequence[PendingEvent],
    *,
    before: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """Append events in order. Taking the sequence locks the thread's row until commit,
    so the events of one thread are numbered without gaps or races.

    `before` is another write (a Postgres CTE and its parameters) that goes in the
    statement of the first thread's events: one round trip for both.
    """
    by_thread: dict[str, list[PendingEvent]] = {}
    for event in pending:
        by_thread.setdefault(event[0], []).append(event)
    now = utcnow()
    if conn.dialect.name == "postgresql":
        for thread_id, batch in by_thread.items():
            _append_pg(conn, thread_id, batch, now, before)
            before = None
        return
    rows = []
    for thread_id, batch in by_thread.items():
        last = conn.execute(
            _TAKE_SEQ, {"b_thread": thread_id, "b_count": len(batch)}
        ).scalar_one_or_none()
        if last is None:
            raise LookupError(f"thread {thread_id} has no row: its events cannot be numbered")
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
    for run_id, owned in _by_run(rows):
        if run_id is not None:
            own_run(conn, run_id)
        else:
            own_thread(conn, owned[0]["thread_id"])
        conn.execute(_INSERT, owned)


def _by_run(rows: list[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The rows in runs of one run each, in order: each run's actor owns its events'
    data (agent_jobs/encryption/keyring.py)."""
    found: list[tuple[str | None, list[dict[str, Any]]]] = []
    for row in rows:
        if found and found[-1][0] == row["run_id"]:
            found[-1][1].append(row)
        else:
            found.append((row["run_id"], [row]))
    return found


def _append_pg(
    conn: Connection,
    thread_id: str,
    batch: list[PendingEvent],
    now: datetime,
    before: tuple[str, dict[str, Any]] | None,
) -> None:
    rows = [
        {"ord": ord, "run_id": run_id, "type": kind, "data": _owned(conn, thread_id, run_id, data)}
        for ord, (_, run_id, kind, data) in enumerate(batch, start=1)
    ]
    params = {"thread_id": thread_id, "n": len(batch), "rows": json.dumps(rows), "now": now}
    statement = _APPEND
    if before is not None:
        cte, extra = before
        if cte not in _WITH_BEFORE:
            _WITH_BEFORE[cte] = text(_APPEND_PG.format(before=cte + ",\n"))
        statement = _WITH_BEFORE[cte]
        params |= extra
    driver.later(conn, statement, params)


def _owned(conn: Connection, thread_id: str, run_id: str | None, data: Any) -> Any:
    """An event's data as stored, its run's actor (or its thread's) its owner, a part
    kept apart written on this connection (store/blobs.py)."""
    driver.CONNECTION.set(conn)
    if run_id is not None:
        own_run(conn, run_id)
    else:
        own_thread(conn, thread_id)
    return stored(data)


_THREAD = (
    select(events)
    .where(events.c.thread_id == bindparam("thread_id"), events.c.seq > bindparam("after"))
    .order_by(events.c.seq)
)
_THREAD_TYPES = _THREAD.where(events.c.type.in_(bindparam("types", expanding=True)))
# Postgres: the types as one array parameter (the statement goes to the driver as is).
_THREAD_TYPES_PG = _THREAD.where(events.c.type == any_(bindparam("types", type_=ARRAY(Text))))


def of_runs_thread(run_id: str, types: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """The events of some types of the run's thread, oldest first, as a statement and
    its parameters (for a batch that reads them with the run's row; Postgres)."""
    return _OF_RUNS_THREAD, {"run_id": run_id, "types": list(types)}


_OF_RUNS_THREAD = (
    select(events)
    .where(
        events.c.thread_id
        == select(runs.c.thread_id).where(runs.c.id == bindparam("run_id")).scalar_subquery(),
        events.c.type == any_(bindparam("types", type_=ARRAY(Text))),
    )
    .order_by(events.c.seq)
)


def for_thread(
    conn: Connection, thread_id: str, *, after: int = 0, types: Sequence[str] | None = None
) -> Sequence[Any]:
    """The thread's events after sequence `after`, oldest first (optionally of some types)."""
    params: dict[str, Any] = {"thread_id": thread_id, "after": after}
    if types is None:
        return driver.rows(conn, _THREAD, params)
    params["types"] = list(types)
    if conn.dialect.name == "postgresql":
        return driver.rows(conn, _THREAD_TYPES_PG, params)
    return conn.execute(_THREAD_TYPES, params).all()


def lock_thread(conn: Connection, thread_id: str) -> Any | None:
    """Take the thread's row lock (posting and turn ends serialise on it), in the order
    of `agent_jobs.store.locks`."""
    locks.note(conn, locks.THREAD)
    return conn.execute(select(threads).where(threads.c.id == thread_id).with_for_update()).first()


def of_threads(conn: Connection, thread_ids: Sequence[str], types: Sequence[str]) -> Sequence[Any]:
    """The events of some types of several threads, each thread's oldest first."""
    if not thread_ids:
        return []
    return conn.execute(
        select(events)
        .where(events.c.thread_id.in_(list(thread_ids)), events.c.type.in_(list(types)))
        .order_by(events.c.thread_id, events.c.seq)
    ).all()
