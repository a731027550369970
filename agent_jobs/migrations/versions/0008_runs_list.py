"""The runs list: an index per filter, newest first; a trigram index for its search (when
pg_trgm can be had); the action calls by tool; and the worker that ran each step

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 20:00:00
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

log = logging.getLogger("agent_jobs.migrations")

ACTION = "kind = 'action'"
# As store/schema.py's SEARCH_TEXT: the planner uses the index only for this expression.
SEARCH = "(id || ' ' || input || ' ' || CAST(metadata AS TEXT))"
LISTED = {
    "ix_runs_created": ["created_at", "id"],
    "ix_runs_status_created": ["status", "created_at", "id"],
    "ix_runs_agent_created": ["agent", "created_at", "id"],
    "ix_runs_actor_created": ["actor", "created_at", "id"],
    "ix_runs_thread_created": ["thread_id", "created_at", "id"],
    "ix_runs_root": ["root_run_id"],
}


def upgrade() -> None:
    # Nullable: adding it rewrites no row of a big table.
    with op.batch_alter_table("journal") as table:
        table.add_column(sa.Column("worker", sa.String(length=200), nullable=True))
    # An index already there is kept: on a big table, build them beforehand without
    # holding writes up (CREATE INDEX CONCURRENTLY, docs/operating.md).
    for name, columns in LISTED.items():
        op.create_index(name, "runs", columns, unique=False, if_not_exists=True)
    # (thread_id, created_at, id) answers whatever (thread_id) alone did.
    op.drop_index("ix_runs_thread", table_name="runs", if_exists=True)
    op.create_index(
        "ix_tool_calls_action",
        "tool_calls",
        ["name", "run_id"],
        unique=False,
        postgresql_where=sa.text(ACTION),
        sqlite_where=sa.text(ACTION),
        if_not_exists=True,
    )
    if op.get_bind().dialect.name == "postgresql":
        _search_index()


def _search_index() -> None:
    """The trigram index of the runs' search, where pg_trgm is installed or this role may
    install it (a trusted extension from PostgreSQL 13: the database's CREATE privilege
    suffices). Without it the search still works, by reading the table."""
    conn = op.get_bind()
    schema = _trgm_schema(conn)
    if schema is None:
        try:
            with conn.begin_nested():
                conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_trgm"))
        except sa.exc.DBAPIError as exc:
            message = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
            log.warning(
                "the runs' search gets no trigram index: pg_trgm cannot be installed "
                "(%s); searching reads the table instead (docs/operating.md, 'The runs list "
                "at scale', says how to add the index later).",
                message,
            )
            return
        schema = _trgm_schema(conn)
    # Named with the extension's schema: it may live outside the search_path.
    ops = f'"{schema}".gin_trgm_ops'
    op.execute(f"CREATE INDEX IF NOT EXISTS ix_runs_search ON runs USING gin ({SEARCH} {ops})")


def _trgm_schema(conn: sa.Connection) -> str | None:
    query = sa.text(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'pg_trgm'"
    )
    found = conn.execute(query).scalar()
    return None if found is None else str(found)


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_runs_search")  # the extension stays: others may use it
    op.drop_index("ix_tool_calls_action", table_name="tool_calls")
    op.create_index("ix_runs_thread", "runs", ["thread_id"], unique=False)
    for name in reversed(LISTED):
        op.drop_index(name, table_name="runs")
    with op.batch_alter_table("journal") as table:
        table.drop_column("worker")
