"""What the server holds for its requests: its door to the runs, its tokens, its settings."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from ..settings import Settings
from .errors import ServiceUnavailableError

if TYPE_CHECKING:
    from .auth import TokenTable
    from .door import Door


@dataclass
class StreamSlots:
    """Counts the event streams open at once; past `limit` a new one is refused, and so is
    one past an actor's share (`per_actor`), so that no one token takes them all.

    Each run stream holds a thread and (durable) a Redis connection while it waits, so
    their number is bounded, as a worker bounds its tasks.
    """

    limit: int
    per_actor: int | None = None  # None: half the limit
    open: int = 0
    by_actor: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def share(self) -> int:
        return self.per_actor if self.per_actor is not None else max(1, self.limit // 2)

    def take(self, actor: str = "") -> str | None:
        """Take a slot for `actor`; else why not."""
        with self._lock:
            if self.open >= self.limit:
                return (
                    f"{self.limit} event streams are open, the most this server keeps "
                    "(AGENT_JOBS_API_MAX_STREAMS); try again shortly"
                )
            if self.by_actor.get(actor, 0) >= self.share:
                return (
                    f"actor {actor!r} has {self.share} event streams open, its share of "
                    "this server's (AGENT_JOBS_API_MAX_STREAMS_PER_ACTOR); close one first"
                )
            self.open += 1
            self.by_actor[actor] = self.by_actor.get(actor, 0) + 1
            return None

    def give_back(self, actor: str = "") -> None:
        with self._lock:
            self.open -= 1
            left = self.by_actor.get(actor, 0) - 1
            if left > 0:
                self.by_actor[actor] = left
            else:
                self.by_actor.pop(actor, None)

    def claim(self, actor: str) -> Release:
        """A slot for a new event stream of `actor`, or `ServiceUnavailableError` (503)."""
        refused = self.take(actor)
        if refused is not None:
            raise ServiceUnavailableError(refused)
        return Release(self, actor)


class Release:
    """Gives an event stream's slot back, once: from the end of its events and from the
    response's end (its events may never have started, the client gone before)."""

    def __init__(self, slots: StreamSlots, actor: str = "") -> None:
        self.slots = slots
        self.actor = actor
        self.done = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
        self.slots.give_back(self.actor)

    async def at_the_end(self) -> None:
        """For the response's background task: a coroutine, so no thread is taken."""
        self()


@dataclass
class ServerState:
    door: Door
    tokens: TokenTable
    settings: Settings
    slots: StreamSlots


STATE_KEY = "agent_jobs"


def server(request: Request) -> ServerState:
    state: ServerState = getattr(request.app.state, STATE_KEY)
    return state
