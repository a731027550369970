"""The runs that hold or wait for a place: a thread's turn, an agent's concurrency key.

Each read takes the lock its place is serialised on first, in the same round trip (on
Postgres the statements go in one pipeline, each seeing what committed before it
began): the thread's row for its turn, a transaction-scoped advisory lock for an agent
and key. A caller that needs both takes the thread's first, as a turn's end does (its
events take the thread's row before it looks for who comes next). SQLite runs one
writing transaction at a time (`BEGIN IMMEDIATE`): there the locks are needed by no one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Executable,
    and_,
    bindparam,
    exists,
    func,
    or_,
    select,
)

from . import driver, locks
from .schema import runs, threads

TERMINAL = ("completed", "failed", "cancelled")
# The order the partial indexes' predicates name them in (ix_runs_unfinished,
# ix_runs_concurrency), written into the SQL, so the planner matches them.
_UNFINISHED = ~driver.among(runs.c.status, TERMINAL)
_COLUMNS = (
    runs.c.id,
    runs.c.status,
    runs.c.waiting_on,
    runs.c.cancel_cause,
    runs.c.runner,
    runs.c.created_at,
)

_LOCK_THREAD = select(threads.c.id).where(threads.c.id == bindparam("b_thread")).with_for_update()
_THREAD_RUNS = (
    select(*_COLUMNS)
    .where(
        runs.c.thread_id == bindparam("b_thread"),
        runs.c.parent_run_id.is_(None),
        _UNFINISHED,
    )
    .order_by(runs.c.created_at, runs.c.id)
)
_LOCK_KEY = select(func.pg_advisory_xact_lock(bindparam("b_lock", type_=BigInteger)))
_KEY = (runs.c.agent == bindparam("b_agent"), runs.c.concurrency_key == bindparam("b_key"))
_KEY_RUNNING = select(func.count()).where(*_KEY, _UNFINISHED, runs.c.status != "queued")
_KEY_QUEUED = (
    select(*_COLUMNS)
    .where(*_KEY, runs.c.status == "queued", runs.c.cancel_cause.is_(None))
    .order_by(runs.c.created_at, runs.c.id)
    .limit(bindparam("b_limit"))
)


def thread_runs(conn: Connection, thread_id: str, *, lock: bool = True) -> list[Any]:
    """The thread's unfinished top-level runs, oldest first (`id`, `status`, `waiting_on`,
    `cancel_cause`, `runner`, `created_at`); with `lock`, its row locked first, until the
    transaction ends."""
    params = {"b_thread": thread_id}
    if not lock:
        return driver.rows(conn, _THREAD_RUNS, params)
    locks.note(conn, locks.THREAD)
    _, found = driver.batch(conn, [(_LOCK_THREAD, params), (_THREAD_RUNS, params)])
    return found


def key_places(
    conn: Connection, agent: str, key: str, limit: int, *, thread_id: str | None = None
) -> tuple[int, list[Any]]:
    """(how many runs of the agent and key have begun and not ended, the first `limit`
    of those still queued and not cancelled, oldest first), under the key's lock; with
    `thread_id`, that thread's row is locked first."""
    statements: list[tuple[Executable, dict[str, Any]]] = []
    if thread_id is not None:
        statements.append((_LOCK_THREAD, {"b_thread": thread_id}))
    if conn.dialect.name == "postgresql":
        statements.append((_LOCK_KEY, {"b_lock": lock_id(agent, key)}))
    params = {"b_agent": agent, "b_key": key}
    statements += [(_KEY_RUNNING, params), (_KEY_QUEUED, params | {"b_limit": limit})]
    *_, running, queued = driver.batch(conn, statements)
    return int(running[0][0]), queued


def lock_id(agent: str, key: str) -> int:
    """The advisory lock of an agent and key: 64 bits of their hash (two pairs that
    share one only wait for each other)."""
    digest = hashlib.sha256(f"{agent}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def ahead(row: Any, of: Any) -> bool:
    """Whether `row` came before `of` (arrival order: creation time, then id)."""
    return bool((row.created_at, row.id) < (of.created_at, of.run_id))


def ids(rows: Sequence[Any]) -> list[str]:
    return [row.id for row in rows]


_AHEAD = runs.alias("ahead")


def queued_behind() -> ColumnElement[bool]:
    """A queued run behind another of its key or its thread, queued and not cancelled:
    the sweep re-drives only the first of each (once it begins, it wakes the next of its
    key that may; when it ends, the next of its thread)."""
    earlier = or_(
        _AHEAD.c.created_at < runs.c.created_at,
        and_(_AHEAD.c.created_at == runs.c.created_at, _AHEAD.c.id < runs.c.id),
    )
    queued = and_(_AHEAD.c.status == "queued", _AHEAD.c.cancel_cause.is_(None), earlier)
    of_key = exists().where(
        _AHEAD.c.agent == runs.c.agent,
        _AHEAD.c.concurrency_key == runs.c.concurrency_key,
        queued,
    )
    of_thread = exists().where(
        _AHEAD.c.thread_id == runs.c.thread_id, _AHEAD.c.parent_run_id.is_(None), queued
    )
    waits_for_thread = and_(runs.c.waiting_on.is_not(None), runs.c.parent_run_id.is_(None))
    return or_(and_(runs.c.concurrency_key.is_not(None), of_key), and_(waits_for_thread, of_thread))
