"""The services every layer above the fast one shares: this session's queue, the
Postgres the tests create their databases in, and emptying a database between tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from agent_jobs import AgentApp, AgentJobsError, InlineRunner
from agent_jobs.store import Store
from agent_jobs.store.db import make_engine, upgrade

# A queue of this test session's own for the shared and crash-test workers: two pytest
# runs on one machine's Redis never take each other's tasks.
SESSION_QUEUE = f"agent_jobs_test_{uuid.uuid4().hex[:8]}"

PG_ADMIN_URL = os.environ.get(
    "AGENT_JOBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@contextmanager
def own_database(prefix: str, *, migrate: bool = True) -> Iterator[str]:
    """A Postgres database of the caller's own, migrated to the newest schema (or left
    empty), and dropped afterwards with whatever still holds a connection to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        except OperationalError as exc:  # a missing service is a failure, never a skip
            pytest.fail(f"Postgres is required for the tests ({PG_ADMIN_URL}): {exc}")
        try:
            url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
            if migrate:
                engine = make_engine(url)
                try:
                    upgrade(engine)
                finally:
                    engine.dispose()
            yield url
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def truncate_all(store: Store) -> None:
    """Empty every table so a test starts from a clean database. The data keys stay:
    processes of earlier tests still hold theirs opened (agent_jobs/encryption)."""
    from agent_jobs.store.schema import data_keys, metadata

    tables = [t for t in metadata.sorted_tables if t is not data_keys]
    if store.engine.dialect.name == "postgresql":
        names = ", ".join(f'"{t.name}"' for t in tables)
        # A shared worker may still be finishing the last test's run: its transaction and
        # the TRUNCATE can deadlock, and Postgres then cancels one. Ours is tried again.
        for attempt in range(5):
            try:
                with store.begin() as conn:
                    conn.execute(text(f"TRUNCATE {names}"))
                return
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
    with store.begin() as conn:
        for table in reversed(tables):
            conn.execute(table.delete())


def finish_inline(runner: InlineRunner) -> None:
    """Let the inline runs the test leaves end: a run still going is cancelled, and each
    run's thread is waited for (it writes after the status a test waits for, and would go
    on using the store after the test disposed it)."""
    from tests.support.waiting import TIMEOUT

    for run in runner.store.list_runs(limit=10_000):
        if run.runner == "inline" and not run.finished:
            with suppress(AgentJobsError):  # refused: it is ending anyway
                runner.cancel(run.run_id)
    for run in runner.store.list_runs(limit=10_000):
        if run.runner == "inline":
            runner.wait(run.run_id, timeout=TIMEOUT)


@contextmanager
def inline_on(app: AgentApp, url: str) -> Iterator[InlineRunner]:
    """The inline runner of `app` on an emptied database at `url`; its runs ended and its
    store closed once the block is done."""
    from agent_jobs.settings import Settings

    store = Store.from_url(url)
    truncate_all(store)
    runner = InlineRunner(app, store, settings=Settings(), poll_interval=0.05)
    try:
        yield runner
    finally:
        finish_inline(runner)
        dispose(store)


def dispose(store: Store) -> None:
    """Close the store's connections once every one is given back. A connection a thread
    still held at `dispose()` would go back, open, to a pool nobody holds any more, and be
    closed by the garbage collector at some later test's moment: a ResourceWarning that
    fails that test (tests/support/leaks.py says where the connection was opened)."""
    from tests.support.waiting import eventually

    checked_out = getattr(store.engine.pool, "checkedout", None)
    if checked_out is not None:
        eventually(
            lambda: checked_out() == 0,
            what="every connection of the store to be given back",
            context=store.engine.pool.status,
        )
    store.engine.dispose()


def wait_for_a_lock(store: Store, pid: int | None = None) -> None:
    """Block until a session of the store's database (the backend `pid`, if given) waits
    for a lock: a transaction the test set against another has reached it."""
    from tests.support.waiting import eventually

    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND (CAST(:pid AS integer) IS NULL OR pid = :pid)"
    )

    def waiting() -> int:
        with store.connect() as conn:
            return int(conn.execute(query, {"pid": pid}).scalar_one())

    eventually(waiting, what=f"a session (pid {pid}) to wait for a lock", every=0.01)


def waiting_on_a_lock(store: Store) -> int:
    """How many sessions of the store's (Postgres) database wait for a lock another one
    holds: a test sees a transaction blocked where it wants it instead of sleeping."""
    with store.engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )
        return int(found.scalar_one())
