"""Schedule rows: each schedule's state (paused, the newest occurrence started)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, select, update

from .db import insert_unless_exists, utcnow
from .schema import schedules


def ensure(conn: Connection, name: str, now: datetime | None = None) -> None:
    """Write the schedule's row if it has none: occurrences from now on are due."""
    now = now or utcnow()
    insert_unless_exists(
        conn,
        schedules,
        {"name": name, "paused": False, "active_from": now, "updated_at": now},
    )


def lock(conn: Connection, name: str) -> Row[Any]:
    """The schedule's row, written if need be, locked until the transaction ends (on
    Postgres: two ticks of one schedule take turns; SQLite writes one at a time)."""
    ensure(conn, name)
    row = conn.execute(select(schedules).where(schedules.c.name == name).with_for_update()).one()
    return row


def get_all(conn: Connection, names: Collection[str] | None = None) -> dict[str, Row[Any]]:
    """The rows of these schedules (all of them without `names`), by name."""
    query = select(schedules)
    if names is not None:
        query = query.where(schedules.c.name.in_(sorted(names)))
    return {row.name: row for row in conn.execute(query)}


def started(conn: Connection, name: str, occurrence: datetime, run_id: str) -> None:
    """The newest occurrence started is now `occurrence` (never moved back)."""
    conn.execute(
        update(schedules)
        .where(schedules.c.name == name)
        .where(schedules.c.last_occurrence.is_(None) | (schedules.c.last_occurrence < occurrence))
        .values(last_occurrence=occurrence, last_run_id=run_id, updated_at=utcnow())
    )


def skipped_to(conn: Connection, name: str, moment: datetime) -> None:
    """Occurrences up to `moment` are not due any more (none started for them)."""
    conn.execute(
        update(schedules)
        .where(schedules.c.name == name)
        .where(schedules.c.active_from < moment)
        .values(active_from=moment, updated_at=utcnow())
    )


def set_paused(conn: Connection, name: str, paused: bool, now: datetime | None = None) -> bool:
    """Pause or resume; True when it changed. A resume makes the occurrences of the
    pause not due: they were skipped on purpose, not missed."""
    now = now or utcnow()
    row = lock(conn, name)
    if row.paused == paused:
        return False
    values: dict[str, Any] = {"paused": paused, "updated_at": now}
    if not paused:
        values["active_from"] = now
    conn.execute(update(schedules).where(schedules.c.name == name).values(**values))
    return True
