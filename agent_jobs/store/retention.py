"""Retention's queries: the finished runs a prune takes, batch by batch, and what it
removes of them (their journal, most of their session-log events, their delivered
notifications); and the payloads kept apart that no row refers to any more.

A pruned run keeps one journal row, its mark: step and state `pruned`, position 0, its
result saying when and how much went. The mark is how a later prune, `agent-jobs
journal` and anything that would drive the run again know its journal is gone. Every
batch is walked in primary-key order from where the last one stopped, so each is one
short transaction over a bounded set of rows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, exists, func, insert, select, text

from . import blobs
from .payloads import Payload, PayloadText
from .runs import TERMINAL
from .schema import events, journal, metadata, outbox, payload_blobs, runs

PRUNED = "pruned"  # the mark's step and state

_MARK = exists().where(journal.c.run_id == runs.c.id, journal.c.step == PRUNED)
_ROOT = runs.alias("root")
# A delegated run goes with its tree: while its top-level run is unfinished, it stays.
_ROOT_UNFINISHED = exists().where(_ROOT.c.id == runs.c.root_run_id, _ROOT.c.status.not_in(TERMINAL))


def finished_before(cutoff: datetime) -> Any:
    """The runs a prune is about: ended before `cutoff`."""
    return and_(runs.c.status.in_(TERMINAL), runs.c.finished_at < cutoff)


def take(
    conn: Connection, *, cutoff: datetime, after: str, limit: int, lock: bool
) -> Sequence[Any]:
    """The next `limit` runs to prune after run id `after` (id, thread_id), in id order:
    ended before `cutoff`, not pruned yet, their top-level run ended.

    `lock` takes each run's row (the lock an UPDATE takes), skipping rows another
    transaction holds: whatever would move a run again (a retry) waits for the batch,
    then finds its mark; two prunes at once never take the same run.
    """
    query = (
        select(runs.c.id, runs.c.thread_id)
        .where(runs.c.id > after, finished_before(cutoff), ~_MARK, ~_ROOT_UNFINISHED)
        .order_by(runs.c.id)
        .limit(limit)
    )
    if lock:
        query = query.with_for_update(of=runs, key_share=True, skip_locked=True)
    return conn.execute(query).all()


def _events_of(taken: Sequence[Any], keep: Sequence[str]) -> Any:
    # Events are keyed by thread: the runs' threads first, so the primary key finds them.
    return and_(
        events.c.thread_id.in_(sorted({row.thread_id for row in taken})),
        events.c.run_id.in_([row.id for row in taken]),
        events.c.type.not_in(keep),
    )


def count(conn: Connection, taken: Sequence[Any], keep: Sequence[str]) -> tuple[int, int]:
    """(journal rows, events) a prune of `taken` would remove."""
    ids = [row.id for row in taken]
    rows = conn.execute(select(func.count()).where(journal.c.run_id.in_(ids))).scalar_one()
    gone = conn.execute(select(func.count()).where(_events_of(taken, keep))).scalar_one()
    return int(rows), int(gone)


def remove(
    conn: Connection, taken: Sequence[Any], keep: Sequence[str], *, now: datetime
) -> tuple[int, int]:
    """Remove the journal and the session-log events (but those of types `keep`) of
    `taken`, and mark each run pruned; (journal rows, events) removed."""
    ids = [row.id for row in taken]
    rows = Counter(
        conn.execute(delete(journal).where(journal.c.run_id.in_(ids)).returning(journal.c.run_id))
        .scalars()
        .all()
    )
    gone = Counter(
        conn.execute(delete(events).where(_events_of(taken, keep)).returning(events.c.run_id))
        .scalars()
        .all()
    )
    marks = [
        {
            "run_id": run_id,
            "step": PRUNED,
            "seq": 0,
            "state": PRUNED,
            "intent": None,
            "result": {
                "pruned_at": now.isoformat(),
                "journal_rows": rows[run_id],
                "events": gone[run_id],
            },
            "error": None,
            "attempts": 0,
            "created_at": now,
            "finished_at": now,
        }
        for run_id in ids
    ]
    conn.execute(insert(journal), marks)
    return sum(rows.values()), sum(gone.values())


def mark(conn: Connection, run_id: str) -> dict[str, Any] | None:
    """The run's mark (when it was pruned, what went), or None: it was not pruned."""
    result = conn.execute(
        select(journal.c.result).where(
            journal.c.run_id == run_id, journal.c.step == PRUNED, journal.c.state == PRUNED
        )
    ).scalar()
    return dict(result) if isinstance(result, dict) else None


def outbox_span(conn: Connection, *, after: int, limit: int) -> int | None:
    """The id of the `limit`-th notification after id `after` (or the last), or None
    when there are none: the next batch's span of the outbox."""
    span = select(outbox.c.id).where(outbox.c.id > after).order_by(outbox.c.id).limit(limit)
    last = conn.execute(select(func.max(span.subquery().c.id))).scalar()
    return int(last) if last is not None else None


def _delivered_in(after: int, upto: int, cutoff: datetime) -> Any:
    return (
        select(outbox.c.id)
        .join(runs, runs.c.id == outbox.c.run_id)
        .where(
            outbox.c.id > after,
            outbox.c.id <= upto,
            outbox.c.delivered_at.is_not(None),
            finished_before(cutoff),
        )
    )


def count_outbox(conn: Connection, *, after: int, upto: int, cutoff: datetime) -> int:
    """Delivered notifications in the span whose runs ended before `cutoff`."""
    found = _delivered_in(after, upto, cutoff).subquery()
    return int(conn.execute(select(func.count()).select_from(found)).scalar_one())


def remove_outbox(conn: Connection, *, after: int, upto: int, cutoff: datetime) -> int:
    """Delete them; rows a sender is deleting (its own retention) are skipped."""
    old = (
        _delivered_in(after, upto, cutoff)
        .with_for_update(of=outbox, skip_locked=True)
        .scalar_subquery()
    )
    return int(conn.execute(delete(outbox).where(outbox.c.id.in_(old))).rowcount)


# --- payloads kept apart (agent_jobs/store/blobs.py) ----------------------------------------


def _payload_columns() -> list[tuple[str, str, bool]]:
    """(table, column, is JSON) of every payload column."""
    return [
        (table.name, column.name, isinstance(column.type, Payload))
        for table in metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, Payload | PayloadText)
    ]


def _referring(conn: Connection, table: str, column: str, is_json: bool) -> Any:
    """The column's stored values (as stored: no codec) that refer to blobs."""
    if is_json and conn.dialect.name == "postgresql":
        where = f"jsonb_exists({column}, '{blobs.WRAPPED}')"
        value = f"{column}::text"
    elif is_json:  # JSON text on SQLite
        where = f"instr({column}, '\"{blobs.WRAPPED}\"') > 0"
        value = column
    else:
        prefix = blobs.TEXT_PREFIX
        where = f"substr({column}, 1, {len(prefix)}) = '{prefix}'"
        value = column
    return conn.execute(text(f"SELECT {value} FROM {table} WHERE {where}")).scalars()


def referenced_blobs(conn: Connection) -> set[str]:
    """The digests of the blobs some payload refers to, directly or through another blob.
    Reads every payload column's references: a scan of the payload tables."""
    found: set[str] = set()
    nested: list[str] = []
    for table, column, is_json in _payload_columns():
        for stored in _referring(conn, table, column, is_json):
            for digest, kind in blobs.references(stored):
                if digest not in found:
                    found.add(digest)
                    if kind == "json":
                        nested.append(digest)
    while nested:
        row = conn.execute(
            select(payload_blobs.c.data).where(payload_blobs.c.sha256 == nested.pop())
        ).first()
        if row is None:
            continue
        inner = {blobs.WRAPPED: json.loads(bytes(row[0]))}
        for digest, kind in blobs.references(inner):
            if digest not in found:
                found.add(digest)
                if kind == "json":
                    nested.append(digest)
    return found


def blobs_written_before(conn: Connection, cutoff: datetime) -> dict[str, int]:
    """Every blob last written before `cutoff`: its digest and size."""
    query = select(payload_blobs.c.sha256, payload_blobs.c.size).where(
        payload_blobs.c.written_at < cutoff
    )
    return {str(digest): int(size) for digest, size in conn.execute(query).all()}


def remove_blobs(conn: Connection, digests: Sequence[str], cutoff: datetime) -> tuple[int, int]:
    """Delete these blobs unless one was written again since `cutoff` (a row that refers
    to it again); (blobs, bytes) removed."""
    gone = conn.execute(
        delete(payload_blobs)
        .where(payload_blobs.c.sha256.in_(list(digests)), payload_blobs.c.written_at < cutoff)
        .returning(payload_blobs.c.size)
    ).scalars()
    sizes = [int(size) for size in gone]
    return len(sizes), sum(sizes)
