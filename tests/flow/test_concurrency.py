"""Concurrency per key, against real services: at most `max_concurrent` runs of an agent
and key run at once, across every worker process; the rest wait `queued`, in the order
they came, and begin as others end (a worker killed, a wake-up lost: they still do)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
import redis
from sqlalchemy import select

from agent_jobs import InlineRunner, Store, admission
from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.settings import Settings
from agent_jobs.store import RunView
from agent_jobs.store import runs as run_rows
from agent_jobs.store.schema import runs
from tests.support import apps
from tests.support.apps import concurrency as concurrency_apps
from tests.support.cluster import Cluster
from tests.support.services import inline_on
from tests.support.waiting import TIMEOUT, eventually, wait_status

APP = {"AGENT_JOBS_APP": "tests.support.apps.concurrency:app"}
ENDED = ("completed", "failed", "cancelled")


class Sampler:
    """The statuses of every run, read in one snapshot every 10 ms on a thread of its own
    while the test goes on."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.snapshots: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            with self.store.connect() as conn:
                rows = conn.execute(select(runs.c.id, runs.c.status)).all()
            self.snapshots.append({row.id: row.status for row in rows})
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def most_running(self, ids: Sequence[str]) -> int:
        """The most of `ids` seen begun and not ended at once."""
        return max(
            (sum(1 for i in ids if snap.get(i, "queued") not in ("queued", *ENDED)))
            for snap in self.snapshots
        )

    def began(self, run_id: str) -> int:
        """The first snapshot that saw the run past `queued`."""
        return next(
            n for n, snap in enumerate(self.snapshots) if snap.get(run_id, "queued") != "queued"
        )

    def ever_queued_while_full(self, ids: Sequence[str], limit: int) -> bool:
        return any(
            sum(1 for i in ids if snap.get(i) == "queued") > 0
            and sum(1 for i in ids if snap.get(i) not in (None, "queued", *ENDED)) == limit
            for snap in self.snapshots
        )


def assert_in_arrival_order(sampler: Sampler, ids: Sequence[str], limit: int) -> None:
    """No run began after one that came `limit` or more places behind it (runs that a
    freed place lets begin at one moment may begin in either order among themselves)."""
    began = [sampler.began(i) for i in ids]
    for i, first in enumerate(began):
        for j in range(i + limit, len(ids)):
            assert first <= began[j], (
                f"run {i} began in snapshot {first}, after run {j} ({began[j]})"
            )


def executions_at(run_id: str, what: str, key: str) -> datetime:
    with apps.side_engine().connect() as conn:
        return conn.execute(
            select(apps.executions.c.at).where(
                apps.executions.c.run_id == run_id,
                apps.executions.c.what == what,
                apps.executions.c.key == key,
            )
        ).scalar_one()


def assert_two_at_a_time(sampler: Sampler, ids: list[str], other: str) -> None:
    """At most two of `ids` ran at once, the rest queued meanwhile and began in the order
    they came; `other` (another actor's) was not held back: it began while some still
    waited."""
    assert sampler.most_running(ids) == 2
    assert sampler.ever_queued_while_full(ids, 2)
    assert_in_arrival_order(sampler, ids, 2)
    assert any(
        snap.get(other) not in (None, "queued") and "queued" in [snap.get(i) for i in ids]
        for snap in sampler.snapshots
    )


# --- the durable runner, several worker processes ----------------------------------------


@contextmanager
def durable(cluster: Cluster, workers: int = 2, **extra: str) -> Iterator[Client]:
    """A client of the concurrency app on the cluster, with its workers (of three each)."""
    apps.side_engine()  # the executions' table made here, not by workers racing to
    for _ in range(workers):
        cluster.worker(concurrency=3, **APP, **extra)
    settings = Settings(broker_url=cluster.broker, database_url=cluster.pg_url)
    yield Client(cluster.store, concurrency_apps.app, settings, CeleryDispatcher(cluster.celery))


def test_twenty_runs_of_one_actor_two_at_a_time_across_workers(cluster: Cluster) -> None:
    with durable(cluster) as client, Sampler(cluster.store) as sampler:
        ids = [client.enqueue_run("limited", f"job {n}", actor="user-7") for n in range(20)]
        other = client.enqueue_run("limited", "another actor's", actor="bob")
        for run_id in [*ids, other]:
            run = cluster.wait(run_id)
            assert (run.status, run.output) == ("completed", "limited done"), run.error
    assert_two_at_a_time(sampler, ids, other)
    held = cluster.store.get_run(ids[-1])
    assert held.concurrency_key == "user-7" and held.waiting_on is None


def test_a_queued_run_says_what_it_waits_for(cluster: Cluster) -> None:
    with durable(cluster, workers=1) as client:
        first = client.enqueue_run("single_slow", "one", actor="user-7")
        # The first holds the key's place before the second is sent: else the second's
        # pass may come first, and wait for an earlier run rather than a running one.
        wait_status(cluster.store, first, "running")
        second = client.enqueue_run("single_slow", "two", actor="user-7")
        run = eventually(
            lambda: (r := cluster.store.get_run(second)).waiting_on is not None and r,
            what=f"{second} to say why it waits",
            context=lambda: cluster.store.get_run(second),
        )
        assert run.status == "queued"
        assert run.waiting_on == "concurrency single_slow/user-7: 1 of 1 running"
        assert cluster.wait(first).status == "completed"
        assert cluster.wait(second).status == "completed"
        assert cluster.store.get_run(second).waiting_on is None


def test_a_run_sent_before_an_earlier_one_began_waits_for_it(cluster: Cluster) -> None:
    with durable(cluster, workers=0) as client:  # nothing takes either run yet
        first = client.enqueue_run("single_slow", "one", actor="user-7")
        second = client.enqueue_run("single_slow", "two", actor="user-7")
        with cluster.store.begin() as conn:  # the second's pass, before the first's
            row = run_rows.lock_run(conn, second)
            entry = admission.enter(conn, concurrency_apps.app, RunView.from_row(row))
        assert not entry
        waiting = "concurrency single_slow/user-7: 0 of 1 running, earlier runs first"
        assert entry.waiting_on == cluster.store.get_run(second).waiting_on == waiting
        cluster.worker(concurrency=3, **APP)
        assert cluster.wait(first).status == "completed"
        assert cluster.wait(second).status == "completed"
    assert executions_at(first, "model", "model:1") < executions_at(second, "model", "model:1")


def test_a_worker_killed_while_running_one_lets_the_next_begin(cluster: Cluster) -> None:
    shipped = {"AGENT_JOBS_STEP_LEASE": "30", "AGENT_JOBS_SWEEP_STALE_AFTER": "60"}
    with (
        durable(cluster, restart="yes", **shipped) as client,
        Sampler(cluster.store) as sampler,
    ):
        first = client.enqueue_run("single_held", "one", actor="user-7")
        second = client.enqueue_run("single_held", "two", actor="user-7")
        # Killed at the event: the held step has begun (its start is recorded).
        [(pid, _)] = eventually(
            lambda: apps.held_starts(first),
            what=f"the held step of {first} to begin",
            context=cluster.logs,
        )
        assert cluster.store.get_run(second).status == "queued"
        os.kill(pid, signal.SIGKILL)  # the process running the first run's step
        assert cluster.wait(first).status == "completed"
        assert cluster.wait(second).status == "completed"
    assert len(apps.held_starts(first)) == 2  # the killed step ran again
    assert sampler.most_running([first, second]) == 1
    assert sampler.began(second) > max(
        n for n, snap in enumerate(sampler.snapshots) if snap.get(first) != "completed"
    )


def test_a_lost_wake_up_is_caught_by_the_sweep(cluster: Cluster) -> None:
    with durable(cluster, workers=1) as client:
        worker = cluster.procs[-1]
        first = client.enqueue_run("single_slow", "one", actor="user-7")
        second = client.enqueue_run("single_slow", "two", actor="user-7")
        eventually(
            lambda: cluster.store.get_run(second).waiting_on,
            what=f"{second} to wait for {first}",
            context=cluster.logs,
        )
        worker.stop()  # a warm shutdown: the first run ends, its wake-up goes to the broker
        assert cluster.store.get_run(first).status == "completed"
        redis.Redis.from_url(cluster.broker).flushall()  # and is lost
        assert cluster.store.get_run(second).status == "queued"
        cluster.worker(concurrency=2, **APP)
        # The new worker had its chance: a run sent after it came up has been taken and
        # ended (and no sweep runs: beat is not started yet).
        plain = client.enqueue_run("plain", "meanwhile", actor="bob")
        assert cluster.wait(plain).status == "completed"
        assert cluster.store.get_run(second).status == "queued"  # nobody woke it
        cluster.beat()
        assert cluster.wait(second).status == "completed"


def test_a_delegated_run_is_not_held_by_its_agents_key(cluster: Cluster) -> None:
    with durable(cluster, workers=1) as client:
        holding = client.enqueue_run("helper", "hold the place", actor="user-7")
        apps_wait_model(holding, 1)
        lead = client.enqueue_run("lead", "delegate", actor="user-7")
        assert cluster.wait(lead).status == "completed"
        assert cluster.wait(holding).status == "completed"
    [child] = [r for r in cluster.store.run_tree(lead) if r != lead]
    assert cluster.store.get_run(child).concurrency_key is None
    # The child began while the other helper run still held the key's only place.
    assert executions_at(child, "model", "model:1") < executions_at(holding, "model", "model:2")


def apps_wait_model(run_id: str, n: int) -> None:
    eventually(
        lambda: ("model", f"model:{n}") in apps.executed(run_id),
        what=f"model:{n} of {run_id} to run",
        context=lambda: apps.executed(run_id),
    )


# --- the inline runner --------------------------------------------------------------------


@pytest.fixture
def inline(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[InlineRunner]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    apps.side_engine()
    with inline_on(concurrency_apps.app, pg_url) as runner:
        yield runner


def test_twenty_runs_of_one_actor_two_at_a_time_inline(inline: InlineRunner) -> None:
    with Sampler(inline.store) as sampler:
        ids = [inline.start("limited", f"job {n}", actor="user-7") for n in range(20)]
        other = inline.start("limited", "another actor's", actor="bob")
        for run_id in [*ids, other]:
            run = inline.wait(run_id, timeout=TIMEOUT)
            assert (run.status, run.output) == ("completed", "limited done"), run.error
    assert_two_at_a_time(sampler, ids, other)


def test_keys_by_thread_and_by_function_inline(inline: InlineRunner) -> None:
    with Sampler(inline.store) as sampler:
        a = [inline.start("per_tenant", "a", actor="u", metadata={"tenant": "acme"}) for _ in "12"]
        b = inline.start("per_tenant", "b", actor="u", metadata={"tenant": "globex"})
        free = [inline.start("per_tenant", "free", actor="u") for _ in "12"]
        threaded = [inline.start("per_thread", "t", actor="u") for _ in "12"]
        for run_id in [*a, b, *free, *threaded]:
            assert inline.wait(run_id, timeout=TIMEOUT).status == "completed"
    keys = [inline.store.get_run(r).concurrency_key for r in [*a, b, *free]]
    assert keys == ["acme", "acme", "globex", None, None]
    assert sampler.most_running(a) == 1  # one tenant's runs, one at a time
    assert sampler.most_running([a[0], b]) == 2  # another tenant's beside them
    assert sampler.most_running(free) == 2  # no key: nothing held them
    assert sampler.most_running(threaded) == 2  # a thread each


def test_a_queued_inline_run_cancelled_ends_without_a_turn(inline: InlineRunner) -> None:
    first = inline.start("single_slow", "one", actor="user-7")
    second = inline.start("single_slow", "two", actor="user-7")
    assert inline.store.get_run(second).status == "queued"
    assert inline.cancel(second) == [second]
    run = inline.wait(second, timeout=TIMEOUT)
    assert run.status == "cancelled" and run.error == "cancelled (user)"
    assert "turn/start" not in [e.type for e in inline_events(inline, second)]
    assert inline.wait(first, timeout=TIMEOUT).status == "completed"


def inline_events(inline: InlineRunner, run_id: str) -> list[Any]:
    return [e for e in Client(inline.store, inline.app).events(run_id) if e.run_id == run_id]
