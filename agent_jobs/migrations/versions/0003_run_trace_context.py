"""runs.trace_context: the W3C trace context a run was started in, for its steps' spans

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable with no default: adding it rewrites nothing, on either dialect.
    op.add_column(
        "runs",
        sa.Column(
            "trace_context",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
    )


def downgrade() -> None:
    op.drop_column("runs", "trace_context")
