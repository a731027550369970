"""The row-lock order of agent_jobs/store/locks.py, checked as each lock is taken: a run's
row, then its thread's, within one transaction; a new transaction starts afresh."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_jobs.store import Store, places
from agent_jobs.store import events as event_rows
from agent_jobs.store import runs as run_rows
from agent_jobs.store.locks import LockOrderError

pytestmark = pytest.mark.unit


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    made = Store.from_url(f"sqlite:///{tmp_path / 'locks.db'}")
    try:
        yield made
    finally:
        made.engine.dispose()


def test_a_run_then_its_thread_is_the_order(store: Store) -> None:
    with store.begin() as conn:
        run_rows.lock_run(conn, "r1")
        run_rows.lock_run(conn, "r2", touch=True)
        event_rows.lock_thread(conn, "t1")
        places.thread_runs(conn, "t1")


def test_a_run_locked_after_its_thread_fails_loudly(store: Store) -> None:
    wrong = "a run's row locked after a thread's row"
    with pytest.raises(LockOrderError, match=wrong), store.begin() as conn:
        event_rows.lock_thread(conn, "t1")
        run_rows.lock_run(conn, "r1")
    with pytest.raises(LockOrderError, match=wrong), store.begin() as conn:
        places.thread_runs(conn, "t1")
        run_rows.lock_and_touch(conn, "r1")


def test_each_transaction_starts_afresh(store: Store) -> None:
    with store.begin() as conn:
        event_rows.lock_thread(conn, "t1")
    with store.begin() as conn:  # the same pooled connection, a new transaction
        run_rows.lock_run(conn, "r1")


def test_outside_the_test_suite_a_wrong_order_is_logged(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("AGENT_JOBS_LOCK_ORDER")
    with store.begin() as conn:
        event_rows.lock_thread(conn, "t1")
        run_rows.lock_run(conn, "r1")
    assert "a run's row locked after a thread's row" in caplog.text
