"""`agent-jobs prune` on SQLite and Postgres: what goes, what stays, and what never moves.

Runs are real (the inline runner drives them against the store); their end is then moved
back in time, as if they had ended weeks ago. Their live streams are Redis Streams on the
session's own `redis-server`, written as a durable run writes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select, update

from agent_jobs import InlineRunner, ScriptedModel, session
from agent_jobs.retention import PruneReport, prune, pruned
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.store import events as event_rows
from agent_jobs.store.db import utcnow
from agent_jobs.store.retention import PRUNED
from agent_jobs.store.schema import (
    events,
    journal,
    messages,
    outbox,
    runs,
    tool_calls,
    usage,
)
from agent_jobs.streams.base import stream_key
from tests.support import encryption as test_encryption
from tests.support.builders import add_run, support_app
from tests.support.harness import InlineHarness
from tests.support.redis_server import free_port
from tests.support.services import dispose, finish_inline
from tests.support.waiting import TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
DAYS = 30


def _reads_then_answer() -> ScriptedModel:
    return ScriptedModel(
        [
            {
                "text": "Checking. ",
                "tool_calls": [
                    {"name": "lookup_order", "args": {"order_id": "42"}},
                    {"name": "lookup_order", "args": {"order_id": "7"}},
                ],
            },
            {"text": "Both shipped."},
        ]
    )


@pytest.fixture
def runner(store: Store) -> Iterator[InlineRunner]:
    app = support_app(_reads_then_answer())
    app.agent(
        "refunder",
        model=ScriptedModel(
            [{"tool_calls": [{"name": "refund", "args": {"order_id": "42", "amount": 5}}]}]
        ),
        tools=["refund"],
    )
    settings = Settings(database_url="sqlite://", broker_url=None, redis_url=None)
    made = InlineRunner(app, store, settings=settings, poll_interval=0.05)
    yield made
    finish_inline(made)  # a parked run's thread must not outlive the test


@pytest.fixture
def streams(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def finished(runner: InlineRunner, **kwargs: Any) -> str:
    run_id = runner.start("support", "Where are orders 42 and 7?", actor="user-7", **kwargs)
    assert runner.wait(run_id, timeout=TIMEOUT).status == "completed"
    return run_id


def ended_days_ago(store: Store, run_id: str, days: float) -> None:
    with store.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(finished_at=utcnow() - timedelta(days=days))
        )


def with_stream(client: redis.Redis, run_id: str) -> None:
    """The run's live stream, as a durable run leaves it."""
    client.xadd(stream_key(run_id), {"frame": json.dumps({"type": "done", "run_id": run_id})})


def deliver_all(store: Store) -> None:
    """What a sender does once a notification went everywhere it goes."""
    with store.begin() as conn:
        conn.execute(update(outbox).values(delivered_at=utcnow(), streamed_at=utcnow()))


def counts(store: Store, run_id: str) -> dict[str, int]:
    """Every row a run has, by table."""
    found: dict[str, int] = {}
    with store.connect() as conn:
        for table in (journal, events, outbox, tool_calls, usage, messages):
            found[table.name] = conn.execute(
                select(func.count()).select_from(table).where(table.c.run_id == run_id)
            ).scalar_one()
    return found


# What a notification sender writes on an outbox row as it delivers it, at any moment
# after the run ended (a prune never does): left out of the comparisons.
SENDERS_COLUMNS = {"streamed_at", "delivered_at", "attempts", "next_attempt_at", "last_error"}


def everything(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Every row of the tables a prune touches or must not touch (an outbox row without
    its sender's bookkeeping)."""

    def row(table: Any, found: Any) -> dict[str, Any]:
        fields = dict(found._mapping)
        if table is outbox:
            fields = {k: v for k, v in fields.items() if k not in SENDERS_COLUMNS}
        return fields

    with store.connect() as conn:
        return {
            table.name: sorted((row(table, r) for r in conn.execute(select(table))), key=repr)
            for table in (runs, journal, events, outbox, tool_calls, usage, messages)
        }


def test_a_prune_removes_old_runs_payloads_and_keeps_their_records(
    store: Store, runner: InlineRunner, streams: redis.Redis
) -> None:
    old = finished(runner)
    also_old = finished(runner)
    recent = finished(runner, thread_id=old)  # the old run's thread goes on
    waiting = runner.start("refunder", "refund 42", actor="user-7")
    InlineHarness(runner).wait_status(waiting, "awaiting_approval")
    deliver_all(store)
    for run_id in (old, also_old):
        ended_days_ago(store, run_id, DAYS + 10)
    ended_days_ago(store, recent, DAYS - 1)  # ended after the cutoff
    for run_id in (old, also_old, recent, waiting):
        with_stream(streams, run_id)
    before = {r: counts(store, r) for r in (old, also_old, recent, waiting)}
    kept_before = everything(store)
    messages_before = store.thread_messages(old)
    assert before[old]["journal"] > 10 and before[old]["events"] > 10
    assert before[old]["outbox"] == 1

    report = prune(store, older_than=DAYS, redis_client=streams)

    assert report.runs == 2 and report.streams == 2 and report.complete
    assert report.journal_rows == before[old]["journal"] + before[also_old]["journal"]
    assert report.outbox == 2
    for run_id in (old, also_old):
        now = counts(store, run_id)
        assert now["journal"] == 1  # its mark
        assert now["events"] == 0 and now["outbox"] == 0
        assert streams.exists(stream_key(run_id)) == 0
        # What stays: the run's row, its messages, its tool calls, its usage.
        for table in ("tool_calls", "usage", "messages"):
            assert now[table] == before[run_id][table]
        [mark] = store.journal(run_id)
        assert (mark["step"], mark["state"], mark["seq"]) == (PRUNED, PRUNED, 0)
        assert mark["result"]["journal_rows"] == before[run_id]["journal"]
        assert pruned(store, run_id) == mark["result"]
        assert store.get_run(run_id).status == "completed"
    assert report.events == before[old]["events"] + before[also_old]["events"]
    # The recent run and the waiting one are untouched, streams and all.
    for run_id in (recent, waiting):
        assert counts(store, run_id) == before[run_id]
        assert streams.exists(stream_key(run_id)) == 1
        assert pruned(store, run_id) is None
    assert store.thread_messages(old) == messages_before
    after = everything(store)
    assert after["runs"] == kept_before["runs"]
    for table in ("tool_calls", "usage", "messages"):
        assert after[table] == kept_before[table]

    again = prune(store, older_than=DAYS, redis_client=streams)
    assert (again.runs, again.rows, again.streams) == (0, 0, 0)


def test_a_dry_run_counts_what_the_prune_then_removes_and_changes_nothing(
    store: Store, runner: InlineRunner, streams: redis.Redis
) -> None:
    ids = [finished(runner) for _ in range(3)]
    deliver_all(store)
    for run_id in ids:
        ended_days_ago(store, run_id, DAYS + 1)
        with_stream(streams, run_id)
    before = everything(store)

    dry = prune(store, older_than=DAYS, dry_run=True, batch=2, redis_client=streams)

    assert everything(store) == before
    assert all(streams.exists(stream_key(r)) for r in ids)
    assert dry.dry_run and dry.runs == 3 and dry.streams == 3 and dry.outbox == 3
    done = prune(store, older_than=DAYS, batch=2, redis_client=streams)
    assert (done.runs, done.journal_rows, done.events, done.outbox, done.streams) == (
        dry.runs,
        dry.journal_rows,
        dry.events,
        dry.outbox,
        dry.streams,
    )
    assert dry.journal_rows > 0 and dry.events > 0
    # Three runs two at a time, then one span of the outbox.
    assert done.batches == 3 and done.longest_batch == max(done.durations) > 0


def test_a_thread_keeps_its_inbox_model_and_controls_when_its_old_runs_are_pruned(
    store: Store, runner: InlineRunner
) -> None:
    old = finished(runner)
    with store.begin() as conn:  # a message queued by thread, then taken by the old run
        event_rows.append(
            conn,
            [
                (old, None, session.SPLICED, session.splice("next-turn", -1, 0, ["later"], None)),
                (old, old, session.SPLICED, session.splice("next-turn", 0, 1, [], "claimed")),
                (old, old, session.SELECTED, {"provider": "p", "model": "m"}),
                (old, old, session.PAUSE, {"by": "alice"}),  # who did what stays
            ],
        )
        log = session.thread_events(conn, old)
    assert session.fold_inbox(log).next_turn == []
    ended_days_ago(store, old, DAYS + 1)

    prune(store, older_than=DAYS)

    with store.connect() as conn:
        log = session.thread_events(conn, old)
    assert session.fold_inbox(log).next_turn == []  # "later" was taken: it stays taken
    selection = session.fold_selection(log)
    assert selection is not None and selection.model == "m"
    assert session.fold_status(log) == "idle"
    assert {e.type for e in log} == {session.SPLICED, session.SELECTED, session.PAUSE}


def test_a_delegated_run_stays_while_its_top_level_run_is_unfinished(
    store: Store, runner: InlineRunner
) -> None:
    child = finished(runner)
    waiting = runner.start("refunder", "refund 42", actor="user-7")
    InlineHarness(runner).wait_status(waiting, "awaiting_approval")
    with store.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == child).values(root_run_id=waiting))
    ended_days_ago(store, child, DAYS + 1)
    rows = counts(store, child)["journal"]

    assert prune(store, older_than=DAYS).runs == 0
    assert counts(store, child)["journal"] == rows

    runner.cancel(waiting)
    runner.wait(waiting, timeout=TIMEOUT)
    assert prune(store, older_than=DAYS).runs == 1  # the child (its root ended just now)


def test_a_redis_that_fails_fails_the_batch_and_changes_nothing(
    store: Store, runner: InlineRunner
) -> None:
    run_id = finished(runner)
    ended_days_ago(store, run_id, DAYS + 1)
    before = everything(store)
    down = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)

    with pytest.raises(redis.ConnectionError):
        prune(store, older_than=DAYS, redis_client=down)

    assert everything(store) == before
    assert prune(store, older_than=DAYS).runs == 1  # and the next prune takes it


def test_bad_arguments_are_refused(store: Store) -> None:
    from agent_jobs.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="days >= 0"):
        prune(store, older_than=-1)
    with pytest.raises(InvalidRequestError, match="--batch"):
        prune(store, older_than=1, batch=0)


def test_a_run_held_by_another_transaction_is_skipped_not_waited_for(
    pg_url: str, runner_on_pg: InlineRunner
) -> None:
    store = runner_on_pg.store
    held, free = finished(runner_on_pg), finished(runner_on_pg)
    for run_id in (held, free):
        ended_days_ago(store, run_id, DAYS + 1)
    hold = threading.Event()
    released = threading.Event()

    def holder() -> None:  # e.g. a retry that moves the run: it takes the run's row
        with store.begin() as conn:
            conn.execute(select(runs).where(runs.c.id == held).with_for_update())
            hold.set()
            released.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert hold.wait(10)
        report = prune(store, older_than=DAYS)
    finally:
        released.set()
        thread.join(10)
    assert report.runs == 1 and pruned(store, free) is not None and pruned(store, held) is None
    assert prune(store, older_than=DAYS).runs == 1 and pruned(store, held) is not None


@pytest.fixture
def runner_on_pg(pg_url: str) -> Iterator[InlineRunner]:
    from tests.support.services import truncate_all

    store = Store.from_url(pg_url)
    truncate_all(store)
    settings = Settings(database_url=pg_url, broker_url=None, redis_url=None)
    runner = InlineRunner(support_app(_reads_then_answer()), store, settings=settings)
    try:
        yield runner
    finally:
        finish_inline(runner)
        dispose(store)


# --- the command line ---------------------------------------------------------------------


def agent_jobs(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = test_encryption.bare_environ()
    return subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", *args],
        cwd=ROOT,
        env=environment | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_prunes_and_journal_and_status_still_answer(
    db_url: str, store: Store, runner: InlineRunner, streams: redis.Redis, redis_url: str
) -> None:
    run_id = finished(runner)
    ended_days_ago(store, run_id, DAYS + 1)
    with_stream(streams, run_id)
    env = {"AGENT_JOBS_DATABASE_URL": db_url, "AGENT_JOBS_REDIS_URL": redis_url}

    dry = agent_jobs("prune", "--older-than", str(DAYS), "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["runs"] == 1 and counts(store, run_id)["journal"] > 1

    done = agent_jobs("prune", "--older-than", str(DAYS), "--batch", "5", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pruned 1 run: "), done.stdout
    assert "1 stream" in done.stdout and "the longest" in done.stdout
    assert streams.exists(stream_key(run_id)) == 0

    shown = agent_jobs("journal", run_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"the journal of run {run_id} was pruned at" in shown.stdout
    status = agent_jobs("status", run_id, "--json", env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["status"] == "completed" and doc["output"] == "Both shipped."
    assert doc["usage"]["model_calls"] == 2

    refused = agent_jobs("prune", "--older-than", "-2", env=env)
    assert refused.returncode == 2 and "--older-than" in refused.stderr
    missing = agent_jobs("prune", env=env)
    assert missing.returncode == 2


def test_the_command_says_so_when_redis_is_down(db_url: str, store: Store) -> None:
    env = {
        "AGENT_JOBS_DATABASE_URL": db_url,
        "AGENT_JOBS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    add_run(store, "old-run")  # one old finished run, with no journal
    with store.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == "old-run")
            .values(status="completed", finished_at=utcnow() - timedelta(days=DAYS + 1))
        )

    done = agent_jobs("prune", "--older-than", str(DAYS), env=env)

    assert done.returncode == 5, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: Redis (redis://127.0.0.1:") and "unreachable" in (
        done.stderr
    )
    assert pruned(store, "old-run") is None


def test_a_report_reads_as_a_sentence() -> None:
    report = PruneReport(cutoff=utcnow(), dry_run=True, runs=1, journal_rows=2, events=1)
    assert report.summary() == (
        "would prune 1 run: 2 journal rows, 1 event, 0 notifications, 0 streams"
    )
