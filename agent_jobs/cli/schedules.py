"""`agent-jobs schedules list | pause NAME | resume NAME | run-now NAME`.

Schedules are defined in code (`app.schedule`); their state (paused, the newest
occurrence started) is in the database, where beat's tick (or the embedded default's)
reads it. `run-now` starts a run `sched:<name>:now:<UTC time>` at once: with
`AGENT_JOBS_BROKER_URL` set the workers drive it; without it, this process does and
follows it to its end, as `agent-jobs run` does. Exit codes: 2 for an unknown schedule;
a run driven here exits 0 when it completes and 1 otherwise.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from ..app import AgentApp
from ..schedules import Schedule
from ..schedules import tick as schedule_tick
from ..schedules.cron import run_time
from ..store import Store
from ..store import schedules as rows
from ..store.db import utcnow
from .common import handle_errors, out, print_json
from .controls import _client, _finish, _inline
from .text import visible

AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group()
def schedules() -> None:
    """The app's schedules: list them, pause and resume them, start one's run now."""


@schedules.command("list")
@AS_JSON
@handle_errors
def list_schedules(as_json: bool) -> None:
    """Each schedule: its agent, cron and time zone, catch-up, whether it is paused, the
    newest occurrence started and the next one."""
    client = _client()
    listed = described(client.store, client.app)
    if as_json:
        print_json({"schedules": listed})
        return
    if not listed:
        out.print("this app defines no schedules (app.schedule)")
        return
    for item in listed:
        state = "paused" if item["paused"] else "active"
        out.print(
            visible(
                f"{item['name']}  {state}  agent={item['agent']}  cron={item['cron']!r} "
                f"{item['timezone']}  catch_up={item['catch_up']}  "
                f"last={item['last_occurrence'] or '-'} ({item['last_run_id'] or '-'})  "
                f"next={item['next_occurrence'] or '-'}"
            )
        )


def described(store: Store, app: AgentApp, now: datetime | None = None) -> list[dict[str, Any]]:
    """The app's schedules with their state, by name."""
    now = now or utcnow()
    with store.connect() as conn:
        found = rows.get_all(conn, list(app.schedules))
    return [_describe(found, schedule, now) for _, schedule in sorted(app.schedules.items())]


def _describe(found: dict[str, Any], schedule: Schedule, now: datetime) -> dict[str, Any]:
    row = found.get(schedule.name)
    last = schedule_tick.utc(row.last_occurrence) if row and row.last_occurrence else None
    paused = bool(row.paused) if row is not None else False
    return {
        "name": schedule.name,
        "agent": schedule.agent,
        "cron": schedule.cron.expression,
        "timezone": schedule.cron.timezone,
        "catch_up": schedule.catch_up,
        "actor": schedule.actor,
        "paused": paused,
        "last_occurrence": run_time(last) if last else None,
        "last_run_id": row.last_run_id if row is not None else None,
        "next_occurrence": None if paused else run_time(schedule.cron.next_after(now)),
    }


@schedules.command()
@click.argument("name")
@AS_JSON
@handle_errors
def pause(name: str, as_json: bool) -> None:
    """Start no more runs of schedule NAME until it is resumed (runs going on go on)."""
    client = _client()
    changed = schedule_tick.set_paused(client.store, client.app, name, True)
    _said(name, "paused", changed, as_json)


@schedules.command()
@click.argument("name")
@AS_JSON
@handle_errors
def resume(name: str, as_json: bool) -> None:
    """Start schedule NAME's runs again, from its next occurrence: those of the pause
    are skipped, whatever its catch_up."""
    client = _client()
    changed = schedule_tick.set_paused(client.store, client.app, name, False)
    _said(name, "resumed", changed, as_json)


def _said(name: str, what: str, changed: bool, as_json: bool) -> None:
    if as_json:
        print_json({"schedule": name, what: True, "changed": changed})
    else:
        out.print(visible(f"schedule {name} {what}" + ("" if changed else " (it was already)")))


@schedules.command("run-now")
@click.argument("name")
@AS_JSON
@handle_errors
def run_now(name: str, as_json: bool) -> None:
    """Start a run of schedule NAME now (paused or not), named `sched:NAME:now:<UTC
    time>`; the schedule's own occurrences are not moved."""
    runner = _inline()
    if runner is not None:
        started = schedule_tick.run_now(runner.store, runner.app, runner.wake, name)
    else:
        client = _client()
        started = schedule_tick.run_now(client.store, client.app, client.waker, name)
    answer = {"schedule": name, "run_id": started.run_id, "created": started.created}
    if not as_json:
        again = "" if started.created else " (started already this second)"
        out.print(visible(f"schedule {name}: run {started.run_id}{again}"))
    if runner is None or not started.created:  # the workers drive it, or it was there
        if as_json:
            print_json(answer)
        return
    _finish(runner, started.run_id, answer, as_json)
