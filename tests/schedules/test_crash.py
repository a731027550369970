"""Schedules through crashes: beat SIGKILLed and started again, and Postgres restarted
(a cluster of the test's own), with an every-second schedule that catches up on all it
missed: no occurrence missed, none started twice."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from agent_jobs.store import Store
from agent_jobs.store.db import utcnow
from tests.schedules.support import (
    assert_one_run_a_second,
    schedule_doors,
    wait_all_finished,
    wait_clock_past,
    wait_runs_past,
)
from tests.support.hosts import Postgres, as_postgres
from tests.support.workers import start_beat


def test_beat_killed_and_started_again_misses_and_doubles_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    with schedule_doors(pg_url, tmp_path) as doors:
        doors.worker()
        beat = doors.beat()
        wait_runs_past(doors, utcnow() + timedelta(seconds=2), "before the kill")
        beat.kill()  # SIGKILL: no goodbye
        killed = utcnow()
        wait_clock_past(killed + timedelta(seconds=3))  # occurrences nobody ticks
        doors.procs.append(start_beat(doors.env, tmp_path))
        back = utcnow()
        found = wait_runs_past(doors, back + timedelta(seconds=2), "after the restart")
        down = [o for o in found if killed < o < back]
        assert len(down) >= 3, "the occurrences while beat was down, caught up"
        assert_one_run_a_second(found)
        wait_all_finished(doors, found)


class OwnPostgres(Postgres):
    """A cluster of this test's own, stopped hard and started again on its data."""

    def halt(self) -> None:
        ctl = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]
        subprocess.run(as_postgres(ctl), capture_output=True, timeout=60, check=True)

    def again(self) -> None:
        options = f"-p {self.port} -k {self.home} -c listen_addresses={','.join(self.listen)}"
        ctl = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.home / "log")]
        subprocess.run(
            as_postgres([*ctl, "-o", options, "-w", "start"]),
            capture_output=True,
            timeout=120,
            check=True,
        )


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    cluster = OwnPostgres(["127.0.0.1"], "127.0.0.1/32")
    cluster.start()
    try:
        Store.from_url(cluster.url("127.0.0.1"), auto_upgrade=True).engine.dispose()
        yield cluster
    finally:
        cluster.stop()


def test_a_postgres_restart_doubles_no_run(own_postgres: OwnPostgres, tmp_path: Path) -> None:
    url = own_postgres.url("127.0.0.1")
    with schedule_doors(url, tmp_path) as doors:
        worker = doors.worker()
        doors.beat()
        wait_runs_past(doors, utcnow() + timedelta(seconds=2), "before the restart")
        doors.store.engine.dispose()
        own_postgres.halt()
        stopped = utcnow()
        wait_clock_past(stopped + timedelta(seconds=3))
        own_postgres.again()
        back = utcnow()
        found = wait_runs_past(doors, back + timedelta(seconds=3), "after the restart")
        assert [o for o in found if stopped < o < back], "the outage's occurrences, caught up"
        assert "this tick failed" in worker.log(), "ticks came while Postgres was down"
        assert_one_run_a_second(found)
        wait_all_finished(doors, found)
