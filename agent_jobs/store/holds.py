"""Who holds a remote step in flight, as its journal row says: a claim (the pass that
scheduled the step keeps it to run at once), the lease a delivery keeps alive while it
runs, a step held back until later, and the step's epoch (`fence`), moved on each time
its holder is let go of so that whatever that holder writes afterwards is refused."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Integer, Row, bindparam, func, or_, select, tuple_, update

from . import driver
from .db import utcnow
from .schema import journal

IN_FLIGHT = ("scheduled", "started")  # a remote step sent, not yet done or failed


def mark_started(
    conn: Connection,
    run_id: str,
    step: str,
    *,
    attempt: int,
    started_at: datetime,
    lease: float,
    holder: str | None = None,
    fence: int | None = None,
) -> bool:
    """Show a long-running step as started, with the lease its worker keeps alive.

    `holder` is the claimant when the lease lives here (a step claimed by the pass that
    scheduled it); None when Redis holds it, which also clears a claim a dead process
    left behind. With `fence`, only while the step's epoch is still that one: False once
    its holder was let go of (`release_claims`, `fence_steps`).
    """
    values = {"b_run_id": run_id, "b_step": step, "b_attempt": attempt, "b_holder": holder}
    values["b_fence"] = fence
    values |= {"b_started_at": started_at, "b_until": utcnow() + timedelta(seconds=lease)}
    return driver.rowcount(conn, _MARK_STARTED, values) == 1


# A write by a delivery that read the step's epoch as `b_fence` (None: any epoch).
FENCED = or_(bindparam("b_fence", type_=Integer).is_(None), journal.c.fence == bindparam("b_fence"))

_MARK_STARTED = (
    update(journal)
    .where(
        journal.c.run_id == bindparam("b_run_id"),
        journal.c.step == bindparam("b_step"),
        driver.among(journal.c.state, IN_FLIGHT),
        FENCED,
    )
    .values(
        state="started",
        attempts=bindparam("b_attempt"),
        started_at=bindparam("b_started_at"),
        lease_until=bindparam("b_until"),
        holder=bindparam("b_holder"),
    )
)


def claim(values: dict[str, Any], holder: str, lease: float) -> None:
    """Make a `scheduled` row of `row()` one the pass's own process runs at once: its
    first attempt, started now, leased to `holder` (written with the pass, no round trip)."""
    now = utcnow()
    values.update(
        state="started",
        attempts=1,
        started_at=now,
        lease_until=now + timedelta(seconds=lease),
        holder=holder,
    )


def unclaim(conn: Connection, run_id: str, step: str, holder: str) -> bool:
    """Give a claimed step back to the broker: `scheduled` again, for whoever is sent it."""
    result = conn.execute(
        update(journal)
        .where(
            journal.c.run_id == run_id,
            journal.c.step == step,
            journal.c.holder == holder,
            journal.c.state.in_(("scheduled", "started")),
        )
        .values(state="scheduled", attempts=0, started_at=None, lease_until=None, holder=None)
    )
    return result.rowcount == 1


def release_claims(
    conn: Connection,
    run_id: str,
    prefix: str,
    keep: Collection[str] = (),
    *,
    skip_locked: bool = False,
) -> Sequence[Row[Any]]:
    """Let go of the run's steps claimed by holders whose names start with `prefix` (a
    process that died, or one holder given up on), but those in `keep` (taken over since
    by a live delivery): the attempt begun stays counted, the step's epoch moves on, and
    whoever is sent the step may take it. With `skip_locked` (Postgres), a row another
    transaction locks is left as it is. Returns the rows let go."""
    where = [
        journal.c.run_id == run_id,
        journal.c.state.in_(IN_FLIGHT),
        func.substr(journal.c.holder, 1, len(prefix)) == prefix,
    ]
    if keep:
        where.append(journal.c.step.not_in(list(keep)))
    return conn.execute(
        update(journal)
        .where(*_unlocked(where, skip_locked))
        .values(lease_until=None, holder=None, fence=journal.c.fence + 1)
        .returning(journal.c.step, journal.c.intent)
    ).all()


def fence_steps(
    conn: Connection, run_id: str, steps: Sequence[str], *, skip_locked: bool = False
) -> set[str]:
    """Let go of whoever holds these steps of the run in flight (a Redis lease of a
    process taken for dead, a lease run out): their epoch moves on, so what that holder
    writes later is refused. Whoever is sent the step next reads the new epoch. With
    `skip_locked` (Postgres), a row another transaction locks is left as it is. Returns
    the steps fenced."""
    if not steps:
        return set()
    where = [
        journal.c.run_id == run_id,
        journal.c.step.in_(list(steps)),
        journal.c.state.in_(IN_FLIGHT),
    ]
    fenced = conn.execute(
        update(journal)
        .where(*_unlocked(where, skip_locked))
        .values(fence=journal.c.fence + 1)
        .returning(journal.c.step)
    )
    return {row.step for row in fenced}


def _unlocked(where: list[Any], skip_locked: bool) -> list[Any]:
    """`where`, or (with `skip_locked`) the rows of `where` no other transaction locks:
    recovery goes past a row a lost host's open transaction still holds, and comes back."""
    if not skip_locked:
        return where
    free = select(journal.c.run_id, journal.c.step).where(*where).with_for_update(skip_locked=True)
    return [tuple_(journal.c.run_id, journal.c.step).in_(free)]


def hold(
    conn: Connection,
    run_id: str,
    step: str,
    *,
    not_before: datetime,
    lease: float,
    fence: int | None = None,
) -> bool:
    """Hold a step in flight back until `not_before` (a retry later, a model step waiting
    for capacity): recovery and the sweep leave it alone until then, and a lease longer
    (for the delivery sent for then to take it). A pass's claim is let go of. With
    `fence`, only while the step's epoch is that one; False if the row was not held."""
    until = not_before + timedelta(seconds=lease)
    where = [journal.c.run_id == run_id, journal.c.step == step, journal.c.state.in_(IN_FLIGHT)]
    if fence is not None:
        where.append(journal.c.fence == fence)
    held = conn.execute(
        update(journal).where(*where).values(not_before=not_before, lease_until=until, holder=None)
    )
    return held.rowcount == 1
