"""Connections to MCP servers, pooled per process and reused across runs.

One event loop per process, in a daemon thread of its own, holds every connection; a
worker thread (a step) borrows a connection, hands a coroutine to that loop and waits
for it in short slices, so that a step's soft time limit (raised into the thread) is
delivered while it waits. A connection is borrowed by one call at a time and goes back
to the pool after it; one that failed or timed out is closed (a stdio server's process
ends with it), and the next call opens a new one. A stdio server is started once per
process and connection, never once per call.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ToolError

if TYPE_CHECKING:
    from mcp import Client

    from .servers import McpServer

log = logging.getLogger(__name__)

T = TypeVar("T")

# Connections kept idle per server (the rest are closed when they come back).
MAX_IDLE = 4
# How long one wait on the loop lasts before the waiting thread looks up again.
SLICE = 0.2


class McpUnavailableError(ToolError):
    """The MCP server could not be reached, or failed the connection."""


class McpTimeoutError(ToolError):
    """The MCP server did not answer within the call's time limit."""


class _Failed(Exception):
    """The coroutine handed to the loop raised `cause` (not the waiting thread: a soft
    time limit raised into it goes through as it is)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(eq=False)
class _Connection:
    """One open session with a server, held by a task of the pool's loop."""

    server: str
    client: Client | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    holder: concurrent.futures.Future[None] | None = None
    opened_at: float = field(default_factory=time.monotonic)
    calls: int = 0
    # The call it is lent to: what a mid-call elicitation (an older server's) is
    # answered from, and where it says what it asked.
    current: Any = None


class McpPool:
    """The process's connections to MCP servers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._idle: dict[str, list[_Connection]] = {}
        self._pid = os.getpid()
        self.opened = 0  # connections opened by this process (the tests count them)

    # --- the loop ------------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's loop is not here
                self._loop, self._thread, self._idle, self.opened = None, None, {}, 0
                self._pid = os.getpid()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="agent-jobs-mcp", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _wait(
        self,
        future: concurrent.futures.Future[T],
        timeout: float,
        what: str,
        limit: float | None = None,
    ) -> T:
        """The coroutine's result, waited for in slices; on timeout it is cancelled.
        `limit`: the time limit a timeout names (the whole call's), if not `timeout`."""
        deadline = time.monotonic() + timeout
        shown = timeout if limit is None else limit
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise McpTimeoutError(f"{what} did not answer within {shown:g} s")
                try:
                    return future.result(timeout=min(SLICE, left))
                except concurrent.futures.TimeoutError:
                    continue
                except Exception as exc:
                    if future.done() and not future.cancelled() and future.exception() is exc:
                        raise _Failed(exc) from exc
                    raise
        except BaseException:
            future.cancel()  # a timeout, or a soft time limit raised into this thread
            raise

    def _submit(self, coroutine: Awaitable[T]) -> concurrent.futures.Future[T]:
        async def run() -> T:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(run(), self._running_loop())

    # --- connections ---------------------------------------------------------------------

    def _open(self, server: McpServer, timeout: float) -> _Connection:
        loop = self._running_loop()
        conn = _Connection(server.name)
        ready: concurrent.futures.Future[_Connection] = concurrent.futures.Future()

        async def hold() -> None:
            conn.closed = asyncio.Event()
            try:
                async with server.client(partial(_elicited, conn)) as client:
                    conn.client = client
                    ready.set_result(conn)
                    await conn.closed.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                elif not isinstance(exc, asyncio.CancelledError | GeneratorExit):
                    log.info("MCP server %s: connection ended: %s", server.name, exc)
            finally:
                conn.client = None

        conn.holder = asyncio.run_coroutine_threadsafe(hold(), loop)
        try:
            opened = self._wait(ready, timeout, f"MCP server {server.name!r}")
        except _Failed as failed:
            raise McpUnavailableError(
                f"MCP server {server.name!r} is unavailable: {_described(failed.cause)}"
            ) from None
        except BaseException:
            conn.holder.cancel()
            raise
        self.opened += 1
        return opened

    def _close(self, conn: _Connection) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(conn.closed.set)

    def _borrow(self, server: McpServer, timeout: float) -> _Connection:
        with self._lock:
            idle = self._idle.get(server.name, [])
            while idle:
                conn = idle.pop()
                if conn.client is not None:
                    return conn
        return self._open(server, timeout)

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(conn.server, [])
            if conn.client is not None and len(idle) < MAX_IDLE:
                idle.append(conn)
                return
        self._close(conn)

    def use(
        self,
        server: McpServer,
        work: Callable[[Client], Awaitable[T]],
        *,
        what: str,
        timeout: float,
        current: Any = None,
    ) -> T:
        """`work(client)` on a borrowed connection, within `timeout` seconds (connecting
        included). A failure of the server is a `ToolError` the model sees."""
        started = time.monotonic()
        conn = self._borrow(server, timeout)
        client = conn.client
        if client is None:  # ended between the borrow and now
            raise McpUnavailableError(f"MCP server {server.name!r} closed the connection")
        left = max(0.05, timeout - (time.monotonic() - started))
        conn.current = current
        ok = False
        try:
            waited = self._submit(work(client))
            result = self._wait(waited, left, f"MCP server {server.name!r}", limit=timeout)
            ok = True
            return result
        except _Failed as failed:
            if isinstance(failed.cause, ToolError):  # the work's own verdict (a tool error)
                raise failed.cause from None
            raise McpUnavailableError(
                f"MCP server {server.name!r} failed {what}: {_described(failed.cause)}"
            ) from None
        finally:
            conn.calls += 1
            conn.current = None
            if ok and not getattr(current, "cancelled", False):
                self._give_back(conn)
            else:  # it may be wedged mid-request: never lend it again
                self._close(conn)

    def close(self) -> None:
        """Close every idle connection (a stdio server's process ends with it)."""
        with self._lock:
            idle = [conn for conns in self._idle.values() for conn in conns]
            self._idle = {}
        for conn in idle:
            self._close(conn)
        for conn in idle:
            if conn.holder is not None:
                with contextlib.suppress(Exception):
                    conn.holder.result(timeout=2)


async def _elicited(conn: _Connection, context: Any, params: Any) -> Any:
    """A server's elicitation in the middle of a call (protocol versions before
    multi-round-trip requests): the call's `current.elicited` answers it or ends it."""
    current = conn.current
    if current is None:
        from mcp.types import ElicitResult

        return ElicitResult(action="cancel")
    return await current.elicited(params)


def _described(exc: BaseException) -> str:
    """An exception, or the first leaf of an exception group, as one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text


POOL = McpPool()
atexit.register(POOL.close)
