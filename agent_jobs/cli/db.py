"""`agent-jobs db`: the database schema."""

from __future__ import annotations

import click
import sqlalchemy.exc
from alembic.util import CommandError

from ..store.db import current_revision, head_revision, make_engine, upgrade
from .common import fail, handle_errors, out, settings


@click.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@handle_errors
def db_upgrade() -> None:
    """Migrate the database to the newest schema (on Postgres, in the schema
    AGENT_JOBS_DATABASE_SCHEMA names, moving an installation of the earlier layout there
    from public first)."""
    engine = make_engine(settings().database_url)
    try:
        upgrade(engine)
    except MIGRATION_ERRORS as exc:
        said = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        fail(
            f"migrating the database failed ({type(exc).__name__}: {said}); each migration "
            "runs in a transaction, so the database is as the last one that succeeded left "
            "it: fix what this names and run `agent-jobs db upgrade` again"
        )
    else:
        out.print(f"database at revision {current_revision(engine)}")
    finally:
        engine.dispose()


# What a migration that cannot apply raises (a database that cannot be reached is not
# one: `handle_errors` says so, exit 5).
MIGRATION_ERRORS = (
    sqlalchemy.exc.ProgrammingError,
    sqlalchemy.exc.IntegrityError,
    sqlalchemy.exc.InternalError,
    sqlalchemy.exc.NotSupportedError,
    CommandError,
)


@db.command("current")
@handle_errors
def db_current() -> None:
    """Show the database's schema revision and the newest one."""
    engine = make_engine(settings().database_url)
    try:
        out.print(f"current: {current_revision(engine) or 'none'}  newest: {head_revision()}")
    finally:
        engine.dispose()
