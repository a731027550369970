"""What a run's state change tells the world, written in the change's own transaction.

A run that ends (`completed`, `failed`, `cancelled`) or starts waiting for a person
(`awaiting_approval`, `awaiting_answers`, `awaiting_reconcile`) produces a
notification: a row of the outbox, written by the status writes of `store/runs.py`, so
it exists exactly when the change committed. The senders deliver it (`sender.py`).

Once per transition: an end is written by the writer that ended the run (the first).
A wait is one notification for each thing a person must do: each call waiting for a
decision, each set of questions, each call whose outcome is unknown, written by the
write that parked the run on it. A pass that replays a run and parks it again on what
it already waits on writes nothing; a new wait (the next call to decide, the next
questions) is a new notification, even when the status stays the same (the run waits on
call_2 after call_1 was rejected); a wait that only got smaller (one of two questions
answered) is not. Two questions asked at once are two notifications on both runners
(the durable runner parks on both in one pass, the inline runner on each in turn).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from .. import checkpoints as names
from ..messages import args_sha256
from ..store import outbox as rows
from ..store.db import utcnow
from ..store.schema import runs
from . import wake

# The event type of each status a notification is written for.
TYPES: dict[str, str] = {
    "completed": "run.completed",
    "failed": "run.failed",
    "cancelled": "run.cancelled",
    "awaiting_approval": "run.awaiting_approval",
    "awaiting_answers": "run.awaiting_answers",
    "awaiting_reconcile": "run.outcome_unknown",
}
ENDS = frozenset({"completed", "failed", "cancelled"})
WAITS = frozenset({"awaiting_approval", "awaiting_answers", "awaiting_reconcile"})

MASK = "***"
# Characters a receiver might read as markup (or a script's line end), escaped inside
# the JSON's strings: the body decodes to the same values and holds none of them raw.
_UNSAFE = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)


def encode(body: Mapping[str, Any]) -> bytes:
    """The notification's bytes, the same every time (so a duplicate is the same body,
    and its signature the same): JSON, sorted keys, no spaces, UTF-8, `<`, `>` and `&`
    escaped."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_UNSAFE).encode("utf-8")


def ended(
    conn: Connection,
    run_id: str,
    status: str,
    *,
    output: str | None,
    error: str | None,
    error_type: str | None,
    run: Any = None,
) -> None:
    """The run ended (this transaction's write ended it): `run.completed` with its
    output, or `run.failed` / `run.cancelled` with its error. `run` is its row or view
    as the caller holds it (read here when None)."""
    if run is None:
        run = conn.execute(select(runs).where(runs.c.id == run_id)).first()
    body = _common(run_id, run, status)
    if status == "completed":
        body["output"] = output
    else:
        body["error"] = _masked(error)
        body["error_type"] = error_type
    _write(conn, body)


def parked(
    conn: Connection,
    before: Any,
    status: str,
    waiting_on: str | None,
    notice: Mapping[str, Any] | None = None,
) -> int:
    """The run, `before` as its locked row was, now waits on `waiting_on` with `status`:
    write a notification for each new thing it waits on. `notice`: the caller describes
    the wait itself (one notification with these fields, if the wait is new). Returns how
    many were written."""
    if status not in WAITS or before is None:
        return 0
    m = before._mapping
    if m["status"] in ENDS:
        return 0
    run_id = m["id"]
    same = m["status"] == status
    was = set((m["waiting_on"] or "").split()) if same else set()
    waits = [] if notice is not None else _waited_on(conn, run_id, status, waiting_on)
    if waits:
        waits = [(key, fields) for key, fields in waits if key not in was]
    elif not same or waiting_on != m["waiting_on"]:
        waits = [("", dict(notice or {}))]  # described by the caller, or by its label alone
    for _key, fields in waits:
        body = _common(run_id, before, status)
        body["waiting_on"] = waiting_on
        body.update(fields)
        _write(conn, body)
    return len(waits)


def _waited_on(
    conn: Connection, run_id: str, status: str, waiting_on: str | None
) -> list[tuple[str, dict[str, Any]]]:
    """Each thing the run waits on as `waiting_on` names it (a call, a request for
    answers), keyed by its id, with what a receiver needs to act on it."""
    named = set((waiting_on or "").split())
    if status == "awaiting_answers":
        return [
            (
                q.request_id,
                {
                    "request_id": q.request_id,
                    "call_id": q.call_id,
                    "tool": q.tool,
                    "questions": q.questions,
                },
            )
            for q in rows.open_questions(conn, run_id)
            if q.request_id in named
        ]
    calls = [c for c in rows.run_calls(conn, run_id) if c.call_id in named]
    if status == "awaiting_approval":
        return [
            (
                c.call_id,
                {
                    "call_id": c.call_id,
                    "tool": c.name,
                    "args": c.args,
                    "args_sha256": args_sha256(c.args),
                    "deadline": _iso(c.approval_deadline),
                },
            )
            for c in calls
            if c.status == "pending_approval"
        ]
    return [
        (
            c.call_id,
            {
                "call_id": c.call_id,
                "tool": c.name,
                "args": c.args,
                "idempotency_key": f"{run_id}:{names.tool(c.call_id)}",
            },
        )
        for c in calls
    ]


def _common(run_id: str, run: Any, status: str) -> dict[str, Any]:
    m = run._mapping if hasattr(run, "_mapping") else dict(run)  # a row, or a RunView
    return {
        "type": TYPES[status],
        "event_id": uuid.uuid4().hex,
        "run_id": run_id,
        "at": _iso(utcnow()),
        "status": status,
        "agent": m["agent"],
        "actor": m["actor"],
        "thread_id": m["thread_id"],
        "parent_run_id": m["parent_run_id"],
        "root_run_id": m["root_run_id"],
        "metadata": m["metadata"],
    }


def _write(conn: Connection, body: dict[str, Any]) -> None:
    at = datetime.fromisoformat(body["at"])
    rows.add(
        conn, event_id=body["event_id"], type=body["type"], run_id=body["run_id"], body=body, at=at
    )
    wake.written(conn)


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def _masked(text: str | None) -> str | None:
    if text is None:
        return None
    for secret in _secrets():
        text = text.replace(secret, MASK)
    return text


@functools.cache
def _secrets() -> tuple[str, ...]:
    """The process's known secrets (as its logs mask them), longest first."""
    from ..logs import known_secrets

    return tuple(sorted({s for s in known_secrets() if len(s) >= 6}, key=len, reverse=True))
