"""What the schedule tests with real workers and beat share: their doors, and reading the
runs a schedule started."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from agent_jobs.store import Store
from agent_jobs.store.db import utcnow
from agent_jobs.store.schema import runs
from tests.support.doors import Doors, open_doors, wait_for
from tests.support.redis_server import RedisServer

APP = "tests.support.apps.schedules:app"
EVERY_SECOND = "every|all|* * * * * *"
PREFIX = "sched:every:"


@contextmanager
def schedule_doors(pg_url: str, tmp: Path, schedules: str = EVERY_SECOND) -> Iterator[Doors]:
    """Doors whose processes load the schedules app with `schedules` (TEST_SCHEDULES),
    ticking every half second, on a Redis server of their own."""
    server = RedisServer().start()
    try:
        with open_doors(
            pg_url,
            server.url(0),
            0,
            tmp,
            AGENT_JOBS_APP=APP,
            TEST_SCHEDULES=schedules,
            AGENT_JOBS_SCHEDULE_INTERVAL="0.5",
        ) as doors:
            yield doors
    finally:
        server.close()


def occurrences(store: Store, prefix: str = PREFIX) -> list[datetime]:
    """The occurrences the runs `prefix…` were started for, oldest first."""
    with store.connect() as conn:
        ids = conn.execute(select(runs.c.id).where(runs.c.id.like(prefix + "%"))).scalars()
        times = [i[len(prefix) :] for i in ids]
    # Not the runs asked for by hand (`sched:<name>:now:<time>`).
    return sorted(
        datetime.fromisoformat(t.replace("Z", "+00:00")) for t in times if not t.startswith("now:")
    )


def assert_one_run_a_second(found: list[datetime]) -> None:
    """One run for each second from the first to the last: none missed, none twice."""
    assert found, "no runs"
    span = int((found[-1] - found[0]).total_seconds()) + 1
    gaps = [(a, b) for a, b in itertools.pairwise(found) if b - a != timedelta(seconds=1)]
    assert not gaps and len(found) == span, f"{len(found)} runs over {span} s; gaps {gaps}"


def wait_runs_past(doors: Doors, moment: datetime, what: str) -> list[datetime]:
    """Wait for a run of an occurrence after `moment`; the occurrences then."""
    return wait_for(  # type: ignore[no-any-return]
        lambda: (o := occurrences(doors.store)) and o[-1] > moment and o,
        f"a run of an occurrence after {moment} ({what})\n{doors.logs()}",
    )


def wait_clock_past(moment: datetime) -> None:
    """Wait until the clock reads past `moment` (occurrences come with time)."""
    wait_for(lambda: utcnow() > moment, f"the clock to pass {moment}", every=0.1)


def wait_all_finished(doors: Doors, found: list[datetime]) -> None:
    ids = [PREFIX + o.strftime("%Y-%m-%dT%H:%M:%SZ") for o in found]
    wait_for(
        lambda: all(doors.store.get_run(i).status == "completed" for i in ids),
        f"the {len(ids)} runs to complete\n{doors.logs()}",
    )
