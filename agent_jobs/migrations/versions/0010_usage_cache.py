"""The usage ledger's prompt-cache tokens: how many of a call's input tokens were read from
and written to the provider's cache, which it bills at other prices

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = ("cache_read_tokens", "cache_write_tokens")


def upgrade() -> None:
    # A constant default: Postgres adds the columns without rewriting the ledger's rows,
    # and the rows before hold 0, as the calls they record were billed.
    with op.batch_alter_table("usage") as table:
        for name in COLUMNS:
            table.add_column(sa.Column(name, sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("usage") as table:
        for name in reversed(COLUMNS):
            table.drop_column(name)
