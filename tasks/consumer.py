"""Celery's consumer, reconnecting to the broker at most a second apart.

Celery asks kombu to reconnect with kombu's defaults: 2 s after the first failure, 2 s
more after each, up to 30 s. A worker cut off from the network for 14 s then waited up
to 8 s more after the network healed before it consumed again. Here the attempts are half
a second, then a second apart: a broker that is away costs a failed connect a second.
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

RETRY = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 1.0}


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(conn.ensure_connection, **RETRY)
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection  # the method again
