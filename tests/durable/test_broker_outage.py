"""Redis goes away and comes back: no run fails for it, no worker dies of it.

Each test runs on a `redis-server` of its own, stopped and started again at will; none
starts beat, so what recovers the runs here is not the sweep.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.leases import Leases
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.settings import Settings
from agent_jobs.streams.redis_streams import RedisStreams
from tests.support import apps
from tests.support.cluster import Cluster
from tests.support.redis_server import RedisServer
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually


def test_a_worker_survives_redis_restarts_with_a_step_in_flight(
    cluster: Cluster, tmp_path: Path
) -> None:
    # kombu closed the channel twice when the connection dropped while a message was
    # unacknowledged and a BRPOP in flight: "Unrecoverable error", the worker gone.
    # Restarted six times: while a model streams (three seconds of deltas), and while a
    # tool waits at a gate the test opens after the restart (no seconds to sit out).
    worker = cluster.worker(concurrency=2, TEST_GATE_DIR=str(tmp_path))
    for i in range(6):
        agent, step, what, output = (
            ("crashy", "model:1", "model", "survived")
            if i % 2 == 0
            else ("gated_by_file", "tool:call_1", "wait_for_gate:start", "through the gate")
        )
        run_id = cluster.client.enqueue_run(agent, "go", actor="user-7")
        key = step if what == "model" else f"{run_id}:{step}"
        # The step runs (it counts itself as it begins): one task running, the queue
        # empty.
        eventually(
            lambda r=run_id, k=key, w=what: (w, k) in apps.executed(r),
            what=f"{step} of {agent} to be running",
            context=worker.log,
        )
        cluster.redis.restart()
        (tmp_path / run_id).touch()  # the gate, for the tool that waits at it
        # The step that ran through the restart went on to its end and moved its run
        # on: nothing waited for the sweep (there is none here).
        run = cluster.wait(run_id)
        assert run.status == "completed" and run.output == output, run
        assert apps.executed(run_id).count((what, key)) == 1
        assert worker.running, worker.log()[-4000:]
    # The worker consumed from the broker after the last restart: it reconnected, alive.
    after = cluster.client.enqueue_run("w1", "go", actor="user-7")
    assert cluster.wait(after).status == "completed"
    assert worker.running, worker.log()[-4000:]
    assert "Unrecoverable error" not in worker.log()


def test_an_outage_between_steps_delays_the_run_and_never_fails_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Every step crosses the broker here (see the next test for the fast path).
    worker = cluster.worker(
        concurrency=2, TEST_GATE_DIR=str(tmp_path), AGENT_JOBS_EAGER_STEPS="false"
    )
    run_id = cluster.client.enqueue_run("gated_by_file", "go", actor="user-7")
    cluster.wait_step(run_id, "tool:call_1", "started")
    cluster.redis.stop()
    (tmp_path / run_id).touch()  # the tool ends while Redis is down; its result commits
    cluster.wait_step(run_id, "tool:call_1", "done")
    cluster.wait_step(run_id, "model:2", "scheduled")
    # The send of model:2 is refused, and kept to be sent again: the run goes on waiting.
    eventually(
        lambda: "the broker refused the" in worker.log(),
        what="the send of model:2 to be refused",
        context=worker.log,
    )
    run = cluster.store.get_run(run_id)
    assert run.status == "running", run
    cluster.redis.start()
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "through the gate"


def test_on_the_fast_path_an_outage_between_steps_does_not_stop_the_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The step a pass keeps is claimed in its journal row, not in Redis: the chain goes
    # on through the outage (only the live frames of those steps are lost).
    cluster.worker(concurrency=2, TEST_GATE_DIR=str(tmp_path))
    run_id = cluster.client.enqueue_run("gated_by_file", "go", actor="user-7")
    cluster.wait_step(run_id, "tool:call_1", "started")
    cluster.redis.stop()
    try:
        (tmp_path / run_id).touch()
        run = cluster.wait(run_id)
        assert run.status == "completed" and run.output == "through the gate"
        journal = {j["step"]: j for j in cluster.store.journal(run_id)}
        assert journal["model:2"]["attempts"] == journal["model:3"]["attempts"] == 1
    finally:
        cluster.redis.start()


def test_a_send_the_broker_refuses_after_the_commit_is_sent_once_it_is_back(
    pg_url: str, redis_url: str, monkeypatch: Any
) -> None:
    from tests.support.services import truncate_all

    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    broker = RedisServer().start()
    streams = RedisStreams.from_url(redis_url)
    celery = celery_client(broker.url(0), SESSION_QUEUE)
    from agent_jobs.store import Store

    store = Store.from_url(pg_url)
    truncate_all(store)
    runner = DurableRunner(
        apps.app,
        store,
        CeleryDispatcher(celery),
        streams,
        Settings(database_url=pg_url),
        Leases(streams.client),
    )
    try:
        runner.create(RunRequest(agent="w1", input="go", actor="user-7"), "refused-send")
        broker.stop()
        outcome = runner.coordinate("refused-send")
        assert outcome == "waiting model:1"
        run = store.get_run("refused-send")
        assert run.status == "running" and run.error is None
        assert {j["step"]: j["state"] for j in store.journal("refused-send")}["model:1"] == (
            "scheduled"
        )
        assert runner.dispatcher.kept == 1
        broker.start()
        eventually(lambda: not runner.dispatcher.kept, what="the kept send to go out")
        queued = redis.Redis.from_url(broker.url(0))
        assert queued.llen(SESSION_QUEUE) == 1
        queued.close()
    finally:
        celery.close()
        streams.client.close()
        store.engine.dispose()
        broker.close()


def test_a_retry_the_broker_cannot_take_waits_for_it_instead_of_dropping_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery publishes a retry as a new message and, when that fails, rejects the message
    it ran without requeueing it: a `start_run` whose database and broker were both cut
    off was lost (the partition lab found two). The retry waits for the broker."""
    from celery.exceptions import Retry

    import tasks.base
    from tasks.app import create_app

    waits: list[float] = []
    sleep = time.sleep
    # The waits between two tries, noted (and kept short: the broker is back when told).
    monkeypatch.setattr(
        tasks.base, "time", SimpleNamespace(sleep=lambda s: (waits.append(s), sleep(0.05)))
    )
    server = RedisServer().start()
    try:
        settings = Settings(broker_url=server.url(0), queue="retry-probe")
        celery = create_app(settings)
        task = celery.tasks["agent_jobs.coordinate"]
        outcome: list[BaseException] = []

        def retry() -> None:  # as a worker's thread running the task does
            task.push_request(
                id="retry-probe-1", args=["run-1"], kwargs={}, retries=0, called_directly=False
            )
            try:
                task.retry(countdown=1, max_retries=8)
            except BaseException as exc:
                outcome.append(exc)
            finally:
                task.pop_request()

        server.stop()  # the broker is away when the retry is sent
        retrying = threading.Thread(target=retry, daemon=True)
        retrying.start()
        client = redis.Redis(port=server.port)
        try:
            eventually(lambda: waits, what="the retry to be refused once, and waited on")
            assert outcome == []  # not given up on: the message is not dropped
            server.start()
            eventually(lambda: outcome, what="the retry to be sent once the broker is back")
            assert isinstance(outcome[0], Retry), outcome
            assert client.llen("retry-probe") == 1  # the retry, in the queue
        finally:
            client.close()
            celery.close()
    finally:
        server.close()
