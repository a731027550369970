"""runs.wake_at: when a sleeping run wakes, and its index for beat's timers tick

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SLEEPING = "wake_at IS NOT NULL"


def upgrade() -> None:
    # Nullable: adding it rewrites no row of a big table.
    with op.batch_alter_table("runs") as table:
        table.add_column(sa.Column("wake_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_runs_wake_at",
        "runs",
        ["wake_at"],
        postgresql_where=sa.text(SLEEPING),
        sqlite_where=sa.text(SLEEPING),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_wake_at", table_name="runs")
    with op.batch_alter_table("runs") as table:
        table.drop_column("wake_at")
