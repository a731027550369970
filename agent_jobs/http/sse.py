"""Server-sent events: their wire format, and a blocking reader's items handed to the loop.

A run's frames are read by the same blocking follower `agent-jobs tail` uses
(`agent_jobs.streams.follow`), in a thread of the stream's own: the event loop never
blocks on Redis or the database, and the follower's checks stay in one place. The
thread hands each item over as it comes (a bounded queue: a slow client holds the
reader back, not the server's memory); when the client goes away the thread is told
to stop, and it does at its next look (the follower's reads then wait at most `WAKE`,
a quarter of a second), giving back its Redis connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

KEEPALIVE = b": keep-alive\n\n"
# Sent first: how long a client that lost the stream waits before it asks again (ms).
RETRY = b"retry: 1000\n\n"
# No cache may keep or buffer a stream (nginx buffers unless told not to).
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
QUEUE_SIZE = 256
_ITEM, _FAILED, _END = 0, 1, 2


def event(data: Any, *, id: str | None = None) -> bytes:
    """One event: `id` (when given) and `data`, JSON on a single line."""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}data: {body}\n\n".encode()


def failure(message: str, kind: str) -> bytes:
    """An event named `error` (not a frame: a frame is a default event) saying why the
    stream stops before its end, in the error shape: `{"error", "type"}`."""
    body = json.dumps({"error": message, "type": kind}, ensure_ascii=False)
    return f"event: error\ndata: {body}\n\n".encode()


async def from_thread(
    produce: Callable[[threading.Event], Iterator[T]], *, keepalive: float
) -> AsyncIterator[T | None]:
    """The items `produce(stop)` yields, read in a thread of their own and handed to the
    event loop as they come; None after each `keepalive` seconds without one.

    Leaving the iteration (the client went away, the task was cancelled) sets `stop`;
    `produce` must end soon after it is set. An exception in `produce` is raised here.
    """
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(QUEUE_SIZE)
    handoff = _Handoff(asyncio.get_running_loop(), queue)
    threading.Thread(target=handoff.pump, args=(produce,), name="event-stream", daemon=True).start()
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(queue.get(), keepalive)
            except TimeoutError:
                yield None
                continue
            if kind == _END:
                return
            if kind == _FAILED:
                raise value
            yield value
    finally:
        handoff.stop.set()


class _Handoff:
    """The reading thread's side of `from_thread`: it runs the producer and puts what it
    yields, its end or its failure on the loop's queue, until `stop` is set."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> None:
        self.loop = loop
        self.queue = queue
        self.stop = threading.Event()

    def pump(self, produce: Callable[[threading.Event], Iterator[Any]]) -> None:
        items: Iterator[Any] | None = None
        try:
            items = produce(self.stop)
            for item in items:
                if self.stop.is_set() or not self.hand(_ITEM, item):
                    return
            self.hand(_END, None)
        except Exception as exc:
            self.hand(_FAILED, exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a generator's `finally` (its Redis connection) runs here, now

    def hand(self, kind: int, value: Any) -> bool:
        """Put an item on the loop's queue, waiting while it is full; False once the
        reader is gone."""
        try:
            future = asyncio.run_coroutine_threadsafe(self.queue.put((kind, value)), self.loop)
        except RuntimeError:  # the loop has closed
            return False
        while True:
            try:
                future.result(timeout=0.25)
                return True
            except concurrent.futures.TimeoutError:
                if self.stop.is_set():
                    future.cancel()
                    return False
            except concurrent.futures.CancelledError:
                return False
