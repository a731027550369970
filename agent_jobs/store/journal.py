"""The journal: one row per checkpointed step, keyed by run and step name."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, Literal, Self

from sqlalchemy import (
    Connection,
    Integer,
    bindparam,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
    update,
)

from ..checkpoints import model_prefix
from ..encryption.keyring import note_actor, own_run, owns
from . import driver
from . import events as event_rows
from . import runs as run_rows
from .db import insert_unless_exists, this_process, utcnow
from .events import PendingEvent
from .holds import FENCED, IN_FLIGHT
from .model_requests import expand, is_model_turn
from .payloads import Codecs, stored
from .schema import journal, runs

StepState = Literal["scheduled", "started", "done", "failed", "waiting"]


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """A journal row as a replay reads it (`load_for_replay`): the step's name and
    position, its state, and its outcome. A runner's own rows, written while it drives
    the loop, are kept in this shape too (runners/cursor.py)."""

    step: str
    seq: int
    state: str  # a StepState, or `pruned` (store/retention.py)
    result: Any = None
    error: str | None = None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> ReplayRow:
        """The row of a result's `_mapping`, or of a dict of `row()`."""
        return cls(m["step"], m["seq"], m["state"], m["result"], m["error"])


@dataclass(frozen=True, slots=True)
class JournalRow:
    """A journal row, every column (`load`, `get`, `in_flight`, `stranded`)."""

    run_id: str
    step: str
    seq: int
    state: str  # a StepState, or `pruned` (store/retention.py)
    intent: Any  # as journaled: a model step's may hold only what changed since the last
    result: Any
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    lease_until: datetime | None  # a started remote step is its worker's until then
    finished_at: datetime | None
    holder: str | None  # the process that claimed the step in the pass that scheduled it
    not_before: datetime | None  # held back until then
    fence: int  # the step's epoch (store/holds.py)
    worker: str | None  # the worker process that ran the step

    @classmethod
    def from_row(cls, row: Any) -> Self:
        """The row of a query that selects the class's columns, and nothing else."""
        return cls(**row._mapping)

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (the values themselves, not copies)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass(frozen=True, slots=True)
class JournalRowWithRun(JournalRow):
    """A step's row with what a step task reads of its run (`get_with_run`)."""

    run_status: str
    run_actor: str
    root_run_id: str
    thread_id: str
    run_created_at: datetime


def load(conn: Connection, run_id: str) -> list[JournalRow]:
    """The run's whole journal in one query, in the order the loop asked for it."""
    found = conn.execute(
        select(journal).where(journal.c.run_id == run_id).order_by(journal.c.seq)
    ).all()
    return [JournalRow.from_row(row) for row in found]


# Built once: a replay runs this on every pass, and building a statement costs more
# than running it. The intents stay behind: a replay needs only names and results.
_REPLAY = (
    select(journal.c.step, journal.c.seq, journal.c.state, journal.c.result, journal.c.error)
    .where(journal.c.run_id == bindparam("run_id"), journal.c.seq > bindparam("after"))
    .order_by(journal.c.seq)
)


def load_for_replay(conn: Connection, run_id: str, *, after: int = 0) -> list[ReplayRow]:
    """What a replay needs of the run's journal, in one query: the rows after position
    `after` (a replay that knows the rows up to there)."""
    return _replayed(driver.rows(conn, _REPLAY, {"run_id": run_id, "after": after}))


def _replayed(rows: Sequence[Any]) -> list[ReplayRow]:
    return [ReplayRow.from_mapping(row._mapping) for row in rows]


def get(conn: Connection, run_id: str, step: str) -> JournalRow | None:
    found = conn.execute(
        select(journal).where(journal.c.run_id == run_id, journal.c.step == step)
    ).first()
    return None if found is None else JournalRow.from_row(found)


def insert_done(
    conn: Connection,
    *,
    run_id: str,
    step: str,
    seq: int,
    intent: Any,
    result: Any,
    started_at: datetime | None = None,
) -> None:
    """Record a step that ran in this transaction. A plain INSERT: the run's row lock
    serialises its writers, so a row already there is a bug that must fail loudly."""
    owns(conn, run_id)
    values = row(run_id=run_id, step=step, seq=seq, state="done", intent=intent, result=result)
    if started_at is not None:
        values["created_at"] = values["started_at"] = started_at
    conn.execute(_INSERT, values)


def insert_pending(
    conn: Connection, *, run_id: str, step: str, seq: int, intent: Any, state: StepState
) -> bool:
    """Insert a `scheduled` (or `waiting`) row unless it exists; True when inserted."""
    owns(conn, run_id)
    values = {
        "run_id": run_id,
        "step": step,
        "seq": seq,
        "state": state,
        "intent": intent,
        "attempts": 0,
        "created_at": utcnow(),
    }
    return insert_unless_exists(conn, journal, values)


_WITH_RUN = (
    select(
        journal,
        runs.c.status.label("run_status"),
        runs.c.actor.label("run_actor"),
        runs.c.root_run_id,
        runs.c.thread_id,
        runs.c.created_at.label("run_created_at"),
    )
    .join(runs, runs.c.id == journal.c.run_id)
    .where(journal.c.run_id == bindparam("run_id"), journal.c.step == bindparam("step"))
)


def _due(now: datetime) -> Any:
    """A step not held back (`hold`), or whose moment has come."""
    return or_(journal.c.not_before.is_(None), journal.c.not_before <= now)


def get_with_run(conn: Connection, run_id: str, step: str) -> JournalRowWithRun | None:
    """A step's row with its run's status and top-level run, in one query."""
    found = driver.first(conn, _WITH_RUN, {"run_id": run_id, "step": step})
    if found is None:
        return None
    note_actor(run_id, found.run_actor)  # the owner of the step's outcome, when written
    return JournalRowWithRun.from_row(found)


def get_with_whole_intent(
    conn: Connection,
    run_id: str,
    step: str,
    known: Callable[[datetime], tuple[str, Any] | None] = lambda created_at: None,
) -> JournalRowWithRun | None:
    """`get_with_run`, a model step's intent whole: journaled against the run's model
    step before it (runners/model_requests.py), it is the one `known(run's creation
    time)` gives as (step, whole intent) if that is this step (this process scheduled
    it), or completed from it if it is the step before; else from the run's earlier
    model intents, read in one more query."""
    row = get_with_run(conn, run_id, step)
    if row is None or not (isinstance(row.intent, dict) and "since" in row.intent):
        return row
    base = known(row.run_created_at)
    if base is not None and base[0] == step:
        whole = base[1]
    elif base is not None and base[0] == row.intent["since"]["step"]:
        whole = expand(row.intent, {base[0]: base[1]}.get)
    else:
        whole = expand(row.intent, _model_intents(conn, run_id, before=row.seq).get)
    return replace(row, intent=whole)


def whole_model_intent(conn: Connection, run_id: str, step: str) -> Any | None:
    """A model step's intent, whole, from the run's model intents as journaled."""
    intents = _model_intents(conn, run_id)
    return expand(intents[step], intents.get) if step in intents else None


def _model_intents(conn: Connection, run_id: str, *, before: int | None = None) -> dict[str, Any]:
    values = {"run_id": run_id, "before": before if before is not None else 2**31 - 1}
    found = driver.rows(conn, _MODEL_INTENTS, values)
    return {row.step: row.intent for row in found if is_model_turn(row.intent)}


# By the steps' names, not by the intents' `type`: a payload is looked at once decoded
# (agent_jobs/store/payloads.py), never inside the database.
_MODEL_INTENTS = select(journal.c.step, journal.c.intent).where(
    journal.c.run_id == bindparam("run_id"),
    journal.c.step.like(literal_column(f"'{model_prefix()}%'")),
    journal.c.seq < bindparam("before"),
)


def stranded(conn: Connection, run_id: str, *, older_than: datetime) -> list[JournalRow]:
    """Remote steps of a run nobody is working on: scheduled long ago, or lease expired;
    not held back (`hold`)."""
    now = utcnow()
    found = conn.execute(
        select(journal).where(
            journal.c.run_id == run_id,
            journal.c.state.in_(("scheduled", "started")),
            journal.c.created_at < older_than,
            or_(journal.c.lease_until.is_(None), journal.c.lease_until < now),
            _due(now),
        )
    ).all()
    return [JournalRow.from_row(row) for row in found]


def in_flight(conn: Connection, run_id: str) -> list[JournalRow]:
    """The run's remote steps scheduled or started, not yet done or failed; not those
    held back until later (`hold`): a delivery is on its way for then."""
    found = conn.execute(
        select(journal).where(
            journal.c.run_id == run_id,
            journal.c.state.in_(("scheduled", "started")),
            _due(utcnow()),
        )
    ).all()
    return [JournalRow.from_row(row) for row in found]


def complete(
    conn: Connection,
    run_id: str,
    step: str,
    *,
    state: Literal["done", "failed"],
    result: Any = None,
    error: str | None = None,
    attempts: int | None = None,
    started_at: datetime | None = None,
    fence: int | None = None,
) -> bool:
    """Write a step's outcome; the first writer wins, and with `fence` only while the
    step's epoch is that one (its holder was not let go of meanwhile)."""
    owns(conn, run_id)
    values = _outcome(run_id, step, state, result, error, attempts, started_at, fence)
    return driver.rowcount(conn, _COMPLETE, values) == 1


def complete_and_load(
    conn: Connection,
    run_id: str,
    step: str,
    *,
    state: Literal["done", "failed"],
    result: Any = None,
    error: str | None = None,
    attempts: int | None = None,
    started_at: datetime | None = None,
    fence: int | None = None,
    after: int = 0,
) -> list[ReplayRow]:
    """`complete`, then `load_for_replay` (from `after`): on Postgres in one statement
    (the outcome's row as written, the others as they were), the two in a row on SQLite.
    A completed step is in flight until now, so it is after any position whose rows
    (and those before it) the replay knows to be final."""
    owns(conn, run_id)
    values = _outcome(run_id, step, state, result, error, attempts, started_at, fence)
    if conn.dialect.name != "postgresql":
        conn.execute(_COMPLETE, values)
        return load_for_replay(conn, run_id, after=after)
    return _replayed(driver.rows(conn, _COMPLETE_AND_REPLAY, values | {"after": after}))


def lock_and_load(
    conn: Connection,
    run_id: str,
    *,
    after: int,
    outcome: dict[str, Any] | None = None,
    inbox: Sequence[str] | None = None,
) -> tuple[Any | None, list[ReplayRow], Sequence[Any] | None]:
    """The run's row, locked and touched (`runs.lock_and_touch`), and its journal after
    position `after` with `outcome` written first if given (`complete_and_load`'s
    arguments after the run, as `step` and the rest); and, with `inbox` (event types),
    its thread's events of those types (else None): on Postgres in one round trip, the
    lock taken before the outcome is written. An unknown run gives (None, [], None)."""
    if conn.dialect.name != "postgresql":
        run = run_rows.lock_and_touch(conn, run_id)  # its actor owns what is written
        if run is None:
            return None, [], None
        if outcome is None:
            return run, load_for_replay(conn, run_id, after=after), None
        return run, complete_and_load(conn, run_id, after=after, **outcome), None
    own_run(conn, run_id)  # the outcome is written with the lock: its owner known before
    read: tuple[Any, dict[str, Any]]
    if outcome is None:
        read = (_REPLAY, {"run_id": run_id, "after": after})
    else:
        values = _outcome(run_id, **outcome)
        read = (_COMPLETE_AND_REPLAY, values | {"after": after})
    statements = [run_rows.lock_statement(conn, run_id), read]
    if inbox is not None:
        statements.append(event_rows.of_runs_thread(run_id, inbox))
    locked, rows, *events = driver.batch(conn, statements)
    if not locked:
        return None, [], None
    return locked[0], _replayed(rows), events[0] if events else None


def _outcome(
    run_id: str,
    step: str,
    state: str,
    result: Any = None,
    error: str | None = None,
    attempts: int | None = None,
    started_at: datetime | None = None,
    fence: int | None = None,
) -> dict[str, Any]:
    now = utcnow()
    return {
        "b_fence": fence,
        "b_run_id": run_id,
        "b_step": step,
        "b_state": state,
        "b_result": result,
        "b_error": error,
        "b_finished_at": now,
        "b_attempts": attempts,
        "b_started_at": started_at,
        "b_worker": this_process(),
    }


_COMPLETE = (
    update(journal)
    .where(
        journal.c.run_id == bindparam("b_run_id"),
        journal.c.step == bindparam("b_step"),
        driver.among(journal.c.state, (*IN_FLIGHT, "waiting")),
        FENCED,
    )
    .values(
        state=bindparam("b_state"),
        result=bindparam("b_result", type_=journal.c.result.type),
        error=bindparam("b_error"),
        finished_at=bindparam("b_finished_at"),
        attempts=func.coalesce(bindparam("b_attempts", type_=Integer), journal.c.attempts),
        started_at=func.coalesce(
            bindparam("b_started_at", type_=journal.c.started_at.type), journal.c.started_at
        ),
        worker=bindparam("b_worker"),
    )
)

_REPLAYED = (journal.c.step, journal.c.seq, journal.c.state, journal.c.result, journal.c.error)
_DONE = _COMPLETE.returning(*_REPLAYED).cte("done")
_COMPLETE_AND_REPLAY = (
    select(*_REPLAYED)
    .where(
        journal.c.run_id == bindparam("b_run_id"),
        journal.c.seq > bindparam("after"),
        journal.c.step.not_in(select(_DONE.c.step)),
    )
    .union_all(select(_DONE.c.step, _DONE.c.seq, _DONE.c.state, _DONE.c.result, _DONE.c.error))
    .order_by("seq")
)

_INSERT = insert(journal)


def insert_many(
    conn: Connection, rows: list[dict[str, Any]], events: Sequence[PendingEvent] = ()
) -> None:
    """Insert the rows a coordinator pass produced, in one statement, and append the
    pass's `events` (on Postgres in that same statement). A plain INSERT, like
    `insert_done`: the pass holds the run's row lock and inserts only steps its replay
    did not find, so a conflict is a bug, never a race to swallow."""
    if rows:
        owns(conn, rows[0]["run_id"])  # a pass's rows are its run's
    if not rows or conn.dialect.name != "postgresql":
        if rows:
            conn.execute(_INSERT, rows)
        event_rows.append(conn, events)
        return
    driver.CONNECTION.set(conn)  # the codecs' connection (store/blobs.py)
    if Codecs.installed:  # the document's values reach no column type: encoded here
        rows = [r | {"intent": stored(r["intent"]), "result": stored(r["result"])} for r in rows]
    params = {"journal_rows": json.dumps(rows, default=_json_default, ensure_ascii=False)}
    if events:
        event_rows.append(conn, events, before=(_INSERT_RECORDS_CTE, params))
    else:
        driver.later(conn, _INSERT_RECORDS, params)


# Postgres: the rows as one JSON document, typed by the table's own row type (one
# statement, one parameter, whatever the number of rows).
_RECORDS = "jsonb_populate_recordset(NULL::journal, CAST(:journal_rows AS jsonb))"
_INSERT_RECORDS = text(f"INSERT INTO journal SELECT * FROM {_RECORDS}")
_INSERT_RECORDS_CTE = f"new_steps AS (INSERT INTO journal SELECT * FROM {_RECORDS})"


def _json_default(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a journal value")


def row(
    *,
    run_id: str,
    step: str,
    seq: int,
    state: StepState,
    intent: Any,
    result: Any = None,
) -> dict[str, Any]:
    """A journal row as `insert_many` (and `insert_done`) take it."""
    now = utcnow()
    done = state == "done"
    return {
        "run_id": run_id,
        "step": step,
        "seq": seq,
        "state": state,
        "intent": intent,
        "result": result,
        "error": None,
        "attempts": 1 if done else 0,
        "created_at": now,
        "started_at": now if done else None,
        "lease_until": None,
        "finished_at": now if done else None,
        "holder": None,
        "not_before": None,
        "fence": 0,
        "worker": this_process() if done else None,
    }
