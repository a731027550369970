"""The process that drives an inline run, so that another can tell it was abandoned

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: adding it rewrites no row of a big table.
    with op.batch_alter_table("runs") as table:
        table.add_column(sa.Column("driver", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as table:
        table.drop_column("driver")
