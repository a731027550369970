"""Where the tables live on Postgres: a schema of their own (`AGENT_JOBS_DATABASE_SCHEMA`,
`agent_jobs`) with their own Alembic version table, beside an application's own tables
and migrations in the same database. A deployment of the earlier layout (everything in
`public`) is moved there in place by `agent-jobs db upgrade`; a migration that fails says
so in one line."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from agent_jobs.migrations import HEAD
from agent_jobs.store import Store
from agent_jobs.store.db import make_engine, upgrade
from agent_jobs.store.schema import metadata
from tests.support import encryption as test_encryption
from tests.support.services import PG_ADMIN_URL, own_database
from tests.support.workers import ROOT

APP_REVISION = "a1b2c3d4e5f6"  # the application's own Alembic history


@pytest.fixture
def database() -> Iterator[str]:
    """An empty database holding, in `public`, an application's own table and Alembic
    version table."""
    with own_database("agent_jobs_layout", migrate=False) as url:
        plain = create_engine(url)
        with plain.begin() as conn:
            conn.execute(text("CREATE TABLE orders (id int primary key, note text)"))
            conn.execute(text("INSERT INTO orders VALUES (42, 'theirs')"))
            conn.execute(text("CREATE TABLE alembic_version (version_num varchar(32) primary key)"))
            conn.execute(text("INSERT INTO alembic_version VALUES (:r)"), {"r": APP_REVISION})
        plain.dispose()
        yield url


def tables(url: str) -> dict[str, set[str]]:
    plain = create_engine(url)
    try:
        with plain.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT table_schema, table_name FROM information_schema.tables "
                    "WHERE table_schema IN ('public', 'agent_jobs')"
                )
            ).all()
    finally:
        plain.dispose()
    found: dict[str, set[str]] = {"public": set(), "agent_jobs": set()}
    for schema, name in rows:
        found[schema].add(name)
    return found


def revisions(url: str, schema: str) -> list[str]:
    plain = create_engine(url)
    try:
        with plain.connect() as conn:
            query = text(f"SELECT version_num FROM {schema}.alembic_version")
            return list(conn.execute(query).scalars())
    finally:
        plain.dispose()


def db_upgrade(url: str) -> subprocess.CompletedProcess[str]:
    env = test_encryption.bare_environ()
    env.update(AGENT_JOBS_DATABASE_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


OURS = {t.name for t in metadata.sorted_tables}
LATER = {
    "schedules",
    "data_keys",
    "payload_blobs",
}  # tables of migrations after 0005, the earlier layout's last


def test_a_database_with_its_own_migrations_is_upgraded_beside_them(database: str) -> None:
    """It failed with a 60-line traceback (one alembic_version for two histories)."""
    done = db_upgrade(database)
    assert done.returncode == 0, done.stderr
    found = tables(database)
    assert OURS | {"alembic_version"} <= found["agent_jobs"]
    assert found["public"] == {"orders", "alembic_version"}  # theirs, untouched
    assert revisions(database, "public") == [APP_REVISION]
    assert revisions(database, "agent_jobs") == [HEAD]
    store = Store.from_url(database)  # and the store works there
    try:
        assert store.list_runs() == []
    finally:
        store.engine.dispose()


def test_a_deployment_of_the_earlier_layout_is_moved_in_place(database: str) -> None:
    """Everything in `public`, its revision in the shared `alembic_version`: after the
    upgrade, its tables and rows are in the schema, the application's are where they
    were."""
    earlier = make_engine(database, schema="public")
    try:
        with earlier.begin() as conn:  # what the earlier layout's upgrade left
            conn.execute(text("DROP TABLE alembic_version"))
        upgrade(earlier, "0005")
        with earlier.begin() as conn:
            conn.execute(text("INSERT INTO alembic_version VALUES (:r)"), {"r": APP_REVISION})
            conn.execute(
                text(
                    "INSERT INTO threads (id, created_at, updated_at) "
                    "VALUES ('t-earlier', now(), now())"
                )
            )
    finally:
        earlier.dispose()
    assert tables(database)["public"] >= OURS - LATER

    done = db_upgrade(database)
    assert done.returncode == 0, done.stderr
    found = tables(database)
    assert found["agent_jobs"] >= OURS and not (OURS & found["public"])
    assert found["public"] == {"orders", "alembic_version"}
    assert revisions(database, "public") == [APP_REVISION]
    assert revisions(database, "agent_jobs") == [HEAD]  # and migrated on to the newest
    plain = create_engine(database)
    try:
        with plain.connect() as conn:
            moved = conn.execute(text("SELECT id FROM agent_jobs.threads")).scalars().all()
            theirs = conn.execute(text("SELECT note FROM public.orders")).scalars().all()
    finally:
        plain.dispose()
    assert moved == ["t-earlier"] and theirs == ["theirs"]


def test_a_migration_that_fails_says_what_to_do_in_one_line(database: str) -> None:
    plain = create_engine(database)
    try:
        with plain.begin() as conn:  # a table of our name that is not ours: a migration fails
            conn.execute(text("CREATE SCHEMA agent_jobs"))
            conn.execute(text("CREATE TABLE agent_jobs.threads (id int)"))
    finally:
        plain.dispose()
    done = db_upgrade(database)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: migrating the database failed"), lines
    assert "Traceback" not in done.stderr


def test_a_role_that_may_not_create_schemas_upgrades_the_schema_made_for_it() -> None:
    """A database role given a schema of its own (made for it by an administrator), and
    no right to create schemas in the database: `db upgrade` failed with "permission
    denied for database" at `CREATE SCHEMA IF NOT EXISTS`, which Postgres checks before
    it looks whether the schema exists."""
    role = f"aj_migrator_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        with own_database("agent_jobs_migrator", migrate=False) as url:
            owner = create_engine(url, isolation_level="AUTOCOMMIT")
            try:
                with owner.connect() as conn:
                    conn.execute(text(f'CREATE SCHEMA agent_jobs AUTHORIZATION "{role}"'))
                    name = url.rsplit("/", 1)[1]
                    conn.execute(text(f'REVOKE CREATE ON DATABASE "{name}" FROM "{role}"'))
            finally:
                owner.dispose()
            as_role = url.replace("postgres@", f"{role}@", 1)
            done = db_upgrade(as_role)
            assert done.returncode == 0, done.stderr
            assert OURS | {"alembic_version"} <= tables(url)["agent_jobs"]
            assert revisions(url, "agent_jobs") == [HEAD]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()
