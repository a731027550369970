"""Run rows: created before any work starts, moved through their statuses."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Row, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .db import utcnow
from .schema import runs, usage

RunStatus = Literal[
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_answers",
    "completed",
    "failed",
    "cancelled",
]
RUN_STATUSES: tuple[str, ...] = (
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_answers",
    "completed",
    "failed",
    "cancelled",
)
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


def insert_run(
    conn: Connection,
    *,
    run_id: str,
    thread_id: str,
    agent: str,
    actor: str,
    persona: str | None,
    input: str,
    status: RunStatus,
    runner: str,
    day: str,
    metadata: dict[str, Any],
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
) -> bool:
    """Insert the run row; False when a run with this id already exists."""
    now = utcnow()
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    inserted = conn.execute(
        dialect_insert(runs)
        .values(
            id=run_id,
            thread_id=thread_id,
            agent=agent,
            actor=actor,
            persona=persona,
            input=input,
            status=status,
            runner=runner,
            day=day,
            metadata=metadata,
            parent_run_id=parent_run_id,
            root_run_id=root_run_id or run_id,
            depth=depth,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=[runs.c.id])
        .returning(runs.c.id)
    )
    return inserted.first() is not None


_GET = select(runs).where(runs.c.id == bindparam("run_id"))
_LOCK = _GET.with_for_update()


_LOCK_AND_TOUCH = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"))
    .values(updated_at=bindparam("b_now"))
    .returning(*runs.c)
)


def lock_and_touch(conn: Connection, run_id: str) -> Row[Any] | None:
    """Take the run's row lock and mark it as just driven, in one statement.

    Re-drives of a run serialise on this lock; `updated_at` is what the sweep reads to
    tell a run that makes progress from one that stalled.
    """
    return conn.execute(_LOCK_AND_TOUCH, {"b_run_id": run_id, "b_now": utcnow()}).first()


def get_run(conn: Connection, run_id: str, *, for_update: bool = False) -> Row[Any] | None:
    """The run's row; `for_update` takes its lock (serialises re-drives of the run)."""
    return conn.execute(_LOCK if for_update else _GET, {"run_id": run_id}).first()


def set_status(
    conn: Connection,
    run_id: str,
    status: RunStatus,
    *,
    waiting_on: str | None = None,
    only_if_not_terminal: bool = True,
) -> bool:
    """Move a run to `status`; a finished run never moves again."""
    query = _SET_STATUS if only_if_not_terminal else _SET_STATUS_ANY
    values: dict[str, Any] = {"b_run_id": run_id, "b_status": status, "b_waiting_on": waiting_on}
    values["b_now"] = utcnow()
    return conn.execute(query, values).rowcount == 1


_SET_STATUS_ANY = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"))
    .values(
        status=bindparam("b_status"),
        waiting_on=bindparam("b_waiting_on"),
        updated_at=bindparam("b_now"),
    )
)
_SET_STATUS = _SET_STATUS_ANY.where(runs.c.status.not_in(TERMINAL))


def finish_run(
    conn: Connection,
    run_id: str,
    status: Literal["completed", "failed", "cancelled"],
    *,
    output: str | None = None,
    error: str | None = None,
    error_type: str | None = None,
) -> bool:
    """Record a run's end, once: the first writer wins."""
    now = utcnow()
    result = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status.not_in(TERMINAL))
        .values(
            status=status,
            output=output,
            error=error,
            error_type=error_type,
            waiting_on=None,
            updated_at=now,
            finished_at=now,
        )
    )
    return result.rowcount == 1


def set_deadline(conn: Connection, run_id: str, deadline: datetime) -> None:
    conn.execute(update(runs).where(runs.c.id == run_id).values(deadline=deadline))


def touch(conn: Connection, run_id: str) -> None:
    conn.execute(update(runs).where(runs.c.id == run_id).values(updated_at=utcnow()))


def list_runs(
    conn: Connection, *, limit: int = 50, status: str | None = None, thread_id: str | None = None
) -> Sequence[Row[Any]]:
    query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id).limit(limit)
    if status is not None:
        query = query.where(runs.c.status == status)
    if thread_id is not None:
        query = query.where(runs.c.thread_id == thread_id)
    return conn.execute(query).all()


def run_tree_ids(conn: Connection, run_id: str) -> list[str]:
    """The run and all its descendants (delegated child runs)."""
    found = [run_id]
    frontier = [run_id]
    while frontier:
        children = conn.execute(
            select(runs.c.id).where(runs.c.parent_run_id.in_(frontier))
        ).scalars()
        frontier = [c for c in children if c not in found]
        found.extend(frontier)
    return found


def run_totals(conn: Connection, run_id: str) -> dict[str, Any]:
    """Token and cost totals of a run, its delegated children included."""
    ids = run_tree_ids(conn, run_id)
    row = conn.execute(
        select(
            func.coalesce(func.sum(usage.c.input_tokens), 0),
            func.coalesce(func.sum(usage.c.output_tokens), 0),
            func.sum(usage.c.cost),
            func.count(),
        ).where(usage.c.run_id.in_(ids))
    ).one()
    return {
        "input_tokens": int(row[0]),
        "output_tokens": int(row[1]),
        "cost": float(row[2]) if row[2] is not None else None,
        "model_calls": int(row[3]),
    }
