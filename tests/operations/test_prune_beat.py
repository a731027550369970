"""The prune beat runs (`AGENT_JOBS_PRUNE_AFTER_DAYS`): real durable runs, a worker and beat,
and Flower, which shows the task only when it pruned something."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from agent_jobs.retention import PRUNE, pruned
from agent_jobs.store.db import utcnow
from agent_jobs.store.schema import runs
from agent_jobs.streams.base import stream_key
from tests.operations.test_flower import Flower, flower_caught_up, succeeded
from tests.support import apps
from tests.support.doors import Doors, open_doors, wait_for
from tests.support.redis_server import RedisServer

EVERY = "0.5"  # seconds between prunes


@pytest.fixture
def doors(pg_url: str, tmp_path: Path) -> Iterator[Doors]:
    server = RedisServer().start()
    try:
        with open_doors(
            pg_url,
            server.url(0),
            0,
            tmp_path,
            AGENT_JOBS_PRUNE_AFTER_DAYS="30",
            AGENT_JOBS_PRUNE_INTERVAL=EVERY,
        ) as made:
            yield made
    finally:
        server.close()


def test_beat_prunes_old_runs_and_flower_shows_only_the_prune_that_did(doors: Doors) -> None:
    flower = Flower(doors)  # first, so it hears every event of the worker
    apps.side_engine()  # the apps' side table made here: two pool processes making it collide
    worker = doors.worker()
    doors.beat()
    old, recent = (doors.client.enqueue_run("w1", "go", actor="user-7") for _ in range(2))
    for run_id in (old, recent):
        doors.wait_status(run_id, "completed")
    assert doors.redis.exists(stream_key(old)) == 1

    def idle() -> int:
        return succeeded(worker, PRUNE, NOTHING)

    wait_for(lambda: idle() >= 3, f"three prunes with nothing to prune\n{doors.logs()}")
    flower_caught_up(flower, doors)
    assert flower.tasks(taskname=PRUNE) == {}, "a prune that pruned nothing is not shown"
    assert pruned(doors.store, old) is None

    with doors.store.begin() as conn:  # it ended 40 days ago
        conn.execute(
            update(runs).where(runs.c.id == old).values(finished_at=utcnow() - timedelta(days=40))
        )

    mark = wait_for(lambda: pruned(doors.store, old), f"the prune of {old}\n{doors.logs()}")
    assert mark["journal_rows"] > 20
    assert doors.redis.exists(stream_key(old)) == 0
    assert pruned(doors.store, recent) is None and doors.redis.exists(stream_key(recent)) == 1

    def the_prune_of_the_run() -> list[Any]:
        shown = flower.tasks(taskname=PRUNE).values()
        return [t for t in shown if str(t["result"]).startswith("'pruned 1 run: ")]

    wait_for(the_prune_of_the_run, "the prune that pruned, in Flower")
    after = idle()
    wait_for(lambda: idle() >= after + 3, f"three more idle prunes\n{doors.logs()}")
    flower_caught_up(flower, doors)
    # Prunes every half second overlap: the run's notification may go with another prune
    # than the run ("pruned 0 runs: …, 1 notification"), shown too as it pruned something.
    shown = list(flower.tasks(taskname=PRUNE).values())
    assert [t["state"] for t in shown] == ["SUCCESS"] * len(shown), shown
    assert len(the_prune_of_the_run()) == 1 and len(shown) <= 2, shown
    assert NOTHING not in [t["result"] for t in shown], shown
    assert doors.store.get_run(old).status == "completed"


NOTHING = "'pruned 0 runs: 0 journal rows, 0 events, 0 notifications, 0 streams'"
