"""The usage ledger and the per-actor daily token quota."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, select, text

from ..messages import Usage
from . import driver
from .db import DIALECTS, dialect_insert, utcnow
from .schema import quota_usage, usage

_RECORD = usage.insert()


def charge(
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
    """A model call's tokens on the ledger and on the actor's quota for `day` (one
    statement on Postgres)."""
    row = {
        "run_id": run_id,
        "thread_id": thread_id,
        "actor": actor,
        "day": day,
        "step": step,
        "kind": kind,
        "model": model,
        "input_tokens": spent.input_tokens,
        "output_tokens": spent.output_tokens,
        "cost": spent.cost,
        "cost_source": spent.cost_source,
        "created_at": utcnow(),
        "cache_read_tokens": spent.cache_read_tokens,
        "cache_write_tokens": spent.cache_write_tokens,
    }
    if conn.dialect.name == "postgresql":
        driver.later(conn, _CHARGE_PG, row | {"tokens": spent.total_tokens})
        return
    conn.execute(_RECORD, row)
    bump_quota(conn, actor=actor, day=day, tokens=spent.total_tokens)


def bump_quota(conn: Connection, *, actor: str, day: str, tokens: int) -> None:
    """Add `tokens` to the actor's count for `day` (an upsert on both dialects)."""
    conn.execute(_BUMP[conn.dialect.name], {"actor": actor, "day": day, "tokens": tokens})


def _bump(dialect: str) -> Any:
    statement = dialect_insert(dialect, quota_usage)
    return statement.on_conflict_do_update(
        index_elements=[quota_usage.c.actor, quota_usage.c.day],
        set_={"tokens": quota_usage.c.tokens + statement.excluded.tokens},
    )


_BUMP = {dialect: _bump(dialect) for dialect in DIALECTS}
_LEDGER = (
    "run_id, thread_id, actor, day, step, kind, model, input_tokens, output_tokens, cost, "
    "cost_source, created_at, cache_read_tokens, cache_write_tokens"
)
_CHARGE_PG = text(
    f"""
    WITH ledger AS (
        INSERT INTO usage ({_LEDGER}) VALUES (:{_LEDGER.replace(", ", ", :")})
    )
    INSERT INTO quota_usage (actor, day, tokens) VALUES (:actor, :day, :tokens)
    ON CONFLICT (actor, day) DO UPDATE SET tokens = quota_usage.tokens + excluded.tokens
    """
)


_USED = select(quota_usage.c.tokens).where(
    quota_usage.c.actor == bindparam("actor"), quota_usage.c.day == bindparam("day")
)


def tokens_used(conn: Connection, *, actor: str, day: str) -> int:
    return int(conn.execute(_USED, {"actor": actor, "day": day}).scalar() or 0)


def run_usage_rows(conn: Connection, run_id: str) -> list[dict[str, object]]:
    rows = conn.execute(select(usage).where(usage.c.run_id == run_id).order_by(usage.c.id)).all()
    return [dict(row._mapping) for row in rows]


_RECORDED = (
    select(usage.c.id)
    .where(usage.c.run_id == bindparam("run_id"), usage.c.step == bindparam("step"))
    .limit(1)
)


def usage_recorded(conn: Connection, run_id: str, step: str) -> bool:
    """Whether the usage ledger already has a row for this step of the run."""
    return conn.execute(_RECORDED, {"run_id": run_id, "step": step}).first() is not None
