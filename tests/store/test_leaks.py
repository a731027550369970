"""Connections left open: one garbage-collected while open says where it was opened
(tests/support/leaks.py: pytest reports the warning in whatever test runs at that moment,
so the place is what tells whose it was), and a store that refuses to open closes its
own."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, text

from agent_jobs.errors import SchemaNotReadyError
from agent_jobs.store import Store
from tests.support.services import PG_ADMIN_URL, own_database


def open_and_forget(pg_url: str) -> None:
    conn = psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://", 1))
    assert not conn.closed  # and never closed: deleted open as this function returns


def test_a_connection_deleted_while_open_prints_where_it_was_opened(
    pg_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        open_and_forget(pg_url)
    assert [w for w in caught if issubclass(w.category, ResourceWarning)], caught
    err = capfd.readouterr().err
    assert "was deleted while still open; it was opened at:" in err
    assert "in open_and_forget" in err and "test_leaks.py" in err


@pytest.fixture
def unmigrated() -> Iterator[str]:
    """An empty database: no schema yet."""
    with own_database("agent_jobs_unmigrated", migrate=False) as url:
        yield url


def sessions_on(url: str) -> int:
    """How many connections the server holds open to the database at `url`."""
    admin = create_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            query = text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name")
            return int(conn.execute(query, {"name": url.rsplit("/", 1)[1]}).scalar_one())
    finally:
        admin.dispose()


@pytest.mark.services
def test_a_store_that_refuses_an_old_schema_leaves_no_connection_open(unmigrated: str) -> None:
    """Before: the engine that read the schema's version kept its connection, open until
    the refusal was garbage-collected (a ResourceWarning then, in whatever code ran)."""
    with pytest.raises(SchemaNotReadyError) as refused:
        Store.from_url(unmigrated)
    assert "agent-jobs db upgrade" in str(refused.value)
    assert sessions_on(unmigrated) == 0  # the refusal (and its traceback) still held here
