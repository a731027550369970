"""journal.fence: the step's epoch, moved on whenever its holder is let go of

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: Postgres (11 and newer) adds it without rewriting the table.
    with op.batch_alter_table("journal") as table:
        table.add_column(sa.Column("fence", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("journal") as table:
        table.drop_column("fence")
