"""Sleeping runs: the `wait` tool an agent with `timers=True` is offered.

The model calls `wait` with `{"seconds": N}` or `{"until": "<ISO 8601>"}` (and an optional
`reason`). Its call is checked where every call is (`persist:toolcall:<id>`): bad
arguments, or a sleep longer than `AGENT_JOBS_MAX_SLEEP`, are a tool error the model
reads. Then the turn sleeps on the row `timer:<call_id>`: its intent keeps the wake time,
the run is `sleeping` with `runs.wake_at` set, and a `timer` frame goes out. Nothing else
holds it: no worker, no thread, no broker message. It wakes at its time, or early when a
message for the next step is posted to it; the row's result, which the model reads, is
`{"woke": "time" | "message", "at": "<ISO 8601>"}`.

Who wakes it decides here, under the run's lock: a durable pass (sent by beat's timers
tick, which reads the sleepers due from Postgres, or by the command that posted the
message), the inline runner's one waiter for all its sleepers.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from . import session
from .checkpoints import Woke
from .errors import ToolError
from .messages import ToolSpec
from .store import RunView
from .store import journal as journal_rows
from .store import runs as run_rows
from .store import timers as timer_rows

WAIT = "wait"
_ARGS = frozenset({"seconds", "until", "reason"})
MAX_REASON = 500

SPEC = ToolSpec(
    name=WAIT,
    description=(
        "Sleep, giving the worker back, and come back later with the same history: for a "
        "build, a reply, tomorrow morning. Give `seconds` to sleep, or `until` (an ISO 8601 "
        "time with its offset). A message to the run wakes it early. The result says how "
        'it woke: {"woke": "time" | "message", "at": "<ISO 8601>"}.'
    ),
    input_schema={
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "minimum": 0, "description": "how long to sleep"},
            "until": {
                "type": "string",
                "format": "date-time",
                "description": "when to wake, ISO 8601 with an offset",
            },
            "reason": {"type": "string", "description": "what the run waits for"},
        },
        "additionalProperties": False,
    },
)


def offers_wait(tools: Any, offered: list[str]) -> bool:
    """Whether a call named `wait` is the timers' (the agent was offered it and no tool of
    the app has that name)."""
    return WAIT in offered and WAIT not in tools


def wake_time(args: dict[str, Any], now: datetime, max_sleep: float) -> datetime:
    """When a `wait` call with `args`, made at `now`, wakes; `ToolError` (which the model
    reads) for arguments that say no time, or a time past `max_sleep` seconds from now."""
    unknown = set(args) - _ARGS
    if unknown:
        raise ToolError(f"wait takes `seconds` or `until` (and `reason`), not {sorted(unknown)}")
    reason = args.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        raise ToolError(f"wait's `reason` is a string of at most {MAX_REASON} characters")
    if ("seconds" in args) == ("until" in args):
        raise ToolError("wait takes one of `seconds` (a number) or `until` (an ISO 8601 time)")
    if "seconds" in args:
        seconds = args["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ToolError("wait's `seconds` is a number of seconds")
        if not math.isfinite(seconds) or seconds < 0:
            raise ToolError("wait's `seconds` is a finite number, 0 or more")
        if seconds > max_sleep:
            raise ToolError(_too_long(max_sleep))
        return now + timedelta(seconds=seconds)
    wake_at = _instant(args["until"])
    if (wake_at - now).total_seconds() > max_sleep:
        raise ToolError(_too_long(max_sleep))
    return max(wake_at, now)


def _instant(value: Any) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise ToolError("wait's `until` is an ISO 8601 time, e.g. 2026-12-07T09:00:00+01:00")
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ToolError(
            f"wait's `until` {value!r} is not an ISO 8601 time, e.g. 2026-12-07T09:00:00+01:00"
        ) from None
    if moment.tzinfo is None:
        raise ToolError(f"wait's `until` {value!r} needs its offset (Z or +01:00)")
    return moment.astimezone(UTC)


def _too_long(max_sleep: float) -> str:
    return (
        f"wait sleeps at most {max_sleep:g} seconds (AGENT_JOBS_MAX_SLEEP); "
        "sleep that long and call wait again"
    )


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def wake_at_of(intent: Any) -> datetime:
    when = intent.get("wake_at") if isinstance(intent, dict) else None
    if not isinstance(when, str):
        raise ValueError(f"a timer row without its wake time: {intent!r}")
    return datetime.fromisoformat(when)


def label(call_id: str, when: str) -> str:
    """`waiting_on` of a sleeping run."""
    return f"sleeping until {when} ({call_id})"


def woke(conn: Connection, run: RunView, wake_at: datetime, now: datetime) -> dict[str, Any] | None:
    """How the run wakes now, if it does: a message for its next step came (early), or its
    time has come; None while it sleeps on."""
    log = session.thread_events(conn, run.thread_id, types=[session.SPLICED])
    if session.fold_inbox(log).next_step:
        return Woke(woke="message", at=iso(now)).model_dump()
    if now >= wake_at:
        return Woke(woke="time", at=iso(now)).model_dump()
    return None


def settle(conn: Connection, run_id: str, step: str, result: dict[str, Any]) -> None:
    """The run woke: its timer row is done with `result`, and it sleeps no more."""
    journal_rows.complete(conn, run_id, step, state="done", result=result)
    timer_rows.clear_wake(conn, run_id)


def start(conn: Connection, run_id: str, wake_at: datetime) -> None:
    """The run sleeps until `wake_at` (its status is set where it parks)."""
    timer_rows.set_wake(conn, run_id, wake_at)


def sleeper(conn: Connection, run_or_thread: str) -> str | None:
    """The thread's run that a message for its next step, posted in this transaction,
    must wake: its row is locked first, so a pass putting it to sleep either ends before
    (the run is read `sleeping` here) or reads the message (and does not sleep)."""
    found = run_rows.get_run(conn, run_or_thread)
    active: Any
    if found is not None and found.parent_run_id is not None:
        active = found  # a delegated run, on a thread of its own
    else:
        thread_id = found.thread_id if found is not None else run_or_thread
        active = run_rows.active_run(conn, thread_id)
    if active is None or active.status not in ("running", "sleeping"):
        return None
    locked = run_rows.lock_run(conn, active.id)
    return active.id if locked is not None and locked.status == "sleeping" else None
