"""What an operator runs on the keys and the data (`agent-jobs keys …`, `agent-jobs
forget`): each in batches, each batch its own transaction, so it may run while workers
do, be stopped, and be run again to go on where it stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Table,
    Text,
    func,
    or_,
    select,
    type_coerce,
    update,
)

from ..errors import ConfigurationError
from ..store import Store, payload_rows
from ..store import data_keys as key_rows
from ..store.db import utcnow
from ..store.payloads import Codecs, Payload, PayloadText
from ..store.schema import Json, metadata, runs, threads
from . import envelope
from .keyring import keyring, own


def _tables() -> list[tuple[Table, list[Column[Any]]]]:
    """Every table with payload columns, and those columns."""
    found = []
    for table in metadata.sorted_tables:
        columns = [c for c in table.columns if isinstance(c.type, (Payload, PayloadText))]
        if columns:
            found.append((table, columns))
    return found


def _encrypting() -> str:
    current = keyring().current
    if current is None:
        raise ConfigurationError(
            "encryption is off: set AGENT_JOBS_ENCRYPTION_KEYS and AGENT_JOBS_ENCRYPTION_KEY_ID"
        )
    return current


# --- rotate --------------------------------------------------------------------------


def rotate(store: Store, *, batch: int = 100, progress: Callable[[int], None] | None = None) -> int:
    """Re-wrap every live data key not under the current master key with it; the
    number re-wrapped. A key's bytes do not change: what it sealed stays as it is, and
    processes that hold it opened go on using it."""
    current = _encrypting()
    ring, done = keyring(), 0
    while True:
        with store.begin() as conn:
            found = key_rows.not_under(conn, current, batch)
            for row in found:
                key = ring.unwrap(row)
                wrapped, master = ring.wrap(row.id, row.actor, key.key)
                done += key_rows.rewrap(
                    conn, row.id, was=row.master_key_id, wrapped=wrapped, master_key_id=master
                )
        if progress is not None and found:
            progress(done)
        if len(found) < batch:
            return done


# --- forget --------------------------------------------------------------------------


@dataclass(frozen=True)
class Forgotten:
    actor: str
    keys: list[str]  # the data keys destroyed
    payloads: int  # the stored payloads sealed under them, now unreadable


def forget(store: Store, actor: str) -> Forgotten:
    """Destroy the actor's data keys: what they sealed is unreadable from then on (in
    other processes once their opened copy expires, keyring.TTL). Their runs stay, with
    their ids, statuses and every clear column."""
    with store.begin() as conn:
        ids = key_rows.forget(conn, actor, utcnow())
        count = _sealed_under(conn, ids)
    keyring().drop_all()
    return Forgotten(actor, ids, count)


def _sealed_under(conn: Connection, ids: list[str]) -> int:
    """The stored payloads (a column of a row each) sealed under the keys `ids`."""
    if not ids:
        return 0
    total = 0
    for table, columns in _tables():
        for column in columns:
            if isinstance(column.type, Payload):
                mark = type_coerce(column, Json)["k"].as_string().in_(ids)
            else:
                stored = type_coerce(column, Text)
                mark = or_(*(stored.startswith(f"{envelope.TEXT_MARK}{i}$") for i in ids))
            query = select(func.count()).select_from(table).where(mark)
            total += int(conn.execute(query).scalar() or 0)
    return total


# --- encrypt what is clear -----------------------------------------------------------


def encrypt_existing(
    store: Store, *, batch: int = 500, progress: Callable[[str, int], None] | None = None
) -> dict[str, int]:
    """Seal every payload still stored clear (written before encryption was on), table
    by table, `batch` rows a transaction; the number sealed per table. A batch's rows are
    locked while it runs (store/payload_rows.py; SQLite has one writer at a time): a
    worker's write to one waits, and is never overwritten with an older value."""
    _encrypting()
    sealed: dict[str, int] = {}
    for table, columns in _tables():
        sealed[table.name] = 0
        for count in _encrypt_table(store, table, columns, batch):
            sealed[table.name] += count
            if progress is not None:
                progress(table.name, sealed[table.name])
    return sealed


def _encrypt_table(
    store: Store, table: Table, columns: list[Column[Any]], batch: int
) -> Iterator[int]:
    key = list(table.primary_key.columns)
    last: tuple[Any, ...] | None = None
    owners: dict[str, str | None] = {}
    while True:
        with store.begin() as conn:
            found = payload_rows.locked_batch(
                conn, table, columns, _owner_columns(table), after=last, limit=batch
            )
            count = 0
            for row in found:
                clear = {c.name: _value(c, row) for c in columns if _is_clear(c, row)}
                if not clear:
                    continue
                actor = _owner_of(conn, table, row, owners)
                if actor is None:
                    continue  # a row of no run: nobody's key may seal it
                own(conn, actor)
                where = [c == row._mapping[c.name] for c in key]
                conn.execute(update(table).where(*where).values(clear))
                count += 1
        if found:
            last = tuple(found[-1]._mapping[c.name] for c in key)
            yield count
        if len(found) < batch:
            return


def _value(column: Column[Any], row: Any) -> Any:
    """A clear payload's value as its readers see it (a part kept apart fetched, an
    escaped look-alike as it was): what the update writes back, sealed."""
    stored = row._mapping[column.name]
    if isinstance(column.type, Payload):
        return Codecs.decode_json(stored)
    return Codecs.decode_text(stored)


def _is_clear(column: Column[Any], row: Any) -> bool:
    value = row._mapping[column.name]
    if value is None:
        return False
    if isinstance(column.type, Payload):
        return envelope.read_json_form(value) is None
    return envelope.read_text_form(value) is None


def _owner_columns(table: Table) -> list[Any]:
    if table is runs:
        return [runs.c.actor.label("owner_actor")]
    if table is threads:  # its title: its first run's actor's
        return [threads.c.id.label("owner_thread")]
    if "run_id" in table.c:
        actor = select(runs.c.actor).where(runs.c.id == table.c.run_id).scalar_subquery()
        found = [actor.label("owner_actor")]
        if "thread_id" in table.c:
            found.append(table.c.thread_id.label("owner_thread"))
        return found
    return []


def _owner_of(
    conn: Connection, table: Table, row: Any, owners: dict[str, str | None]
) -> str | None:
    """The actor whose key seals the row: its run's; for a row of a thread and no run
    (a message posted to it, the thread's own title), the thread's first run's."""
    mapping = row._mapping
    actor = mapping.get("owner_actor")
    if actor is not None:
        return str(actor)
    thread_id = mapping.get("owner_thread")
    if thread_id is None:
        return None
    if thread_id not in owners:
        owners[thread_id] = conn.execute(
            select(runs.c.actor)
            .where(runs.c.thread_id == thread_id)
            .order_by(runs.c.created_at)
            .limit(1)
        ).scalar()
    return owners[thread_id]
