"""The durable runner's sleepers (agent_jobs/timers.py): beat's timers tick finds in
Postgres the sleeping runs whose time comes before the next tick and sends each a
`coordinate` due at its time; the pass it drives wakes the run.

The wake time lives in Postgres alone: a sleeping run holds no broker message, and a
Redis restarted or flushed loses nothing (the next tick finds the run due). The one
message a tick sends waits in the broker one tick at most. A run woken twice (a tick that
came before the first pass ended) is replayed once more and finds itself awake.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from ...dispatch import Dispatcher
from ...store import Store
from ...store import timers as timer_rows
from ...store.db import utcnow

log = logging.getLogger(__name__)

TIMERS = "agent_jobs.timers"  # the Celery task beat runs the tick as
LATE = 0.005  # a pass sent for a wake time arrives this much after it, never before


def wake_due(store: Store, dispatcher: Dispatcher, ahead: float, limit: int = 1000) -> int:
    """Send a `coordinate` to each sleeping run whose time comes within `ahead` seconds,
    due at its time (those past it at once); returns how many."""
    now = utcnow()
    with store.connect() as conn:
        due = timer_rows.due(conn, now + timedelta(seconds=ahead), limit)
    for run_id, wake_at in due:
        left = (wake_at - utcnow()).total_seconds()
        dispatcher.coordinate(run_id, countdown=left + LATE if left > 0 else None)
    if due:
        log.info("timers: %d sleeping run(s) wake within %.1fs", len(due), ahead)
    return len(due)
