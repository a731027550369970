"""The data keys of encryption at rest (agent_jobs/encryption): small queries on
`data_keys`, each taking a connection; the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from .db import dialect_insert, utcnow
from .schema import DATA_KEY_LIVE, data_keys


def live_key(conn: Connection, actor: str) -> Any | None:
    """The actor's live (unforgotten) data key row, or None."""
    return conn.execute(select(data_keys).where(data_keys.c.actor == actor, DATA_KEY_LIVE)).first()


def add_key(
    conn: Connection, *, key_id: str, actor: str, wrapped: bytes, master_key_id: str
) -> bool:
    """Add the actor's live data key unless one exists (a concurrent writer's wins);
    True when this one was added."""
    statement = (
        dialect_insert(conn.dialect.name, data_keys)
        .values(
            id=key_id,
            actor=actor,
            wrapped=wrapped,
            master_key_id=master_key_id,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=[data_keys.c.actor], index_where=DATA_KEY_LIVE)
        .returning(data_keys.c.id)
    )
    return conn.execute(statement).first() is not None


_BY_ID = select(data_keys).where(data_keys.c.id == bindparam("key_id"))


def by_id(conn: Connection, key_id: str) -> Any | None:
    return conn.execute(_BY_ID, {"key_id": key_id}).first()


def not_under(conn: Connection, master_key_id: str, limit: int) -> Sequence[Any]:
    """Live data keys wrapped by another master key than `master_key_id`, locked (on
    Postgres, skipping those another rotation holds)."""
    query = (
        select(data_keys)
        .where(data_keys.c.master_key_id != master_key_id, DATA_KEY_LIVE)
        .order_by(data_keys.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return conn.execute(query).all()


def rewrap(conn: Connection, key_id: str, *, was: str, wrapped: bytes, master_key_id: str) -> bool:
    """Store a data key wrapped anew, if it is still wrapped by `was` and live."""
    done = conn.execute(
        update(data_keys)
        .where(data_keys.c.id == key_id, data_keys.c.master_key_id == was, DATA_KEY_LIVE)
        .values(wrapped=wrapped, master_key_id=master_key_id, rotated_at=utcnow())
    )
    return bool(done.rowcount)


def forget(conn: Connection, actor: str, now: datetime) -> list[str]:
    """Destroy the actor's data keys (the wrapped bytes are gone; the rows stay, so a
    reader can say whose data it was); the ids destroyed."""
    found = conn.execute(
        update(data_keys)
        .where(data_keys.c.actor == actor, data_keys.c.wrapped.is_not(None))
        .values(wrapped=None, forgotten_at=func.coalesce(data_keys.c.forgotten_at, now))
        .returning(data_keys.c.id)
    ).all()
    return [row.id for row in found]
