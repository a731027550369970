"""Retention: what a finished run leaves behind is removed once it is old enough.

`prune` removes, of the runs that ended before the cutoff, their journal (a finished
run's journal is never replayed: it keeps one row, the mark that says it was pruned),
their session-log events, their live streams in Redis and their delivered
notifications, in small batches: each batch is one short transaction over a few runs
taken in primary-key order, so the tables the workers write are never held up for long.
Run rows, thread messages, tool calls, questions and usage stay.

Then the payloads kept apart (agent_jobs/store/blobs.py) that no row refers to any more
go: those of the journals just pruned, and those a transaction wrote and rolled back. A
blob written within `BLOB_GRACE` is kept whatever refers to it: the transaction that
wrote it may not have committed the row that refers to it yet. Finding the references
reads every payload column's (a scan of the payload tables, on a read connection); the
removal is one short transaction.

Of the session log, the inbox and model-selection events stay: a thread's inbox and its
model are folded from every such event of the thread, so removing some would change
what a later turn of the thread sees. So do the operator's controls (who paused,
resumed, retried or forked the run): few, and the record of what people did, as its
tool calls' decisions are.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .errors import InvalidRequestError
from .session import CONTROLS, INBOX
from .store import Store
from .store import retention as rows
from .store.db import utcnow
from .streams.base import stream_key

if TYPE_CHECKING:
    import redis

PRUNE = "agent_jobs.prune"  # the Celery task beat runs it as

# The session-log events a prune leaves (see above).
KEPT_EVENTS: tuple[str, ...] = (*INBOX, *CONTROLS)

# A batch of the outbox spans this many notifications per run of a batch of runs.
OUTBOX_SPAN = 10

# Seconds a blob written lately is kept, referred to or not: longer than any transaction
# lives (a step's time limit, Postgres's idle-in-transaction timeout).
BLOB_GRACE = 3600.0
# Blobs one DELETE names.
BLOB_BATCH = 500


@dataclass
class PruneReport:
    """What a prune removed (or, dry, would remove), and how long its batches took."""

    cutoff: datetime
    dry_run: bool
    runs: int = 0
    journal_rows: int = 0
    events: int = 0
    outbox: int = 0
    streams: int = 0
    blobs: int = 0  # payloads kept apart that no row referred to any more
    blob_bytes: int = 0
    batches: int = 0
    longest_batch: float = 0.0  # seconds, the longest transaction
    elapsed: float = 0.0
    # False when a time budget stopped it first: the next prune goes on from there.
    complete: bool = True
    durations: list[float] = field(default_factory=list, repr=False)

    @property
    def rows(self) -> int:
        """Database rows removed: journal rows, events and notifications."""
        return self.journal_rows + self.events + self.outbox

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["durations"]
        doc["cutoff"] = self.cutoff.isoformat()
        doc["rows"] = self.rows
        return doc

    def summary(self) -> str:
        verb = "would prune" if self.dry_run else "pruned"
        text = (
            f"{verb} {_many(self.runs, 'run')}: {_many(self.journal_rows, 'journal row')}, "
            f"{_many(self.events, 'event')}, {_many(self.outbox, 'notification')}, "
            f"{_many(self.streams, 'stream')}"
        )
        if self.blobs:
            text += f", {_many(self.blobs, 'blob')} ({self.blob_bytes:,} bytes)"
        return text if self.complete else text + " (stopped by its time budget; more left)"

    def took(self, seconds: float) -> None:
        """A batch took `seconds`."""
        self.batches += 1
        self.durations.append(seconds)
        self.longest_batch = max(self.longest_batch, seconds)


def _many(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def cutoff_for(days: float, *, now: datetime | None = None) -> datetime:
    """The moment `days` days before `now` (the current time by default)."""
    if not days >= 0:  # NaN too
        raise InvalidRequestError(f"--older-than must be a number of days >= 0, not {days}")
    return (now or utcnow()) - timedelta(days=days)


def prune(
    store: Store,
    *,
    older_than: float,
    dry_run: bool = False,
    batch: int = 100,
    redis_client: redis.Redis | None = None,
    budget: float | None = None,
    rest: float = 0.0,
    now: datetime | None = None,
    blob_grace: float = BLOB_GRACE,
) -> PruneReport:
    """Prune the runs that ended more than `older_than` days ago, `batch` runs a
    transaction; `dry_run` counts what would go and changes nothing.

    `redis_client` holds the runs' live streams (None: there are none to remove). A Redis that
    fails fails the batch it was in, which changes nothing: the batches before it stay
    done and the next prune goes on. With `budget` (seconds), no batch starts after it.
    After each batch it rests `rest` times as long as the batch took: on a busy database
    batches take longer and the prune yields more (0: one batch right after the other).
    Last, the blobs no row refers to, but those written in the last `blob_grace` seconds.
    """
    if batch < 1:
        raise InvalidRequestError(f"--batch must be at least 1, not {batch}")
    if not rest >= 0:
        raise InvalidRequestError(f"--rest must be a number >= 0, not {rest}")
    report = PruneReport(cutoff=cutoff_for(older_than, now=now), dry_run=dry_run)
    started = time.monotonic()

    def go_on() -> bool:
        if budget is not None and time.monotonic() - started >= budget:
            report.complete = False
        return report.complete

    def took(began: float) -> None:
        seconds = time.monotonic() - began
        report.took(seconds)
        if rest:
            time.sleep(seconds * rest)

    after = ""
    while go_on():
        began = time.monotonic()
        after = _runs_batch(store, report, after, batch, redis_client)
        if not after:
            break
        took(began)
    last: int | None = 0
    while last is not None and go_on():
        began = time.monotonic()
        last = _outbox_batch(store, report, last, batch * OUTBOX_SPAN)
        if last is not None:
            took(began)
    if go_on():  # not a batch of runs: its time is in `elapsed` only
        _blobs(store, report, (now or utcnow()) - timedelta(seconds=blob_grace))
    report.elapsed = time.monotonic() - started
    return report


def _blobs(store: Store, report: PruneReport, cutoff: datetime) -> None:
    """The blobs written before `cutoff` that no row refers to: removed, or counted."""
    with store.connect() as conn:
        old = rows.blobs_written_before(conn, cutoff)
        if not old:
            return
        unreferenced = sorted(old.keys() - rows.referenced_blobs(conn))
    if report.dry_run:
        report.blobs += len(unreferenced)
        report.blob_bytes += sum(old[digest] for digest in unreferenced)
        return
    for start in range(0, len(unreferenced), BLOB_BATCH):
        with store.begin() as conn:
            count, size = rows.remove_blobs(conn, unreferenced[start : start + BLOB_BATCH], cutoff)
        report.blobs += count
        report.blob_bytes += size


def _runs_batch(
    store: Store, report: PruneReport, after: str, batch: int, client: redis.Redis | None
) -> str:
    """One batch of runs; the last run id it took ('' when there were none)."""
    now = utcnow()
    opened = store.connect() if report.dry_run else store.begin()
    with opened as conn:
        taken = rows.take(
            conn, cutoff=report.cutoff, after=after, limit=batch, lock=not report.dry_run
        )
        if not taken:
            return ""
        keys = [stream_key(row.id) for row in taken]
        if report.dry_run:
            journal_rows, events = rows.count(conn, taken, KEPT_EVENTS)
            streams = int(client.exists(*keys)) if client is not None else 0
        else:
            journal_rows, events = rows.remove(conn, taken, KEPT_EVENTS, now=now)
            # Before the commit: a Redis that fails leaves the runs unmarked, and the next
            # prune takes them again, streams and all.
            streams = int(client.unlink(*keys)) if client is not None else 0
    report.runs += len(taken)
    report.journal_rows += journal_rows
    report.events += events
    report.streams += streams
    return str(taken[-1].id)


def _outbox_batch(store: Store, report: PruneReport, after: int, span: int) -> int | None:
    """One span of the outbox: its delivered notifications of runs that ended before the
    cutoff; the last id of the span, or None past the outbox's end."""
    opened = store.connect() if report.dry_run else store.begin()
    with opened as conn:
        upto = rows.outbox_span(conn, after=after, limit=span)
        if upto is None:
            return None
        if report.dry_run:
            report.outbox += rows.count_outbox(conn, after=after, upto=upto, cutoff=report.cutoff)
        else:
            report.outbox += rows.remove_outbox(conn, after=after, upto=upto, cutoff=report.cutoff)
    return upto


def pruned(store: Store, run_id: str) -> dict[str, Any] | None:
    """When the run was pruned and what went (`pruned_at`, `journal_rows`, `events`), or
    None if it was not."""
    with store.connect() as conn:
        return rows.mark(conn, run_id)
