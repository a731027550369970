"""Schedules ticked by real beats and workers: one run per occurrence with its id, two
beats at once, the CLI's schedules commands and `runs --schedule` with a broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from agent_jobs.schedules.tick import utc
from agent_jobs.store.db import utcnow
from agent_jobs.store.schema import schedules
from tests.schedules.support import (
    PREFIX,
    assert_one_run_a_second,
    occurrences,
    schedule_doors,
    wait_all_finished,
    wait_runs_past,
)
from tests.support.doors import Doors, cli, wait_for
from tests.support.workers import start_beat


@pytest.fixture
def doors(pg_url: str, tmp_path: Path) -> Iterator[Doors]:
    with schedule_doors(pg_url, tmp_path) as made:
        yield made


def test_each_occurrence_starts_one_run_with_its_id(doors: Doors) -> None:
    doors.worker()
    began = utcnow()
    doors.beat()
    found = wait_for(
        lambda: len(o := occurrences(doors.store)) >= 4 and o,
        f"four runs of the every-second schedule\n{doors.logs()}",
    )
    assert found[0] > began - timedelta(seconds=1)  # nothing before it was first seen
    assert_one_run_a_second(found)
    wait_all_finished(doors, found)
    first = PREFIX + found[0].strftime("%Y-%m-%dT%H:%M:%SZ")
    run = doors.store.get_run(first)
    assert (run.agent, run.actor, run.input) == ("reporter", "ops", "the every report")
    assert run.metadata["schedule"] == "every" and run.metadata["team"] == "ops"
    assert run.output == "report written"


def test_two_beats_at_once_start_one_run_per_occurrence(doors: Doors, tmp_path: Path) -> None:
    doors.worker()
    doors.worker()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    beats = [start_beat(doors.env, tmp_path / "a"), start_beat(doors.env, tmp_path / "b")]
    doors.procs.extend(beats)
    began = utcnow()
    found = wait_runs_past(doors, began + timedelta(seconds=6), "two beats")
    for beat in beats:  # both sent ticks all along
        assert beat.log().count("agent-jobs-schedules") >= 4, beat.log()
    assert_one_run_a_second(found)
    wait_all_finished(doors, found)


def test_the_cli_pauses_resumes_and_runs_a_schedule_now(doors: Doors) -> None:
    doors.worker()
    doors.beat()
    wait_for(lambda: len(occurrences(doors.store)) >= 2, f"runs\n{doors.logs()}")

    done = cli("schedules", "pause", "every", env=doors.env)
    assert done.returncode == 0 and "schedule every paused" in done.stdout, done.stderr
    paused_at = utcnow()
    listed = json.loads(cli("schedules", "list", "--json", env=doors.env).stdout)
    [every] = listed["schedules"]
    assert every["paused"] is True and every["cron"] == "* * * * * *"
    assert every["next_occurrence"] is None
    # A tick or two more may have been under way as it paused; then nothing more.
    last = wait_for(lambda: occurrences(doors.store)[-1], "the last run before the pause")
    assert last <= paused_at + timedelta(seconds=2)

    now = cli("schedules", "run-now", "every", "--json", env=doors.env)
    assert now.returncode == 0, now.stderr
    started = json.loads(now.stdout)
    assert started["run_id"].startswith("sched:every:now:") and started["created"]
    doors.wait_status(started["run_id"], "completed")
    assert occurrences(doors.store)[-1] == last  # paused: still no occurrence

    done = cli("schedules", "resume", "every", env=doors.env)
    assert done.returncode == 0 and "schedule every resumed" in done.stdout, done.stderr
    with doors.store.connect() as conn:  # the resume's moment, as it was recorded
        resumed_at = utc(conn.execute(select(schedules.c.active_from)).scalar_one())
    assert resumed_at > last
    found = wait_runs_past(doors, resumed_at, "after the resume")
    skipped = [o for o in found if last < o <= resumed_at]
    assert skipped == [], "the pause's occurrences are skipped"

    listed_runs = cli("runs", "--schedule", "every", "--json", "--limit", "200", env=doors.env)
    ids = {r["run_id"] for r in json.loads(listed_runs.stdout)}
    assert started["run_id"] in ids and PREFIX + last.strftime("%Y-%m-%dT%H:%M:%SZ") in ids
    assert all(i.startswith("sched:every:") for i in ids)
    assert cli("runs", "--schedule", "other", "--json", env=doors.env).stdout.strip() == "[]"

    unknown = cli("schedules", "pause", "nope", env=doors.env)
    assert unknown.returncode == 2 and "unknown schedule 'nope'" in unknown.stderr


def test_beat_sends_no_tick_for_an_app_without_schedules(pg_url: str, tmp_path: Path) -> None:
    with schedule_doors(pg_url, tmp_path, schedules="") as doors:
        beat = doors.beat()
        wait_for(lambda: beat.log().count("agent-jobs-sweep") >= 3, f"sweeps\n{beat.log()}")
        assert "agent-jobs-schedules" not in beat.log()
