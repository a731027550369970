"""Cron expressions in a time zone: occurrences as instants, daylight-saving changes, and
definitions refused with a `ScheduleError`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.errors import ScheduleError
from agent_jobs.schedules import Cron
from agent_jobs.schedules.cron import run_time

PARIS = "Europe/Paris"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def times(found: list[datetime]) -> list[str]:
    return [run_time(moment) for moment in found]


def test_a_weekday_cron_in_paris_names_utc_instants() -> None:
    cron = Cron("0 9 * * 1-5", PARIS)
    # Friday 2026-12-04 to Tuesday 2026-12-08: winter time, UTC+1; the weekend skipped.
    found = cron.between(at("2026-12-04T00:00:00Z"), at("2026-12-08T23:00:00Z"), 10)
    assert times(found) == [
        "2026-12-04T08:00:00Z",
        "2026-12-07T08:00:00Z",
        "2026-12-08T08:00:00Z",
    ]


def test_six_fields_count_seconds() -> None:
    cron = Cron("* * * * * */5", "UTC")
    found = cron.between(at("2026-12-05T10:00:01Z"), at("2026-12-05T10:00:20Z"), 10)
    assert times(found) == [
        "2026-12-05T10:00:05Z",
        "2026-12-05T10:00:10Z",
        "2026-12-05T10:00:15Z",
        "2026-12-05T10:00:20Z",
    ]


def test_between_is_after_start_up_to_end_and_bounded() -> None:
    cron = Cron("* * * * *", "UTC")
    start = at("2026-12-05T10:00:00Z")
    assert times(cron.between(start, start + timedelta(minutes=2), 10)) == [
        "2026-12-05T10:01:00Z",
        "2026-12-05T10:02:00Z",
    ]
    assert len(cron.between(start, start + timedelta(days=1), 7)) == 7


def test_latest_is_the_newest_in_the_window() -> None:
    cron = Cron("*/15 * * * *", "UTC")
    start = at("2026-12-05T10:00:00Z")
    assert run_time(cron.latest(start, at("2026-12-05T11:20:00Z"))) == "2026-12-05T11:15:00Z"
    assert run_time(cron.latest(start, at("2026-12-05T11:15:00Z"))) == "2026-12-05T11:15:00Z"
    assert cron.latest(start, at("2026-12-05T10:14:59Z")) is None


# --- daylight-saving changes (Europe/Paris, 2026) ------------------------------------------


def test_a_time_the_clocks_skip_runs_once_at_the_jump() -> None:
    """2026-03-29: the clocks go from 02:00 CET to 03:00 CEST. 02:30 does not exist that
    day: the daily 02:30 job runs once, at the jump (01:00 UTC), late, not lost."""
    cron = Cron("30 2 * * *", PARIS)
    found = cron.between(at("2026-03-27T12:00:00Z"), at("2026-03-30T12:00:00Z"), 10)
    assert times(found) == [
        "2026-03-28T01:30:00Z",  # 02:30 CET
        "2026-03-29T01:00:00Z",  # the jump: 03:00 CEST
        "2026-03-30T00:30:00Z",  # 02:30 CEST
    ]


def test_times_of_a_skipped_hour_are_one_occurrence() -> None:
    """Every quarter hour across the jump: 02:00 to 02:45 do not exist, and with 03:00 they
    are one instant, one occurrence."""
    cron = Cron("*/15 * * * *", PARIS)
    found = cron.between(at("2026-03-29T00:30:00Z"), at("2026-03-29T01:30:00Z"), 20)
    assert times(found) == [
        "2026-03-29T00:45:00Z",  # 01:45 CET
        "2026-03-29T01:00:00Z",  # 03:00 CEST (02:00-02:45 fall here)
        "2026-03-29T01:15:00Z",
        "2026-03-29T01:30:00Z",
    ]


def test_a_time_the_clocks_show_twice_runs_once_at_its_first() -> None:
    """2026-10-25: the clocks go from 03:00 CEST back to 02:00 CET, and 02:30 is shown
    twice. The daily 02:30 job runs once, at the first (00:30 UTC)."""
    cron = Cron("30 2 * * *", PARIS)
    found = cron.between(at("2026-10-23T12:00:00Z"), at("2026-10-26T12:00:00Z"), 10)
    assert times(found) == [
        "2026-10-24T00:30:00Z",  # 02:30 CEST
        "2026-10-25T00:30:00Z",  # 02:30 CEST, the first; not 01:30 UTC (02:30 CET)
        "2026-10-26T01:30:00Z",  # 02:30 CET
    ]


def test_latest_in_the_second_pass_of_a_repeated_hour() -> None:
    """At 02:50 CET (01:50 UTC), in the hour's second pass, the newest occurrence of a
    02:15 job is its first pass's, and of a quarter-hourly job the first pass's 02:45."""
    now = at("2026-10-25T01:50:00Z")
    since = at("2026-10-24T12:00:00Z")
    assert run_time(Cron("15 2 * * *", PARIS).latest(since, now)) == "2026-10-25T00:15:00Z"
    assert run_time(Cron("*/15 * * * *", PARIS).latest(since, now)) == "2026-10-25T00:45:00Z"


def test_the_second_pass_of_a_repeated_hour_starts_nothing_again() -> None:
    cron = Cron("*/15 * * * *", PARIS)
    found = cron.between(at("2026-10-25T00:40:00Z"), at("2026-10-25T02:10:00Z"), 20)
    assert times(found) == ["2026-10-25T00:45:00Z", "2026-10-25T02:00:00Z"]  # 03:00 CET


# --- definitions ----------------------------------------------------------------------------


def an_app() -> AgentApp:
    app = AgentApp()
    app.agent("reporter", model=ScriptedModel([{"text": "ok"}]))
    return app


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * *"}, "invalid cron expression"),
        ({"cron": "* * * * * * *"}, "invalid cron expression"),
        ({"cron": ""}, "invalid cron expression"),
        ({"cron": "0 0 30 2 *"}, "never matches"),
        ({"timezone": "Europe/Pariss"}, "unknown time zone"),
        ({"timezone": "../etc/passwd"}, "unknown time zone"),
        ({"catch_up": "some"}, "catch_up must be one of latest, all, none"),
        ({"name": "has:colon"}, "invalid schedule name"),
        ({"name": "x" * 34}, "invalid schedule name"),
        ({"agent": "nobody"}, "unknown agent 'nobody'"),
        ({"input": " "}, "input must be a non-empty text"),
        ({"metadata": {"when": object()}}, "metadata must be JSON"),
    ],
)
def test_a_bad_definition_is_a_schedule_error_and_defines_nothing(
    fields: dict[str, Any], says: str
) -> None:
    app = an_app()
    given = {
        "name": "daily",
        "agent": "reporter",
        "cron": "0 9 * * *",
        "timezone": PARIS,
        "input": "go",
        "catch_up": "latest",
        **fields,
    }
    name = given.pop("name")
    with pytest.raises(ScheduleError, match=says):
        app.schedule(name, **given)
    assert app.schedules == {}


def test_a_name_is_defined_once() -> None:
    app = an_app()
    app.schedule("daily", agent="reporter", cron="0 9 * * *", input="go")
    with pytest.raises(ScheduleError, match="already defined"):
        app.schedule("daily", agent="reporter", cron="0 10 * * *", input="go")
    assert app.schedules["daily"].cron.expression == "0 9 * * *"


def test_run_ids() -> None:
    app = an_app()
    found = app.schedule("daily-report", agent="reporter", cron="0 9 * * 1-5", input="go")
    moment = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
    assert found.run_id(moment) == "sched:daily-report:2026-12-07T08:00:00Z"
    assert found.run_now_id(moment) == "sched:daily-report:now:2026-12-07T08:00:00Z"
    longest = app.schedule("x" * 33, agent="reporter", cron="0 9 * * *", input="go")
    assert len(longest.run_now_id(moment)) == 64  # a run id's most
