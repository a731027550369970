"""kombu's Redis transport, guarded against a worker crash when Redis goes away.

kombu 5.7.0 (the newest release): when the broker connection drops while a worker holds
an unacknowledged message and its consumer waits for the next one (a BRPOP in flight),
Celery closes the channel twice. The first close reads the pending BRPOP reply, fails
on the dead socket and stops half-way; Celery then drops the transport's client; the
second close tries to hand the unacknowledged message back, builds a Redis client from
the transport's client (now None) and raises `AttributeError: 'NoneType' object has no
attribute 'hostname'`, which is not a connection error, so the worker dies
("Unrecoverable error").

Here the first close finishes despite the dead socket, and a channel whose connection is
gone refuses to build a client with a connection error, which kombu and Celery treat as
what it is. Nothing is lost either way: Postgres is the truth and the sweep re-sends.

kombu also builds a new redis-py client for every publish, ack and queue command (its
`conn_or_acquire` calls `_create_client` each time; a client is cheap to use but not to
build: redis-py sets up its response callbacks per instance). A channel here keeps one
client over its pool, and builds it again only when the pool is replaced.
"""

from __future__ import annotations

from queue import Empty
from typing import Any
from urllib.parse import urlsplit

import redis
from kombu.transport import redis as kombu_redis

TRANSPORT = "agent_jobs.transport:Transport"


class Channel(kombu_redis.Channel):
    _sync_client: redis.Redis | None = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client(asynchronous=False)  # type: ignore[misc]
        return client

    def close(self) -> None:
        if self._in_poll:  # type: ignore[attr-defined]
            try:
                self._brpop_read()  # type: ignore[attr-defined]
            except Empty:
                pass
            except self.connection_errors:  # type: ignore[attr-defined]
                pass  # the socket is gone: there is no reply to read, close the rest
        super().close()

    def _connparams(self, asynchronous: bool = False) -> Any:
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous)  # type: ignore[misc]


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str | None) -> str | None:
    """The guarded transport for a `redis://` broker; None leaves kombu's choice.

    `rediss://` keeps kombu's own transport: naming a transport in place of the URL's
    scheme would drop the TLS defaults kombu derives from that scheme.
    """
    if not broker_url:
        return None
    return TRANSPORT if urlsplit(broker_url).scheme == "redis" else None
