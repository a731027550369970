"""Notifications from the outbox: written with the state change, delivered at least once.

The outbox on both databases (Postgres and SQLite), the sender against a real Redis and
a real HTTP receiver (a small threaded `http.server` here): a receiver that is down and
then up gets every event, each signed, per run in order; retries are spaced; two
senders deliver each row once. The runners' notifications are in
`test_notifications_runs.py`.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from sqlalchemy import select, update

from agent_jobs import InlineRunner
from agent_jobs.errors import ConfigurationError
from agent_jobs.notify import outbox as notices
from agent_jobs.notify.sender import EVENTS_STREAM, Sender, backoff, start_sender
from agent_jobs.notify.webhook import Webhook, check
from agent_jobs.runs import RunRequest, create_run
from agent_jobs.settings import Settings
from agent_jobs.store import Store, toolcalls
from agent_jobs.store import outbox as rows
from agent_jobs.store import questions as question_rows
from agent_jobs.store import runs as run_rows
from agent_jobs.store.db import utcnow
from agent_jobs.store.schema import outbox
from tests.support import apps
from tests.support.redis_server import RedisServer, free_port
from tests.support.services import own_database, truncate_all
from tests.support.waiting import eventually
from tests.support.workers import ROOT, Process, service_env, start_worker, worker

SECRET = "webhook-secret-for-the-tests"

# --- a database and a Redis of this module's own -------------------------------------------
# Every process of the test session that sends (workers, the listener, servers) takes
# rows from the database it works on: these tests' rows must be theirs alone.


@pytest.fixture(scope="module")
def notify_pg() -> Iterator[str]:
    with own_database("agent_jobs_notify") as url:
        yield url


@pytest.fixture(scope="module")
def notify_redis() -> Iterator[RedisServer]:
    try:
        server = RedisServer().start()
    except Exception as exc:  # a missing service is a failure, never a skip
        pytest.fail(f"the tests need redis-server: {exc}")
    yield server
    server.close()


@pytest.fixture(params=["sqlite", "postgres"])
def nstore(request: pytest.FixtureRequest, tmp_path: Path, notify_pg: str) -> Iterator[Store]:
    """The outbox on each database."""
    url = f"sqlite:///{tmp_path / 'agent_jobs.db'}" if request.param == "sqlite" else notify_pg
    store = Store.from_url(url, auto_upgrade=True)
    truncate_all(store)
    yield store
    store.engine.dispose()


@pytest.fixture
def pg_store(notify_pg: str) -> Iterator[Store]:
    store = Store.from_url(notify_pg)
    truncate_all(store)
    yield store
    store.engine.dispose()


@pytest.fixture
def events(notify_redis: RedisServer) -> Iterator[redis.Redis]:
    """The Redis the senders append to, emptied."""
    client = redis.Redis.from_url(notify_redis.url(0))
    client.flushdb()
    yield client
    client.close()


# --- helpers ---------------------------------------------------------------------------------


def settings_for(store: Store, redis_url: str | None = None, **changes: Any) -> Settings:
    """Fast settings: short polls and backoffs, so a test sees several retries."""
    values: dict[str, Any] = {
        "database_url": store.engine.url.render_as_string(hide_password=False),
        "redis_url": redis_url,
        "notify_poll_interval": 0.05,
        "webhook_retry_base_delay": 0.2,
        "webhook_retry_max_delay": 1.0,
        "webhook_timeout": 2.0,
    }
    return Settings(**(values | changes))


def new_run(store: Store, agent: str = "support", actor: str = "user-7") -> str:
    run_id = uuid.uuid4().hex
    with store.begin() as conn:
        create_run(
            conn,
            RunRequest(agent=agent, input="go", actor=actor, metadata={"ticket": 7}),
            run_id=run_id,
            runner="inline",
            status="running",
        )
    return run_id


def outbox_rows(store: Store) -> list[dict[str, Any]]:
    with store.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(outbox).order_by(outbox.c.id))]


def bodies(store: Store, run_id: str | None = None) -> list[dict[str, Any]]:
    found = [r["body"] for r in outbox_rows(store)]
    return [b for b in found if run_id is None or b["run_id"] == run_id]


def streamed(client: redis.Redis, run_id: str | None = None) -> list[dict[str, Any]]:
    """The events on `agent_jobs:events`, in order."""
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(EVENTS_STREAM))
    found = [json.loads(fields[b"event"]) for _, fields in entries]
    return [e for e in found if run_id is None or e["run_id"] == run_id]


def undelivered(store: Store) -> int:
    with store.connect() as conn:
        return rows.counts(conn)["undelivered"]


def write_notifications(store: Store, runs: int, each: int) -> list[tuple[str, str]]:
    """`runs * each` notifications, each run's first, then each run's second, …:
    (event id, run id) in the order written."""
    run_ids = [uuid.uuid4().hex for _ in range(runs)]
    written: list[tuple[str, str]] = []
    with store.begin() as conn:
        for n in range(each):
            for run_id in run_ids:
                event_id = uuid.uuid4().hex
                body = {"type": "run.completed", "event_id": event_id, "run_id": run_id, "n": n}
                rows.add(
                    conn,
                    event_id=event_id,
                    type="run.completed",
                    run_id=run_id,
                    body=body,
                    at=utcnow(),
                )
                written.append((event_id, run_id))
    return written


def in_order_per_run(written: list[tuple[str, str]], seen: list[str]) -> bool:
    """Whether each run's events were seen in the order they were written (the first
    time each was seen: a duplicate after a crash may come later)."""
    first_seen = list(dict.fromkeys(seen))
    run_of = dict(written)
    for run_id in set(run_of.values()):
        expected = [e for e, r in written if r == run_id]
        if [e for e in first_seen if run_of.get(e) == run_id] != expected:
            return False
    return True


@dataclass(frozen=True)
class Got:
    """One request the receiver got."""

    at: float
    headers: dict[str, str]
    body: bytes
    status: int
    path: str = ""

    @property
    def event(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self.body)
        return event

    @property
    def signed(self) -> bool:
        expected = hmac.new(SECRET.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.headers["X-Agent-Jobs-Signature"])


class Receiver:
    """A webhook receiver on `port`: answers each POST with the next of `answers`, then
    200; records every request with its raw body."""

    def __init__(
        self,
        port: int | None = None,
        answers: tuple[int, ...] = (),
        path: str = "/hooks/secret-path",
    ) -> None:
        self.port = port or free_port()
        self.path = path
        self.answers = list(answers)
        self.got: list[Got] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    got = Got(time.monotonic(), dict(self.headers), body, status, self.path)
                    receiver.got.append(got)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def delivered(self) -> list[Got]:
        with self._lock:
            return [g for g in self.got if 200 <= g.status < 300]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver().start()
    yield made
    made.stop()


@contextmanager
def running(sender: Sender) -> Iterator[Sender]:
    sender.start()
    try:
        yield sender
    finally:
        sender.stop()
        if sender.redis is not None:
            sender.redis.close()


# --- written with the change ------------------------------------------------------------------


def test_the_notification_is_written_in_the_transaction_of_the_change(nstore: Store) -> None:
    run_id = new_run(nstore)
    with pytest.raises(RuntimeError), nstore.begin() as conn:
        assert run_rows.finish_run(conn, run_id, "completed", output="ok")
        raise RuntimeError("the transaction rolls back")
    assert outbox_rows(nstore) == []
    assert nstore.get_run(run_id).status == "running"

    with pytest.raises(RuntimeError), nstore.begin() as conn:
        run_rows.set_status(conn, run_id, "awaiting_answers", waiting_on="awaiting_answers t r")
        raise RuntimeError("the transaction rolls back")
    assert outbox_rows(nstore) == []

    with nstore.begin() as conn:
        assert run_rows.finish_run(conn, run_id, "completed", output="Order 42 <b>shipped</b>")
    with nstore.begin() as conn:  # a second writer finds it ended: no second notification
        assert not run_rows.finish_run(conn, run_id, "failed", error="late")
    [row] = outbox_rows(nstore)
    assert row["type"] == "run.completed" and row["run_id"] == run_id
    assert row["event_id"] == row["body"]["event_id"]
    assert row["delivered_at"] is None and row["streamed_at"] is None
    body = row["body"]
    assert body == {
        "type": "run.completed",
        "event_id": row["event_id"],
        "run_id": run_id,
        "at": body["at"],
        "status": "completed",
        "agent": "support",
        "actor": "user-7",
        "thread_id": run_id,
        "parent_run_id": None,
        "root_run_id": run_id,
        "metadata": {"ticket": 7},
        "output": "Order 42 <b>shipped</b>",
    }


def test_a_failure_says_its_error_without_a_known_secret(
    nstore: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_jobs.settings import get_settings

    monkeypatch.setenv("AGENT_JOBS_APPROVAL_SECRET", "approval-secret-1234")
    get_settings.cache_clear()
    notices._secrets.cache_clear()
    try:
        run_id = new_run(nstore)
        with nstore.begin() as conn:
            run_rows.finish_run(
                conn, run_id, "failed", error="bad key approval-secret-1234", error_type="X"
            )
    finally:
        get_settings.cache_clear()
        notices._secrets.cache_clear()
    [body] = bodies(nstore)
    assert body["type"] == "run.failed"
    assert body["error"] == "bad key ***" and body["error_type"] == "X"
    assert "output" not in body


def _calls(store: Store, run_id: str, *call_ids: str) -> None:
    with store.begin() as conn:
        for n, call_id in enumerate(call_ids):
            toolcalls.insert_call(
                conn,
                run_id=run_id,
                call_id=call_id,
                thread_id=run_id,
                name="refund",
                kind="action",
                args={"order_id": "42", "amount": n + 1},
                status="pending_approval",
            )


def _park(store: Store, run_id: str, status: str, waiting_on: str | None, *, later: bool) -> None:
    """Park as the inline runner does (`set_status`), or as a durable pass (`note_status`)."""
    with store.begin() as conn:
        if later:
            run_rows.note_status(conn, run_id, cast(Any, status), waiting_on=waiting_on)
        else:
            run_rows.set_status(conn, run_id, cast(Any, status), waiting_on=waiting_on)


@pytest.mark.parametrize("later", [False, True], ids=["set_status", "note_status"])
def test_each_new_wait_is_notified_once(nstore: Store, later: bool) -> None:
    run_id = new_run(nstore)
    _calls(nstore, run_id, "call_1", "call_2")
    first = "awaiting_approval refund call_1"
    _park(nstore, run_id, "awaiting_approval", first, later=later)
    # A replayed pass parks the run on the same wait again: nobody is told twice.
    _park(nstore, run_id, "awaiting_approval", first, later=later)
    _park(nstore, run_id, "awaiting_approval", first, later=not later)
    [approval] = bodies(nstore)
    assert approval == {
        "type": "run.awaiting_approval",
        "event_id": approval["event_id"],
        "run_id": run_id,
        "at": approval["at"],
        "status": "awaiting_approval",
        "agent": "support",
        "actor": "user-7",
        "thread_id": run_id,
        "parent_run_id": None,
        "root_run_id": run_id,
        "metadata": {"ticket": 7},
        "waiting_on": first,
        "call_id": "call_1",
        "tool": "refund",
        "args": {"order_id": "42", "amount": 1},
        "args_sha256": hashlib.sha256(b'{"amount":1,"order_id":"42"}').hexdigest(),
        "deadline": None,
    }
    # The next call to decide is a new wait, whether the run ran in between or not.
    _park(nstore, run_id, "awaiting_approval", "awaiting_approval refund call_2", later=later)
    assert bodies(nstore)[-1]["call_id"] == "call_2"
    _park(nstore, run_id, "running", None, later=later)
    assert len(bodies(nstore)) == 2

    # Two questions at once: one notification each; one answered while the run waits on
    # the other: nothing new to tell.
    with nstore.begin() as conn:
        for request_id in ("call_3:1", "call_4:1"):
            question_rows.ask(
                conn,
                run_id=run_id,
                request_id=request_id,
                call_id=request_id[:6],
                tool="schedule",
                asked=[{"id": "q1", "question": "Which day?"}],
            )
    both = "awaiting_answers schedule call_3:1 awaiting_answers schedule call_4:1"
    _park(nstore, run_id, "awaiting_answers", both, later=later)
    asked = bodies(nstore)[-2:]
    assert [b["type"] for b in asked] == ["run.awaiting_answers"] * 2
    assert [b["request_id"] for b in asked] == ["call_3:1", "call_4:1"]
    assert asked[0]["waiting_on"] == both
    assert {k: asked[0][k] for k in ("request_id", "call_id", "tool", "questions")} == {
        "request_id": "call_3:1",
        "call_id": "call_3",
        "tool": "schedule",
        "questions": [{"id": "q1", "question": "Which day?"}],
    }
    with nstore.begin() as conn:
        assert question_rows.answer(
            conn, run_id, "call_3:1", answers={"q1": "Friday"}, actor="alice"
        )
    _park(nstore, run_id, "awaiting_answers", "awaiting_answers schedule call_4:1", later=later)
    assert len(bodies(nstore)) == 4

    # An action's outcome unknown after a crash (the reconcile work calls the same write).
    _park(nstore, run_id, "awaiting_reconcile", "awaiting_reconcile refund call_2", later=later)
    unknown = bodies(nstore)[-1]
    assert unknown["type"] == "run.outcome_unknown" and unknown["status"] == "awaiting_reconcile"
    assert {k: unknown[k] for k in ("call_id", "tool", "args", "idempotency_key")} == {
        "call_id": "call_2",
        "tool": "refund",
        "args": {"order_id": "42", "amount": 2},
        "idempotency_key": f"{run_id}:tool:call_2",
    }
    with nstore.begin() as conn:
        run_rows.finish_run(conn, run_id, "cancelled", error="cancelled (user)", error_type="C")
    _park(nstore, run_id, "awaiting_approval", first, later=later)  # it ended: no more
    assert [b["type"] for b in bodies(nstore)] == [
        "run.awaiting_approval",
        "run.awaiting_approval",
        "run.awaiting_answers",
        "run.awaiting_answers",
        "run.outcome_unknown",
        "run.cancelled",
    ]
    assert len({b["event_id"] for b in bodies(nstore)}) == 6


def test_a_caller_adds_fields_of_its_own(nstore: Store) -> None:
    run_id = new_run(nstore)
    given = [{"call_id": "call_9", "tool": "refund", "args": {}, "idempotency_key": "k"}]
    with nstore.begin() as conn:
        run_rows.set_status(
            conn,
            run_id,
            cast(Any, "awaiting_reconcile"),
            waiting_on="awaiting_reconcile refund call_9",
            notice={"calls": given},
        )
    [body] = bodies(nstore)
    assert body["type"] == "run.outcome_unknown" and body["calls"] == given
    with nstore.begin() as conn:  # the same wait again: nothing
        run_rows.note_status(
            conn,
            run_id,
            cast(Any, "awaiting_reconcile"),
            waiting_on="awaiting_reconcile refund call_9",
            notice={"calls": given},
        )
    assert len(bodies(nstore)) == 1


def test_the_body_is_json_that_no_receiver_takes_for_markup() -> None:
    body = {"output": "<img src=x onerror=alert(1)> & </script>\u2028é", "type": "run.completed"}
    encoded = notices.encode(body)
    assert json.loads(encoded) == body
    for raw in (b"<", b">", b"&", "\u2028".encode()):
        assert raw not in encoded
    assert "é".encode() in encoded  # UTF-8, not escaped
    assert notices.encode(dict(reversed(body.items()))) == encoded  # the same bytes always


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    for attempts, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (8, 10.0), (30, 10.0)):
        delays = [backoff(attempts, base=1.0, cap=10.0) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 10  # jitter
    assert backoff(1, base=1.0, cap=10.0, retry_after=7.0) == 7.0  # the receiver asked
    assert backoff(1, base=1.0, cap=10.0, retry_after=3600.0) == 10.0  # capped


# --- delivery -------------------------------------------------------------------------------


def test_a_commit_of_this_process_wakes_its_sender_at_once(
    nstore: Store, events: redis.Redis, notify_redis: RedisServer
) -> None:
    settings = settings_for(nstore, notify_redis.url(0), notify_poll_interval=30.0)
    sender = Sender(nstore, settings, redis_client=redis.Redis.from_url(notify_redis.url(0)))
    with running(sender):
        eventually(lambda: sender.polls >= 1, what="the sender's first look")
        looked = time.monotonic()  # its next look is a 30 s poll from here
        run_id = new_run(nstore)
        with nstore.begin() as conn:
            run_rows.finish_run(conn, run_id, "completed", output="ok")
        [event] = eventually(partial(streamed, events, run_id), what="the event on the stream")
        # Not the poll, which comes 30 s after the first look: the commit woke it.
        assert time.monotonic() - looked < settings.notify_poll_interval
        assert event == bodies(nstore, run_id)[0]
        eventually(lambda: undelivered(nstore) == 0, what="the delivery marked")
        [row] = outbox_rows(nstore)
        assert row["streamed_at"] is not None and row["delivered_at"] is not None


def test_two_senders_deliver_each_row_once(
    notify_pg: str, events: redis.Redis, notify_redis: RedisServer, receiver: Receiver
) -> None:
    first, second = Store.from_url(notify_pg), Store.from_url(notify_pg)
    truncate_all(first)
    written = write_notifications(first, runs=60, each=5)
    settings = settings_for(
        first, notify_redis.url(0), webhook_url=receiver.url, webhook_secret=SECRET
    )
    senders = [
        Sender(
            store,
            settings,
            redis_client=redis.Redis.from_url(notify_redis.url(0)),
            webhook=Webhook.from_settings(settings),
        )
        for store in (first, second)
    ]
    try:
        for sender in senders:
            sender.start()
        eventually(lambda: undelivered(first) == 0, what="every row delivered")
    finally:
        for sender in senders:
            sender.stop()
            if sender.redis is not None:
                sender.redis.close()
        for store in (first, second):
            store.engine.dispose()
    ids = [event_id for event_id, _ in written]
    on_stream = [e["event_id"] for e in streamed(events)]
    assert sorted(on_stream) == sorted(ids)  # each once
    posted = [g.event["event_id"] for g in receiver.delivered()]
    assert sorted(posted) == sorted(ids) and len(receiver.got) == len(ids)
    assert all(g.signed for g in receiver.got)
    assert in_order_per_run(written, on_stream) and in_order_per_run(written, posted)
    assert senders[0].polls > 0 and senders[1].polls > 0


def test_a_receiver_that_is_down_then_up_gets_every_event_signed(
    pg_store: Store, events: redis.Redis, notify_redis: RedisServer
) -> None:
    port = free_port()
    down = Receiver(port)  # nothing listens on the port yet
    written = write_notifications(pg_store, runs=5, each=4)
    settings = settings_for(
        pg_store, notify_redis.url(0), webhook_url=down.url, webhook_secret=SECRET
    )
    sender = Sender(
        pg_store,
        settings,
        redis_client=redis.Redis.from_url(notify_redis.url(0)),
        webhook=Webhook.from_settings(settings),
    )
    up = Receiver(port)
    with running(sender):
        # The stream does not wait for the webhook: every event is on it at once.
        eventually(lambda: len(streamed(events)) == len(written), what="every event streamed")
        # The receiver stays down until a row has been tried four times. What each try
        # scheduled next (attempts, next_attempt_at), seen as it goes:
        heads = {event_id for event_id, _ in written[:5]}
        seen: dict[str, dict[int, Any]] = {event_id: {} for event_id in heads}

        def tried_four_times() -> bool:
            for r in outbox_rows(pg_store):
                if r["event_id"] in heads:
                    seen[r["event_id"]].setdefault(r["attempts"], r["next_attempt_at"])
            return max(max(tries, default=0) for tries in seen.values()) >= 4

        eventually(tried_four_times, what="a row tried four times", context=lambda: seen)
        tried = {r["event_id"]: r["attempts"] for r in outbox_rows(pg_store)}
        assert undelivered(pg_store) == len(written)
        # Retries are spaced: base 0.2 s, doubling, capped at 1 s, at least half of each
        # step (not once a poll, 0.05 s): by the sender's own schedule, each webhook try
        # is due no sooner than half a step after the one before was. The first attempt
        # is the stream's: after attempt k, the webhook has failed k - 1 times.
        pairs = 0
        for tries in seen.values():
            posts = sorted(n for n in tries if n >= 2)
            for a, b in itertools.pairwise(posts):
                least = sum(min(1.0, 0.2 * 2.0 ** (k - 2)) / 2 for k in range(a + 1, b + 1))
                spaced = (tries[b] - tries[a]).total_seconds()
                assert spaced >= least, (a, b, spaced, least, tries)
                pairs += 1
        assert pairs >= 1, seen  # retries were seen, and their spacing judged
        # The later rows of a run wait for its first (their one attempt is the stream's).
        assert all(n == 1 for event_id, n in tried.items() if event_id not in heads)
        assert all(
            "ConnectError" in (r["last_error"] or "")
            for r in outbox_rows(pg_store)
            if r["attempts"] > 1
        )
        up.start()
        try:
            eventually(lambda: undelivered(pg_store) == 0, what="every event delivered")
        finally:
            up.stop()
    ids = [event_id for event_id, _ in written]
    got = up.delivered()
    assert {g.event["event_id"] for g in got} == set(ids)  # none lost
    assert all(g.signed for g in got)
    assert all(g.headers["X-Agent-Jobs-Event-Id"] == g.event["event_id"] for g in got)
    assert all(g.headers["Content-Type"] == "application/json" for g in got)
    for g in got:  # a duplicate is the same event, byte for byte
        assert [o.body for o in got if o.event["event_id"] == g.event["event_id"]] == [
            g.body
        ] * len([o for o in got if o.event["event_id"] == g.event["event_id"]])
    assert in_order_per_run(written, [g.event["event_id"] for g in got])
    assert sorted(e["event_id"] for e in streamed(events)) == sorted(ids)  # streamed once


def test_a_receiver_answering_500_then_200_is_retried_with_backoff(
    pg_store: Store, notify_redis: RedisServer
) -> None:
    failing = Receiver(answers=(500, 503, 500)).start()
    [(event_id, _)] = write_notifications(pg_store, runs=1, each=1)
    settings = settings_for(pg_store, None, webhook_url=failing.url, webhook_secret=SECRET)
    sender = Sender(pg_store, settings, webhook=Webhook.from_settings(settings))
    # What each failed try scheduled, and when the test first saw it (time.time(): the
    # sender's clock too): attempts -> (next_attempt_at, seen).
    scheduled: dict[int, tuple[float, float]] = {}

    def delivered() -> bool:
        [row] = outbox_rows(pg_store)
        if row["delivered_at"] is None and row["attempts"]:
            scheduled.setdefault(row["attempts"], (row["next_attempt_at"].timestamp(), time.time()))
        return row["delivered_at"] is not None

    try:
        with running(sender):
            eventually(delivered, what="the delivery", context=lambda: scheduled)
    finally:
        failing.stop()
    assert [g.status for g in failing.got] == [500, 503, 500, 200]
    assert {g.event["event_id"] for g in failing.got} == {event_id}
    assert len({g.body for g in failing.got}) == 1 and all(g.signed for g in failing.got)
    gaps = [b.at - a.at for a, b in zip(failing.got, failing.got[1:], strict=False)]
    # Base 0.2 s, doubling, half of each step fixed: at least 0.1, 0.2, 0.4 s.
    for gap, least in zip(gaps, (0.1, 0.2, 0.4), strict=True):
        assert least * 0.9 <= gap, gaps
    # And no more than a whole step, by the sender's own schedule: each failed try set
    # its next no later than one step (0.2, 0.4, 0.8 s) after it was written, so no later
    # than that after the test saw it (however late a loaded machine let it look).
    assert scheduled, "no failed try seen"
    for attempts, (due, seen) in scheduled.items():
        assert due - seen <= min(1.0, 0.2 * 2.0 ** (attempts - 1)) + 0.001, scheduled
    [row] = outbox_rows(pg_store)
    assert row["attempts"] == 4 and row["last_error"] is None and row["streamed_at"] is None


def test_a_refusal_is_logged_loudly_and_still_retried(
    pg_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = Receiver(answers=(400,)).start()
    write_notifications(pg_store, runs=1, each=1)
    settings = settings_for(pg_store, None, webhook_url=refusing.url, webhook_secret=SECRET)
    sender = Sender(pg_store, settings, webhook=Webhook.from_settings(settings))
    caplog.set_level(logging.WARNING, logger="agent_jobs.notify.sender")
    try:
        with running(sender):
            eventually(lambda: undelivered(pg_store) == 0, what="delivery after the refusal")
    finally:
        refusing.stop()
    assert [g.status for g in refusing.got] == [400, 200]
    [record] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert record.levelno == logging.ERROR and "HTTP 400" in record.getMessage()
    assert "check its URL" in record.getMessage()
    assert "secret-path" not in caplog.text  # the URL's path may be a secret: never logged


def test_a_webhook_without_a_secret_is_refused_at_start(pg_store: Store, tmp_path: Path) -> None:
    url = "https://hooks.example.com/notify"
    no_secret = settings_for(pg_store, None, webhook_url=url)
    for attempt in (
        lambda: check(no_secret),
        lambda: start_sender(pg_store, no_secret),
        lambda: InlineRunner(apps.app, pg_store, settings=no_secret),
    ):
        with pytest.raises(ConfigurationError, match="AGENT_JOBS_WEBHOOK_SECRET is not"):
            attempt()
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        check(settings_for(pg_store, None, webhook_url="ftp://x/y", webhook_secret=SECRET))
    env = {
        **service_env("redis://127.0.0.1:1/0", f"sqlite:///{tmp_path / 'cli.db'}"),
        "AGENT_JOBS_WEBHOOK_URL": url,
    }
    del env["AGENT_JOBS_BROKER_URL"]
    ran = subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "run", "hello", "--yes"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.strip().splitlines() == [ran.stderr.strip()]  # one line
    assert ran.stderr.startswith(
        "error: AGENT_JOBS_WEBHOOK_URL is set but AGENT_JOBS_WEBHOOK_SECRET"
    )


@pytest.mark.pools_named
def test_a_worker_with_a_webhook_but_no_secret_stops_at_start(notify_pg: str) -> None:
    env = service_env("redis://127.0.0.1:1/0", notify_pg)
    env["AGENT_JOBS_WEBHOOK_URL"] = "https://hooks.example.com/notify"
    proc = worker(env, name="nosecret").start()
    assert proc.proc is not None
    assert proc.proc.wait(timeout=60) == 2
    assert "error: AGENT_JOBS_WEBHOOK_URL is set but AGENT_JOBS_WEBHOOK_SECRET is not" in proc.log()


def test_delivered_rows_past_the_retention_are_deleted_in_batches(
    nstore: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = write_notifications(nstore, runs=4, each=3)  # 12 rows
    old = utcnow() - timedelta(days=8)
    ids = [r["id"] for r in outbox_rows(nstore)]
    with nstore.begin() as conn:  # 7 delivered long ago, 3 yesterday, 2 never
        conn.execute(update(outbox).where(outbox.c.id.in_(ids[:7])).values(delivered_at=old))
        recent = utcnow() - timedelta(days=1)
        conn.execute(update(outbox).where(outbox.c.id.in_(ids[7:10])).values(delivered_at=recent))
    monkeypatch.setattr("agent_jobs.notify.sender.PRUNE_BATCH", 3)
    sender = Sender(nstore, settings_for(nstore, None))
    assert sender.prune() == 7
    assert [r["id"] for r in outbox_rows(nstore)] == ids[7:]
    assert sender.prune() == 0
    assert len(written) == 12


def test_the_readme_receiver_verifies_what_the_sender_signs(pg_store: Store) -> None:
    readme = (ROOT / "docs" / "operating.md").read_text()
    start = readme.index("A receiver, with the standard library alone")
    block = readme[readme.index("```python\n", start) + len("```python\n") :]
    code = block[: block.index("```")]
    port = free_port()
    assert 'HTTPServer(("0.0.0.0", 8080)' in code
    code = code.replace('HTTPServer(("0.0.0.0", 8080)', f'HTTPServer(("127.0.0.1", {port})')
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code],
        env={"AGENT_JOBS_WEBHOOK_SECRET": SECRET, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        eventually(lambda: _listening(port), what="the README's receiver to listen")
        run_id = new_run(pg_store)
        with pg_store.begin() as conn:
            run_rows.finish_run(conn, run_id, "completed", output="Order 42 <b>shipped</b>")
        settings = settings_for(pg_store, None, webhook_url=url, webhook_secret=SECRET)
        sender = Sender(pg_store, settings, webhook=Webhook.from_settings(settings))
        with running(sender):
            eventually(lambda: undelivered(pg_store) == 0, what="delivery to the README's receiver")
        forged = Webhook(url, "not-the-secret", timeout=5)
        refused = forged.post("e1", notices.encode({"type": "run.completed"}))
        forged.close()
        assert not refused.delivered and refused.error == "HTTP 401" and refused.loud
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert out.splitlines() == [f"run {run_id} completed: Order 42 <b>shipped</b>"]


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- the webhook's URL in the logs -------------------------------------------------------


@pytest.mark.parametrize("sender", ["worker", "listener", "serve"])
def test_no_process_that_sends_logs_the_webhooks_path_or_query(
    sender: str, notify_redis: RedisServer
) -> None:
    """A receiver's secret is often in its URL's path or query (Slack-, Teams- and
    Discord-style): httpx logged the whole URL at INFO on every delivery."""
    canary = f"canary{uuid.uuid4().hex[:12]}"
    hook = Receiver(path=f"/hooks/{canary}-path?token={canary}-query").start()
    try:
        with own_database("agent_jobs_notify_log") as url:
            store = Store.from_url(url)
            try:
                [(event_id, _)] = write_notifications(store, 1, 1)
            finally:
                store.engine.dispose()
            env = service_env(
                notify_redis.url(15),
                url,
                AGENT_JOBS_WEBHOOK_URL=hook.url,
                AGENT_JOBS_WEBHOOK_SECRET=SECRET,
                AGENT_JOBS_NOTIFY_POLL_INTERVAL="0.2",
                AGENT_JOBS_LOG_LEVEL="DEBUG",
            )
            proc = started(sender, env)
            try:
                eventually(
                    lambda: event_id in {g.event["event_id"] for g in hook.delivered()},
                    what=f"the {sender} to deliver the notification",
                    context=proc.log,
                )
                assert hook.delivered()[0].path == hook.path  # it went to the secret URL

                # httpx logs the request once its response is read: after the receiver
                # has it.
                def logged() -> str | None:
                    text = proc.log()
                    return text if "HTTP Request: POST http://127.0.0.1" in text else None

                logs = eventually(logged, what=f"the {sender} to log its request", context=proc.log)
                assert canary not in logs  # …with neither its path nor its query
            finally:
                proc.stop()
    finally:
        hook.stop()


def started(sender: str, env: dict[str, str]) -> Process:
    """A process of the kind `sender`, as its users start it, at log level DEBUG."""
    from tests.support.serve import ApiServer, api_env

    if sender == "worker":
        return start_worker(env, concurrency=1, name="notify-log-worker")
    if sender == "listener":
        args = [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen"]
        signed = {**env, "AGENT_JOBS_APPROVAL_SECRET": "listener-secret-for-the-test"}
        return Process(args, signed, "notify-log-listener").start(ready="listening on channel")
    server = ApiServer(api_env({**env, "AGENT_JOBS_BROKER_URL": ""}), "notify-log-serve")
    server.start()
    return server.proc
