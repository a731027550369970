"""Humans in the loop: approval deadlines and escalation, a non-idempotent action's
handler start, and the notifications outbox

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
PENDING = "status = 'pending_approval' AND approval_deadline IS NOT NULL"


def upgrade() -> None:
    # Nullable, or with a constant default: adding them rewrites no row of a big table.
    with op.batch_alter_table("tool_calls") as table:
        table.add_column(sa.Column("requested_at", sa.DateTime(timezone=True), nullable=True))
        table.add_column(sa.Column("approval_deadline", sa.DateTime(timezone=True), nullable=True))
        table.add_column(
            sa.Column("escalated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        table.add_column(sa.Column("approvers", JSON, nullable=True))
        table.add_column(sa.Column("handler_started_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_tool_calls_deadline",
        "tool_calls",
        ["approval_deadline"],
        unique=False,
        postgresql_where=sa.text(PENDING),
        sqlite_where=sa.text(PENDING),
    )
    op.create_table(
        "outbox",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=64), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("body", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("streamed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("event_id"),
    )
    op.create_index(
        "ix_outbox_undelivered",
        "outbox",
        ["next_attempt_at"],
        unique=False,
        postgresql_where=sa.text("delivered_at IS NULL"),
        sqlite_where=sa.text("delivered_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_undelivered", table_name="outbox")
    op.drop_table("outbox")
    op.drop_index("ix_tool_calls_deadline", table_name="tool_calls")
    with op.batch_alter_table("tool_calls") as table:
        for column in (
            "handler_started_at",
            "approvers",
            "escalated",
            "approval_deadline",
            "requested_at",
        ):
            table.drop_column(column)
