"""The tick on both databases, its clock given: each occurrence one run with its id,
catch-up, pause and resume, run-now, ticks racing, and the daylight-saving days."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.schedules import tick as ticks
from agent_jobs.store import Store
from agent_jobs.store.listing import RunFilter
from agent_jobs.store.schema import runs, schedules

PARIS = "Europe/Paris"
GRACE = 60.0


class Sent:
    """A dispatcher that keeps what it was asked to send."""

    def __init__(self) -> None:
        self.coordinated: list[str] = []
        self._lock = threading.Lock()

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        with self._lock:
            self.coordinated.append(run_id)

    def steps(self, run_id: str, steps: Any, *, countdown: float | None = None) -> None:
        raise AssertionError("a tick sends no steps")


class Admitting(ticks.Dispatched):
    """A wake for `run_now`: `Dispatched` with an admission that refuses nothing."""

    def admission(self, request: object) -> AbstractContextManager[None]:
        return nullcontext()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def an_app(cron: str = "*/10 * * * *", catch_up: str = "latest", tz: str = "UTC") -> AgentApp:
    app = AgentApp()
    app.agent("reporter", model=ScriptedModel([{"text": "ok"}]))
    app.schedule(
        "report",
        agent="reporter",
        cron=cron,
        timezone=tz,
        input="the report",
        actor="ops",
        metadata={"team": "ops"},
        catch_up=catch_up,
    )
    return app


def tick(store: Store, app: AgentApp, now: str, sent: Sent | None = None) -> list[str]:
    starts = ticks.Dispatched(sent or Sent())  # type: ignore[arg-type]
    found = ticks.tick(store, app, starts, grace=GRACE, now=at(now))
    return [s.run_id for s in found if s.created]


def seen_from(store: Store, moment: str) -> None:
    """The schedule's row as if first seen at `moment`."""
    with store.begin() as conn:
        conn.execute(update(schedules).values(active_from=at(moment), last_occurrence=None))


def started(store: Store) -> list[str]:
    with store.connect() as conn:
        return sorted(conn.execute(select(runs.c.id).where(runs.c.id.like("sched:%"))).scalars())


def test_nothing_before_the_schedule_was_first_seen(store: Store) -> None:
    app = an_app()
    assert tick(store, app, "2026-12-05T10:05:00Z") == []
    assert started(store) == []
    with store.connect() as conn:
        [row] = conn.execute(select(schedules)).all()
    assert row.name == "report" and not row.paused and row.last_occurrence is None


def test_an_occurrence_starts_one_run_with_its_id(store: Store) -> None:
    app, sent = an_app(), Sent()
    tick(store, app, "2026-12-05T10:05:00Z")  # the row, first seen at 10:05
    seen_from(store, "2026-12-05T10:05:00Z")
    assert tick(store, app, "2026-12-05T10:09:59Z", sent) == []
    assert tick(store, app, "2026-12-05T10:10:00.4Z", sent) == ["sched:report:2026-12-05T10:10:00Z"]
    assert tick(store, app, "2026-12-05T10:10:01Z", sent) == []  # once
    assert sent.coordinated == ["sched:report:2026-12-05T10:10:00Z"]
    run = store.get_run("sched:report:2026-12-05T10:10:00Z")
    assert (run.agent, run.actor, run.input, run.status) == (
        "reporter",
        "ops",
        "the report",
        "queued",
    )
    assert run.metadata == {
        "team": "ops",
        "schedule": "report",
        "occurrence": "2026-12-05T10:10:00Z",
    }
    with store.connect() as conn:
        row = conn.execute(select(schedules)).one()
    assert row.last_run_id == "sched:report:2026-12-05T10:10:00Z"
    page = store.runs_page(RunFilter(schedule="report"), limit=10)
    assert [r.run_id for r in page.runs] == ["sched:report:2026-12-05T10:10:00Z"]
    assert store.runs_page(RunFilter(schedule="other"), limit=10).runs == []


def missed(store: Store, app: AgentApp, now: str) -> list[str]:
    """Down from 10:00 (the last started) to `now`: what the tick then starts."""
    tick(store, app, "2026-12-05T09:59:00Z")
    with store.begin() as conn:
        conn.execute(
            update(schedules).values(
                active_from=at("2026-12-05T09:00:00Z"), last_occurrence=at("2026-12-05T10:00:00Z")
            )
        )
    return tick(store, app, now)


def test_catch_up_all_starts_each_missed_occurrence(store: Store) -> None:
    app = an_app(catch_up="all")
    assert missed(store, app, "2026-12-05T10:45:00Z") == [
        "sched:report:2026-12-05T10:10:00Z",
        "sched:report:2026-12-05T10:20:00Z",
        "sched:report:2026-12-05T10:30:00Z",
        "sched:report:2026-12-05T10:40:00Z",
    ]


def test_catch_up_all_goes_a_batch_a_tick(store: Store, monkeypatch: Any) -> None:
    monkeypatch.setattr(ticks, "BATCH", 3)
    app = an_app(catch_up="all")
    first = missed(store, app, "2026-12-05T11:05:00Z")
    second = tick(store, app, "2026-12-05T11:05:01Z")
    assert len(first) == 3 and len(second) == 3
    assert first + second == [
        f"sched:report:2026-12-05T{t}:00Z"
        for t in ("10:10", "10:20", "10:30", "10:40", "10:50", "11:00")
    ]


def test_catch_up_latest_starts_the_newest_missed_only(store: Store) -> None:
    app = an_app(catch_up="latest")
    assert missed(store, app, "2026-12-05T10:45:00Z") == ["sched:report:2026-12-05T10:40:00Z"]
    assert tick(store, app, "2026-12-05T10:49:00Z") == []
    assert tick(store, app, "2026-12-05T10:50:00Z") == ["sched:report:2026-12-05T10:50:00Z"]


def test_catch_up_none_skips_what_was_missed(store: Store) -> None:
    app = an_app(catch_up="none")
    # 10:40 was 5 minutes ago, more than the grace: missed, skipped.
    assert missed(store, app, "2026-12-05T10:45:00Z") == []
    assert tick(store, app, "2026-12-05T10:46:00Z") == []
    # The next one, on time (30 s late, within the grace), starts.
    assert tick(store, app, "2026-12-05T10:50:30Z") == ["sched:report:2026-12-05T10:50:00Z"]
    assert started(store) == ["sched:report:2026-12-05T10:50:00Z"]


def test_a_paused_schedule_starts_nothing_and_skips_its_pause(store: Store) -> None:
    app = an_app(catch_up="all")
    tick(store, app, "2026-12-05T10:05:00Z")
    seen_from(store, "2026-12-05T10:05:00Z")
    assert ticks.set_paused(store, app, "report", True)
    assert not ticks.set_paused(store, app, "report", True)  # already
    assert tick(store, app, "2026-12-05T10:35:00Z") == []
    assert ticks.set_paused(store, app, "report", False)
    # Resumed now (the real clock, after all of these): the pause's occurrences are not due.
    assert tick(store, app, "2026-12-05T10:36:00Z") == []
    assert started(store) == []


def test_run_now_starts_a_run_of_its_own(store: Store) -> None:
    app, sent = an_app(), Sent()

    found = ticks.run_now(store, app, Admitting(sent), "report")  # type: ignore[arg-type]
    assert found.created and found.run_id.startswith("sched:report:now:")
    assert sent.coordinated == [found.run_id]
    run = store.get_run(found.run_id)
    assert run.metadata == {"team": "ops", "schedule": "report"}
    with store.connect() as conn:
        assert conn.execute(select(schedules)).all() == []  # no occurrence moved


def test_ticks_racing_start_one_run_per_occurrence(store: Store) -> None:
    app, sent = an_app(cron="* * * * *", catch_up="all"), Sent()
    tick(store, app, "2026-12-05T10:00:30Z")
    seen_from(store, "2026-12-05T10:00:30Z")
    barrier = threading.Barrier(4)
    made: list[list[str]] = []

    def racer() -> None:
        barrier.wait()
        made.append(tick(store, app, "2026-12-05T10:05:00Z", sent))

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [f"sched:report:2026-12-05T10:0{m}:00Z" for m in range(1, 6)]
    assert sorted(run for found in made for run in found) == expected
    assert sorted(sent.coordinated) == expected
    assert started(store) == expected


def ticked_through(store: Store, app: AgentApp, start: str, hours: int, every: int) -> list[str]:
    """Tick every `every` seconds for `hours` hours from `start`."""
    tick(store, app, start)
    seen_from(store, start)
    moment, end = at(start), at(start) + timedelta(hours=hours)
    while moment <= end:
        tick(store, app, moment.isoformat())
        moment += timedelta(seconds=every)
    return started(store)


def test_a_job_in_the_skipped_hour_runs_once_that_day(store: Store) -> None:
    app = an_app(cron="30 2 * * *", catch_up="latest", tz=PARIS)
    # 2026-03-28 23:00 to 2026-03-29 23:00 UTC, the whole local day, a tick every 5 min.
    found = ticked_through(store, app, "2026-03-28T22:00:00+00:00", 25, 300)
    assert found == ["sched:report:2026-03-29T01:00:00Z"]  # at the jump, 03:00 CEST


def test_a_job_in_the_repeated_hour_runs_once_that_day(store: Store) -> None:
    app = an_app(cron="30 2 * * *", catch_up="all", tz=PARIS)
    found = ticked_through(store, app, "2026-10-24T22:00:00+00:00", 26, 300)
    assert found == ["sched:report:2026-10-25T00:30:00Z"]  # 02:30 CEST, the first
