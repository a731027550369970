"""The session runtime, event-sourced: status, inbox, model selection and consumed work
are folded from a thread's events, never kept on the side.

Event types: `turn/start`, `step/start`, `agent/request`, `tool/call`, `tool/result`,
`agent/status`, `agent/inbox/spliced`, `agent/model/selected`, `turn/stopping`,
`turn/end` (reason `completed`, `interrupted`, `aborted`, `error` or `blocked`), and the
operator's controls with who asked (`run/pause`, `run/paused`, `run/resume`, `run/retry`,
`run/fork`, `run/forked`: agent_jobs/controls).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel
from sqlalchemy import Connection

from .errors import InvalidRequestError, UnknownRunError
from .store import events as event_rows
from .store import runs as run_rows
from .store.db import contains_nul

Target = Literal["next-step", "next-turn"]
TARGETS: tuple[str, ...] = ("next-step", "next-turn")
CancelCause = Literal["user", "timeout", "parent", "shutdown", "superseded"]
CANCEL_CAUSES: tuple[str, ...] = ("user", "timeout", "parent", "shutdown", "superseded")
TurnEndReason = Literal["completed", "interrupted", "aborted", "error", "blocked"]

SPLICED = "agent/inbox/spliced"
STATUS = "agent/status"
SELECTED = "agent/model/selected"
INBOX = (SPLICED, SELECTED)  # what a step boundary reads: steering, the model selection

# The operator's controls (agent_jobs/controls), each with who asked (`by`).
PAUSE = "run/pause"  # a pause asked for
PAUSED = "run/paused"  # honoured at a step boundary, with what the run was doing then
RESUME = "run/resume"
RETRY = "run/retry"  # the failed steps run again
FORK = "run/fork"  # in the fork's thread: the run and step it was made from
FORKED = "run/forked"  # in the source's thread: the fork made of it
CONTROLS = (PAUSE, PAUSED, RESUME, RETRY, FORK, FORKED)


class Event(BaseModel):
    """One entry of a thread's session log."""

    thread_id: str
    seq: int
    run_id: str | None
    type: str
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Event:
        return cls.model_validate(dict(row._mapping))


# --- folds ------------------------------------------------------------------------------


@dataclass
class Inbox:
    """Pending work: steering for the next step, requests for the next turn."""

    next_step: list[str] = field(default_factory=list)
    next_turn: list[str] = field(default_factory=list)

    @property
    def has_pending(self) -> bool:
        return bool(self.next_step or self.next_turn)

    def queue(self, target: str) -> list[str]:
        return self.next_step if target == "next-step" else self.next_turn

    def apply(self, data: dict[str, Any]) -> None:
        queue = self.queue(data["target"])
        start = data["start"] if data["start"] >= 0 else len(queue)
        queue[start : start + data["removed_count"]] = list(data["inserted"])


def splice(
    target: str, start: int, removed: int, inserted: Sequence[str], outcome: str | None
) -> dict[str, Any]:
    return {
        "target": target,
        "start": start,
        "removed_count": removed,
        "inserted": list(inserted),
        "outcome": outcome,
    }


def fold_inbox(events: Iterable[Event]) -> Inbox:
    inbox = Inbox()
    for event in events:
        if event.type == SPLICED:
            inbox.apply(event.data)
    return inbox


def fold_status(events: Iterable[Event]) -> Literal["idle", "running"]:
    status: Literal["idle", "running"] = "idle"
    for event in events:
        if event.type == STATUS:
            status = event.data["status"]
    return status


class ModelSelection(BaseModel):
    """A thread's model choice for its next steps."""

    provider: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None


def fold_selection(events: Iterable[Event]) -> ModelSelection | None:
    selection: ModelSelection | None = None
    for event in events:
        if event.type == SELECTED:
            selection = ModelSelection.model_validate(event.data)
    return selection


@dataclass(frozen=True)
class ConsumedWork:
    """Which turn last accounted for work, and whether queued work was dropped unrun."""

    end: Event | None
    dropped_unrun: bool


def fold_consumed_work(events: Iterable[Event]) -> ConsumedWork:
    """Fold the log once.

    A turn accounts for work when it entered a model step, or when it claimed input and
    then ended any way but `completed` (blocked, aborted, error, interrupted: the input's
    ending too). Work is dropped unrun when a cancellation cleared queued inbox items
    after the last accounting turn began (or at all, when none did).
    """
    end: Event | None = None
    entered: set[str | None] = set()
    claimed: set[str | None] = set()
    dropped = False
    for event in events:
        if event.type == "step/start":
            entered.add(event.run_id)
        elif event.type == SPLICED:
            data = event.data
            if data.get("outcome") == "claimed" and data["removed_count"]:
                claimed.add(event.run_id)
            elif data.get("outcome") == "canceled" and data["removed_count"]:
                dropped = True
        elif event.type == "turn/end":
            run = event.run_id
            if run in entered or (run in claimed and event.data.get("reason") != "completed"):
                end = event
                dropped = False
    return ConsumedWork(end=end, dropped_unrun=dropped)


# --- reading ----------------------------------------------------------------------------


def thread_events(
    conn: Connection, thread_id: str, *, types: Sequence[str] | None = None
) -> list[Event]:
    return [Event.from_row(r) for r in event_rows.for_thread(conn, thread_id, types=types)]


def resolve_thread(conn: Connection, run_or_thread: str) -> tuple[str, Any | None]:
    """(thread id, run row) for a run id or a thread id."""
    run = run_rows.get_run(conn, run_or_thread)
    if run is not None:
        return run.thread_id, run
    if event_rows.lock_thread(conn, run_or_thread) is None:
        raise UnknownRunError(run_or_thread)
    return run_or_thread, None


def active_run(conn: Connection, thread_id: str) -> Any | None:
    """The thread's unfinished top-level run, if any."""
    return run_rows.active_run(conn, thread_id)


def last_run(conn: Connection, thread_id: str) -> Any | None:
    """The thread's newest top-level run: a new turn continues with its agent and actor."""
    return run_rows.last_run(conn, thread_id)


# --- commands (inside the caller's transaction) ------------------------------------------


def push(conn: Connection, thread_id: str, run_id: str | None, target: str, text: str) -> None:
    """Queue a message for the next step or the next turn."""
    if target not in TARGETS:
        raise InvalidRequestError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    if not text.strip():
        raise InvalidRequestError("a message needs some text")
    event_rows.append(conn, [(thread_id, run_id, SPLICED, splice(target, -1, 0, [text], None))])


def claim_next_step(
    conn: Connection, thread_id: str, run_id: str, *, log: Sequence[Event] | None = None
) -> list[str]:
    """Take every steering message queued for the next step (`log`: the thread's events,
    if the caller already read them)."""
    inbox = fold_inbox(log if log is not None else thread_events(conn, thread_id, types=[SPLICED]))
    if not inbox.next_step:
        return []
    batch = list(inbox.next_step)
    data = splice("next-step", 0, len(batch), [], "claimed")
    event_rows.append(conn, [(thread_id, run_id, SPLICED, data)])
    return batch


def claim_next_turn(conn: Connection, thread_id: str, run_id: str | None) -> str | None:
    """Take the first request queued for the next turn."""
    inbox = fold_inbox(thread_events(conn, thread_id, types=[SPLICED]))
    if not inbox.next_turn:
        return None
    data = splice("next-turn", 0, 1, [], "claimed")
    event_rows.append(conn, [(thread_id, run_id, SPLICED, data)])
    return inbox.next_turn[0]


def clear(conn: Connection, thread_id: str, run_id: str | None) -> int:
    """Drop everything queued (a cancellation); returns how many messages were dropped."""
    inbox = fold_inbox(thread_events(conn, thread_id, types=[SPLICED]))
    pending = [
        (thread_id, run_id, SPLICED, splice(target, 0, len(inbox.queue(target)), [], "canceled"))
        for target in TARGETS
        if inbox.queue(target)
    ]
    event_rows.append(conn, pending)
    return len(inbox.next_step) + len(inbox.next_turn)


def request_cancel(
    conn: Connection, run_id: str, cause: str, *, keep_inbox: bool = False
) -> list[str]:
    """Record a cancel for the run and its unfinished children; returns their ids."""
    return request_cancels(conn, [run_id], cause, keep_inbox=keep_inbox)


def request_cancels(
    conn: Connection, run_ids: Sequence[str], cause: str, *, keep_inbox: bool = False
) -> list[str]:
    """`request_cancel` of several runs at once (a thread's, oldest first).

    Every run's row is taken before any thread's (which the cancels' events take), the
    order a pass and a queued run's entry take them in: a cancel that took a thread's row
    and then waited for a second run of the thread deadlocked with that run's entry.
    """
    if cause not in CANCEL_CAUSES:
        raise InvalidRequestError(f"cause must be one of {', '.join(CANCEL_CAUSES)}, not {cause!r}")
    affected: list[str] = []
    stopping: list[event_rows.PendingEvent] = []
    for run_id in run_ids:
        if run_rows.get_run(conn, run_id) is None:
            raise UnknownRunError(run_id)
        for index, target in enumerate(run_rows.run_tree_ids(conn, run_id)):
            own_cause = cause if index == 0 else "parent"
            thread_id = run_rows.record_cancel(conn, target, own_cause, keep_inbox=keep_inbox)
            if thread_id is not None:
                data = {"cause": own_cause, "keep_inbox": keep_inbox}
                stopping.append((thread_id, target, "turn/stopping", data))
                affected.append(target)
    event_rows.append(conn, stopping)
    return affected


def select_model(conn: Connection, thread_id: str, selection: ModelSelection) -> None:
    """Switch the thread's model for its next steps (captured at prompt assembly). A
    selection naming neither a model nor a provider, or with a name no model has, is
    refused (`InvalidRequestError`) and nothing is written."""
    if selection.model is None and selection.provider is None:
        raise InvalidRequestError("invalid model selection: name a model, a provider or both")
    names = [selection.provider, selection.model, selection.reasoning_effort]
    if contains_nul(names) or any(name is not None and not 0 < len(name) <= 200 for name in names):
        raise InvalidRequestError(
            "invalid model selection: each name is 1 to 200 characters, with no NUL"
        )
    event_rows.append(conn, [(thread_id, None, SELECTED, selection.model_dump())])


def end_reason(cause: str) -> TurnEndReason:
    """An explicit cancel by a user aborts the turn; every other cause interrupts it."""
    return "aborted" if cause == "user" else "interrupted"
