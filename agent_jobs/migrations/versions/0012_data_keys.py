"""data_keys: the per-actor data keys of encryption at rest, wrapped by a master key

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 02:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

LIVE = "forgotten_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "data_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("wrapped", sa.LargeBinary, nullable=True),
        sa.Column("master_key_id", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_data_keys_live",
        "data_keys",
        ["actor"],
        unique=True,
        postgresql_where=sa.text(LIVE),
        sqlite_where=sa.text(LIVE),
    )
    op.create_index("ix_data_keys_master", "data_keys", ["master_key_id"])


def downgrade() -> None:
    op.drop_index("ix_data_keys_master", table_name="data_keys")
    op.drop_index("ix_data_keys_live", table_name="data_keys")
    op.drop_table("data_keys")
