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

And kombu fetches with BRPOP, which Redis answers by removing the message: a reply lost
with its connection (a host cut off from the network, a NAT entry gone) loses the
message, which is in no queue and not among kombu's unacknowledged ones (those are noted
by the client once it has read the reply). A `start_run` a plain Celery client sent was
lost so. Here a fetch is a script that pops the message and notes it as fetched, in one
step; the consumer, once it has read the reply, says it received it; a message fetched
and not received within `fetch_restore_after` seconds (10) is put back at the head of
its queue by the next fetch of any consumer, and a receipt that comes later than that
drops its copy, so the message is delivered once. A consumer with nothing to fetch waits
on its deployment's queue with a BLMOVE of that list onto itself, which takes nothing
(`fetch_wait`, 0.5 s, at most): a message on another queue it reads is seen that late
when the worker is idle. With kombu's `global_keyprefix` set, kombu's own BRPOP is kept.
The scripts go by their SHA-1 (`EVALSHA`), not their text (4 kB a fetch), loaded once a
channel; a server that does not know them (restarted, its scripts flushed) answers
NOSCRIPT, which runs nothing: the script is loaded again and the fetch sent again.
"""

from __future__ import annotations

import hashlib
from queue import Empty
from time import monotonic
from typing import Any
from urllib.parse import urlsplit

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from .leases import tcp_keepalive

TRANSPORT = "agent_jobs.transport:Transport"


# Fetched messages not yet received: when each was fetched (Redis's clock, ms), the
# message as it was in its list, and the list it came from.
FETCHED = "agent_jobs:fetched"
FETCHED_MESSAGES = "agent_jobs:fetched:messages"
FETCHED_FROM = "agent_jobs:fetched:from"
FETCH_SEQ = "agent_jobs:fetched:seq"

# Put back what was fetched more than ARGV[1] ms ago and never received, then pop one
# message from the first of KEYS[5..] that has one and note it fetched: {key, message, id}.
_FETCH = """
local now = redis.call('time')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lost = redis.call('zrangebyscore', KEYS[1], '-inf', now - tonumber(ARGV[1]),
                        'LIMIT', 0, 20)
for _, id in ipairs(lost) do
  local message = redis.call('hget', KEYS[2], id)
  local source = redis.call('hget', KEYS[3], id)
  if message and source then
    redis.call('rpush', source, message)
  end
  redis.call('zrem', KEYS[1], id)
  redis.call('hdel', KEYS[2], id)
  redis.call('hdel', KEYS[3], id)
end
for i = 5, #KEYS do
  local message = redis.call('rpop', KEYS[i])
  if message then
    local id = tostring(redis.call('incr', KEYS[4]))
    redis.call('zadd', KEYS[1], now, id)
    redis.call('hset', KEYS[2], id, message)
    redis.call('hset', KEYS[3], id, KEYS[i])
    return {KEYS[i], message, id}
  end
end
return false
"""
# The consumer has the message fetched as ARGV[1]: 1, or 0 if it was put back already.
_RECEIVED = """
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('hdel', KEYS[2], ARGV[1])
redis.call('hdel', KEYS[3], ARGV[1])
return 1
"""
_FETCH_SHA = hashlib.sha1(_FETCH.encode()).hexdigest()  # Redis names a script so
_RECEIVED_SHA = hashlib.sha1(_RECEIVED.encode()).hexdigest()


class Channel(kombu_redis.Channel):
    _sync_client: redis.Redis | None = None

    from_transport_options = (
        *kombu_redis.Channel.from_transport_options,
        "fetch_wait_queue",
        "fetch_wait",
        "fetch_restore_after",
    )
    # The queue an idle consumer waits on (the deployment's; by default the first read).
    fetch_wait_queue: str | None = None
    fetch_wait = 0.5
    fetch_restore_after = 10.0
    _waiting = False  # the command in flight waits for a message, it fetches none
    _wait_next = False  # the last fetch found nothing: wait before the next
    _fetch_loaded = False  # the fetch's script was loaded on the server by this channel

    def _brpop_start(self, timeout: float | None = None) -> None:
        if self.global_keyprefix:
            super()._brpop_start(timeout)  # type: ignore[misc]
            return
        queues = self._queue_cycle.consume(len(self.active_queues))  # type: ignore[attr-defined]
        if not queues:
            return
        connection = self.client.connection
        self._in_poll = connection
        self._brpop_sent_at = monotonic()
        self._waiting = self._wait_next
        if self._waiting:
            key = self.fetch_wait_queue if self.fetch_wait_queue in queues else queues[0]
            wait = min(timeout or self.brpop_timeout, self.fetch_wait)
            connection.send_command("BLMOVE", key, key, "RIGHT", "RIGHT", wait)
            return
        keys = [
            self._q_for_pri(queue, pri)  # type: ignore[attr-defined]
            for pri in self.priority_steps
            for queue in queues
        ]
        fixed = [FETCHED, FETCHED_MESSAGES, FETCHED_FROM, FETCH_SEQ]
        if not self._fetch_loaded:
            self._create_client().script_load(_FETCH)
            self._fetch_loaded = True
        restore_ms = int(self.fetch_restore_after * 1000)
        connection.send_command(
            "EVALSHA", _FETCH_SHA, len(fixed) + len(keys), *fixed, *keys, restore_ms
        )

    def _brpop_read(self, **options: Any) -> bool:
        if self.global_keyprefix:
            return bool(super()._brpop_read(**options))  # type: ignore[misc]
        client = self.client
        try:
            command = "BLMOVE" if self._waiting else "EVALSHA"
            try:
                reply = client.parse_response(client.connection, command, **options)
            except self.connection_errors:  # type: ignore[attr-defined]
                client.connection.disconnect()  # the next fetch connects again
                raise
            except redis.exceptions.NoScriptError:  # it ran nothing: load it, fetch again
                self._fetch_loaded = self._wait_next = False
                raise Empty() from None
            self._wait_next = not self._waiting and not reply
            if self._waiting or not reply:
                raise Empty()
            key, item, fetched = reply
            if not self._received(fetched):
                raise Empty()  # put back meanwhile: another delivery has it
            queue = bytes_to_str(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)  # type: ignore[attr-defined]
            self.connection._deliver(loads(bytes_to_str(item)), queue)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()  # type: ignore[attr-defined]

    def _received(self, fetched: bytes) -> bool:
        """Say the fetched message arrived; False if it was put back already. When that
        cannot be said (the connection dropped), the message is delivered here: it may
        be delivered once more, which a duplicate delivery survives, where a message
        dropped would be lost."""
        try:
            client = self._create_client()
            fixed = [FETCHED, FETCHED_MESSAGES, FETCHED_FROM]
            try:
                return bool(client.evalsha(_RECEIVED_SHA, len(fixed), *fixed, fetched))
            except redis.exceptions.NoScriptError:  # it ran nothing: send its text
                return bool(client.eval(_RECEIVED, len(fixed), *fixed, fetched))
        except self.connection_errors:  # type: ignore[attr-defined]
            return True

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client(asynchronous=False)  # type: ignore[misc]
        return client

    def close(self) -> None:
        if self._in_poll:
            try:
                self._brpop_read()
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


# A broker connection that went half-open (a cut, a NAT table's entry gone) is dropped
# within about this many seconds: kombu drops a BRPOP whose reply is overdue by its own
# timeout plus `health_check_interval` (checked that often), redis-py pings a connection
# idle that long before using it, and TCP keepalives and an unacknowledged-data limit
# find a silent peer; a publish or an acknowledgement waits at most `socket_timeout`.
HALF_OPEN_WITHIN = 3.0


def transport_options(**extra: Any) -> dict[str, Any]:
    """kombu's Redis transport options for every connection to the broker, a worker's
    and a sending client's: a half-open connection noticed in seconds (kombu's defaults
    take 51 s, and a publish on one waits forever), then `extra`."""
    return {
        "health_check_interval": 1,
        "socket_timeout": 5,
        "socket_connect_timeout": 2,
        "socket_keepalive": True,
        "socket_keepalive_options": tcp_keepalive(HALF_OPEN_WITHIN),
        **extra,
    }


def transport_for(broker_url: str | None) -> str | None:
    """The guarded transport for a `redis://` broker; None leaves kombu's choice.

    `rediss://` keeps kombu's own transport: naming a transport in place of the URL's
    scheme would drop the TLS defaults kombu derives from that scheme.
    """
    if not broker_url:
        return None
    return TRANSPORT if urlsplit(broker_url).scheme == "redis" else None
