"""A model step held back for later (the provider's Retry-After, a rate limit's wait) is
left alone by recovery and the sweep until its moment: a delivery is on its way for then.
Once the moment has passed and nobody took the step, they send it as any other.

Real Postgres and Redis; the durable runner in this process, its sends recorded."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from agent_jobs import AgentApp
from agent_jobs.dispatch import MODEL_TURN
from agent_jobs.errors import ModelError, RetryLater
from agent_jobs.leases import Leases
from agent_jobs.messages import ModelRequest, ModelResponse
from agent_jobs.models.base import DeltaSink
from agent_jobs.runners.durable import recovery
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.runs import RunRequest
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.store.db import utcnow
from agent_jobs.store.schema import journal
from agent_jobs.streams.redis_streams import RedisStreams
from tests.support.services import truncate_all

RETRY_AFTER = 30.0


class TooMany:
    """A provider that answers every call with a 429 and a Retry-After."""

    name = "openai:busy"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        raise ModelError("HTTP 429: slow down", kind="rate_limit", retry_after=RETRY_AFTER)


class Sent:
    """A dispatcher that remembers what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float | None]] = []
        self.redrives: list[str] = []

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        self.redrives.append(run_id)

    def steps(
        self, run_id: str, steps: Sequence[tuple[str, str]], *, countdown: float | None = None
    ) -> None:
        self.sent.extend((run_id, step, countdown) for _, step in steps)

    def steps_of(self, run_id: str) -> list[tuple[str, str, float | None]]:
        return [sent for sent in self.sent if sent[0] == run_id]


@pytest.fixture
def held(pg_url: str, redis_url: str) -> Iterator[tuple[DurableRunner, Sent, str]]:
    """A run whose model step the provider wants retried in 30 s: held back until then."""
    app = AgentApp()
    app.agent("busy", model=TooMany())  # type: ignore[arg-type]
    store = Store.from_url(pg_url)
    truncate_all(store)
    streams = RedisStreams.from_url(redis_url)
    sent = Sent()
    settings = Settings(database_url=pg_url, sweep_stale_after=0)
    runner = DurableRunner(app, store, sent, streams, settings, Leases(streams.client))
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    runner.create(RunRequest(agent="busy", input="hello", actor="user-7"), run_id)
    runner.continue_run(run_id)  # model:1 runs where the pass ended: a 429
    # Its retry went to the broker with the provider's wait.
    assert sent.steps_of(run_id) == [(run_id, "model:1", pytest.approx(RETRY_AFTER, abs=1))]
    sent.sent.clear()
    try:
        yield runner, sent, run_id
    finally:
        streams.client.close()
        store.engine.dispose()


def _row(runner: DurableRunner, run_id: str) -> dict[str, Any]:
    return next(j for j in runner.store.journal(run_id) if j["step"] == "model:1")


def _move_back(runner: DurableRunner, run_id: str, seconds: float) -> None:
    """As if `seconds` had passed since the step was held back: its moment (and lease)
    are that much nearer."""
    row = _row(runner, run_id)
    moments = ("not_before", "lease_until", "created_at")
    values = {c: row[c] - timedelta(seconds=seconds) for c in moments if row[c] is not None}
    with runner.store.begin() as conn:
        conn.execute(
            update(journal)
            .where(journal.c.run_id == run_id, journal.c.step == "model:1")
            .values(**values)
        )


def test_a_dead_processs_recovery_leaves_a_held_step_alone_until_its_moment(
    held: tuple[DurableRunner, Sent, str],
) -> None:
    runner, sent, run_id = held
    row = _row(runner, run_id)
    assert row["state"] in ("scheduled", "started") and row["holder"] is None  # unclaimed
    # A process that worked on the run died (a sibling's task, a pass): the runs it held
    # are recovered. The held step has a delivery coming in 30 s: not sent now.
    recovery.recover_process(runner.store, runner.leases, sent, "m|1|gone", {run_id})
    recovery.adopt_orphans(runner.store, runner.leases, sent, run_id)
    assert sent.steps_of(run_id) == []
    # Its moment passed and nobody took it (that delivery was lost with the process that
    # held it): now it is sent.
    _move_back(runner, run_id, RETRY_AFTER + 1)
    recovery.recover_process(runner.store, runner.leases, sent, "m|1|gone", {run_id})
    assert sent.steps_of(run_id) == [(run_id, "model:1", None)]


def test_the_sweep_leaves_a_held_step_alone_until_its_moment(
    held: tuple[DurableRunner, Sent, str],
) -> None:
    runner, sent, run_id = held
    _move_back(runner, run_id, 5)  # stale by any measure, but due in 25 s
    with runner.store.begin() as conn:  # a lease lapsed long ago: only its moment holds it
        conn.execute(
            update(journal)
            .where(journal.c.run_id == run_id, journal.c.step == "model:1")
            .values(lease_until=utcnow() - timedelta(minutes=5))
        )
    assert recovery.redrive_stale(runner.store, runner.leases, sent, runner.settings) == 1
    assert sent.steps_of(run_id) == [] and sent.redrives == [run_id]
    _move_back(runner, run_id, RETRY_AFTER)
    recovery.redrive_stale(runner.store, runner.leases, sent, runner.settings)
    assert sent.steps_of(run_id) == [(run_id, "model:1", None)]


def test_a_held_step_delivered_on_time_is_carried_out(
    held: tuple[DurableRunner, Sent, str],
) -> None:
    runner, _, run_id = held
    _move_back(runner, run_id, RETRY_AFTER)
    # Its delivery arrives (Celery's countdown): the provider still says 429, so the
    # waterfall holds it back again, as a retry of it.
    with pytest.raises(RetryLater):
        runner.execute_step(run_id, "model:1", task=MODEL_TURN, retries=1)
    assert _row(runner, run_id)["not_before"] > utcnow() + timedelta(seconds=25)
    attempts = runner.leases.client.get(f"agent_jobs:attempts:{run_id}:model:1")
    assert attempts == b"2"  # the call was made: an attempt, after the kept one
