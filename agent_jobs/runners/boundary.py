"""The step boundary: what a run must do before its next step, decided in one order for
both runners.

First a stop (a cancel asked for, or the run's deadline passed), then a pause (asked
for, and no step of the run in flight), then admission (a queued run whose thread or
concurrency key has no place for it yet); else the run goes on. The answer is data
(`Stop`, `Hold`, `Queue`, `Go`): the durable pass ends, parks or replays the run with
it, the inline runner raises `Cancelled`, waits or runs the step.

Each gate writes what it decides with the caller's transaction: a deadline's cancel
(`session.request_cancel`), a pause (`controls.hold`), a queued run's `waiting_on`
(`admission.enter`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from .. import admission, controls, session
from ..app import AgentApp
from ..controls.pause import RESUMED_BY
from ..executor import StepEnv
from ..store import RunView
from ..store.journal import ReplayRow
from .turn import overdue


@dataclass(frozen=True)
class Stop:
    """The run stops here, with `cause`. `asked` names the runs whose cancel this
    boundary recorded (a deadline that passed: the run and its unfinished children);
    empty when the cancel was asked for before."""

    cause: str
    asked: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hold:
    """The run is paused, or pauses once its steps in flight end; `outcome` says which."""

    outcome: str


@dataclass(frozen=True)
class Queue:
    """A queued run that may not begin yet; `outcome` says what it waits for."""

    outcome: str


@dataclass(frozen=True)
class Go:
    """The run goes on. `admitted`: a queued run was let in, and its turn begins now;
    `woken`, the queued runs of its key that may begin with it. `resumed`: the run's
    first boundary since a resume (its `waiting_on` still says who resumed it)."""

    admitted: bool = False
    woken: tuple[str, ...] = ()
    resumed: bool = False


Verdict = Stop | Hold | Queue | Go


def decide(
    conn: Connection,
    env: StepEnv,
    app: AgentApp,
    run: RunView,
    rows: Sequence[ReplayRow],
    *,
    queued_pause: bool = True,
) -> Verdict:
    """The boundary's verdict for `run` (`rows`: its journal rows as far as the caller
    knows them, for a pause waits for those in flight), with the caller's transaction.

    With `queued_pause=False` a queued run asked to pause is not held before its turn:
    the inline runner's queue admits it, and it pauses at its turn's first step.
    """
    stopped = stop(conn, run)
    if stopped is not None:
        return stopped
    if queued_pause or run.status != "queued":
        held = controls.hold(conn, env, run, rows)
        if held is not None:
            return Hold(held)
    if run.status != "queued":
        return Go(resumed=resumed(run))
    entry = admission.enter(conn, app, run)
    if not entry:
        return Queue(entry.outcome)
    return Go(admitted=True, woken=entry.woken)


def stop(conn: Connection, run: RunView) -> Stop | None:
    """The first gate alone (a run waiting between boundaries looks at it too): why the
    run must stop now, if it must. A deadline that passed is recorded here as a
    `timeout` cancel, for the run and its children."""
    if run.cancel_cause is None and overdue(run):
        asked = session.request_cancel(conn, run.run_id, "timeout")
        return Stop("timeout", tuple(asked))
    if run.cancel_cause is not None:
        return Stop(run.cancel_cause)
    return None


def stops(run: RunView) -> bool:
    """Whether `stop` stops `run` as read: a cancel asked for, or its deadline passed."""
    return run.cancel_cause is not None or overdue(run)


def quiet(run: RunView) -> bool:
    """Whether `decide` lets `run` as read go on and writes nothing: no stop, no pause
    asked, no resume to announce, not queued. A runner that reads the run outside a
    transaction opens one for `decide` only when it is not."""
    return (
        not stops(run)
        and run.pause_requested_by is None
        and not resumed(run)
        and run.status != "queued"
    )


def resumed(run: RunView) -> bool:
    """Whether the run was resumed and no pass has said where it stands since."""
    return (run.waiting_on or "").startswith(RESUMED_BY)
