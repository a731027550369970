"""Engines and migrations: SQLite for the embedded default, Postgres through psycopg 3."""

from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy import Column, Connection, Engine, Table, create_engine, event, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.dml import ReturningInsert

from ..errors import ConfigurationError, SchemaNotReadyError
from . import blobs, driver

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


_HOST = socket.gethostname()


def this_process() -> str:
    """The process writing a step's outcome, as the journal's `worker` names it
    (`host:pid`): computed each time, since a pool's processes fork from one parent."""
    return f"{_HOST}:{os.getpid()}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


# --- statements both dialects write the same way -----------------------------------------

DIALECTS: tuple[str, ...] = ("postgresql", "sqlite")
UpsertInsert = postgresql.Insert | sqlite.Insert


def dialect_insert(dialect: str, table: Table) -> UpsertInsert:
    """An `INSERT` into `table` that takes `ON CONFLICT` clauses, for `dialect` (the
    connection's `dialect.name`: "postgresql", or "sqlite")."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


_UNLESS_EXISTS: dict[tuple[str, Table, tuple[Column[Any], ...]], ReturningInsert[Any]] = {}


def insert_unless_exists(
    conn: Connection,
    table: Table,
    values: Mapping[str, Any],
    *,
    conflict: Sequence[Column[Any]] | None = None,
) -> bool:
    """Insert the row unless one with the same key exists (one statement on both
    dialects: `INSERT … ON CONFLICT (key) DO NOTHING`); True when it was inserted.

    The key is `conflict`, the table's primary key by default. A conflict on any other
    unique index still raises.
    """
    key = tuple(conflict) if conflict is not None else tuple(table.primary_key.columns)
    cached = (conn.dialect.name, table, key)
    statement = _UNLESS_EXISTS.get(cached)
    if statement is None:
        statement = _UNLESS_EXISTS[cached] = (
            dialect_insert(conn.dialect.name, table)
            .on_conflict_do_nothing(index_elements=list(key))
            .returning(key[0])
        )
    # rowcount is not reliable for INSERT … ON CONFLICT on every driver; RETURNING is.
    return conn.execute(statement.values(dict(values))).first() is not None


# --- engines and migrations --------------------------------------------------------------


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    password: SecretStr | str | None = None,
    schema: str | None = None,
) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout and immediate transactions.

    `password` (by default `AGENT_JOBS_DATABASE_PASSWORD`, when set) is the server's: set
    on the parsed URL, never written into its text, so it may hold any character.
    On Postgres every connection works in `schema` (by default `AGENT_JOBS_DATABASE_SCHEMA`,
    `agent_jobs`): its `search_path`, so the tables and their version table are there.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with a terse message
        raise ConfigurationError(f"AGENT_JOBS_DATABASE_URL is not a database URL: {exc}") from exc
    from ..settings import get_settings

    found = get_settings()
    password = found.database_password if password is None else password
    schema = found.database_schema if schema is None else schema
    if isinstance(password, SecretStr):
        password = password.get_secret_value()
    blobs.install()  # payloads over the inline limit kept apart, on every engine
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            poolclass=NullPool if parsed.database in (None, "", ":memory:") else None,
            hide_parameters=True,  # a statement's values are runs' data: never in a log
        )
        _tune_sqlite(engine)
        blobs.watch(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.get_driver_name() in ("", "psycopg2"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        if password is not None:
            parsed = parsed.set(password=password)
        # No pre-ping: it costs a round trip per checkout. A connection that died is
        # invalidated when it fails, and the task that hit it is retried (tasks/steps.py).
        engine = create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=10,
            pool_recycle=1800,
            hide_parameters=True,  # a statement's values are runs' data: never in a log
            connect_args=postgres_connect_args(
                schema, found.database_keepalive, found.database_idle_in_transaction_timeout
            ),
        )
        _SCHEMAS[engine] = schema
        driver.install(engine)
        blobs.watch(engine)
        event.listen(engine, "do_connect", _name_session)
        return engine
    raise ConfigurationError(
        f"unsupported database {parsed.get_backend_name()!r}: use sqlite:/// or postgresql+psycopg://"
    )


def postgres_connect_args(
    schema: str, keepalive: float, idle_in_transaction: float | None
) -> dict[str, Any]:
    """libpq's options for a connection to Postgres: its schema, and a peer silent for
    `keepalive` seconds taken for gone on both sides (libpq's keepalives and
    `tcp_user_timeout`; the server session's `tcp_keepalives_*` and `tcp_user_timeout`),
    so neither keeps a vanished peer's connection (nor its transaction's locks) open;
    and the server's limit on a session idle in a transaction."""
    idle = max(1, int(keepalive / 3))
    count = max(1, int(keepalive) - idle)
    user_timeout = int(keepalive * 1000)
    server = {
        "search_path": schema,
        "tcp_keepalives_idle": idle,
        "tcp_keepalives_interval": 1,
        "tcp_keepalives_count": count,
        "tcp_user_timeout": user_timeout,
    }
    if idle_in_transaction is not None:
        server["idle_in_transaction_session_timeout"] = int(idle_in_transaction * 1000)
    return {
        "options": " ".join(f"-c {name}={value}" for name, value in server.items()),
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": 1,
        "keepalives_count": count,
        "tcp_user_timeout": user_timeout,
    }


def _name_session(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    """Name each Postgres session after the process that opens it (`session_name`)."""
    from ..leases import my_session_name

    cparams["application_name"] = my_session_name()


def end_sessions_of(conn: Connection, name: str) -> int:
    """End the Postgres sessions named `name` (a process taken for dead: its open
    transactions are rolled back and their locks let go); how many. Any session of the
    same database role may be ended so. SQLite: none."""
    if conn.dialect.name != "postgresql":
        return 0
    ended = conn.execute(
        text(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = :name AND pid <> pg_backend_pid()"
        ),
        {"name": name},
    )
    return int(ended.scalar_one())


def wait_for_locks_at_most(conn: Connection, seconds: float) -> None:
    """In this transaction (Postgres), a statement that waits longer than `seconds` for a
    row lock fails (`lock_not_available`) instead of waiting on: for work that can come
    back later, such as letting go of a lost host's steps while its open transaction still
    locks one. SQLite waits on its busy timeout."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, int(seconds * 1000))}")


def lock_not_available(exc: BaseException) -> bool:
    """Whether `exc` is a statement given up waiting for a lock (`wait_for_locks_at_most`)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03"


READ_ONLY = driver.READ_ONLY  # an execution option: the connection only reads
# The schema each Postgres engine works in (`make_engine`).
_SCHEMAS: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def schema_of(engine: Engine) -> str | None:
    """The Postgres schema `engine` works in; None on SQLite."""
    return _SCHEMAS.get(engine)


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Take the write lock when a transaction begins, not when it first writes:
        # two threads upgrading read locks at once is how SQLite deadlocks.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # A read-only connection (`Store.connect`) takes no lock until it reads, and then
        # a shared one: in WAL mode readers never wait for a writer nor hold one up (a
        # stream of short readers taking the write lock starved a waiting writer).
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _alembic_config(engine: Engine | None) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def head_revision() -> str:
    """The newest revision as Alembic's scripts say (loads them: slow)."""
    from alembic.script import ScriptDirectory

    config = _alembic_config(None)
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database to `revision` (the newest by default). On Postgres, in the
    engine's schema, made if missing; an installation of the earlier layout (its tables
    and its revision in `public`) is moved there first, in one transaction."""
    from alembic import command

    schema = schema_of(engine)
    if schema is not None:
        with engine.begin() as conn:
            # Made only when missing: Postgres checks the right to create a schema before
            # it looks whether one exists, and a role given a schema made for it need not
            # have that right.
            exists = text("SELECT 1 FROM pg_namespace WHERE nspname = :schema")
            if conn.execute(exists, {"schema": schema}).first() is None:
                conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            adopt_public_layout(conn, schema)
    command.upgrade(_alembic_config(engine), revision)


def adopt_public_layout(conn: Connection, schema: str) -> list[str]:
    """Move an installation of the earlier layout into `schema`: its tables from `public`,
    and its row of `public.alembic_version` into a version table of the schema's own (the
    application's own revision, if it shares that table, stays). Nothing when `schema`
    has a version table already, or `public` holds no revision of ours. The tables moved."""
    from alembic.script import ScriptDirectory

    from .schema import metadata

    def has(where: str, table: str) -> bool:
        query = text("SELECT to_regclass(:name) IS NOT NULL")
        return bool(conn.execute(query, {"name": f'"{where}"."{table}"'}).scalar())

    if has(schema, "alembic_version") or not has("public", "alembic_version"):
        return []
    ours = {r.revision for r in ScriptDirectory.from_config(_alembic_config(None)).walk_revisions()}
    found = conn.execute(text("SELECT version_num FROM public.alembic_version")).scalars().all()
    revision = next((r for r in found if r in ours), None)
    if revision is None:
        return []  # the application's own migrations: not ours to touch
    moved = [t.name for t in metadata.sorted_tables if has("public", t.name)]
    for name in moved:
        conn.execute(text(f'ALTER TABLE public."{name}" SET SCHEMA "{schema}"'))
    conn.execute(
        text(
            f'CREATE TABLE "{schema}".alembic_version (version_num VARCHAR(32) NOT NULL, '
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    conn.execute(
        text(f'INSERT INTO "{schema}".alembic_version VALUES (:revision)'), {"revision": revision}
    )
    conn.execute(
        text("DELETE FROM public.alembic_version WHERE version_num = :revision"),
        {"revision": revision},
    )
    if len(found) == 1:
        conn.execute(text("DROP TABLE public.alembic_version"))
    return moved


def ensure_schema(engine: Engine, *, auto_upgrade: bool) -> None:
    """Check the schema is current; migrate when allowed (the embedded SQLite default)."""
    from ..migrations import HEAD

    if current_revision(engine) == HEAD:
        return
    if auto_upgrade:
        upgrade(engine)
        return
    raise SchemaNotReadyError(
        "the database schema is not at the version this code needs; run `agent-jobs db upgrade`"
    )


def contains_nul(value: Any) -> bool:
    """Whether a NUL character is anywhere in `value` (keys included): Postgres text and
    jsonb cannot hold one, so it is refused before it reaches an INSERT."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False
