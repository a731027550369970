"""The journal: one row per checkpointed step, keyed by run and step name."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, Row, and_, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .db import utcnow
from .schema import journal

StepState = Literal["scheduled", "started", "done", "failed", "waiting"]


def load(conn: Connection, run_id: str) -> Sequence[Row[Any]]:
    """The run's whole journal in one query, in the order the loop asked for it."""
    return conn.execute(
        select(journal).where(journal.c.run_id == run_id).order_by(journal.c.seq)
    ).all()


def get(conn: Connection, run_id: str, step: str) -> Row[Any] | None:
    return conn.execute(
        select(journal).where(journal.c.run_id == run_id, journal.c.step == step)
    ).first()


def insert_done(
    conn: Connection,
    *,
    run_id: str,
    step: str,
    seq: int,
    intent: Any,
    result: Any,
    started_at: datetime | None = None,
) -> None:
    now = utcnow()
    conn.execute(
        insert(journal).values(
            run_id=run_id,
            step=step,
            seq=seq,
            state="done",
            intent=intent,
            result=result,
            attempts=1,
            created_at=started_at or now,
            started_at=started_at or now,
            finished_at=now,
        )
    )


def insert_pending(
    conn: Connection, *, run_id: str, step: str, seq: int, intent: Any, state: StepState
) -> bool:
    """Insert a `scheduled` (or `waiting`) row unless it exists; True when inserted."""
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    result = conn.execute(
        dialect_insert(journal)
        .values(
            run_id=run_id,
            step=step,
            seq=seq,
            state=state,
            intent=intent,
            attempts=0,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=[journal.c.run_id, journal.c.step])
        .returning(journal.c.step)
    )
    # rowcount is not reliable for INSERT … ON CONFLICT on every driver; RETURNING is.
    return result.first() is not None


def claim(
    conn: Connection, run_id: str, step: str, *, max_attempts: int, lease: float
) -> Row[Any] | None:
    """Take a remote step for this attempt; None when it is not this attempt's to run.

    A step is claimable when it is scheduled, or started by an attempt whose lease ran
    out (its worker died). A duplicate delivery while the lease is live claims nothing.
    """
    now = utcnow()
    result = conn.execute(
        update(journal)
        .where(
            journal.c.run_id == run_id,
            journal.c.step == step,
            or_(
                journal.c.state == "scheduled",
                and_(journal.c.state == "started", journal.c.lease_until < now),
            ),
            journal.c.attempts < max_attempts,
        )
        .values(
            state="started",
            attempts=journal.c.attempts + 1,
            started_at=now,
            lease_until=now + timedelta(seconds=lease),
        )
        .returning(journal)
    )
    return result.first()


def extend_lease(conn: Connection, run_id: str, step: str, *, attempt: int, lease: float) -> bool:
    """Keep a running step's lease alive; False once the step is no longer this attempt's."""
    result = conn.execute(
        update(journal)
        .where(
            journal.c.run_id == run_id,
            journal.c.step == step,
            journal.c.state == "started",
            journal.c.attempts == attempt,
        )
        .values(lease_until=utcnow() + timedelta(seconds=lease))
    )
    return result.rowcount == 1


def stranded(conn: Connection, run_id: str, *, older_than: datetime) -> Sequence[Row[Any]]:
    """Remote steps of a run nobody is working on: scheduled long ago, or lease expired."""
    now = utcnow()
    return conn.execute(
        select(journal).where(
            journal.c.run_id == run_id,
            or_(
                and_(journal.c.state == "scheduled", journal.c.created_at < older_than),
                and_(journal.c.state == "started", journal.c.lease_until < now),
            ),
        )
    ).all()


def complete(
    conn: Connection,
    run_id: str,
    step: str,
    *,
    state: Literal["done", "failed"],
    result: Any = None,
    error: str | None = None,
) -> bool:
    """Write a step's outcome; the first writer wins."""
    outcome = conn.execute(
        update(journal)
        .where(
            journal.c.run_id == run_id,
            journal.c.step == step,
            journal.c.state.in_(("scheduled", "started", "waiting")),
        )
        .values(state=state, result=result, error=error, finished_at=utcnow())
    )
    return outcome.rowcount == 1
