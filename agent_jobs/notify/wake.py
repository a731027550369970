"""Wake this process's senders once a transaction that wrote notifications commits.

The writer marks its connection (`written`). SQLAlchemy says nothing after a commit, so
the mark is read when the connection goes back to its pool, which is after its commit
or its rollback; a rollback takes the mark away first. A connection kept out of the
pool across transactions wakes the senders later, or a poll finds its rows: the wake is
a shortcut, never what delivery depends on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.pool import Pool

_WRITTEN = "agent_jobs.outbox_written"  # on the connection's (pool record's) `info`
_lock = threading.Lock()
_wakers: list[Callable[[], None]] = []


def written(conn: Connection) -> None:
    """The transaction on `conn` wrote notifications: wake the senders once it commits."""
    conn.info[_WRITTEN] = True


def subscribe(waker: Callable[[], None]) -> None:
    with _lock:
        _wakers.append(waker)


def unsubscribe(waker: Callable[[], None]) -> None:
    with _lock:
        if waker in _wakers:
            _wakers.remove(waker)


def wake_all() -> None:
    with _lock:
        wakers = list(_wakers)
    for waker in wakers:
        waker()


@event.listens_for(Engine, "rollback")
def _rolled_back(conn: Connection) -> None:
    if not conn.invalidated:  # an invalidated one's info went with its connection
        conn.info.pop(_WRITTEN, None)


@event.listens_for(Pool, "checkin")
def _checked_in(_dbapi: Any, record: Any) -> None:
    if record is not None and record.info.pop(_WRITTEN, None):
        wake_all()
