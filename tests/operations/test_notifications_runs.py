"""Both runners notify: each transition of a run is one event on `agent_jobs:events`, and
one POST to the webhook, with what a receiver needs.

The inline runner's process sends its own (a thread beside the runs); the durable
runner's worker processes (real Celery workers, on each pool) send theirs. Fakes only
for the model (`tests/apps.py`).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_jobs import InlineRunner, startup
from agent_jobs.client import Client
from agent_jobs.dispatch import COORDINATE, CeleryDispatcher, celery_client
from agent_jobs.messages import args_sha256
from agent_jobs.notify.sender import stop_sender
from agent_jobs.settings import Settings
from agent_jobs.store import RunView, Store
from agent_jobs.store.schema import outbox
from tests.operations.test_notifications import (
    SECRET,
    Receiver,
    notify_pg,  # noqa: F401 (the fixtures, shared)
    notify_redis,  # noqa: F401
    settings_for,
    streamed,
)
from tests.support import apps
from tests.support.redis_server import RedisServer
from tests.support.services import dispose, finish_inline, own_database, truncate_all
from tests.support.waiting import eventually, wait_status
from tests.support.workers import ROOT, TEST_POOLS, Process, service_env, start_worker

BROKER_DB = 1  # the durable runs' broker, and the Redis their workers append events to


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    made = Receiver().start()
    yield made
    made.stop()


class Driven:
    """A runner, as these tests drive it, and where its events arrive."""

    kind: str
    store: Store
    events: redis.Redis

    def start(self, agent: str) -> str:
        raise NotImplementedError

    def decide(self, run_id: str, call_id: str) -> None:
        raise NotImplementedError

    def answer(self, run_id: str, request_id: str) -> None:
        raise NotImplementedError

    def cancel(self, run_id: str) -> None:
        raise NotImplementedError

    def redrive(self, run_id: str) -> None:
        """Drive the run again where it stands (what a sweep or a stray wake-up does)."""

    def wait_status(self, run_id: str, status: str) -> RunView:
        return wait_status(self.store, run_id, status)

    def redriven(self) -> bool:
        """Every re-drive the test asked for has been done."""
        return True

    def settled(self, run_id: str) -> bool:
        """Nothing left that could write another notification: no step of the run is
        running, every re-drive asked for is done, and every notification written is
        on the stream (a notification's row is written with the status it tells of)."""
        with self.store.connect() as conn:
            rows = conn.execute(outbox.select().where(outbox.c.run_id == run_id)).all()
        running = [j for j in self.store.journal(run_id) if j["state"] == "running"]
        return not running and self.redriven() and all(r.streamed_at for r in rows)

    def written(self, run_id: str) -> int:
        with self.store.connect() as conn:
            return len(conn.execute(outbox.select().where(outbox.c.run_id == run_id)).all())

    def notified(self, run_id: str, count: int) -> list[dict[str, Any]]:
        """The run's events once `count` have arrived and the run has settled: no more
        were written, none more is on the stream."""
        eventually(
            lambda: len(streamed(self.events, run_id)) >= count,
            what=f"{count} events of {run_id}",
            context=lambda: [e["type"] for e in streamed(self.events, run_id)],
        )
        eventually(
            lambda: self.settled(run_id),
            what=f"{run_id} to settle",
            context=lambda: self.store.journal(run_id),
        )
        found = streamed(self.events, run_id)
        assert len(found) == count == self.written(run_id), [e["type"] for e in found]
        return found


class Inline(Driven):
    kind = "inline"

    def __init__(self, store: Store, settings: Settings, events: redis.Redis) -> None:
        self.store = store
        self.events = events
        self.runner = InlineRunner(apps.app, store, settings=settings, poll_interval=0.05)
        startup.start(store, settings)  # this process delivers its runs' notifications

    def start(self, agent: str) -> str:
        return self.runner.start(agent, "go", actor="user-7", metadata={"ticket": 7})

    def decide(self, run_id: str, call_id: str) -> None:
        assert self.runner.signal(run_id, call_id, "approve", actor="alice")

    def answer(self, run_id: str, request_id: str) -> None:
        assert self.runner.answer(run_id, request_id, {"q1": "Friday"}, actor="alice")

    def cancel(self, run_id: str) -> None:
        self.runner.cancel(run_id)


class Durable(Driven):
    kind = "durable"

    def __init__(
        self, store: Store, client: Client, events: redis.Redis, logs: Callable[[], str]
    ) -> None:
        self.store = store
        self.client = client
        self.events = events
        self.logs = logs
        self.redrives: list[str] = []  # the ids of the coordinate tasks the test sent

    def start(self, agent: str) -> str:
        return self.client.enqueue_run(agent, "go", actor="user-7", metadata={"ticket": 7})

    def decide(self, run_id: str, call_id: str) -> None:
        assert self.client.decide(run_id, call_id, "approve", actor="alice")

    def answer(self, run_id: str, request_id: str) -> None:
        assert self.client.answer(run_id, request_id, {"q1": "Friday"}, actor="alice")

    def cancel(self, run_id: str) -> None:
        self.client.cancel(run_id)

    def redrive(self, run_id: str) -> None:
        """`dispatcher.coordinate`, keeping the task's id: the worker's log says when it
        is done."""
        dispatcher = self.client.dispatcher
        assert isinstance(dispatcher, CeleryDispatcher)
        sent = dispatcher.celery.send_task(COORDINATE, args=[run_id], queue=dispatcher.queue)
        self.redrives.append(sent.id)

    def redriven(self) -> bool:
        logs = self.logs()
        return all(f"[{task_id}] succeeded" in logs for task_id in self.redrives)


@pytest.fixture(scope="module")
def workers(notify_pg: str, notify_redis: RedisServer, hook: Receiver) -> Iterator[dict[str, Any]]:  # noqa: F811
    """Two worker processes on each pool, started when a test first needs them; each
    process sends notifications to Redis and to the webhook."""
    started: dict[str, Process] = {}
    queues: dict[str, str] = {}

    def on(pool: str) -> str:
        if pool not in started:
            queues[pool] = f"notify_{pool}_{uuid.uuid4().hex[:6]}"
            env = service_env(
                notify_redis.url(BROKER_DB),
                notify_pg,
                AGENT_JOBS_QUEUE=queues[pool],
                AGENT_JOBS_WEBHOOK_URL=hook.url,
                AGENT_JOBS_WEBHOOK_SECRET=SECRET,
                AGENT_JOBS_NOTIFY_POLL_INTERVAL="0.2",
            )
            started[pool] = start_worker(env, concurrency=2, name=f"notify-{pool}", pool=pool)
        return queues[pool]

    yield {"on": on, "procs": started}
    for proc in started.values():
        proc.stop()


@pytest.fixture(scope="module")
def inline_pg() -> Iterator[str]:
    """The inline runs' database: not the workers', whose senders would take (and send
    elsewhere) the rows of this process's runs."""
    with own_database("agent_jobs_notify_inline") as url:
        yield url


@pytest.fixture(params=["inline", *(f"durable-{pool}" for pool in TEST_POOLS)])
def driven(
    request: pytest.FixtureRequest,
    notify_pg: str,  # noqa: F811
    notify_redis: RedisServer,  # noqa: F811
    hook: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Driven]:
    if request.param == "inline":
        url = request.getfixturevalue("inline_pg")
        monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", url)  # where the test apps record
        store = Store.from_url(url)
        truncate_all(store)
        events = redis.Redis.from_url(notify_redis.url(0))
        events.delete("agent_jobs:events")
        settings = settings_for(
            store, notify_redis.url(0), webhook_url=hook.url, webhook_secret=SECRET
        )
        made = Inline(store, settings, events)
        try:
            yield made
        finally:
            finish_inline(made.runner)
            stop_sender(store)
            events.close()
            dispose(store)
        return
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", notify_pg)
    store = Store.from_url(notify_pg)
    truncate_all(store)
    pool = request.param.partition("-")[2]
    queue = request.getfixturevalue("workers")["on"](pool)
    broker = notify_redis.url(BROKER_DB)
    events = redis.Redis.from_url(broker)
    events.delete("agent_jobs:events")
    celery = celery_client(broker, queue)
    settings = Settings(broker_url=broker, database_url=notify_pg, queue=queue)
    try:
        client = Client(store, apps.app, settings, CeleryDispatcher(celery))
        logs = request.getfixturevalue("workers")["procs"][pool].log
        yield Durable(store, client, events, logs)
    finally:
        celery.close()
        events.close()
        store.engine.dispose()


def common(event: dict[str, Any], run_id: str, status: str) -> None:
    """The fields every notification has."""
    assert event["run_id"] == run_id and event["status"] == status
    assert (
        event["type"]
        == {
            "completed": "run.completed",
            "failed": "run.failed",
            "cancelled": "run.cancelled",
            "awaiting_approval": "run.awaiting_approval",
            "awaiting_answers": "run.awaiting_answers",
        }[status]
    )
    assert event["agent"] and event["actor"] == "user-7" and event["thread_id"] == run_id
    assert event["metadata"] == {"ticket": 7} and event["root_run_id"] == run_id
    assert event["at"] and len(event["event_id"]) == 32


def posted(hook: Receiver, events: list[dict[str, Any]]) -> None:
    """The webhook got the same events as the stream, each signed."""
    ids = {e["event_id"] for e in events}

    def arrived() -> bool:
        return ids <= {g.event["event_id"] for g in hook.delivered()}

    eventually(arrived, what="the webhook's copies")
    got = [g for g in hook.delivered() if g.event["event_id"] in ids]
    assert all(g.signed for g in got)
    assert {g.event["event_id"]: g.event for g in got} == {e["event_id"]: e for e in events}


def test_a_run_that_waits_for_approval_then_completes_notifies_twice(
    driven: Driven, hook: Receiver
) -> None:
    run_id = driven.start("gated")
    driven.wait_status(run_id, "awaiting_approval")
    for _ in range(3):  # driven again while it waits: it parks on the same wait, silently
        driven.redrive(run_id)
    [waiting] = driven.notified(run_id, 1)
    common(waiting, run_id, "awaiting_approval")
    [call] = driven.store.pending_calls(run_id)
    assert waiting["call_id"] == call["call_id"] and waiting["tool"] == "refund"
    assert waiting["args"] == {"order_id": "42", "amount": 1}
    assert waiting["args_sha256"] == args_sha256(call["args"])
    assert waiting["waiting_on"] == f"awaiting_approval refund {call['call_id']}"
    driven.decide(run_id, call["call_id"])
    first, done = driven.notified(run_id, 2)
    assert first == waiting
    common(done, run_id, "completed")
    assert done["output"] == "gated done" and "error" not in done
    posted(hook, [first, done])


def test_a_failed_run_notifies_once(driven: Driven, hook: Receiver) -> None:
    run_id = driven.start("unauthorized")
    [failed] = driven.notified(run_id, 1)
    common(failed, run_id, "failed")
    run = driven.store.get_run(run_id)
    assert run.status == "failed"
    assert failed["error"] == run.error and failed["error_type"] == run.error_type
    assert "provider says auth" in failed["error"]
    assert "output" not in failed
    posted(hook, [failed])


def test_a_cancelled_run_notifies_once(driven: Driven, hook: Receiver) -> None:
    run_id = driven.start("slowtalk")  # a model step of two seconds
    driven.wait_status(run_id, "running")
    driven.cancel(run_id)
    [cancelled] = driven.notified(run_id, 1)
    common(cancelled, run_id, "cancelled")
    assert cancelled["error"] == "cancelled (user)" and cancelled["error_type"] == "Cancelled"
    posted(hook, [cancelled])


def test_questions_notify_once_each_then_the_end(driven: Driven, hook: Receiver) -> None:
    run_id = driven.start("planner2")  # two reads of one turn, both ask
    asked = driven.notified(run_id, 2)
    for event in asked:
        common(event, run_id, "awaiting_answers")
        assert event["tool"] == "schedule"
        assert event["questions"] == [{"id": "q1", "question": "Which day suits you?"}]
    requests = sorted(e["request_id"] for e in asked)
    assert requests == sorted(q["request_id"] for q in driven.store.open_questions(run_id))
    driven.answer(run_id, requests[0])
    # The answered read has run again, with its answer; the run still waits on the
    # other: nothing new to tell.
    answered = f"tool:{requests[0].split(':')[0]}"

    def ran_again() -> bool:
        return any(j["step"] == answered and j["state"] == "done" for j in journal(run_id))

    journal = driven.store.journal
    eventually(
        ran_again,
        what=f"{answered} of {run_id} to be done",
        context=lambda: driven.store.journal(run_id),
    )
    assert driven.notified(run_id, 2) == asked
    driven.answer(run_id, requests[1])
    *_, done = driven.notified(run_id, 3)
    common(done, run_id, "completed")
    assert done["output"] == "planned both"
    posted(hook, [*asked, done])


def test_agent_jobs_run_delivers_its_notifications_before_it_exits(tmp_path: Path) -> None:
    """The embedded default (SQLite, no services) notifies too: `agent-jobs run` sends
    what its run wrote, and what it wrote last, before the process ends."""
    receiver = Receiver().start()
    env = {
        **service_env("redis://127.0.0.1:1/0", f"sqlite:///{tmp_path / 'agent_jobs.db'}"),
        "AGENT_JOBS_WEBHOOK_URL": receiver.url,
        "AGENT_JOBS_WEBHOOK_SECRET": SECRET,
    }
    del env["AGENT_JOBS_BROKER_URL"], env["AGENT_JOBS_APP"]  # the bundled demo, inline
    try:
        ran = subprocess.run(
            [sys.executable, "-m", "agent_jobs.cli", "run", "Where is order 42?", "--yes"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        receiver.stop()
    assert ran.returncode == 0, ran.stderr
    events = [g.event for g in receiver.delivered()]
    assert [e["type"] for e in events] == ["run.awaiting_approval", "run.completed"]
    assert all(g.signed for g in receiver.got)
    assert events[0]["tool"] == "refund" and events[1]["run_id"] == events[0]["run_id"]
