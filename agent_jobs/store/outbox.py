"""The notifications outbox: rows written with a run's state change, taken by senders.

A row is written in the transaction that changes the run (`add`), so it exists exactly
when the change does. A sender takes rows with a lease (`claim`): one statement moves
their `next_attempt_at` past the time the delivery may take, so no other sender takes
them meanwhile (Postgres skips the rows another claim has locked, `FOR UPDATE SKIP
LOCKED`; SQLite has one writer), and a sender that dies leaves them to be taken again
when the lease runs out. A row waits while an earlier row of its run is undelivered on
the same way out, so each run's notifications leave in the order they were written.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection, Update, bindparam, delete, exists, func, insert, select, update

from ..encryption.keyring import owns
from . import driver
from .schema import outbox, questions, tool_calls

# Where a claim takes rows from: not yet on the Redis Stream; on it (or with no stream)
# and not yet POSTed to the webhook.
Way = Literal["stream", "webhook", "webhook_only"]

_INSERT = insert(outbox)


def add(
    conn: Connection,
    *,
    event_id: str,
    type: str,
    run_id: str,
    body: dict[str, Any],
    at: datetime,
) -> None:
    """Write a notification, with the transaction's next statement or its commit (nothing
    reads it back: a pass pays no round trip for it)."""
    owns(conn, run_id)
    values = {
        "event_id": event_id,
        "type": type,
        "run_id": run_id,
        "body": body,
        "created_at": at,
        "next_attempt_at": at,
    }
    driver.later(conn, _INSERT, values)


# The idle poll's one query: the undelivered rows' index, read to its first entry.
_NEXT_DUE = (
    select(outbox.c.next_attempt_at)
    .where(outbox.c.delivered_at.is_(None))
    .order_by(outbox.c.next_attempt_at)
    .limit(1)
)


def next_due(conn: Connection) -> datetime | None:
    """When the earliest undelivered row may be tried (None: every row is delivered)."""
    found = driver.first(conn, _NEXT_DUE, {})
    due = found[0] if found is not None else None
    if due is not None and due.tzinfo is None:  # SQLite keeps no zone: it wrote UTC
        due = due.replace(tzinfo=UTC)
    return due


_CLAIMS: dict[tuple[Way, int], Update] = {}


def _claim_statement(way: Way, limit: int) -> Update:
    cached = _CLAIMS.get((way, limit))
    if cached is not None:
        return cached
    row = outbox.alias("candidate")
    earlier = outbox.alias("earlier")
    waits = [row.c.delivered_at.is_(None), row.c.next_attempt_at <= bindparam("now")]
    before = [
        earlier.c.run_id == row.c.run_id,
        earlier.c.id < row.c.id,
        earlier.c.delivered_at.is_(None),
    ]
    if way == "stream":
        waits.append(row.c.streamed_at.is_(None))
        before.append(earlier.c.streamed_at.is_(None))
    elif way == "webhook":
        waits.append(row.c.streamed_at.is_not(None))
    taken = (
        select(row.c.id)
        .where(*waits, ~exists().where(*before))
        .order_by(row.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=row)
    )
    statement = (
        update(outbox)
        .where(outbox.c.id.in_(taken))
        .values(next_attempt_at=bindparam("lease_until"))
        .returning(
            outbox.c.id,
            outbox.c.event_id,
            outbox.c.type,
            outbox.c.run_id,
            outbox.c.body,
            outbox.c.attempts,
        )
    )
    _CLAIMS[(way, limit)] = statement
    return statement


def claim(
    conn: Connection, way: Way, *, now: datetime, lease_until: datetime, limit: int
) -> list[Any]:
    """Take up to `limit` rows due on `way` (at most one of each run: the first it has
    undelivered there), leased until `lease_until`; in the order they were written."""
    found = conn.execute(_claim_statement(way, limit), {"now": now, "lease_until": lease_until})
    return sorted(found.all(), key=lambda r: r.id)


def streamed(conn: Connection, ids: Sequence[int], *, now: datetime, delivered: bool) -> None:
    """The rows are on the stream (and so `delivered`, when no webhook follows)."""
    values: dict[str, Any] = {
        "streamed_at": now,
        "next_attempt_at": now,  # the webhook may take it at once
        "attempts": outbox.c.attempts + 1,
        "last_error": None,
    }
    if delivered:
        values["delivered_at"] = now
    conn.execute(
        update(outbox)
        .where(outbox.c.id.in_(list(ids)), outbox.c.delivered_at.is_(None))
        .values(values)
    )


def delivered(conn: Connection, row_id: int, *, now: datetime) -> None:
    """The row reached the webhook: it is done."""
    conn.execute(
        update(outbox)
        .where(outbox.c.id == row_id, outbox.c.delivered_at.is_(None))
        .values(delivered_at=now, attempts=outbox.c.attempts + 1, last_error=None)
    )


def failed(
    conn: Connection,
    row_ids: Sequence[int],
    *,
    lease_until: datetime,
    retry_at: datetime,
    error: str,
) -> None:
    """An attempt failed: try again at `retry_at`. A row whose lease ran out meanwhile
    (another sender may hold it now) is left to that sender."""
    conn.execute(
        update(outbox)
        .where(
            outbox.c.id.in_(list(row_ids)),
            outbox.c.delivered_at.is_(None),
            outbox.c.next_attempt_at == lease_until,
        )
        .values(attempts=outbox.c.attempts + 1, next_attempt_at=retry_at, last_error=error)
    )


def release(
    conn: Connection, row_ids: Sequence[int], *, lease_until: datetime, retry_at: datetime
) -> None:
    """Give back rows that were not tried (their way out is down): no attempt counted."""
    if not row_ids:
        return
    conn.execute(
        update(outbox)
        .where(
            outbox.c.id.in_(list(row_ids)),
            outbox.c.delivered_at.is_(None),
            outbox.c.next_attempt_at == lease_until,
        )
        .values(next_attempt_at=retry_at)
    )


def prune(conn: Connection, *, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` rows delivered before `cutoff`, oldest first; how many.

    Rows are delivered about in the order they were written, so the oldest ids are the
    ones to go: the primary key is walked from its start, and rows another sender is
    deleting are skipped, not waited for.
    """
    row = outbox.alias("old")
    old = (
        select(row.c.id)
        .where(row.c.delivered_at < cutoff)
        .order_by(row.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return int(conn.execute(delete(outbox).where(outbox.c.id.in_(old))).rowcount)


def counts(conn: Connection) -> dict[str, int]:
    """Rows by where they stand (for operators and tests)."""
    undelivered = func.count().filter(outbox.c.delivered_at.is_(None))
    unstreamed = func.count().filter(
        outbox.c.streamed_at.is_(None), outbox.c.delivered_at.is_(None)
    )
    row = conn.execute(select(func.count(), undelivered, unstreamed)).one()
    return {"rows": int(row[0]), "undelivered": int(row[1]), "unstreamed": int(row[2])}


# --- what a run waits on, for its notification --------------------------------------------

_CALLS = (
    select(
        tool_calls.c.call_id,
        tool_calls.c.name,
        tool_calls.c.args,
        tool_calls.c.status,
        tool_calls.c.approval_deadline,
    )
    .where(tool_calls.c.run_id == bindparam("run_id"))
    .order_by(tool_calls.c.created_at, tool_calls.c.call_id)
)
_OPEN_QUESTIONS = (
    select(questions.c.request_id, questions.c.call_id, questions.c.tool, questions.c.questions)
    .where(questions.c.run_id == bindparam("run_id"), questions.c.answers.is_(None))
    .order_by(questions.c.created_at, questions.c.request_id)
)


def run_calls(conn: Connection, run_id: str) -> list[Any]:
    """The run's tool calls: id, tool, arguments, status and approval deadline."""
    return list(conn.execute(_CALLS, {"run_id": run_id}).all())


def open_questions(conn: Connection, run_id: str) -> list[Any]:
    """The run's questions no one has answered yet."""
    return list(conn.execute(_OPEN_QUESTIONS, {"run_id": run_id}).all())
