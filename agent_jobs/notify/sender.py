"""The sender: delivers the outbox's rows, each at least once, per run in order.

A thread of its own in every long-lived process (each worker process, the approvals
listener, `agent-jobs serve`, the inline runner's process). A commit of its own process
that wrote notifications wakes it at once (`wake.py`); otherwise it looks every
`notify_poll_interval` seconds for rows other processes wrote, with one query on the
undelivered rows' index (`store/outbox.py: next_due`) that finds nothing while nothing
waits. Each row goes to the Redis Stream `agent_jobs:events` (`XADD … MAXLEN ~`, one
field `event`, the JSON), then, with a webhook, is POSTed (`webhook.py`); a failure is
tried again after an exponential backoff with jitter, capped, until it succeeds. Rows
are leased while they are sent (`store/outbox.py: claim`), so two senders never send
one row at once; a sender that dies mid-way leaves its rows to be sent again when the
lease runs out, with the same `event_id`. Delivered rows older than
`notify_retention` are deleted, a few hundred at a time.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import Connection

from ..settings import Settings
from ..store import Store
from ..store import outbox as rows
from ..store.db import utcnow
from . import wake
from .outbox import encode
from .webhook import Webhook, check

log = logging.getLogger(__name__)

EVENTS_STREAM = "agent_jobs:events"
STREAM_BATCH = 100  # rows appended to the stream in one pipeline
STREAM_LEASE = 30.0  # seconds: a pipeline of XADDs ends well within (socket timeout 5 s)
WEBHOOK_BATCH = 8  # rows taken for the webhook at once, POSTed one after another
# Seconds a woken sender waits for the commits right behind the one that woke it: at
# many runs a second their notifications then go in one claim, one pipeline, one mark
# (each a transaction), instead of a round of each for every run.
COALESCE = 0.02
PRUNE_EVERY = 300.0  # seconds between deletions of old delivered rows
PRUNE_BATCH = 500  # rows one statement deletes
PRUNE_MAX_BATCHES = 10  # a round deletes at most this many batches


def backoff(attempts: int, *, base: float, cap: float, retry_after: float | None = None) -> float:
    """Seconds before the next try after `attempts` failed ones: doubling from `base`,
    capped at `cap`, with jitter (half fixed, half random: retries of many rows spread
    out, and none comes sooner than half its step). A receiver's `Retry-After` is
    honoured up to the cap."""
    ceiling = min(cap, base * 2.0 ** max(0, attempts - 1))
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


class Sender:
    """Delivers notifications from `store` to Redis (`redis_client`) and `webhook`."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        redis_client: redis.Redis | None = None,
        webhook: Webhook | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.redis = redis_client
        self.webhook = webhook
        self.polls = 0  # looks at the outbox (what idling costs)
        self.owns_redis = False  # its client was made for it: closed when it stops
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._next_prune = time.monotonic() + 10.0  # not in the way of a start
        self._due: datetime | None = None
        # Rows taken for the webhook with the commit that marked them streamed, and their
        # lease.
        self._for_webhook: tuple[list[Any], datetime] | None = None
        self._failing = 0  # cycles in a row that raised (the database unreachable)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Sender:
        self._thread = threading.Thread(target=self._run, name="notifications", daemon=True)
        self._thread.start()
        wake.subscribe(self.wake)
        # A process that ends (`agent-jobs run` once its run has) first delivers what
        # its last commits wrote, for at most a webhook timeout.
        atexit.register(self._at_exit)
        return self

    def _at_exit(self) -> None:
        self.stop(drain=self.settings.webhook_timeout)

    @property
    def alive(self) -> bool:
        """Running in this process (a forked child inherits the object, not the thread)."""
        thread = self._thread
        return self._pid == os.getpid() and thread is not None and thread.is_alive()

    def wake(self) -> None:
        """Look at the outbox now (a commit of this process wrote to it)."""
        self._wake.set()

    def stop(self, drain: float = 0.0) -> None:
        """Stop; with `drain`, first deliver what is due, for at most that many seconds
        (what cannot go now stays in the outbox for the next sender)."""
        if self._stop.is_set():
            return
        atexit.unregister(self._at_exit)
        wake.unsubscribe(self.wake)
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + drain
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self.alive:
            thread.join(timeout=max(drain, 2.0))  # what it was sending, sent
        try:
            while time.monotonic() < deadline and self.run_once():
                pass
        except Exception as exc:  # at exit, with the database gone: the rows wait
            log.warning("notifications not delivered before stopping: %s", exc)
        if self.webhook is not None:
            self.webhook.close()
        if self.owns_redis and self.redis is not None:
            self.redis.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.is_set()  # a commit here wrote rows: no need to look first
            if woken:
                self._stop.wait(COALESCE)
            self._wake.clear()
            try:
                worked = self.run_once(look=not woken)
                self._failing = 0
            except Exception as exc:  # the database or Redis down: keep trying
                self._failing += 1
                if self._failing == 1:
                    log.warning("delivering notifications failed (will retry): %s", exc)
                worked = False
            if worked:
                continue
            self._wake.wait(self._idle_wait())

    def _idle_wait(self) -> float:
        poll = self.settings.notify_poll_interval
        if self._failing:
            return min(30.0, poll * 2.0 ** min(self._failing, 5))
        if self._due is not None:
            left = (self._due - utcnow()).total_seconds()
            if left > 0:
                return min(poll, left)
        return poll

    # --- one look ----------------------------------------------------------------------

    def run_once(self, *, look: bool = True) -> bool:
        """Deliver what is due now; True when it sent (or tried to send) anything.
        `look`: ask first whether anything is due (the poll's one query); without it the
        rows are taken at once (this process has just written some)."""
        if look:
            self.polls += 1
            with self.store.connect() as conn:
                self._due = rows.next_due(conn)
        worked = False
        if not look or (self._due is not None and self._due <= utcnow()):
            if self.redis is not None:
                worked = self._stream() or worked
            if self.webhook is not None:
                worked = self._post() or worked
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_EVERY
            self.prune()
        return worked

    def _stream(self) -> bool:
        assert self.redis is not None
        now = utcnow()
        lease = now + timedelta(seconds=STREAM_LEASE)
        if self.webhook is None:
            return self._stream_only(now, lease)
        with self.store.begin() as conn:
            claimed = rows.claim(conn, "stream", now=now, lease_until=lease, limit=STREAM_BATCH)
        if not claimed:
            return False
        try:
            self._append(claimed)
        except redis.RedisError as exc:
            self._append_failed(claimed, lease, exc)
            return True
        with self.store.begin() as conn:
            now = utcnow()
            rows.streamed(
                conn, [row.id for row in claimed], now=now, delivered=self.webhook is None
            )
            if self.webhook is not None:  # what is now due there, taken in the same commit
                self._for_webhook = self._claim_for_webhook(conn, now)
        return True

    def _stream_only(self, now: datetime, lease: datetime) -> bool:
        """With no webhook: the rows taken, appended and marked delivered in one
        transaction (their locks held over the pipeline), which a failed append rolls
        back."""
        try:
            with self.store.begin() as conn:
                claimed = rows.claim(conn, "stream", now=now, lease_until=lease, limit=STREAM_BATCH)
                if claimed:
                    self._append(claimed)
                    ids = [row.id for row in claimed]
                    rows.streamed(conn, ids, now=utcnow(), delivered=True)
        except redis.RedisError as exc:
            self._append_failed(claimed, lease, exc)
        return bool(claimed)

    def _append(self, claimed: list[Any]) -> None:
        assert self.redis is not None
        pipe = self.redis.pipeline(transaction=False)
        for row in claimed:
            pipe.xadd(
                EVENTS_STREAM,
                {"event": encode(row.body)},
                maxlen=self.settings.events_maxlen,
                approximate=True,
            )
        pipe.execute()

    def _append_failed(self, claimed: list[Any], lease: datetime, exc: Exception) -> None:
        log.warning("could not append %d notifications to %s: %s", len(claimed), EVENTS_STREAM, exc)
        with self.store.begin() as conn:
            for row in claimed:
                retry_at = utcnow() + timedelta(seconds=self._backoff(row.attempts + 1))
                rows.failed(conn, [row.id], lease_until=lease, retry_at=retry_at, error=str(exc))

    def _claim_for_webhook(self, conn: Connection, now: datetime) -> tuple[list[Any], datetime]:
        way: rows.Way = "webhook" if self.redis is not None else "webhook_only"
        # Long enough for every POST of the batch to time out: nobody takes them meanwhile.
        lease = now + timedelta(seconds=(self.settings.webhook_timeout + 1) * WEBHOOK_BATCH + 5)
        return rows.claim(conn, way, now=now, lease_until=lease, limit=WEBHOOK_BATCH), lease

    def _post(self) -> bool:
        assert self.webhook is not None
        if self._for_webhook is not None:
            (claimed, lease), self._for_webhook = self._for_webhook, None
        else:
            with self.store.begin() as conn:
                claimed, lease = self._claim_for_webhook(conn, utcnow())
        for index, row in enumerate(claimed):
            attempt = self.webhook.post(row.event_id, encode(row.body))
            if attempt.delivered:
                with self.store.begin() as conn:
                    rows.delivered(conn, row.id, now=utcnow())
                continue
            # Its tries so far, less the one that put it on the stream: the webhook's
            # first retry waits the base delay.
            tried = row.attempts - (1 if self.redis is not None else 0)
            delay = self._backoff(tried + 1, attempt.retry_after)
            retry_at = utcnow() + timedelta(seconds=delay)
            level = logging.ERROR if attempt.loud else logging.WARNING
            log.log(
                level,
                "webhook %s refused notification %s (%s, run %s): %s; "
                "tried %d times, next in %.1fs%s",
                self.webhook.where,
                row.event_id,
                row.type,
                row.run_id,
                attempt.error,
                row.attempts + 1,
                delay,
                " — the receiver rejects what it is sent: check its URL and its code"
                if attempt.loud
                else "",
                extra={"run_id": row.run_id, "event_id": row.event_id},
            )
            with self.store.begin() as conn:
                rows.failed(
                    conn, [row.id], lease_until=lease, retry_at=retry_at, error=attempt.error or ""
                )
                if attempt.down:  # the others would fail the same way: they wait with it
                    later = [r.id for r in claimed[index + 1 :]]
                    rows.release(conn, later, lease_until=lease, retry_at=retry_at)
            if attempt.down:
                break
        return bool(claimed)

    def _backoff(self, attempts: int, retry_after: float | None = None) -> float:
        settings = self.settings
        return backoff(
            attempts,
            base=settings.webhook_retry_base_delay,
            cap=settings.webhook_retry_max_delay,
            retry_after=retry_after,
        )

    def prune(self) -> int:
        """Delete delivered rows older than the retention, in small batches."""
        cutoff = utcnow() - timedelta(seconds=self.settings.notify_retention)
        deleted = 0
        for _ in range(PRUNE_MAX_BATCHES):
            with self.store.begin() as conn:
                gone = rows.prune(conn, cutoff=cutoff, limit=PRUNE_BATCH)
            deleted += gone
            if gone < PRUNE_BATCH:
                break
        if deleted:
            log.info("deleted %d delivered notifications older than the retention", deleted)
        return deleted


# --- one sender a process and database ------------------------------------------------------

_lock = threading.Lock()
_running: dict[str, Sender] = {}


def start_sender(
    store: Store, settings: Settings, *, redis_client: redis.Redis | None = None
) -> Sender | None:
    """This process's sender for `store`'s database, started once (a second call returns
    the first's); None when there is nowhere to deliver (no Redis, no webhook). A webhook
    without a secret is a `ConfigurationError`."""
    check(settings)
    url = settings.effective_redis_url
    if redis_client is None and not url and not settings.webhook_url:
        return None
    key = store.engine.url.render_as_string(hide_password=True)
    with _lock:
        running = _running.get(key)
        if running is not None and running.alive:
            return running
        owned = redis_client is None and url is not None
        if redis_client is None and url:
            redis_client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        sender = Sender(
            store, settings, redis_client=redis_client, webhook=Webhook.from_settings(settings)
        )
        sender.owns_redis = owned
        _running[key] = sender.start()
    log.info(
        "notifications go to %s",
        " and ".join(
            ([f"Redis Stream {EVENTS_STREAM}"] if redis_client is not None else [])
            + ([f"the webhook at {sender.webhook.where}"] if sender.webhook is not None else [])
        ),
    )
    return sender


def stop_sender(store: Store, drain: float = 0.0) -> None:
    """Stop this process's sender for `store`'s database, if one runs."""
    key = store.engine.url.render_as_string(hide_password=True)
    with _lock:
        sender = _running.pop(key, None)
    if sender is not None:
        sender.stop(drain=drain)
