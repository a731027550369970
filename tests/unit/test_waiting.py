"""The one way a test waits (tests/support/waiting.py): what it returns, and what it says
when the awaited event does not come. Runs on SQLite with the inline runner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_jobs import AgentApp, InlineRunner, ScriptedModel, Store
from tests.support.waiting import GaveUp, eventually, wait_status

# Only the tests that expect a wait to give up use it: the event they wait for never comes.
NEVER = 0.2


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[InlineRunner]:
    app = AgentApp()
    app.agent("chat", model=ScriptedModel([{"text": "hello"}]))
    store = Store.from_url(f"sqlite:///{tmp_path / 'waiting.db'}", auto_upgrade=True)
    try:
        yield InlineRunner(app, store, poll_interval=0.01)
    finally:
        store.engine.dispose()


def test_eventually_returns_what_the_check_returned_once_it_held() -> None:
    calls = iter([None, 0, "", "seen"])
    assert eventually(lambda: next(calls), what="the third look") == "seen"


def test_a_wait_that_gives_up_says_what_it_awaited_the_last_value_and_the_context() -> None:
    with pytest.raises(GaveUp) as gave_up:
        eventually(lambda: [], NEVER, what="a row to appear", context=lambda: "the log")
    message = str(gave_up.value)
    assert "waiting for a row to appear" in message
    assert "last: []" in message and "context: 'the log'" in message


def test_wait_status_returns_the_run_and_waits_for_one_not_there_yet(
    runner: InlineRunner,
) -> None:
    run_id = runner.start("chat", "hi", actor="user-7")
    assert wait_status(runner.store, run_id, "completed").output == "hello"
    with pytest.raises(GaveUp) as gave_up:
        wait_status(runner.store, "no-such-run", "completed", timeout=NEVER)
    assert "run no-such-run to be completed" in str(gave_up.value)
    assert "no such run" in str(gave_up.value)


def test_a_strict_wait_fails_at_once_when_the_run_ended_otherwise(
    runner: InlineRunner,
) -> None:
    run_id = runner.start("chat", "hi", actor="user-7")
    wait_status(runner.store, run_id, "completed")
    # Not a GaveUp after the timeout: the run has ended and nothing would start it again.
    with pytest.raises(AssertionError) as ended:
        wait_status(runner.store, run_id, "awaiting_approval", strict=True, context=lambda: "logs")
    assert not isinstance(ended.value, GaveUp)
    assert f"run {run_id} ended completed" in str(ended.value) and "logs" in str(ended.value)
    # Without `strict`, the same wait only gives up at its timeout.
    with pytest.raises(GaveUp):
        wait_status(runner.store, run_id, "awaiting_approval", timeout=NEVER)
