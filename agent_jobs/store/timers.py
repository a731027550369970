"""Sleeping runs' wake times (`runs.wake_at`): set while a run sleeps on a `wait` call,
cleared when it wakes or ends (agent_jobs/timers.py says when)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from .schema import runs


def set_wake(conn: Connection, run_id: str, wake_at: datetime) -> None:
    """The run sleeps until `wake_at`."""
    conn.execute(update(runs).where(runs.c.id == run_id).values(wake_at=wake_at))


def clear_wake(conn: Connection, run_id: str) -> None:
    """The run sleeps no more."""
    conn.execute(
        update(runs).where(runs.c.id == run_id, runs.c.wake_at.is_not(None)).values(wake_at=None)
    )


def due(
    conn: Connection, until: datetime, limit: int = 500, runner: str = "durable"
) -> list[tuple[str, datetime]]:
    """The sleeping runs of `runner` whose time comes by `until`, earliest first: (run id,
    wake_at). A paused sleeper keeps its time but is not among them: it wakes once
    resumed. An inline runner's sleepers are its own process's to wake."""
    rows = conn.execute(
        select(runs.c.id, runs.c.wake_at)
        .where(runs.c.wake_at <= until, runs.c.status == "sleeping", runs.c.runner == runner)
        .order_by(runs.c.wake_at)
        .limit(limit)
    ).all()
    return [(row.id, row.wake_at) for row in rows]


def sleepers(conn: Connection, run_ids: Sequence[str]) -> list[Any]:
    """The rows of those runs (status, wake time, cancel and pause asked for, thread)."""
    if not run_ids:
        return []
    return list(
        conn.execute(
            select(
                runs.c.id,
                runs.c.thread_id,
                runs.c.status,
                runs.c.wake_at,
                runs.c.cancel_cause,
                runs.c.pause_requested_by,
            ).where(runs.c.id.in_(list(run_ids)))
        ).all()
    )
