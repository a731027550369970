"""Operator controls (docs/operating.md, "Operator controls: pause, resume, retry, fork"),
the store's side: what each records, in the caller's transaction, and what it refuses. The runners
honour them (the step boundary: `hold`; a replay reads a retry row in its failed step's
place) and the doors (client, command line, HTTP API) wake what must go on.

Every control is an event in the run's thread's session log with who asked
(`session.CONTROLS`); `history` reads them back for `status --json`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from .. import session
from .fork import Again, Forked, fork
from .pause import hold, opened_turn, pause, resume
from .retry import Retried, retry, task_of


def history(conn: Connection, run_id: str, thread_id: str) -> list[dict[str, Any]]:
    """The controls of a run, oldest first: the event's type (`run/pause`, …), when, who
    asked (`by`) and what it says."""
    found = session.thread_events(conn, thread_id, types=list(session.CONTROLS))
    return [
        {"event": event.type, "at": event.created_at.isoformat(), **event.data}
        for event in found
        if event.run_id == run_id
    ]


__all__ = [
    "Again",
    "Forked",
    "Retried",
    "fork",
    "history",
    "hold",
    "opened_turn",
    "pause",
    "resume",
    "retry",
    "task_of",
]
