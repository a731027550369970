"""The floor: a Celery no-op task, with a result backend only for the round trip.

`noop_acked` has the workers' settings (acks late, one prefetched message, task
events on): how many of those two processes drain a second bounds W1 from above.
"""

from __future__ import annotations

import os

from celery import Celery

floor = Celery(
    "floor",
    broker=os.environ.get("FLOOR_BROKER_URL", "redis://127.0.0.1:6379/10"),
    backend=os.environ.get("FLOOR_BROKER_URL", "redis://127.0.0.1:6379/10"),
)
floor.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


@floor.task(name="floor.noop")
def noop() -> None:
    return None


@floor.task(name="floor.noop_acked", acks_late=True, ignore_result=True)
def noop_acked() -> None:
    return None
