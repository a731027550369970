"""`agent-jobs db`: the database schema."""

from __future__ import annotations

import click

from ..store.db import current_revision, head_revision, make_engine, upgrade
from .common import handle_errors, out, settings


@click.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@handle_errors
def db_upgrade() -> None:
    """Migrate the database to the newest schema."""
    engine = make_engine(settings().database_url)
    try:
        upgrade(engine)
        out.print(f"database at revision {current_revision(engine)}")
    finally:
        engine.dispose()


@db.command("current")
@handle_errors
def db_current() -> None:
    """Show the database's schema revision and the newest one."""
    engine = make_engine(settings().database_url)
    try:
        out.print(f"current: {current_revision(engine) or 'none'}  newest: {head_revision()}")
    finally:
        engine.dispose()
