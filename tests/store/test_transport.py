"""The guarded kombu Redis transport: one redis-py client per channel, not one a command."""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Callable
from queue import Empty
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from agent_jobs import transport
from agent_jobs.transport import (
    _FETCH,
    FETCH_SEQ,
    FETCHED,
    FETCHED_FROM,
    FETCHED_MESSAGES,
    TRANSPORT,
    Channel,
    transport_for,
)
from tests.support.redis_server import RedisServer
from tests.support.waiting import TIMEOUT, eventually


def _count_clients(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built = [0]
    original = redis.Redis.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        built[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def test_a_channel_publishes_and_acks_with_one_client(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = Queue("transport-probe", Exchange("transport-probe"), "transport-probe")
    with Connection(redis_url, transport=TRANSPORT) as conn:
        channel = conn.channel()
        assert isinstance(channel, Channel)
        producer = conn.Producer(channel, serializer="json")
        producer.publish(
            {"n": 0}, exchange=queue.exchange, routing_key="transport-probe", declare=[queue]
        )
        built = _count_clients(monkeypatch)
        for n in range(1, 51):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key="transport-probe")
        got: list[int] = []
        with conn.Consumer(queue, channel=channel, accept=["json"]) as consumer:
            consumer.register_callback(lambda body, message: (got.append(body["n"]), message.ack()))
            while len(got) < 51:
                conn.drain_events(timeout=TIMEOUT)
        assert sorted(got) == list(range(51))
        # Fifty publishes and fifty-one acks: kombu alone builds a client for each.
        assert built[0] <= 2, f"{built[0]} redis clients built for 101 commands"
        channel.close()


def test_a_replaced_pool_gets_a_client_of_its_own(redis_url: str) -> None:
    with Connection(redis_url, transport=TRANSPORT) as conn:
        channel = conn.channel()
        first = channel._create_client()
        assert channel._create_client() is first
        channel._pool = None  # what kombu does when the connection is reset
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()
        channel.close()


def test_redis_urls_get_the_guarded_transport_and_others_keep_kombus() -> None:
    assert transport_for("redis://127.0.0.1:6379/0") == TRANSPORT
    assert transport_for("rediss://127.0.0.1:6380/0") is None
    assert transport_for(None) is None


def _publish(conn: Connection, queue: Queue, n: int) -> None:
    producer = conn.Producer(serializer="json")
    producer.publish({"n": n}, exchange=queue.exchange, routing_key=queue.name, declare=[queue])


def _drain(conn: Connection, queue: Queue, until: Callable[[list[int]], bool]) -> list[int]:
    got: list[int] = []

    def drained() -> bool:
        with contextlib.suppress(TimeoutError, socket.timeout):
            conn.drain_events(timeout=0.2)
        return until(got)

    with conn.Consumer(queue, accept=["json"]) as consumer:
        consumer.register_callback(lambda body, message: (got.append(body["n"]), message.ack()))
        if not until(got):
            eventually(drained, what=f"messages of {queue.name} (got {got})")
    return got


def _fetch_unread(channel: Any) -> None:
    """Send the channel's fetch as its poller would, and read nothing."""
    channel.client.connection = channel.client.connection_pool.get_connection()
    channel._brpop_start()


def test_a_message_fetched_into_a_connection_that_died_is_delivered_once_again(
    redis_url: str,
) -> None:
    """Redis removes what it answers a fetch with, whether or not the reply arrives: a
    `start_run` fetched by a worker whose connection was cut at that moment was lost
    (kombu's BRPOP). Fetched and not received within `fetch_restore_after`, it is put
    back, and delivered once."""
    name = f"fetch-probe-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), name)
    options = {"fetch_restore_after": 0.5}
    client = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT, transport_options=options) as sender:
        _publish(sender, queue, 1)
    with Connection(redis_url, transport=TRANSPORT, transport_options=options) as cut:
        channel = cut.channel()
        cut.Consumer(queue, channel=channel, accept=["json"]).consume()
        _fetch_unread(channel)
        eventually(lambda: client.llen(name) == 0, what="Redis to answer the fetch")
        channel.client.connection.disconnect()  # cut: the reply is lost with it
        channel._in_poll = None
    assert client.llen(name) == 0  # in no queue now: only the fetch knows of it
    with Connection(redis_url, transport=TRANSPORT, transport_options=options) as other:
        got = _drain(other, queue, until=lambda got: bool(got))
        assert got == [1]
        # Once: nothing else comes, though every fetch looks for lost ones to put back.
        _publish(other, queue, 2)
        got = _drain(other, queue, until=lambda got: 2 in got)
        assert got == [2] and client.llen(name) == 0


def test_a_receipt_that_comes_after_the_message_was_put_back_drops_its_copy(
    redis_url: str,
) -> None:
    name = f"fetch-probe-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), name)
    options = {"fetch_restore_after": 0.2}
    client = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT, transport_options=options) as slow:
        _publish(slow, queue, 1)
        channel = slow.channel()
        got: list[int] = []
        consumer = slow.Consumer(queue, channel=channel, accept=["json"])
        consumer.register_callback(lambda body, message: (got.append(body["n"]), message.ack()))
        consumer.consume()
        _fetch_unread(channel)
        eventually(lambda: client.llen(name) == 0, what="Redis to answer the fetch")

        def put_back() -> bool:  # what any consumer's next fetch does first
            fixed = [FETCHED, FETCHED_MESSAGES, FETCHED_FROM, FETCH_SEQ]
            client.eval(_FETCH, len(fixed), *fixed, 200)
            return client.llen(name) == 1

        eventually(put_back, what="the message to be put back")
        with contextlib.suppress(Empty):
            channel._brpop_read()  # the reply, read late
        assert got == [] and client.llen(name) == 1  # dropped: the queue has it
        channel.close()


@pytest.mark.services  # a redis-server of its own
def test_a_server_that_does_not_know_the_scripts_is_taught_them_and_loses_nothing() -> None:
    """The fetch and the receipt go by their scripts' SHA-1; a Redis that never saw them
    (new, restarted, its scripts flushed) answers NOSCRIPT, which runs nothing: the
    script is loaded and every message still arrives once."""
    server = RedisServer().start()
    try:
        url = server.url(0)
        client = redis.Redis.from_url(url)
        name = f"noscript-probe-{uuid.uuid4().hex[:8]}"
        queue = Queue(name, Exchange(name), name)
        with Connection(url, transport=TRANSPORT) as conn:
            for n in range(3):
                _publish(conn, queue, n)
            assert client.script_exists(transport._FETCH_SHA) == [False]
            got = _drain(conn, queue, until=lambda got: len(got) == 3)
            assert sorted(got) == [0, 1, 2]
            assert client.script_exists(transport._FETCH_SHA, transport._RECEIVED_SHA) == [
                True,
                True,
            ]
            client.script_flush()  # this test's own server
            _publish(conn, queue, 3)
            got = _drain(conn, queue, until=lambda got: got == [3])
            assert got == [3] and client.llen(name) == 0
            assert client.zcard(transport.FETCHED) == 0  # each received, none left behind
        client.close()
    finally:
        server.close()
