"""Celery's consumer, reconnecting to the broker at most a second apart, and sending the
task events of the main process together.

Celery asks kombu to reconnect with kombu's defaults: 2 s after the first failure, 2 s
more after each, up to 30 s. A worker cut off from the network for 14 s then waited up
to 8 s more after the network healed before it consumed again. Here the attempts are half
a second, then a second apart: a broker that is away costs a failed connect a second.

The main process sends the events of the tasks it receives and finishes (`task-received`,
`task-started`, `task-succeeded`, …) buffered, in one `task.multi` message a flush, but
Celery flushes at the next turn of the event loop: nearly every event went alone, a
PUBLISH each, about 6 % of a worker's CPU in a W1 run. Here the buffer is flushed 50 ms
after its first event (or at Celery's limit of 24 events, or at shutdown): Flower shows a
task's events at most 50 ms later, one message for all of them.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

RETRY = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 1.0}
EVENTS_APART = 0.05  # seconds from a buffered task event to the flush that sends it


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(conn.ensure_connection, **RETRY)
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection  # the method again

    _events_due_at = 0.0  # when a flush of the buffered events was last set for

    def on_send_event_buffered(self) -> None:  # type: ignore[override]
        hub: Any = getattr(self, "hub", None)  # the worker's event loop (none with gevent)
        if hub is None:
            return
        now = time.monotonic()
        if now - self._events_due_at <= EVENTS_APART * 2:
            return  # a flush is set and comes (one set longer ago was lost: set another)
        self._events_due_at = now + EVENTS_APART
        hub.call_later(EVENTS_APART, self._send_buffered_events)

    def _send_buffered_events(self) -> None:
        self._events_due_at = 0.0
        dispatcher: Any = getattr(self, "event_dispatcher", None)
        if dispatcher is not None:
            dispatcher.flush()
