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
    """Counts the event streams open at once; past `limit` a new one is refused.

    Each run stream holds a thread and (durable) a Redis connection while it waits, so
    their number is bounded, as a worker bounds its tasks.
    """

    limit: int
    open: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        with self._lock:
            if self.open >= self.limit:
                return False
            self.open += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.open -= 1

    def claim(self) -> Release:
        """A slot for a new event stream, or `ServiceUnavailableError` (503)."""
        if not self.take():
            raise ServiceUnavailableError(
                f"{self.limit} event streams are open, the most this server keeps "
                "(AGENT_JOBS_API_MAX_STREAMS); try again shortly"
            )
        return Release(self)


class Release:
    """Gives an event stream's slot back, once: from the end of its events and from the
    response's end (its events may never have started, the client gone before)."""

    def __init__(self, slots: StreamSlots) -> None:
        self.slots = slots
        self.done = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
        self.slots.give_back()

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
