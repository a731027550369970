"""Running a failed run's failed step again (docs/operating.md, "Operator controls").

Only a run that failed on a step may be retried: a dead letter or a step's error
(`StepFailedError`; the inline runner's model errors are its step errors,
`ModelError`). Anything else (a quota, `max_steps`, a refused step, a replay that went
another way) would fail the same way again, and is refused. The failed steps run again
with attempt counts of their own, the run's error is cleared, and it goes on from there,
its finished steps read back from the journal.

A journal row that is done or failed never changes (processes keep runs' final rows:
runners/durable/journal_cache.py, runners/durable/sticky.py), so the failed row stays as
it was: each retry is a row of its own after the journal's last, `retry:<k>:<step>`, with
the failed step's intent (a new name: its Redis attempt count starts afresh), which a
replay reads in the failed row's place (runners/durable/replay.py). Nobody drives the run
while the row is written: it has ended, and the caller holds its lock until the commit;
then the caller sends the retry rows to the workers (the inline runner drives the run itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from .. import checkpoints as names
from .. import session
from ..dispatch import INVOKE_TOOL, MODEL_TURN
from ..errors import ControlRefusedError
from ..store import events as event_rows
from ..store import journal as journal_rows
from ..store import runs as run_rows
from ..store.journal import JournalRow
from ..store.retention import PRUNED
from .pause import checked_actor, locked

# What a run that failed on a step failed with.
RETRYABLE = frozenset({"StepFailedError", "ModelError"})


@dataclass(frozen=True)
class Retried:
    """A retry recorded: the failed steps that run again, and (durable) the rows that run
    them, as the broker takes them: (task, step)."""

    run_id: str
    steps: list[str]
    sends: list[tuple[str, str]] = field(default_factory=list)


def retry(conn: Connection, run_id: str, actor: str, *, runner: str) -> Retried:
    """Record a retry of the failed run by `actor`, for `runner` (the one that carries it
    out). Refused (`ControlRefusedError`, nothing written) for a run that did not fail on
    a step, a delegated run, a run whose thread went on without it, or one of the other
    runner."""
    actor = checked_actor(actor)
    run = locked(conn, run_id)
    _check(conn, run, runner)
    rows = journal_rows.load(conn, run_id)
    if any(row.state == PRUNED for row in rows):
        raise ControlRefusedError(f"run {run_id}'s journal was pruned: it cannot go on")
    failed = unretried_failures(rows)
    if runner == "durable" and not failed:
        raise ControlRefusedError(
            f"run {run_id} has no failed step in its journal to run again: "
            f"`agent-jobs journal {run_id}` shows it"
        )
    seq = max((row.seq for row in rows), default=0)
    again: list[dict[str, Any]] = []
    for step, k, row in failed:
        seq += 1
        retry_step = names.retry(step, k + 1)
        again.append(
            journal_rows.row(
                run_id=run_id, step=retry_step, seq=seq, state="scheduled", intent=row.intent
            )
        )
    journal_rows.insert_many(conn, again)
    run_rows.reopen(conn, run_id)
    steps = [step for step, _, _ in failed] or _failed_request(conn, run)
    events: list[event_rows.PendingEvent] = [
        (run.thread_id, run_id, session.RETRY, {"by": actor, "steps": steps})
    ]
    if runner == "durable":  # the inline runner opens the turn as it drives it
        start = {"request": run.input, "agent": run.agent, "retried_by": actor}
        events += [
            (run.thread_id, run_id, "turn/start", start),
            (run.thread_id, run_id, session.STATUS, {"status": "running"}),
        ]
    event_rows.append(conn, events)
    sends = [(task_of(row["intent"]), row["step"]) for row in again]
    return Retried(run_id, steps, sends)


def _check(conn: Connection, run: Any, runner: str) -> None:
    run_id = run.id
    if run.status != "failed":
        raise ControlRefusedError(
            f"run {run_id} is {run.status}: only a run that failed on a step can be retried"
        )
    if run.error_type not in RETRYABLE:
        raise ControlRefusedError(
            f"run {run_id} failed with {run.error_type} ({run.error}), not on a step: it "
            "would fail the same way again"
        )
    if run.parent_run_id is not None:
        raise ControlRefusedError(
            f"run {run_id} was delegated by run {run.parent_run_id}, which has had its "
            f"answer: retry or fork run {run.parent_run_id} instead"
        )
    if run.runner != runner:
        raise ControlRefusedError(
            f"run {run_id} ran on the {run.runner} runner: retry it there "
            + (
                "(with AGENT_JOBS_BROKER_URL set)"
                if run.runner == "durable"
                else "(in a process without a broker)"
            )
        )
    last = run_rows.last_run(conn, run.thread_id)
    if last is not None and last.id != run_id:
        raise ControlRefusedError(
            f"thread {run.thread_id} went on without run {run_id} (run {last.id} came "
            f"after it): fork run {run_id} to take it up on a thread of its own"
        )


def _failed_request(conn: Connection, run: Any) -> list[str]:
    """The step whose model request failed the run, as its session log says (the inline
    runner journals no failed step: the step runs again as one it never ran)."""
    requests = session.thread_events(conn, run.thread_id, types=["agent/request"])
    failed = [e.data.get("step") for e in requests if e.run_id == run.id]
    last = failed[-1] if failed else None
    return [last] if isinstance(last, str) else []


def last_runs(rows: Sequence[JournalRow]) -> dict[str, tuple[int, JournalRow]]:
    """Each step of the journal `rows`: how often it was retried, and the row of its last
    run (the step's own row, or its latest retry row)."""
    last: dict[str, tuple[int, JournalRow]] = {}
    for row in rows:
        again = names.retried(row.step)
        step, k = again if again is not None else (row.step, 0)
        if step not in last or k > last[step][0]:
            last[step] = (k, row)
    return last


def unretried_failures(rows: Sequence[JournalRow]) -> list[tuple[str, int, JournalRow]]:
    """(step, how often it was retried, its last row) of each step whose last run failed,
    in journal order."""
    last = last_runs(rows)
    found = [(step, k, row) for step, (k, row) in last.items() if row.state == "failed"]
    return sorted(found, key=lambda item: item[2].seq)


def task_of(intent: Any) -> str:
    """The step task a remote intent (as journaled) is sent as: a tool's, on its own queue
    if it has one; else a model's."""
    if isinstance(intent, Mapping) and intent.get("type") == "invoke_tool":
        queue = intent.get("queue")
        return f"{INVOKE_TOOL}@{queue}" if queue else INVOKE_TOOL
    return MODEL_TURN
