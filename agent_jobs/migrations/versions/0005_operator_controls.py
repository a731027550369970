"""Operator controls and flow control: a pause asked for, a run's concurrency key, a step
held back until a moment

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

HELD = "concurrency_key IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')"


def upgrade() -> None:
    # Nullable: adding them rewrites no row of a big table.
    with op.batch_alter_table("runs") as table:
        table.add_column(sa.Column("pause_requested_by", sa.String(length=200), nullable=True))
        table.add_column(sa.Column("concurrency_key", sa.String(length=300), nullable=True))
    op.create_index(
        "ix_runs_concurrency",
        "runs",
        ["agent", "concurrency_key", "created_at"],
        unique=False,
        postgresql_where=sa.text(HELD),
        sqlite_where=sa.text(HELD),
    )
    with op.batch_alter_table("journal") as table:
        table.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("journal") as table:
        table.drop_column("not_before")
    op.drop_index("ix_runs_concurrency", table_name="runs")
    with op.batch_alter_table("runs") as table:
        table.drop_column("concurrency_key")
        table.drop_column("pause_requested_by")
