"""The rows of a payload table in batches, as stored (no codec), for the command that
seals what was written clear (agent_jobs/encryption/maintenance.py); the caller owns the
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Connection, Table, Text, select, tuple_, type_coerce

from .payloads import Payload
from .schema import Json


def raw(column: Column[Any]) -> Any:
    """The column as stored (no codec): a JSON value, or text."""
    kind = Json if isinstance(column.type, Payload) else Text()
    return type_coerce(column, kind).label(column.name)


def locked_batch(
    conn: Connection,
    table: Table,
    columns: Sequence[Column[Any]],
    extra: Sequence[Any],
    *,
    after: tuple[Any, ...] | None,
    limit: int,
) -> Sequence[Any]:
    """The next `limit` rows after primary key `after`, in key order: the key, `columns`
    as stored and `extra`; locked until the transaction ends (FOR UPDATE on Postgres;
    SQLite's writer holds the whole database)."""
    key = list(table.primary_key.columns)
    query = select(*key, *(raw(c) for c in columns), *extra)
    if after is not None:
        query = query.where(tuple_(*key) > tuple_(*after))
    query = query.order_by(*key).limit(limit)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(of=table)
    return conn.execute(query).all()
