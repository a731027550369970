"""What `agent-jobs serve` lets a connection hold, below the app (docs/security.md, "What
to put in front of serve").

- A request's headers have a deadline (`AGENT_JOBS_API_HEADER_TIMEOUT`): a connection
  that has not finished them by then, from its start or from the end of its last answer,
  is closed. A client that never finishes its headers (slowloris) holds a socket for
  seconds, not for good.
- Connections are capped (`AGENT_JOBS_API_MAX_CONNECTIONS`, and never more than the
  process's open-files limit leaves room for): one past the cap is answered 503 JSON and
  closed at once, so the server keeps answering those it holds, `/healthz` included once
  a slot is free, instead of failing in `accept()`.
- An error the event loop reports over and over (`accept()` out of file descriptors) is
  logged once a while with how many there were, not once each.

Uvicorn's own HTTP protocol does the rest; this is a subclass of it (whichever it picks:
httptools or h11), relying on what both have: `cycle` (the request in progress),
`on_response_complete`, `connections`, `loop` and `transport`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from typing import Any

log = logging.getLogger(__name__)

# File descriptors the process keeps for itself beyond its connections: the database
# pool, Redis, logs, the listening socket, the interpreter's own.
RESERVED_FILES = 64
# Seconds a connection past the cap is kept, its answer sent, for the client to read it.
REFUSED_LINGER = 1.0
_BUSY = json.dumps(
    {
        "error": "the server holds as many connections as it may; try again shortly",
        "type": "ServiceUnavailableError",
    }
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
    + str(len(_BUSY)).encode()
    + b"\r\n\r\n"
    + _BUSY
)


def connection_cap(wanted: int) -> int:
    """`wanted`, or fewer if the open-files limit (raised to its hard limit first) would
    run out before: a connection past it would fail in `accept()`, unanswered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_FILES))


def protocol(header_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """Uvicorn's HTTP protocol with a deadline for each request's headers and a cap on
    the connections held at once."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Bounded(_HeaderDeadline, AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        _header_timeout = header_timeout
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._refused = True
                self._timer = _refuse(transport, self.loop)
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request's headers are due from now

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return Bounded


def _refuse(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> asyncio.TimerHandle:
    """Answer a connection past the cap at once; what the client sends meanwhile is read
    and dropped, and the connection closed a moment later (closed at once with unread
    bytes, it would be reset before the client read the answer). Returns the timer that
    closes it."""
    transport.write(BUSY_RESPONSE)
    if transport.can_write_eof():
        transport.write_eof()
    return loop.call_later(REFUSED_LINGER, transport.close)


class _HeaderDeadline:
    """A connection's timer, for the protocol `protocol` makes: the deadline of the next
    request's headers (or, for a refused connection, the moment it is closed)."""

    _header_timeout: float
    _timer: asyncio.TimerHandle | None = None
    _awaited: Any = None
    # Uvicorn's protocol's.
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def _arm(self) -> None:
        self._disarm()
        self._awaited = self.cycle
        self._timer = self.loop.call_later(self._header_timeout, self._late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        """The deadline passed: close, unless a request's headers came meanwhile (its
        answer, once complete, sets the next deadline)."""
        self._timer = None
        cycle = self.cycle
        if cycle is self._awaited and (cycle is None or cycle.response_complete):
            self.transport.close()


class QuietRepeats:
    """An event loop exception handler: an error is reported as the loop would (with its
    traceback), but the same message again within `every` seconds only counted, and the
    count said with the next one reported."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        now = time.monotonic()
        last = self._last.get(message)
        if last is not None and now - last < self.every:
            self._skipped[message] = self._skipped.get(message, 0) + 1
            return
        skipped = self._skipped.pop(message, 0)
        self._last[message] = now
        if skipped:
            log.error("%s: %d more times since it was last reported", message, skipped)
        loop.default_exception_handler(context)
