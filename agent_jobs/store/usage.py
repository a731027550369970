"""The usage ledger and the per-actor daily token quota."""

from __future__ import annotations

from sqlalchemy import Connection, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..messages import Usage
from .db import utcnow
from .schema import quota_usage, usage


def record_usage(
    conn: Connection,
    *,
    run_id: str,
    thread_id: str,
    actor: str,
    day: str,
    step: str,
    kind: str,
    model: str | None,
    spent: Usage,
) -> None:
    conn.execute(
        usage.insert().values(
            run_id=run_id,
            thread_id=thread_id,
            actor=actor,
            day=day,
            step=step,
            kind=kind,
            model=model,
            input_tokens=spent.input_tokens,
            output_tokens=spent.output_tokens,
            cost=spent.cost,
            cost_source=spent.cost_source,
            created_at=utcnow(),
        )
    )


def bump_quota(conn: Connection, *, actor: str, day: str, tokens: int) -> None:
    """Add `tokens` to the actor's count for `day` (an upsert on both dialects)."""
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    statement = dialect_insert(quota_usage).values(actor=actor, day=day, tokens=tokens)
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[quota_usage.c.actor, quota_usage.c.day],
            set_={"tokens": quota_usage.c.tokens + statement.excluded.tokens},
        )
    )


def tokens_used(conn: Connection, *, actor: str, day: str) -> int:
    value = conn.execute(
        select(quota_usage.c.tokens).where(quota_usage.c.actor == actor, quota_usage.c.day == day)
    ).scalar()
    return int(value or 0)


def run_usage_rows(conn: Connection, run_id: str) -> list[dict[str, object]]:
    rows = conn.execute(select(usage).where(usage.c.run_id == run_id).order_by(usage.c.id)).all()
    return [dict(row._mapping) for row in rows]
