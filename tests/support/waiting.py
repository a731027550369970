"""The one way a test waits: poll a check until it holds, and say what was awaited when
it gives up.

A test never judges how long something took against the wall clock: a shared two-core
machine can be slow at any moment. It waits for an event (a status, a row, a frame, a
line) with `eventually`, whose timeout is only a guard against a hang, far above what a
slow machine takes; the assertion after it is about order, counts or overlap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from agent_jobs.store import RunView, Store

T = TypeVar("T")

# How long a wait may take before the test fails: a guard against a hang, never a
# measure. AGENT_JOBS_TEST_TIMEOUT raises it on a very slow machine.
TIMEOUT = float(os.environ.get("AGENT_JOBS_TEST_TIMEOUT", "60"))

FINISHED = ("completed", "failed", "cancelled")


class GaveUp(AssertionError):
    """A wait that did not see its event: what was awaited, for how long, what was last
    seen."""


def eventually(
    check: Callable[[], T | None],
    timeout: float | None = None,
    *,
    what: str,
    every: float = 0.02,
    context: Callable[[], object] | None = None,
) -> T:
    """Call `check` until it returns something truthy, and return that. After `timeout`
    seconds (default TIMEOUT) raise GaveUp naming `what`, the last value seen and, when
    given, `context()` (say, the run's journal), so a failure says what did not happen."""
    limit = TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + limit
    last: object = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            seen = f"; context: {context()!r}" if context is not None else ""
            raise GaveUp(f"gave up after {limit:g} s waiting for {what} (last: {last!r}{seen})")
        time.sleep(every)


def settled(read: Callable[[], T], *, what: str) -> T:
    """What `read` returns once two reads in a row are the same: an ended run's worker may
    still write a moment after the run's status says it ended (a lease let go, a late
    pass touching its row)."""
    last = [read()]

    def same() -> T | None:
        now, before = read(), last[0]
        last[0] = now
        return now if now == before else None

    return eventually(same, what=f"{what} to stop changing")


def wait_status(
    store: Store,
    run_id: str,
    *statuses: str,
    timeout: float | None = None,
    strict: bool = False,
    context: Callable[[], object] | None = None,
) -> RunView:
    """The run once its status is one of `statuses` (a run not there yet is waited for).

    `strict`: a run that ends with another status fails the wait at once, with its error,
    instead of at the timeout (nothing in the run would start it again). `context`: what
    a failure shows besides the run's status (the processes' logs, say)."""

    def seen() -> RunView | None:
        view = store.find_run(run_id)
        if view is None:
            return None
        assert not (strict and view.finished and view.status not in statuses), (
            f"run {run_id} ended {view.status}: {view.error}"
            + (f"\n{context()}" if context is not None else "")
        )
        return view if view.status in statuses else None

    def last() -> object:
        status = getattr(store.find_run(run_id), "status", "no such run")
        return status if context is None else f"{status}\n{context()}"

    return eventually(
        seen, timeout, what=f"run {run_id} to be {' or '.join(statuses)}", context=last
    )


def wait_finished(store: Store, run_id: str, timeout: float | None = None) -> RunView:
    """The run once it has ended: completed, failed or cancelled."""
    return wait_status(store, run_id, *FINISHED, timeout=timeout)
