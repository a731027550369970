"""Sleeping runs on the inline runner (the embedded default), on SQLite and Postgres: a
sleeper holds no thread (one waiter for all), wakes at its time or early on a message
(this process's or another's), is cancelled, paused, forked; bad arguments and a sleep
past AGENT_JOBS_MAX_SLEEP are a tool error the model reads; the doors' documents show it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from agent_jobs import InlineRunner, retention
from agent_jobs.documents import run_document, steps_document
from agent_jobs.errors import ControlRefusedError
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.store.db import utcnow
from tests.support import apps
from tests.support.apps.timers import NAP
from tests.support.services import finish_inline, truncate_all
from tests.support.waiting import eventually

ON_TIME = timedelta(seconds=1)


@pytest.fixture
def runner(db_url: str) -> Iterator[InlineRunner]:
    store = Store.from_url(db_url, auto_upgrade=True)
    truncate_all(store)
    made = InlineRunner(apps.app, store, settings=Settings(), poll_interval=0.05)
    try:
        yield made
    finally:
        finish_inline(made)
        store.engine.dispose()


def start(runner: InlineRunner, **args: Any) -> str:
    return runner.start("sleeper", json.dumps(args))


def asleep(runner: InlineRunner, run_id: str) -> datetime:
    run = eventually(
        lambda: (r := runner.store.get_run(run_id)).status == "sleeping" and r,
        what=f"run {run_id} to sleep",
    )
    assert run.wake_at is not None
    return _aware(run.wake_at)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=utcnow().tzinfo)


def timer(runner: InlineRunner, run_id: str) -> dict[str, Any]:
    return {row["step"]: row for row in runner.store.journal(run_id)}[f"timer:{NAP}"]


def run_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("run-")]


def test_a_sleeper_holds_no_thread_and_wakes_at_its_time(runner: InlineRunner) -> None:
    run_ids = [start(runner, seconds=1.5) for _ in range(10)]
    wakes = [asleep(runner, run_id) for run_id in run_ids]
    eventually(lambda: not run_threads(), what="no run's thread left while they sleep")
    eventually(
        lambda: [t.name for t in threading.enumerate()].count("sleepers") == 1,
        what="one waiter for all the sleepers",
    )
    for run_id, wake_at in zip(run_ids, wakes, strict=True):
        run = runner.wait(run_id, timeout=60)
        assert run.status == "completed"
        result = timer(runner, run_id)["result"]
        at = datetime.fromisoformat(result["at"])
        assert result["woke"] == "time" and timedelta(0) <= at - wake_at < ON_TIME
        assert json.loads(run.output or "")["tool"]["woke"] == "time"


def test_a_message_wakes_a_sleeper_at_once(runner: InlineRunner) -> None:
    run_id = start(runner, seconds=3600, reason="the build")
    wake_at = asleep(runner, run_id)
    doc = run_document(runner.store, runner.store.get_run(run_id))
    assert doc["status"] == "sleeping" and doc["wake_at"] is not None
    assert doc["waiting_on"].startswith("sleeping until")
    runner.post_message(run_id, "green")
    run = runner.wait(run_id, timeout=60)
    assert run.status == "completed"
    assert json.loads(run.output or "") == {
        "tool": {"woke": "message", "at": timer(runner, run_id)["result"]["at"]},
        "messages": ["green"],
    }
    assert datetime.fromisoformat(timer(runner, run_id)["result"]["at"]) < wake_at
    frames = [f["type"] for f in runner.frames(run_id)]
    assert frames.index("timer") < frames.index("tool_result") < frames.index("done")
    timer_frame = next(f for f in runner.frames(run_id) if f["type"] == "timer")
    assert timer_frame["call_id"] == NAP and timer_frame["reason"] == "the build"
    kinds = {s["step"]: s["kind"] for s in steps_document(runner.store, run_id)["steps"]}
    assert kinds[f"timer:{NAP}"] == "timer"


def test_a_message_another_process_posts_wakes_the_sleeper(
    runner: InlineRunner, db_url: str
) -> None:
    run_id = start(runner, seconds=3600)
    asleep(runner, run_id)
    other_store = Store.from_url(db_url)
    other = InlineRunner(apps.app, other_store, settings=Settings(), poll_interval=0.05)
    try:
        other.post_message(run_id, "from elsewhere")
    finally:
        other_store.engine.dispose()
    run = runner.wait(run_id, timeout=60)
    assert json.loads(run.output or "")["messages"] == ["from elsewhere"]


def test_a_cancelled_sleeper_ends_and_never_wakes(runner: InlineRunner) -> None:
    run_id = start(runner, seconds=1)
    wake_at = asleep(runner, run_id)
    runner.cancel(run_id)
    run = runner.wait(run_id, timeout=60)
    assert run.status == "cancelled" and run.wake_at is None
    eventually(lambda: utcnow() > wake_at + ON_TIME, what="its wake time to pass")
    assert timer(runner, run_id)["state"] == "waiting"
    assert runner.store.get_run(run_id).status == "cancelled"


def test_a_paused_sleeper_stays_paused_and_wakes_once_resumed(runner: InlineRunner) -> None:
    run_id = start(runner, seconds=1)
    wake_at = asleep(runner, run_id)
    runner.pause(run_id, actor="ops")
    eventually(lambda: runner.store.get_run(run_id).status == "paused", what="it to pause")
    eventually(lambda: utcnow() > wake_at + 2 * ON_TIME, what="its wake time to pass")
    assert runner.store.get_run(run_id).status == "paused"
    resumed = utcnow()
    runner.resume(run_id, actor="ops")
    run = runner.wait(run_id, timeout=60)
    assert run.status == "completed"
    result = timer(runner, run_id)["result"]
    assert result["woke"] == "time" and datetime.fromisoformat(result["at"]) >= resumed


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"seconds": -1}, "0 or more"),
        ({"seconds": 10**9}, "AGENT_JOBS_MAX_SLEEP"),
        ({"until": "tomorrow"}, "ISO 8601"),
        ({"until": "2030-01-01T09:00:00"}, "offset"),
        ({"seconds": 1, "until": "2030-01-01T09:00:00Z"}, "one of"),
        ({"minutes": 5}, "not ['minutes']"),
    ],
)
def test_bad_arguments_are_a_tool_error_the_model_reads(
    runner: InlineRunner, args: dict[str, Any], error: str
) -> None:
    run = runner.wait(start(runner, **args), timeout=60)
    assert run.status == "completed"
    said = json.loads(run.output or "")["tool"]["error"]
    assert error in said
    assert not any(row["step"].startswith("timer:") for row in runner.store.journal(run.run_id))


def test_a_fork_at_the_wait_sleeps_again_and_one_after_it_does_not(
    runner: InlineRunner,
) -> None:
    run_id = start(runner, seconds=0.2)
    assert runner.wait(run_id, timeout=60).status == "completed"
    again = runner.fork(run_id, f"timer:{NAP}", actor="ops")
    asleep(runner, again.run_id)
    assert runner.wait(again.run_id, timeout=60).status == "completed"
    assert timer(runner, again.run_id)["result"]["woke"] == "time"
    after = runner.fork(run_id, f"persist:toolexec:{NAP}", actor="ops")
    assert runner.wait(after.run_id, timeout=60).status == "completed"
    assert timer(runner, after.run_id)["result"] == timer(runner, run_id)["result"]


def test_a_delegated_run_sleeps_and_a_message_to_it_wakes_it(runner: InlineRunner) -> None:
    parent = runner.start("sleeper_boss", "delegate")
    child = eventually(
        lambda: next((r for r in runner.store.list_runs() if r.parent_run_id == parent), None),
        what="the delegated run",
    )
    asleep(runner, child.run_id)
    eventually(lambda: not run_threads(), what="no thread left while the child sleeps")
    runner.post_message(child.run_id, "wake, child")
    assert runner.wait(parent, timeout=60).status == "completed"
    done = runner.store.get_run(child.run_id)
    assert json.loads(done.output or "")["messages"] == ["wake, child"]
    assert timer(runner, child.run_id)["result"]["woke"] == "message"


def test_retry_refuses_a_sleeper_and_prune_leaves_it(runner: InlineRunner) -> None:
    run_id = start(runner, seconds=3600)
    asleep(runner, run_id)
    with pytest.raises(ControlRefusedError):
        runner.retry(run_id, actor="ops")
    later = utcnow() + timedelta(days=2)  # as if it had slept for days
    report = retention.prune(runner.store, older_than=1, now=later)
    assert report.runs == 0
    assert retention.pruned(runner.store, run_id) is None
    assert runner.store.get_run(run_id).status == "sleeping"
    assert len(runner.store.journal(run_id)) > 0
