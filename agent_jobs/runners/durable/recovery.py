"""What the durable runner sends again when nobody will finish a step: the steps of a run
whose holder died (found by a task's returning message, or by another process when the
dead one stopped beating), and the steps of runs that made no progress for a while (found
by the sweep)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Protocol

import redis
from sqlalchemy.exc import OperationalError

from ...app import AgentApp
from ...approvals import deadlines
from ...dispatch import Dispatcher
from ...leases import SEP, Holder, Leases, session_name
from ...settings import Settings
from ...store import Store
from ...store import holds as hold_rows
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import end_sessions_of, lock_not_available, utcnow, wait_for_locks_at_most
from ...streams.base import RunStream, StreamBackend
from . import sleepers
from .replay import sent_as_journaled
from .running import Running

log = logging.getLogger(__name__)


def adopt_orphans(store: Store, leases: Leases, dispatcher: Dispatcher, run_id: str) -> None:
    """Send the run's steps in flight whose holder died: a task that ran them in its
    chain died, and its message, come back, is the delivery that calls this.

    A step claimed in its row (kept by a pass) names its holder there; any other step's
    holder is its Redis lease.
    """
    with store.connect() as conn:
        flying = journal_rows.in_flight(conn, run_id)
    if not flying:
        return
    claimed = {r.step: Holder.parse(r.holder) for r in flying if r.holder is not None}
    dead = {step for step, holder in claimed.items() if holder is not None and holder.gone()}
    dead |= leases.orphaned(run_id, [r.step for r in flying if r.step not in claimed])
    with seized(leases, run_id, dead) as ours:  # not those a live delivery took since
        if ours:  # whatever the dead holder left unwritten stays so
            with store.begin() as conn:
                hold_rows.fence_steps(conn, run_id, sorted(ours))
    orphans = [(sent_as_journaled(r.intent), r.step) for r in flying if r.step in ours]
    if orphans:
        log.info("run %s: re-sending %s, whose process died", run_id, orphans)
        dispatcher.steps(run_id, orphans)


# How long recovery waits for a row lock before it moves on and comes back to the run.
RECOVERY_LOCK_WAIT = 0.5


def recover_process(
    store: Store, leases: Leases, dispatcher: Dispatcher, process: str, run_ids: set[str]
) -> set[str]:
    """`process` died working on `run_ids` (see runners/durable/liveness.py): let go of what it
    held, claims in rows and leases in Redis, and send again each step in flight that
    nobody else holds (a dying process may have let its lease go already); a run with
    none is re-driven (its process died in a pass). Each step let go of is fenced (its
    epoch moves on): a process taken for dead that was only cut off, and comes back, can
    finish its call but not write its outcome, renew its lease or send the step again.

    Returns the runs it could not let go of yet: a row of theirs stayed locked past
    `RECOVERY_LOCK_WAIT` (a lost host's transaction, open until Postgres finds its peer
    gone). Those are for later; the others are not held up by them.
    """
    prefix = process + SEP
    later: set[str] = set()
    for run_id in sorted(run_ids):
        with store.connect() as conn:
            flying = journal_rows.in_flight(conn, run_id)
        mine = {r.step for r in flying if (r.holder or "").startswith(prefix)}
        others = {r.step for r in flying if r.holder is None}
        intents = {r.step: r.intent for r in flying}
        # Its claims, and the leases it held in Redis (or nobody holds): not those a live
        # delivery took since (another recovery of the same death sent them).
        with seized(leases, run_id, mine | others, prefix) as ours:
            try:
                with store.begin() as conn:
                    wait_for_locks_at_most(conn, RECOVERY_LOCK_WAIT)
                    claims = hold_rows.release_claims(
                        conn, run_id, prefix, keep=mine - ours, skip_locked=True
                    )
                    fenced = hold_rows.fence_steps(
                        conn, run_id, sorted(others & ours), skip_locked=True
                    )
            except OperationalError as exc:  # the run's row itself was locked too long
                if not lock_not_available(exc):
                    raise
                claims, fenced = [], set()
        released = {r.step: r.intent for r in claims}
        released |= {step: intents[step] for step in fenced}
        locked = bool(ours - released.keys())  # seized, but its row was locked
        if locked:  # a row a lost host's open transaction locks: the others go now
            log.warning("run %s: a row of it is locked; its recovery comes back to it", run_id)
            later.add(run_id)
            end_sessions(store, process)
            if not released:
                continue
        steps = [(sent_as_journaled(intent), step) for step, intent in released.items()]
        log.info("run %s: process %s stopped beating; re-sending %s", run_id, process, steps)
        if steps:
            dispatcher.steps(run_id, steps)
        else:
            dispatcher.coordinate(run_id)
    return later


def end_sessions(store: Store, process: str) -> None:
    """End the Postgres sessions of `process`, taken for dead: a transaction it left open
    (cut off from the network mid-write) would lock its rows until Postgres found the
    peer gone, `AGENT_JOBS_DATABASE_KEEPALIVE` seconds; ended, they are free at once."""
    try:
        with store.begin() as conn:
            ended = end_sessions_of(conn, session_name(process))
    except Exception as exc:  # the keepalive lets them go in seconds anyway
        log.warning("could not end the database sessions of process %s: %s", process, exc)
        return
    if ended:
        log.warning("ended %d database session(s) of process %s, taken for dead", ended, process)


# How long recovery holds the leases of the steps it lets go of, at most.
SEIZE_FOR = 10.0


@contextmanager
def seized(
    leases: Leases, run_id: str, steps: Collection[str], dead: str = ""
) -> Iterator[set[str]]:
    """Hold the leases of the run's `steps` that no live delivery holds (none, one whose
    holder is provably gone, or one of a process whose names start with `dead`) while the
    caller moves their epochs on; let them go before the caller sends the steps again. A
    delivery that took a lease first keeps its step (it reads the epoch as it is); one
    that comes while they are held finds them taken; either way no delivery reads an
    epoch that moves on under it."""
    me = Holder.me()
    ours: set[str] = set()
    try:
        for step in sorted(steps):
            if dead:
                leases.release_process(run_id, step, dead)
            if leases.take(run_id, step, me, SEIZE_FOR):
                ours.add(step)
        yield ours
    finally:
        for step in ours:
            with contextlib.suppress(redis.RedisError):  # it expires
                leases.release(run_id, step, me)


def give_up(store: Store, leases: Leases, dispatcher: Dispatcher, running: Running) -> None:
    """A step's thread overran the hard time limit (tasks/watchdog.py): let go of its
    claim or lease and send the step again, as if its process had been killed."""
    run_id, step, holder = running.run_id, running.step, running.holder
    with store.begin() as conn:
        if running.claimed:
            hold_rows.release_claims(conn, run_id, str(holder))
        else:
            hold_rows.fence_steps(conn, run_id, [step])
    if not running.claimed:
        leases.release(run_id, step, holder)
    log.error("step %s of run %s overran its time limit: sent again", step, run_id)
    dispatcher.steps(run_id, [(running.task, step)])


class Runner(Protocol):
    """What the sweep uses of the durable runner."""

    @property
    def app(self) -> AgentApp: ...
    @property
    def store(self) -> Store: ...
    @property
    def leases(self) -> Leases: ...
    @property
    def dispatcher(self) -> Dispatcher: ...
    @property
    def streams(self) -> StreamBackend: ...
    @property
    def settings(self) -> Settings: ...


def sweep(runner: Runner) -> int:
    """The sweep: decide the approvals past their deadline, wake the sleepers past their
    time, then re-drive the runs that made no progress for a while; returns how many runs
    it re-drove (or woke)."""
    woken = {found.run_id for found in expire_approvals(runner)}
    # The timers tick wakes sleepers on time; the sweep wakes any it missed (no tick ran).
    woken_sleepers = sleepers.wake_due(runner.store, runner.dispatcher, 0.0)
    return (
        len(woken)
        + woken_sleepers
        + redrive_stale(runner.store, runner.leases, runner.dispatcher, runner.settings)
    )


def expire_approvals(runner: Runner) -> list[deadlines.TimedOut]:
    """Decide the calls past their deadline (approvals/deadlines.py): stream what was
    escalated, wake the runs a timeout decided, and be there at an escalated call's new
    deadline when a delayed message may wait that long (else the next sweep is)."""
    timed_out = deadlines.expire_due(runner.store, runner.app)
    horizon = utcnow() + timedelta(seconds=runner.settings.step_time_limit)
    for found in timed_out:
        log.info("sweep: call %s of run %s timed out: %s", found.call_id, found.run_id, found.how)
        RunStream(runner.streams, found.root_run_id, found.run_id).emit_many(list(found.frames))
        if found.decision is not None:
            runner.dispatcher.coordinate(found.run_id)
        elif found.deadline is not None and found.deadline <= horizon:
            left = (found.deadline - utcnow()).total_seconds()
            runner.dispatcher.coordinate(found.run_id, countdown=max(0.0, left) + 0.05)
    return timed_out


def redrive_stale(store: Store, leases: Leases, dispatcher: Dispatcher, settings: Settings) -> int:
    """Re-drive runs that made no progress for `sweep_stale_after` seconds, and send their
    remote steps nobody holds (a claim or a lease); returns how many runs."""
    cutoff = utcnow() - timedelta(seconds=settings.sweep_stale_after)
    with store.connect() as conn:
        stale = run_rows.stale_run_ids(conn, cutoff=cutoff)
    for run_id in stale:
        with store.begin() as conn:
            stranded = journal_rows.stranded(conn, run_id, older_than=cutoff)
            run_rows.touch(conn, run_id)
        with seized(leases, run_id, {row.step for row in stranded}) as ours:
            if ours:  # whoever let the lease run out writes nothing of them any more
                with store.begin() as conn:
                    hold_rows.fence_steps(conn, run_id, sorted(ours))
        steps = [(sent_as_journaled(row.intent), row.step) for row in stranded if row.step in ours]
        if steps:
            log.info("sweep: re-enqueueing %s of run %s", [s for _, s in steps], run_id)
            dispatcher.steps(run_id, steps)
        dispatcher.coordinate(run_id)
    return len(stale)
