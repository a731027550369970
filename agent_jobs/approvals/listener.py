"""The approvals listener: decisions from the Redis channel and stream, verified and recorded.

Two doors, one handler. Pub/sub (`PUBLISH <channel>`) is at-most-once by Redis's
design: a message sent while no listener is subscribed is gone, and the call stays
pending (`agent-jobs approvals pending`) until someone decides again. The Redis Stream
of the same name (`XADD <channel> * message <json>`) is at-least-once: it is read
through a consumer group, an entry is acknowledged (and deleted) only once its decision
is recorded or it is definitively refused, entries a dead listener left pending are
reclaimed with XAUTOCLAIM, and an entry delivered more than a bounded number of times
is moved to `<channel>:dead`. An entry over the size limit is moved there by Redis
itself, unread (see `approvals_stream`), and the stream is polled rather than blocked on.
A subscription Redis drops (a message over its pub/sub output-buffer limit, a restart)
is restored at once: what is published until then is lost, which is why the stream is
the door for decisions that must not be. Every outcome is logged with its reason and
counted (in memory and in the Redis hash `<channel>:counters`), and so is each lost
subscription, as `pubsub_disconnects`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import redis
from pydantic import Field
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import checkpoints as names
from .. import startup
from ..client import Client
from ..errors import (
    ConfigurationError,
    DecisionRefusedError,
    InvalidRequestError,
    UnknownCallError,
    UnknownRunError,
)
from ..logs import log_context
from ..observability import metrics
from ..settings import Settings, SettingsBase, get_settings
from .messages import DEFAULT_MAX_BYTES, AnswersMessage, Refused, parse_message
from .stream import ApprovalsStream, Entry

log = logging.getLogger(__name__)


class ListenerSettings(SettingsBase):
    """The listener's knobs, `AGENT_JOBS_LISTENER_*`."""

    listener_group: str = "agent_jobs"
    listener_consumer: str | None = None  # default: host name and process id
    listener_max_deliveries: int = Field(default=5, ge=1)
    listener_claim_idle: float = Field(default=30.0, gt=0)
    listener_max_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1024)
    listener_health_file: str | None = None
    listener_stats_interval: float = Field(default=60.0, gt=0)
    listener_poll_interval: float = Field(default=0.05, gt=0, le=1.0)


BEAT_INTERVAL = 1.0
# What one read or reclaim may bring at most: entries over `listener_max_bytes` stay in
# Redis, so a batch of N entries costs at most N times that.
BATCH_BYTES = 1 << 20
READ_COUNT = 16
RECLAIM_COUNT = 50


@dataclass(frozen=True)
class Outcome:
    """What became of one message: `reason` is `recorded` or why nothing changed."""

    reason: str
    detail: str
    run_id: str | None = None
    call_id: str | None = None
    request_id: str | None = None

    @property
    def recorded(self) -> bool:
        return self.reason == "recorded"


class Counters:
    """Outcomes by reason, in this process and in a Redis hash operators can read."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1
        metrics.approval_message(reason)
        try:
            self.client.hincrby(self.key, reason, 1)
        except redis.RedisError as exc:
            log.warning("could not count %s in %s: %s", reason, self.key, exc)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class ApprovalsListener:
    """Subscribes to the channel and consumes the stream until `stop()`."""

    def __init__(
        self,
        client: Client,
        redis_client: redis.Redis,
        *,
        channel: str,
        secret: str | None,
        settings: ListenerSettings | None = None,
        subscriber: redis.Redis | None = None,
    ) -> None:
        """`subscriber` is the client the subscription uses; best without retries of
        its own, so that a lost subscription is seen (and counted) here."""
        self.client = client
        self.redis = redis_client
        self.subscriber = subscriber or redis_client
        self.channel = channel
        self.secret = secret
        self.settings = settings or ListenerSettings()
        consumer = self.settings.listener_consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.stream = ApprovalsStream(
            redis_client,
            channel,
            group=self.settings.listener_group,
            consumer=consumer,
            max_bytes=self.settings.listener_max_bytes,
        )
        self.counters = Counters(redis_client, f"{channel}:counters")
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        self._decide_lock = threading.Lock()
        self._next_beat = 0.0

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        *,
        allow_unsigned: bool = False,
        listener_settings: ListenerSettings | None = None,
    ) -> ApprovalsListener:
        settings = settings or get_settings()
        url = settings.effective_redis_url
        if not url:
            raise ConfigurationError(
                "the approvals listener needs Redis: set AGENT_JOBS_REDIS_URL "
                "or AGENT_JOBS_BROKER_URL"
            )
        startup.check(settings)  # the listener sends notifications too
        secret = settings.approval_secret.get_secret_value() if settings.approval_secret else None
        if not secret and not allow_unsigned:
            raise ConfigurationError(
                "AGENT_JOBS_APPROVAL_SECRET is not set, so anyone who can reach Redis could "
                "approve actions: set it, or pass --allow-unsigned where Redis is trusted"
            )
        return cls(
            Client.from_settings(settings),
            redis.Redis.from_url(url, health_check_interval=30),
            channel=settings.approvals_channel,
            secret=secret or None,
            settings=listener_settings,
            # redis-py's own retries would reconnect (and sleep) inside get_message,
            # unseen: the pub/sub loop does that itself, at once, and counts it.
            subscriber=redis.Redis.from_url(
                url, health_check_interval=30, retry=Retry(NoBackoff(), 0)
            ),
        )

    # --- one message -------------------------------------------------------------------

    def handle(self, raw: bytes | str, *, source: str, entry_id: str | None = None) -> Outcome:
        """Verify and record one message. Raises only on a transient failure (the
        database or the broker unreachable), when the message may be tried again."""
        try:
            message = parse_message(
                raw, secret=self.secret, max_bytes=self.settings.listener_max_bytes
            )
        except Refused as exc:
            return self._settled(Outcome(exc.reason, exc.detail), source, entry_id)
        if isinstance(message, AnswersMessage):
            return self._settled(self._answer(message), source, entry_id)
        ids = {"run_id": message.run_id, "call_id": message.call_id}
        try:
            with self._decide_lock, log_context(**ids):
                recorded = self.client.decide(
                    message.run_id,
                    message.call_id,
                    message.decision,
                    actor=message.actor,
                    reason=message.reason,
                    args_sha256=message.args_sha256,
                )
        except UnknownRunError as exc:
            outcome = Outcome("unknown_run", str(exc), **ids)
        except UnknownCallError as exc:
            outcome = Outcome("unknown_call", str(exc), **ids)
        except DecisionRefusedError as exc:
            outcome = Outcome("refused", str(exc), **ids)
        else:
            if recorded:
                detail = f"{message.decision} by {message.actor}; the run is woken"
                outcome = Outcome("recorded", detail, **ids)
            else:
                outcome = Outcome("already_decided", "another decision came first", **ids)
        return self._settled(outcome, source, entry_id)

    def _answer(self, message: AnswersMessage) -> Outcome:
        """Record answers to a tool's questions (the first answers win), then wake the run."""
        run_id, request_id = message.run_id, message.request_id
        try:
            with self._decide_lock, log_context(run_id=run_id, request_id=request_id):
                recorded = self.client.answer(
                    run_id, request_id, message.answers, actor=message.actor
                )
        except UnknownRunError as exc:
            return Outcome("unknown_run", str(exc), run_id, request_id=request_id)
        except (DecisionRefusedError, InvalidRequestError) as exc:
            return Outcome("refused", str(exc), run_id, request_id=request_id)
        if recorded:
            detail = f"answers by {message.actor}; the run is woken"
            return Outcome("recorded", detail, run_id, request_id=request_id)
        return Outcome("already_decided", "other answers came first", run_id, request_id=request_id)

    def _settled(self, outcome: Outcome, source: str, entry_id: str | None) -> Outcome:
        self.counters.add(outcome.reason)
        level = logging.INFO if outcome.recorded else logging.WARNING
        where = f"{source} {entry_id}" if entry_id else source
        about = f" run {outcome.run_id}" if outcome.run_id else ""
        about += f" call {outcome.call_id}" if outcome.call_id else ""
        about += f" question {outcome.request_id}" if outcome.request_id else ""
        log.log(
            level,
            "%s: %s%s (%s)",
            where,
            outcome.reason,
            about,
            outcome.detail,
            extra={
                "outcome": outcome.reason,
                "source": source,
                "entry_id": entry_id,
                "run_id": outcome.run_id,
                "call_id": outcome.call_id,
                "request_id": outcome.request_id,
                "step": _step(outcome),
            },
        )
        return outcome

    # --- serving -----------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def serve(self) -> None:
        """Listen until `stop()`; bad input and lost connections never end this."""
        # Runs' notifications, delivered from here too (agent_jobs/notify); metrics, when
        # AGENT_JOBS_METRICS_PORT is set (a missing extra or a port in use is a
        # ConfigurationError, before anything is served).
        startup.start(self.client.store, self.client.settings, serve_metrics=True)
        try:
            self.stream.ensure_group()
        except redis.RedisError as exc:
            log.warning("cannot create the consumer group yet (%s); will retry", exc)
        subscriber = threading.Thread(target=self._pubsub_loop, name="approvals-pubsub")
        subscriber.start()
        try:
            if not self.subscribed.wait(10):
                log.warning("not subscribed to %s yet; still trying", self.channel)
            log.info(
                "listening on channel %s and stream %s (group %s, consumer %s)",
                self.channel,
                self.channel,
                self.stream.group,
                self.stream.consumer,
            )
            self._stream_loop(subscriber)
        finally:
            self._stop.set()
            subscriber.join(timeout=5)
            self.log_counters("stopped")

    def log_counters(self, when: str) -> None:
        counts = self.counters.snapshot()
        shown = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing yet"
        log.info("counters (%s): %s", when, shown, extra={"counters": counts})

    def _stream_loop(self, subscriber: threading.Thread) -> None:
        settings = self.settings
        fit = max(1, BATCH_BYTES // settings.listener_max_bytes)
        read_count, reclaim_count = min(READ_COUNT, fit), min(RECLAIM_COUNT, fit)
        next_claim = 0.0
        next_stats = time.monotonic() + settings.listener_stats_interval
        backoff = 0.5
        group_ready = False  # cheap to confirm; it may have failed before
        while not self._stop.is_set():
            self._beat(subscriber)
            now = time.monotonic()
            try:
                if not group_ready:
                    self.stream.ensure_group()
                    group_ready = True
                if now >= next_claim:
                    for entry in self.stream.reclaim(settings.listener_claim_idle, reclaim_count):
                        self._reclaimed(entry)
                    next_claim = now + settings.listener_claim_idle / 2
                if now >= next_stats:
                    self.log_counters("so far")
                    next_stats = now + settings.listener_stats_interval
                entries = self.stream.read(read_count)
                for entry in entries:
                    self._consume(entry)
                backoff = 0.5
                if not entries:
                    # An idle poll is one EVALSHA that finds nothing: cheap, and it bounds
                    # how long a new entry waits.
                    self._stop.wait(settings.listener_poll_interval)
            except redis.RedisError as exc:
                group_ready = False
                if isinstance(exc, redis.ResponseError) and "NOGROUP" in str(exc):
                    log.warning("the stream or its group vanished (Redis flushed?); recreating")
                    continue
                # Whatever was being settled stays pending and is reclaimed later.
                log.warning("Redis failed (%s); retrying in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _reclaimed(self, entry: Entry) -> None:
        if entry.oversized:
            self._too_large(entry)
            return
        if entry.deliveries <= self.settings.listener_max_deliveries:
            log.info("stream %s: reclaimed (delivery %d)", entry.id, entry.deliveries)
            self._consume(entry)
            return
        self.stream.move_aside(entry, "delivered too often without being settled")
        self.counters.add("dead_lettered")
        log.warning(
            "stream %s: delivered %d times without being settled; moved to %s",
            entry.id,
            entry.deliveries,
            self.stream.dead_letter,
            extra={"outcome": "dead_lettered", "source": "stream", "entry_id": entry.id},
        )

    def _too_large(self, entry: Entry) -> None:
        limit = self.settings.listener_max_bytes
        detail = (
            f"{entry.size} bytes, more than the limit of {limit}; "
            f"moved unread to {self.stream.dead_letter}"
        )
        self._settled(Outcome("too_large", detail), "stream", entry.id)

    def _consume(self, entry: Entry) -> None:
        if entry.oversized:  # already acknowledged, by the script that moved it
            self._too_large(entry)
            return
        try:
            if entry.message is None:
                self._settled(
                    Outcome("invalid_message", "a stream entry needs a `message` field"),
                    "stream",
                    entry.id,
                )
            else:
                self.handle(entry.message, source="stream", entry_id=entry.id)
        except Exception:
            # Not acknowledged: it stays pending, is reclaimed after the idle time, and
            # is moved aside once it has been delivered too often.
            self.counters.add("error")
            log.exception("stream %s: could not settle it; it will be tried again", entry.id)
            self._stop.wait(0.5)
            return
        self.stream.ack(entry.id)

    def _pubsub_loop(self) -> None:
        """Keep the channel subscribed. A lost subscription is restored at once, since
        whatever is published meanwhile is gone; only failing attempts back off."""
        pubsub = self.subscriber.pubsub()
        asked = False  # once SUBSCRIBE went out, redis-py repeats it on every reconnect
        lost = False
        backoff = 0.0
        try:
            while not self._stop.is_set():
                try:
                    if not asked:
                        pubsub.subscribe(self.channel)
                        asked = True
                    message = pubsub.get_message(timeout=1.0)
                except redis.RedisError as exc:
                    if self.subscribed.is_set():
                        self.subscribed.clear()
                        lost = True
                        log.warning("pub/sub connection lost (%s); resubscribing now", exc)
                        continue
                    backoff = min(max(backoff * 2, 0.5), 10.0)
                    log.warning(
                        "cannot subscribe to %s (%s); retrying in %.1fs",
                        self.channel,
                        exc,
                        backoff,
                    )
                    self._stop.wait(backoff)
                    continue
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    # A confirmation while already subscribed: a client with retries of
                    # its own reconnected inside get_message without telling us.
                    if lost or self.subscribed.is_set():
                        self._resubscribed()
                    self.subscribed.set()
                    lost = False
                    backoff = 0.0
                elif message["type"] == "message":
                    self._deliver(message["data"])
        finally:
            pubsub.close()

    def _resubscribed(self) -> None:
        # Counted now rather than when it was lost: a restarted Redis would not have
        # kept the count, and Redis may be unreachable at the moment of the loss.
        self.counters.add("pubsub_disconnects")
        log.warning(
            "resubscribed to %s; what was published while the subscription was down is "
            "lost (post it again, or use the stream)",
            self.channel,
            extra={"outcome": "pubsub_disconnects", "source": "pubsub"},
        )

    def _deliver(self, raw: bytes) -> None:
        try:
            self.handle(raw, source="pubsub")
        except Exception:
            # At-most-once: the decision is dropped; the call stays pending and visible.
            self.counters.add("error")
            log.exception("pubsub: could not record a decision; it can be posted again")

    def _beat(self, subscriber: threading.Thread) -> None:
        path = self.settings.listener_health_file
        if not path or not subscriber.is_alive() or not self.subscribed.is_set():
            return
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + BEAT_INTERVAL
            try:
                Path(path).touch()
            except OSError as exc:
                log.warning("could not touch the health file %s: %s", path, exc)


def _step(outcome: Outcome) -> str | None:
    """The journal step a decision or answers complete."""
    if outcome.call_id:
        return names.approval(outcome.call_id)
    if outcome.request_id:
        return names.answers(outcome.request_id)
    return None
