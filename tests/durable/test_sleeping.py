"""Sleeping runs on real workers and beat: a run that sleeps wakes at its time (beat's
timers tick finds it in Postgres), early on a message, after its worker and beat were
SIGKILLed and Redis emptied; many sleepers hold no worker and no broker message; cancel
and pause treat a sleeper as they should."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import redis

from agent_jobs.runs import post_message
from agent_jobs.store.db import utcnow
from tests.support import apps
from tests.support.apps.timers import NAP
from tests.support.cluster import Cluster
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually

ON_TIME = timedelta(seconds=1)  # how late a wake may be, measured from its wake time


def sleep_input(**args: Any) -> str:
    return json.dumps(args)


def timer_row(c: Cluster, run_id: str) -> dict[str, Any]:
    return {row["step"]: row for row in c.store.journal(run_id)}[f"timer:{NAP}"]


def woke(c: Cluster, run_id: str) -> tuple[str, datetime, datetime]:
    """(how, when, the wake time it slept until) of the run's wait."""
    row = timer_row(c, run_id)
    return (
        row["result"]["woke"],
        datetime.fromisoformat(row["result"]["at"]),
        datetime.fromisoformat(row["intent"]["wake_at"]),
    )


def asleep(c: Cluster, run_id: str) -> datetime:
    """Wait until the run sleeps; its wake time."""
    run = eventually(
        lambda: (r := c.store.get_run(run_id)).status == "sleeping" and r,
        what=f"run {run_id} to sleep",
        context=lambda: c.store.journal(run_id),
    )
    assert run.wake_at is not None
    return run.wake_at


def test_a_run_sleeps_and_wakes_at_its_time(cluster: Cluster) -> None:
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("sleeper", sleep_input(seconds=3, reason="a build"))
    wake_at = asleep(cluster, run_id)
    assert cluster.store.get_run(run_id).waiting_on.startswith("sleeping until")
    run = cluster.wait(run_id)
    assert run.status == "completed"
    how, at, slept_until = woke(cluster, run_id)
    assert how == "time" and slept_until == wake_at
    assert timedelta(0) <= at - wake_at < ON_TIME, at - wake_at
    assert json.loads(run.output or "")["tool"]["woke"] == "time"


def test_a_message_wakes_a_run_that_sleeps_for_an_hour(cluster: Cluster) -> None:
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("sleeper", sleep_input(seconds=3600))
    wake_at = asleep(cluster, run_id)
    posted = utcnow()
    cluster.client.post_message(run_id, "the build is green")
    run = cluster.wait(run_id)
    assert run.status == "completed"
    how, at, _ = woke(cluster, run_id)
    assert how == "message" and posted <= at < wake_at
    answer = json.loads(run.output or "")
    assert answer["messages"] == ["the build is green"]  # the model read it
    assert cluster.store.get_run(run_id).wake_at is None


def test_a_sleeper_wakes_on_time_after_its_worker_beat_and_broker_lost_everything(
    cluster: Cluster,
) -> None:
    worker, beat = cluster.worker(), cluster.beat()
    # Long enough for the processes to come back (and warm up) before it, on a busy machine.
    run_id = cluster.client.enqueue_run("sleeper", sleep_input(seconds=10))
    wake_at = asleep(cluster, run_id)
    worker.kill()
    beat.kill()
    # Nothing of the sleep lived in Redis: emptied, it loses nothing.
    redis.Redis.from_url(cluster.broker).flushall()
    cluster.worker()
    cluster.beat()
    back = utcnow()
    run = cluster.wait(run_id)
    assert run.status == "completed"
    how, at, _ = woke(cluster, run_id)
    assert how == "time" and at >= wake_at
    # On time, or as soon as the processes were back if they came back after it.
    assert at - max(wake_at, back) < ON_TIME, (at - wake_at, back - wake_at)


def test_sleepers_hold_no_worker_and_no_broker_message(cluster: Cluster) -> None:
    cluster.worker(concurrency=2)
    cluster.beat()
    run_ids = [cluster.client.enqueue_run("sleeper", sleep_input(seconds=3600)) for _ in range(30)]
    for run_id in run_ids:
        asleep(cluster, run_id)
    broker = redis.Redis.from_url(cluster.broker)
    # Two workers' slots, thirty sleepers: none holds a slot, a queued or unacked message.
    inspect = cluster.celery.control.inspect(timeout=5.0)

    def quiet() -> bool:
        held = [inspect.active(), inspect.reserved(), inspect.scheduled()]
        return all(h is not None and not any(h.values()) for h in held) and (
            broker.llen(SESSION_QUEUE) == 0 and broker.hlen("unacked") == 0
        )

    eventually(quiet, what="no task active, reserved or scheduled, no message queued")
    assert {cluster.store.get_run(r).status for r in run_ids} == {"sleeping"}
    # A sleeper still wakes at once for a message, whoever else sleeps.
    cluster.client.post_message(run_ids[0], "wake up")
    assert cluster.wait(run_ids[0]).status == "completed"
    assert {cluster.store.get_run(r).status for r in run_ids[1:]} == {"sleeping"}


def test_a_cancelled_sleeper_ends_and_never_wakes(cluster: Cluster) -> None:
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("sleeper", sleep_input(seconds=2))
    wake_at = asleep(cluster, run_id)
    cluster.client.cancel(run_id)
    run = cluster.wait(run_id)
    assert run.status == "cancelled" and run.wake_at is None
    eventually(lambda: utcnow() > wake_at + ON_TIME, what="the wake time to pass")
    assert timer_row(cluster, run_id)["state"] == "waiting"  # it never woke
    assert cluster.store.get_run(run_id).status == "cancelled"


def test_a_paused_sleeper_stays_paused_past_its_time_and_wakes_once_resumed(
    cluster: Cluster,
) -> None:
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("sleeper", sleep_input(seconds=2))
    wake_at = asleep(cluster, run_id)
    cluster.client.pause(run_id, actor="ops")
    eventually(
        lambda: cluster.store.get_run(run_id).status == "paused", what="the sleeper to pause"
    )
    eventually(lambda: utcnow() > wake_at + 2 * ON_TIME, what="its wake time to pass")
    assert cluster.store.get_run(run_id).status == "paused"
    assert timer_row(cluster, run_id)["state"] == "waiting"
    resumed = utcnow()
    cluster.client.resume(run_id, actor="ops")
    run = cluster.wait(run_id)
    assert run.status == "completed"
    how, at, _ = woke(cluster, run_id)
    assert how == "time" and at >= resumed  # woken by the resume, its time long past


def test_a_delegated_run_sleeps_and_a_message_to_it_wakes_it(cluster: Cluster) -> None:
    cluster.worker()
    cluster.beat()
    parent = cluster.client.enqueue_run("sleeper_boss", "delegate")
    child = eventually(
        lambda: next((r for r in cluster.store.list_runs() if r.parent_run_id == parent), None),
        what="the delegated run",
    )
    asleep(cluster, child.run_id)
    cluster.client.post_message(child.run_id, "wake, child")
    assert cluster.wait(parent).status == "completed"
    done = cluster.store.get_run(child.run_id)
    assert json.loads(done.output or "")["messages"] == ["wake, child"]
    assert woke(cluster, child.run_id)[0] == "message"


def test_the_sweep_wakes_a_sleeper_whose_message_came_with_no_wake(cluster: Cluster) -> None:
    cluster.worker()
    cluster.beat()
    run_id = cluster.client.enqueue_run("sleeper", sleep_input(seconds=3600))
    asleep(cluster, run_id)
    # Recorded, and no wake sent (a broker down, a process with none): the sweep sees it.
    with cluster.store.begin() as conn:
        post_message(conn, apps.app, run_id, "no wake", target="next-step", runner="durable")
    run = cluster.wait(run_id)
    assert run.status == "completed"
    assert json.loads(run.output or "")["messages"] == ["no wake"]
    assert woke(cluster, run_id)[0] == "message"
