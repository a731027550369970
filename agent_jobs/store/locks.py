"""Row locks, and the one order every transaction takes them in.

A transaction that needs several of these rows locks them in this order and never
another, so two transactions wait for each other and never deadlock:

1. runs: a run's row (`runs.lock_run`; `journal.lock_and_load` for a pass), a parent's
   before its children's;
2. a thread: its row (`events.lock_thread`; `places.thread_runs`, which reads the
   thread's runs under it);
3. a call or a question of a run: never locked apart, only written under its run's lock
   (a person's decision, a park on a person, a reconciliation).

Both deadlocks this order prevents happened: a cancel that took a thread's row and then
waited for a second run of the thread, against that run's admission (run, then thread);
a request for a person written before its run was parked, against a decision that took
the run first (run, then question).

Every lock of a run or a thread is taken by one of those store functions, and each notes
it here (`note`) before it takes it. With `AGENT_JOBS_LOCK_ORDER=strict` (the test suite
sets it) a transaction that takes a lock out of order raises `LockOrderError`; otherwise
it is logged as an error, and the transaction goes on.
"""

from __future__ import annotations

import logging
import os

from sqlalchemy import Connection

log = logging.getLogger(__name__)

RUN = 1
THREAD = 2
_NAMES = {RUN: "a run's row", THREAD: "a thread's row"}
_KEY = "agent_jobs.locks"


class LockOrderError(AssertionError):
    """A transaction took a row lock out of the order of `agent_jobs.store.locks`."""


def note(conn: Connection, rank: int) -> None:
    """A lock of `rank` is about to be taken in the connection's transaction."""
    transaction = conn.get_transaction()
    if transaction is None:
        return
    held = conn.info.get(_KEY)
    highest = held[1] if held is not None and held[0] is transaction else 0
    if rank < highest:
        message = (
            f"{_NAMES[rank]} locked after {_NAMES[highest]} in one transaction: the order "
            "is runs, then a thread (agent_jobs/store/locks.py)"
        )
        if os.environ.get("AGENT_JOBS_LOCK_ORDER") == "strict":
            raise LockOrderError(message)
        log.error("%s", message, stack_info=True)
    conn.info[_KEY] = (transaction, max(rank, highest))
