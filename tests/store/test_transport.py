"""The guarded kombu Redis transport: one redis-py client per channel, not one a command."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from agent_jobs.transport import TRANSPORT, Channel, transport_for
from tests.support.waiting import TIMEOUT


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
