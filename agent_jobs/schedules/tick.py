"""A tick: start the runs of the schedules' due occurrences, each exactly once.

For each schedule, one transaction: lock its row (`store/schedules.py`, written on first
sight: occurrences before that are not due), pick the due occurrences as its `catch_up`
says, write their runs (`sched:<name>:<occurrence>`, found when already there), move the
row on, commit; then wake the runner for the runs written. Two ticks at once (two beats,
two workers) take turns on the row, and the second finds nothing left; a tick that dies
before its commit leaves the row and the runs as they were, for the next; one whose
commit went through but whose answer was lost (a Postgres restart) finds the runs there.
Nothing here depends on Redis: a wake that is lost leaves a queued run to the sweep.

Due occurrences are those after the newest started (or after the row's `active_from`)
and up to now. `catch_up` decides between them: "all" starts each (at most `BATCH` a
tick, the rest on the next ones), "latest" the newest only, "none" the newest only if it
is on time (at most `schedule_grace` seconds ago), else none.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from ..app import AgentApp
from ..commands import Wake
from ..dispatch import Dispatcher
from ..errors import AgentJobsError, UnknownScheduleError
from ..runs import RunRequest, admit_in
from ..store import Store
from ..store import schedules as rows
from ..store.db import utcnow
from ..store.runs import RunStatus
from .spec import Schedule

log = logging.getLogger(__name__)

TASK = "agent_jobs.schedules"  # the Celery task beat runs a tick as
BATCH = 100  # occurrences one tick starts for one schedule, at most


class Starts(Protocol):
    """What a tick needs of a runner (a `Wake` is one): the runner and status its new
    runs are written with, and how one written is set going."""

    @property
    def runner(self) -> Literal["durable", "inline"]: ...

    @property
    def new_status(self) -> RunStatus: ...

    def started(self, run_id: str) -> None: ...


@dataclass(frozen=True)
class Dispatched:
    """A durable worker's `Starts`: a run written is sent a `coordinate` (a send that
    fails is sent again in the background; a lost one leaves the run to the sweep)."""

    dispatcher: Dispatcher
    runner: Literal["durable", "inline"] = "durable"
    new_status: RunStatus = "queued"

    def started(self, run_id: str) -> None:
        self.dispatcher.coordinate(run_id)


@dataclass(frozen=True)
class Started:
    """A run a schedule started (`created` False: it was there already)."""

    schedule: str
    run_id: str
    occurrence: datetime | None
    created: bool


def utc(moment: datetime) -> datetime:
    """A stored instant in UTC (SQLite gives it back without its zone)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def due(
    schedule: Schedule,
    *,
    after: datetime,
    now: datetime,
    grace: float,
) -> tuple[list[datetime], datetime | None]:
    """The occurrences to start, and the instant up to which the others are skipped."""
    if schedule.catch_up == "all":
        return schedule.cron.between(after, now, BATCH), None
    latest = schedule.cron.latest(after, now)
    if latest is None:
        return [], None
    if schedule.catch_up == "latest" or now - latest <= timedelta(seconds=grace):
        return [latest], None
    return [], latest  # "none": it was missed


def tick(
    store: Store, app: AgentApp, wake: Starts, *, grace: float, now: datetime | None = None
) -> list[Started]:
    """Start what is due of every schedule of `app`; a schedule that fails is logged and
    left to the next tick. One read of every row first: only a schedule with something
    due (or no row yet) takes its lock, so an idle tick costs one query."""
    found: list[Started] = []
    try:
        with store.connect() as conn:
            seen = rows.get_all(conn, list(app.schedules))
    except Exception:
        log.exception("schedules: this tick failed to read them; the next one tries again")
        return found
    for schedule in list(app.schedules.values()):
        row = seen.get(schedule.name)
        if row is not None and not _maybe_due(schedule, row, now or utcnow(), grace):
            continue
        try:
            found.extend(tick_one(store, app, wake, schedule, grace=grace, now=now))
        except Exception:
            log.exception("schedule %s: this tick failed; the next one tries again", schedule.name)
    return found


def _after(row: Any) -> datetime:
    """The instant after which the row's occurrences are due."""
    after = utc(row.active_from)
    if row.last_occurrence is not None:
        after = max(after, utc(row.last_occurrence))
    return after


def _maybe_due(schedule: Schedule, row: Any, now: datetime, grace: float) -> bool:
    """Whether the row, as read without its lock, has anything to start or skip."""
    if row.paused:
        return False
    occurrences, skip_to = due(schedule, after=_after(row), now=now, grace=grace)
    return bool(occurrences) or skip_to is not None


def tick_one(
    store: Store,
    app: AgentApp,
    wake: Starts,
    schedule: Schedule,
    *,
    grace: float,
    now: datetime | None = None,
) -> list[Started]:
    """Start what is due of one schedule (see the module's docstring)."""
    found: list[Started] = []
    with store.begin() as conn:
        row = rows.lock(conn, schedule.name)
        if row.paused:
            return []
        now = now or utcnow()
        occurrences, skip_to = due(schedule, after=_after(row), now=now, grace=grace)
        for occurrence in occurrences:
            run_id = schedule.run_id(occurrence)
            created = admit_in(
                conn,
                app,
                request(schedule, run_id, occurrence),
                run_id=run_id,
                runner=wake.runner,
                status=wake.new_status,
            )
            rows.started(conn, schedule.name, occurrence, run_id)
            found.append(Started(schedule.name, run_id, occurrence, created))
        if skip_to is not None:
            rows.skipped_to(conn, schedule.name, skip_to)
            log.info("schedule %s: skipped what was missed up to %s", schedule.name, skip_to)
    _wake(wake, found)
    return found


def request(schedule: Schedule, run_id: str, occurrence: datetime | None) -> RunRequest:
    return RunRequest.of(
        schedule.agent,
        schedule.input,
        actor=schedule.actor,
        run_id=run_id,
        metadata=schedule.run_metadata(occurrence),
    )


def _wake(wake: Starts, found: Sequence[Started]) -> None:
    for started in found:
        if started.created:
            try:
                wake.started(started.run_id)
            except AgentJobsError as exc:  # recorded: the sweep starts it
                log.warning("run %s: not started at once (%s)", started.run_id, exc)


# --- commands --------------------------------------------------------------------------


def lookup(app: AgentApp, name: str) -> Schedule:
    """The app's schedule `name`; `UnknownScheduleError` if it has none by that name."""
    try:
        return app.schedules[name]
    except KeyError:
        raise UnknownScheduleError(name, list(app.schedules)) from None


def set_paused(store: Store, app: AgentApp, name: str, paused: bool) -> bool:
    """Pause or resume a schedule; True when that changed it. Occurrences while it was
    paused are skipped, whatever its `catch_up`."""
    lookup(app, name)
    with store.begin() as conn:
        return rows.set_paused(conn, name, paused)


def run_now(store: Store, app: AgentApp, wake: Wake, name: str) -> Started:
    """Start a run of the schedule now, paused or not: `sched:<name>:now:<UTC time>`.
    It is no occurrence: the schedule's own go on as before."""
    schedule = lookup(app, name)
    now = utcnow()
    run_id = schedule.run_now_id(now)
    with wake.admission(None), store.begin() as conn:
        created = admit_in(
            conn,
            app,
            request(schedule, run_id, None),
            run_id=run_id,
            runner=wake.runner,
            status=wake.new_status,
        )
    started = Started(schedule.name, run_id, None, created)
    _wake(wake, [started])
    return started
