"""Run rows: created before any work starts, moved through their statuses."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    Row,
    and_,
    bindparam,
    exists,
    func,
    null,
    or_,
    select,
    update,
)

from ..checkpoints import HUMAN_WAITS
from ..encryption.keyring import own, own_run
from ..notify import outbox as notices
from . import driver, locks, places
from .db import insert_unless_exists, utcnow
from .payloads import Payload, PayloadText
from .schema import events, journal, runs, tool_calls, usage

RunStatus = Literal[
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_answers",
    "awaiting_reconcile",
    "paused",
    "sleeping",
    "completed",
    "failed",
    "cancelled",
]
RUN_STATUSES: tuple[str, ...] = (
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_answers",
    "awaiting_reconcile",
    "paused",
    "sleeping",
    "completed",
    "failed",
    "cancelled",
)
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


def insert_run(
    conn: Connection,
    *,
    run_id: str,
    thread_id: str,
    agent: str,
    actor: str,
    persona: str | None,
    input: str,
    status: RunStatus,
    runner: str,
    day: str,
    metadata: dict[str, Any],
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
    trace_context: dict[str, str] | None = None,
    concurrency_key: str | None = None,
    waiting_on: str | None = None,
) -> bool:
    """Insert the run row; False when a run with this id already exists."""
    now = utcnow()
    values = {
        "id": run_id,
        "thread_id": thread_id,
        "agent": agent,
        "actor": actor,
        "persona": persona,
        "input": input,
        "status": status,
        "runner": runner,
        "day": day,
        "metadata": metadata,
        "parent_run_id": parent_run_id,
        "root_run_id": root_run_id or run_id,
        "depth": depth,
        "concurrency_key": concurrency_key,
        "waiting_on": waiting_on,
        "created_at": now,
        "updated_at": now,
    }
    if trace_context is not None:  # else SQL NULL, not a JSON null
        values["trace_context"] = trace_context
    own(conn, actor, run_id)
    return insert_unless_exists(conn, runs, values)


_GET = select(runs).where(runs.c.id == bindparam("run_id"))
_LOCK = _GET.with_for_update()


_LOCK_AND_TOUCH = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"))
    .values(updated_at=bindparam("b_now"))
    .returning(*runs.c)
)


def lock_and_touch(conn: Connection, run_id: str) -> Row[Any] | None:
    """Take the run's row lock and mark it as just driven, in one statement.

    Re-drives of a run serialise on this lock; `updated_at` is what the sweep reads to
    tell a run that makes progress from one that stalled.
    """
    return _owned(conn, driver.first(conn, *lock_statement(conn, run_id)))


def lock_statement(conn: Connection, run_id: str) -> tuple[Any, dict[str, Any]]:
    """`lock_and_touch` as a statement and its parameters (for a batch on `conn`)."""
    locks.note(conn, locks.RUN)
    return _LOCK_AND_TOUCH, {"b_run_id": run_id, "b_now": utcnow()}


def lock_run(conn: Connection, run_id: str, *, touch: bool = False) -> Row[Any] | None:
    """The run's row, locked until the transaction ends (None: no such run), in the
    order of `agent_jobs.store.locks`; `touch` also marks it as just driven."""
    if touch:
        return lock_and_touch(conn, run_id)
    locks.note(conn, locks.RUN)
    return _owned(conn, conn.execute(_LOCK, {"run_id": run_id}).first())


def _owned(conn: Connection, row: Row[Any] | None) -> Row[Any] | None:
    """The locked run's row; its actor now owns what the transaction writes
    (agent_jobs/encryption/keyring.py)."""
    if row is not None:
        own(conn, row.actor, row.id)
    return row


def get_run(conn: Connection, run_id: str) -> Row[Any] | None:
    """The run's row, unlocked (`lock_run` locks it)."""
    return conn.execute(_GET, {"run_id": run_id}).first()


def get_run_unsealed(conn: Connection, run_id: str) -> Row[Any] | None:
    """The run's row with its payload columns as None: what a process that cannot open
    them (encryption at rest, a missing key) may still read, to fail the run."""
    columns = [
        null().label(c.name) if isinstance(c.type, (Payload, PayloadText)) else c for c in runs.c
    ]
    return conn.execute(select(*columns).where(runs.c.id == run_id)).first()


def set_status(
    conn: Connection,
    run_id: str,
    status: RunStatus,
    *,
    waiting_on: str | None = None,
    only_if_not_terminal: bool = True,
    notice: Mapping[str, Any] | None = None,
) -> bool:
    """Move a run to `status`; a finished run never moves again.

    Parking the run on a person (a status of `notices.WAITS`, `awaiting_reconcile`
    included) writes a notification for each new thing it waits on, named in
    `waiting_on`, in this transaction (`notify/outbox.py`); `notice` is the caller's
    description of the wait instead (one notification with its fields)."""
    own_run(conn, run_id)
    before = _before_wait(conn, run_id, status, lock=True)
    query = _SET_STATUS if only_if_not_terminal else _SET_STATUS_ANY
    values: dict[str, Any] = {"b_run_id": run_id, "b_status": status, "b_waiting_on": waiting_on}
    values["b_now"] = utcnow()
    moved = driver.rowcount(conn, query, values) == 1
    if moved and before is not None:
        notices.parked(conn, before, status, waiting_on, notice)
    return moved


def note_status(
    conn: Connection,
    run_id: str,
    status: RunStatus,
    *,
    waiting_on: str | None = None,
    notice: Mapping[str, Any] | None = None,
) -> None:
    """`set_status` (an unfinished run's), sent with the transaction's next statement or
    its commit: for a caller that does not ask whether it moved. A wait is notified as
    by `set_status`."""
    # The caller holds the run's lock (a durable pass): its row is read as it stands.
    before = _before_wait(conn, run_id, status, lock=False)
    if before is not None:  # its reads first: the writes below wait for the commit
        notices.parked(conn, before, status, waiting_on, notice)
    values = {"b_run_id": run_id, "b_status": status, "b_waiting_on": waiting_on}
    driver.later(conn, _SET_STATUS, values | {"b_now": utcnow()})


def _before_wait(conn: Connection, run_id: str, status: str, *, lock: bool) -> Row[Any] | None:
    """The run's row (`lock`: locked) before it is parked on a person: what it waited on
    before tells a new wait from the same one. None for any other status. Parking is
    rare: the read costs a round trip there alone."""
    if status not in notices.WAITS:
        return None
    # FOR NO KEY UPDATE, the lock the UPDATE takes anyway: a transaction that inserted a
    # row referring to the run (a question, a journal row) holds a key-share lock on it,
    # which FOR UPDATE would wait for (two parks of one run at once deadlocked on it).
    return conn.execute(_LOCK_NO_KEY if lock else _GET, {"run_id": run_id}).first()


_LOCK_NO_KEY = _GET.with_for_update(key_share=True)


_SET_STATUS_ANY = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"))
    .values(
        status=bindparam("b_status"),
        waiting_on=bindparam("b_waiting_on"),
        updated_at=bindparam("b_now"),
    )
)
_SET_STATUS = _SET_STATUS_ANY.where(~driver.among(runs.c.status, TERMINAL))


def finish_run(
    conn: Connection,
    run_id: str,
    status: Literal["completed", "failed", "cancelled"],
    *,
    output: str | None = None,
    error: str | None = None,
    error_type: str | None = None,
    run: Any = None,
) -> bool:
    """Record a run's end, once: the first writer wins, and writes the end's notification
    in this transaction (`notify/outbox.py`). `run`: the run's row or view, if the caller
    has it (its agent, actor and thread are read otherwise)."""
    now = utcnow()
    own_run(conn, run_id)
    values: dict[str, Any] = {"b_run_id": run_id, "b_status": status, "b_output": output}
    values |= {"b_error": error, "b_error_type": error_type, "b_now": now}
    if driver.rowcount(conn, _FINISH, values) != 1:
        return False
    notices.ended(conn, run_id, status, output=output, error=error, error_type=error_type, run=run)
    return True


_FINISH = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"), ~driver.among(runs.c.status, TERMINAL))
    .values(
        status=bindparam("b_status"),
        output=bindparam("b_output"),
        error=bindparam("b_error"),
        error_type=bindparam("b_error_type"),
        waiting_on=None,
        wake_at=None,
        updated_at=bindparam("b_now"),
        finished_at=bindparam("b_now"),
    )
)


def record_cancel(conn: Connection, run_id: str, cause: str, *, keep_inbox: bool) -> str | None:
    """Ask an unfinished run to stop, unless a cancel is already recorded: the first
    cause wins. Returns the run's thread id when this call recorded it, else None."""
    return conn.execute(
        update(runs)
        .where(
            runs.c.id == run_id,
            runs.c.status.not_in(TERMINAL),
            runs.c.cancel_cause.is_(None),
        )
        .values(cancel_cause=cause, cancel_keep_inbox=keep_inbox)
        .returning(runs.c.thread_id)
    ).scalar()


def record_pause(conn: Connection, run_id: str, actor: str) -> str | None:
    """Ask an unfinished run to pause at its next step boundary, unless a pause is asked
    for already. Returns the run's thread id when this call recorded it, else None."""
    return conn.execute(
        update(runs)
        .where(
            runs.c.id == run_id,
            runs.c.status.not_in(TERMINAL),
            runs.c.pause_requested_by.is_(None),
        )
        .values(pause_requested_by=actor, updated_at=utcnow())
        .returning(runs.c.thread_id)
    ).scalar()


def clear_pause(conn: Connection, run_id: str, status: RunStatus, waiting_on: str | None) -> bool:
    """Withdraw an unfinished run's pause, and give it back `status` and `waiting_on` (what
    it had before it paused, or has now if it did not pause yet)."""
    cleared = conn.execute(
        update(runs)
        .where(
            runs.c.id == run_id,
            runs.c.status.not_in(TERMINAL),
            runs.c.pause_requested_by.is_not(None),
        )
        .values(pause_requested_by=None, status=status, waiting_on=waiting_on, updated_at=utcnow())
    )
    return cleared.rowcount == 1


def reopen(conn: Connection, run_id: str) -> bool:
    """A failed run goes on (a person had its failed step run again): `running`, its
    error, output and end cleared."""
    reopened = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "failed")
        .values(
            status="running",
            output=None,
            error=None,
            error_type=None,
            waiting_on=None,
            finished_at=None,
            updated_at=utcnow(),
        )
    )
    return reopened.rowcount == 1


_SET_TRACE_CONTEXT = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"), runs.c.trace_context.is_(None))
    .values(trace_context=bindparam("b_context", type_=runs.c.trace_context.type))
)


def set_driver(conn: Connection, run_ids: Sequence[str], driver: str) -> None:
    """The process that drives these inline runs from now on (agent_jobs/processes.py)."""
    conn.execute(update(runs).where(runs.c.id.in_(list(run_ids))).values(driver=driver))


def note_trace_context(conn: Connection, run_id: str, context: dict[str, str]) -> None:
    """Give a run that has none its trace context, with the transaction's next statement
    or its commit."""
    driver.later(conn, _SET_TRACE_CONTEXT, {"b_run_id": run_id, "b_context": context})


def set_deadline(conn: Connection, run_id: str, deadline: datetime) -> None:
    conn.execute(update(runs).where(runs.c.id == run_id).values(deadline=deadline))


def touch(conn: Connection, run_id: str) -> None:
    conn.execute(update(runs).where(runs.c.id == run_id).values(updated_at=utcnow()))


def unfinished_of(conn: Connection, actor: str, runner: str) -> int:
    """How many runs of `actor` on `runner` have not ended."""
    query = (
        select(func.count())
        .select_from(runs)
        .where(runs.c.actor == actor, runs.c.runner == runner, runs.c.status.not_in(TERMINAL))
    )
    return int(conn.execute(query).scalar_one())


def list_runs(
    conn: Connection,
    *,
    limit: int = 50,
    status: str | None = None,
    thread_id: str | None = None,
    unfinished: bool = False,
) -> Sequence[Row[Any]]:
    query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id).limit(limit)
    if status is not None:
        query = query.where(runs.c.status == status)
    if thread_id is not None:
        query = query.where(runs.c.thread_id == thread_id)
    if unfinished:
        query = query.where(runs.c.status.not_in(TERMINAL))
    return conn.execute(query).all()


_REPLAYED = (journal.c.step, journal.c.seq, journal.c.state, journal.c.result, journal.c.error)


def unfinished_journals(
    conn: Connection, *, thread_id: str | None = None, chunk: int = 500
) -> Iterator[tuple[Row[Any], list[Any]]]:
    """Every unfinished run, oldest first, with its journal as a replay reads it (step,
    seq, state, result, error; in order): the drain query's input. The journals are
    read `chunk` runs at a time."""
    query = select(runs).where(runs.c.status.not_in(TERMINAL)).order_by(runs.c.created_at)
    if thread_id is not None:
        query = query.where(runs.c.thread_id == thread_id)
    found = conn.execute(query).all()
    for start in range(0, len(found), chunk):
        batch = found[start : start + chunk]
        by_run: dict[str, list[Any]] = {row.id: [] for row in batch}
        rows = conn.execute(
            select(journal.c.run_id, *_REPLAYED)
            .where(journal.c.run_id.in_(list(by_run)))
            .order_by(journal.c.run_id, journal.c.seq)
        ).all()
        for row in rows:
            by_run[row.run_id].append(row)
        for run in batch:
            yield run, by_run[run.id]


def active_run(conn: Connection, thread_id: str) -> Row[Any] | None:
    """The thread's unfinished top-level run, if any (the newest)."""
    return conn.execute(
        select(runs)
        .where(
            runs.c.thread_id == thread_id,
            runs.c.parent_run_id.is_(None),
            runs.c.status.not_in(TERMINAL),
        )
        .order_by(runs.c.created_at.desc())
        .limit(1)
    ).first()


def last_run(conn: Connection, thread_id: str) -> Row[Any] | None:
    """The thread's newest top-level run, finished or not."""
    return conn.execute(
        select(runs)
        .where(runs.c.thread_id == thread_id, runs.c.parent_run_id.is_(None))
        .order_by(runs.c.created_at.desc())
        .limit(1)
    ).first()


def stale_run_ids(conn: Connection, *, cutoff: datetime, now: datetime | None = None) -> list[str]:
    """The runs the sweep re-drives. A run is picked when it is

    - queued or running, and not updated since `cutoff` (its worker died, or its
      wake-up was lost), unless queued behind another of its key or thread;
    - parked (awaiting approval or answers), not updated since `cutoff`, with an
      `approval:*` or `answers:*` journal row done after the run's last update (the
      decision or the answers arrived, the wake-up did not);
    - sleeping, not updated since `cutoff`, with a message posted to its thread since
      (the wake-up was lost: the pass wakes it if the message is for its next step);
    - awaiting reconciliation, not updated since `cutoff`, with no `tool:*` row waiting
      (a person decided the call's outcome, or had it run again; the wake-up or the
      step's send did not arrive);
    - asked to cancel (`cancel_cause` set) but not finished, and not updated since
      `cutoff` (a cancel recorded while no wake-up could be sent, the broker down: a
      parked run would wait for ever);
    - overdue: past its deadline (at `now`, the current time by default) and not
      finished, however recently it was updated.
    """
    decided_waiting = exists().where(
        journal.c.run_id == runs.c.id,
        or_(*(journal.c.step.startswith(prefix) for prefix in HUMAN_WAITS)),
        journal.c.state == "done",
        journal.c.finished_at > runs.c.updated_at,
    )
    # A message posted to a sleeper since its last pass (`session.SPLICED`): the wake the
    # command sent was lost, or a process without the broker posted it.
    message_waiting = exists().where(
        events.c.thread_id == runs.c.thread_id,
        events.c.type == "agent/inbox/spliced",
        events.c.created_at > runs.c.updated_at,
    )
    reconcile_waiting = exists().where(
        journal.c.run_id == runs.c.id,
        journal.c.step.startswith("tool:"),
        journal.c.state == "waiting",
    )
    stale = and_(
        runs.c.updated_at < cutoff,
        or_(
            runs.c.status == "running",
            and_(runs.c.status == "queued", ~places.queued_behind()),
            and_(runs.c.status.in_(("awaiting_approval", "awaiting_answers")), decided_waiting),
            and_(runs.c.status == "awaiting_reconcile", ~reconcile_waiting),
            and_(runs.c.status == "sleeping", runs.c.runner == "durable", message_waiting),
            and_(runs.c.cancel_cause.is_not(None), runs.c.status.not_in(TERMINAL)),
        ),
    )
    overdue = and_(
        runs.c.deadline < (now if now is not None else utcnow()),
        runs.c.status.not_in(TERMINAL),
    )
    return list(conn.execute(select(runs.c.id).where(or_(stale, overdue))).scalars())


def run_tree_ids(conn: Connection, run_id: str) -> list[str]:
    """The run and all its descendants (delegated child runs)."""
    found = [run_id]
    frontier = [run_id]
    while frontier:
        children = conn.execute(
            select(runs.c.id).where(runs.c.parent_run_id.in_(frontier))
        ).scalars()
        frontier = [c for c in children if c not in found]
        found.extend(frontier)
    return found


def run_totals(conn: Connection, run_id: str) -> dict[str, Any]:
    """Token and cost totals of a run, its delegated children included; of the input
    tokens, how many the provider read from its prompt cache and wrote to it."""
    ids = run_tree_ids(conn, run_id)
    row = conn.execute(
        select(
            func.coalesce(func.sum(usage.c.input_tokens), 0),
            func.coalesce(func.sum(usage.c.output_tokens), 0),
            func.sum(usage.c.cost),
            func.count(),
            func.coalesce(func.sum(usage.c.cache_read_tokens), 0),
            func.coalesce(func.sum(usage.c.cache_write_tokens), 0),
        ).where(usage.c.run_id.in_(ids))
    ).one()
    return {
        "input_tokens": int(row[0]),
        "output_tokens": int(row[1]),
        "cost": float(row[2]) if row[2] is not None else None,
        "model_calls": int(row[3]),
        "cache_read_tokens": int(row[4]),
        "cache_write_tokens": int(row[5]),
    }


_PENDING_APPROVALS = (
    select(func.count())
    .select_from(tool_calls.join(runs, runs.c.id == tool_calls.c.run_id))
    .where(tool_calls.c.status == "pending_approval", runs.c.status.not_in(TERMINAL))
)


def pending_approvals(conn: Connection) -> int:
    """How many calls wait for a person's decision now: those `approvals pending` lists
    (a call of a run that has ended waits for no one)."""
    return int(conn.execute(_PENDING_APPROVALS).scalar() or 0)


def delegated_by_call(conn: Connection, run_id: str) -> dict[str, str]:
    """The runs `run_id` delegated to, by the call that started each: call id → run id."""
    found = conn.execute(
        select(runs.c.id, runs.c.metadata).where(runs.c.parent_run_id == run_id)
    ).all()
    return {
        str(row.metadata["parent_call_id"]): row.id
        for row in found
        if isinstance(row.metadata, Mapping) and row.metadata.get("parent_call_id")
    }
