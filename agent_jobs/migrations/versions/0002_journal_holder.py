"""journal.holder: the process that claimed a step in the pass that scheduled it

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 16:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable with no default: adding it rewrites nothing, on either dialect.
    op.add_column("journal", sa.Column("holder", sa.String(length=200), nullable=True))


def downgrade() -> None:
    op.drop_column("journal", "holder")
