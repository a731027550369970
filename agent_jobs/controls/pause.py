"""Pausing a run and letting it go on (docs/operating.md, "Operator controls").

A pause is asked for on the run's row (`runs.pause_requested_by`: who asked) and in its
thread's session log (`run/pause`); the run stops at its next step boundary (`hold`). A
durable pass that finds the request and no step of the run in flight parks the run
`paused`: nothing of it is scheduled, leased or running, and every later pass (a
decision came in, a stray wake-up) leaves it so. The inline runner waits at the
boundary. Asking a run to pause asks its unfinished delegated runs too, as a cancel does.

A resume withdraws the request and gives the run back what it was doing when it paused
(kept in its `run/paused` event): the caller then wakes it, and it goes on from where it
stopped. A run that was only asked to pause (it did not reach a boundary yet) just goes
on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Connection

from .. import session
from ..errors import ControlRefusedError, InvalidRequestError, UnknownRunError
from ..executor import StepEnv
from ..store import RunView
from ..store import events as event_rows
from ..store import runs as run_rows
from ..store.holds import IN_FLIGHT
from ..store.journal import ReplayRow

PAUSED_BY = "paused by "  # `waiting_on` of a paused run
RESUMED_BY = "resumed by "  # … and of a run resumed, until its next pass says more
MAX_ACTOR = 200


def checked_actor(actor: Any) -> str:
    """Who asks, as the run rows keep it; `InvalidRequestError` for anything else."""
    if not isinstance(actor, str) or not actor.strip():
        raise InvalidRequestError("an operator control needs the actor who asks (--actor)")
    if len(actor) > MAX_ACTOR or "\x00" in actor:
        raise InvalidRequestError(f"an actor is at most {MAX_ACTOR} characters, with no NUL")
    return actor.strip()


def locked(conn: Connection, run_id: str) -> Any:
    """The run's row with its lock (a pass of the run goes before or after, never
    between the checks and the writes); `UnknownRunError` when there is none."""
    run = run_rows.lock_run(conn, run_id)
    if run is None:
        raise UnknownRunError(run_id)
    return run


def pause(conn: Connection, run_id: str, actor: str) -> list[str]:
    """Ask the run and its unfinished delegated runs to pause at their next step
    boundary; returns the ids asked, the run first. Refused (`ControlRefusedError`, nothing
    written) for a run that has ended, is being cancelled, or is paused or asked already."""
    actor = checked_actor(actor)
    run = locked(conn, run_id)
    if run.status in run_rows.TERMINAL:
        raise ControlRefusedError(f"run {run_id} has ended ({run.status}): nothing to pause")
    if run.cancel_cause is not None:
        raise ControlRefusedError(
            f"run {run_id} is being cancelled ({run.cancel_cause}): it stops at its next "
            "boundary anyway"
        )
    if run.pause_requested_by is not None:
        how = "paused" if run.status == "paused" else "asked to pause"
        raise ControlRefusedError(
            f"run {run_id} is {how} already (by {run.pause_requested_by}); "
            f"`agent-jobs resume {run_id}` lets it go on"
        )
    asked: list[str] = []
    for target in run_rows.run_tree_ids(conn, run_id):
        thread_id = run_rows.record_pause(conn, target, actor)
        if thread_id is not None:
            event_rows.append(conn, [(thread_id, target, session.PAUSE, {"by": actor})])
            asked.append(target)
    return asked


def resume(conn: Connection, run_id: str, actor: str) -> list[str]:
    """Withdraw the pause of the run and of its delegated runs; each gets back the status
    it had when it paused. Returns the ids resumed, the run first (the caller wakes them).
    Refused for a run that has ended or is neither paused nor asked to pause."""
    actor = checked_actor(actor)
    run = locked(conn, run_id)
    if run.status in run_rows.TERMINAL:
        raise ControlRefusedError(f"run {run_id} has ended ({run.status}): nothing to resume")
    if run.pause_requested_by is None:
        raise ControlRefusedError(f"run {run_id} is not paused ({run.status}): nothing to resume")
    resumed: list[str] = []
    for target in run_rows.run_tree_ids(conn, run_id):
        row = run if target == run_id else run_rows.lock_run(conn, target)
        if row is None or row.status in run_rows.TERMINAL or row.pause_requested_by is None:
            continue
        status, waiting_on = restored(conn, row, actor)
        if run_rows.clear_pause(conn, target, status, waiting_on):
            event_rows.append(conn, [(row.thread_id, target, session.RESUME, {"by": actor})])
            resumed.append(target)
    return resumed


def restored(conn: Connection, row: Any, actor: str) -> tuple[run_rows.RunStatus, str | None]:
    """The status and `waiting_on` a run resumed by `actor` goes on with: what it had when
    it paused (as it has now, if it did not pause yet). A run that was running says who
    resumed it until its next pass says more."""
    if row.status != "paused":
        return row.status, row.waiting_on
    status, waiting_on = before_pause(conn, row)
    if status == "running" and waiting_on is None:
        waiting_on = RESUMED_BY + actor
    return status, waiting_on


def before_pause(conn: Connection, row: Any) -> tuple[run_rows.RunStatus, str | None]:
    """What a paused run was doing when it paused: its `run/paused` event says."""
    pauses = session.thread_events(conn, row.thread_id, types=[session.PAUSED])
    mine = [event.data for event in pauses if event.run_id == row.id]
    if not mine:  # paused by no boundary (cannot be): it goes on running
        return "running", None
    status = mine[-1].get("status")
    if status not in run_rows.RUN_STATUSES or status in run_rows.TERMINAL or status == "paused":
        status = "running"
    return cast(run_rows.RunStatus, status), mine[-1].get("waiting_on")


def opened_turn(conn: Connection, run: RunView) -> bool:
    """Whether the run's turn began: a queued run's never did, nor did that of a run
    paused while it was queued."""
    if run.status == "queued":
        return False
    if run.status != "paused":
        return True
    return before_pause(conn, _Row(run))[0] != "queued"


class _Row:
    """A run view as `before_pause` reads a row."""

    def __init__(self, run: RunView) -> None:
        self.id = run.run_id
        self.thread_id = run.thread_id


def hold(conn: Connection, env: StepEnv, run: RunView, rows: Sequence[ReplayRow]) -> str | None:
    """The step boundary's word on a pause: None to go on, else where the run stands (it
    pauses now, it was paused, or it pauses once its steps in flight, among `rows`, have
    ended). Pausing writes `paused`, the `run/paused` event (with the status and
    `waiting_on` the run had) and, after the commit, a `status` frame, with the caller's
    transaction and `env`."""
    by = run.pause_requested_by
    if by is None:
        if run.status == "running" and (run.waiting_on or "").startswith(RESUMED_BY):
            # The first pass since a resume: the run goes on (its pass says where next).
            resumer = (run.waiting_on or "").removeprefix(RESUMED_BY)
            env.emit_after_commit("status", status="running", resumed_by=resumer)
        return None
    if run.status == "paused":
        return PAUSED_BY + by
    flying = [row.step for row in rows if row.state in IN_FLIGHT]
    if flying:
        return "pausing once " + ", ".join(flying) + " ended"
    run_rows.note_status(conn, run.run_id, "paused", waiting_on=PAUSED_BY + by)
    data = {"by": by, "status": run.status, "waiting_on": run.waiting_on}
    env.event(run.thread_id, run.run_id, session.PAUSED, **data)
    env.emit_after_commit("status", status="paused", by=by)
    return PAUSED_BY + by
