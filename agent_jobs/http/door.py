"""What the server serves: a deployment's commands, its store and app, and where the
frames of its runs are read.

The HTTP API speaks to runs only through `agent_jobs.commands`, the same commands every
other door calls; which runner they wake is the deployment's business
(`agent_jobs/serving.py` builds the door: with a broker the workers' runner, frames from
Redis Streams; without one the inline runner of this process, frames from its memory).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from ..app import AgentApp
from ..client import Client
from ..commands import Commands
from ..settings import Settings
from ..store import Store
from ..streams.base import StreamBackend
from ..streams.redis_streams import RedisStreams

# The server's Redis connections are named, so an operator (and a test) can find them
# in `CLIENT LIST`.
REDIS_CLIENT_NAME = "agent-jobs-serve"
# What an entry id of each runner's streams looks like: Redis Streams' `ms-seq`, and the
# memory streams' positions (1, 2, …).
DURABLE_ENTRY_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")
INLINE_ENTRY_ID = re.compile(r"^\d{1,12}$")


@dataclass
class Door:
    """The runs as the server reaches them."""

    runner: str  # the runner this server starts runs on: "durable" or "inline"
    commands: Commands
    streams: StreamBackend  # where the frames of this runner's runs are read
    entry_id: re.Pattern[str]  # what an entry id of those streams looks like
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return self.commands.store

    @property
    def app(self) -> AgentApp:
        return self.commands.app

    def close(self) -> None:
        for close in self.closers:
            close()
        self.store.engine.dispose()


def durable_door(settings: Settings, client: Client, max_streams: int) -> Door:
    """The door of `client` (runs on the Celery workers), reading frames from the
    configured Redis with a pool large enough for `max_streams` readers waiting at once."""
    url = settings.effective_redis_url
    assert url is not None, "a durable door needs a broker"
    connection = redis.Redis.from_url(
        url, max_connections=max_streams + 32, client_name=REDIS_CLIENT_NAME
    )
    streams = RedisStreams(connection, maxlen=settings.stream_maxlen, ttl=settings.stream_ttl)
    closers: list[Callable[[], None]] = [connection.close]
    if client.dispatcher is not None:
        closers.append(client.dispatcher.celery.close)
    return Door("durable", client.commands, streams, DURABLE_ENTRY_ID, closers)
