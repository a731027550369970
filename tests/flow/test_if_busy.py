"""A run asked for on a thread whose turn has not ended, on both runners (`harness`):
`if_busy="enqueue"` runs it after that turn, `"reject"` refuses it and records nothing,
`"interrupt"` cancels the turn as a user would and runs it next."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from agent_jobs import InvalidRequestError, ThreadBusyError, session
from agent_jobs.store.schema import events, runs, threads
from tests.support.harness import DurableHarness, Harness
from tests.support.waiting import eventually
from tests.support.workers import TEST_POOLS, Process


def parked(harness: Harness, text: str = "one", **kwargs: Any) -> tuple[str, str]:
    """A run of `gated` waiting for a lead's decision: (run id, its thread)."""
    run_id = harness.start("gated", text, **kwargs)
    run = harness.wait_status(run_id, "awaiting_approval")
    return run_id, run.thread_id


def approve_all(harness: Harness, run_id: str) -> None:
    for call in harness.store.pending_calls(run_id):
        assert harness.decide(run_id, call["call_id"], "approve", "alice")


def counts(harness: Harness) -> tuple[int, int, int]:
    """Runs, threads and events: what a refused start must leave as it was."""
    with harness.store.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (runs, threads, events)
        )


def passed_over(request: pytest.FixtureRequest, harness: Harness, waiting_on: str) -> None:
    """A worker has had its chance at a queued run: its pass held it (Celery's line for
    the task says so; durable-local's passes have all ended). The inline runner holds it
    in `start` itself."""
    if not isinstance(harness, DurableHarness):
        return
    if harness.local is not None:  # in this process: every pass sent so far has ended
        eventually(harness.local.idle, what=f"the passes to hold the run ({waiting_on})")
        return
    pool = request.node.callspec.params["harness"].partition("-")[2] or TEST_POOLS[0]
    worker: Process = request.getfixturevalue("shared_workers")(pool)
    eventually(
        lambda: f": 'queued: {waiting_on}'" in worker.log(),
        what=f"a worker's pass to hold the run ({waiting_on})",
    )


def test_enqueue_runs_after_the_turn_the_thread_is_in(
    harness: Harness, request: pytest.FixtureRequest
) -> None:
    first, thread = parked(harness)
    second = harness.start("gated", "two", thread_id=thread)  # enqueue: the default
    queued = harness.store.get_run(second)
    assert queued.status == "queued"
    assert queued.waiting_on == f"thread {thread} busy: run {first}"
    passed_over(request, harness, queued.waiting_on)
    assert harness.store.get_run(second).status == "queued"  # the turn has not ended
    approve_all(harness, first)
    assert harness.wait(first).status == "completed"
    harness.wait_status(second, "awaiting_approval")
    approve_all(harness, second)
    assert harness.wait(second).status == "completed"
    log = [(e.run_id, e.type) for e in harness.events(thread)]
    assert log.index((first, "turn/end")) < log.index((second, "turn/start"))
    assert harness.store.get_run(second).waiting_on is None


def test_enqueued_runs_take_the_thread_in_the_order_they_came(harness: Harness) -> None:
    first, thread = parked(harness)
    later = [harness.start("gated", f"then {n}", thread_id=thread) for n in range(3)]
    approve_all(harness, first)
    for run_id in later:
        harness.wait_status(run_id, "awaiting_approval")
        assert [harness.store.get_run(r).status for r in later[later.index(run_id) + 1 :]] == [
            "queued"
        ] * (len(later) - later.index(run_id) - 1)
        approve_all(harness, run_id)
        assert harness.wait(run_id).status == "completed"


def test_reject_refuses_and_records_nothing(harness: Harness) -> None:
    first, thread = parked(harness)
    before = counts(harness)
    with pytest.raises(ThreadBusyError, match=f"run '{first}' has not ended"):
        harness.start("gated", "two", thread_id=thread, run_id="refused-1", if_busy="reject")
    assert counts(harness) == before
    assert harness.store.find_run("refused-1") is None
    approve_all(harness, first)
    assert harness.wait(first).status == "completed"
    # An idle thread takes it.
    done = harness.start("gated", "two", thread_id=thread, if_busy="reject")
    harness.wait_status(done, "awaiting_approval")
    approve_all(harness, done)
    assert harness.wait(done).status == "completed"


def test_interrupt_cancels_the_turn_and_runs_next(harness: Harness) -> None:
    first, thread = parked(harness)
    waiting = harness.start("gated", "two", thread_id=thread)
    third = harness.start("gated", "three", thread_id=thread, if_busy="interrupt")
    ended = harness.wait(first)
    assert (ended.status, ended.cancel_cause) == ("cancelled", "user")
    assert harness.wait(waiting).status == "cancelled"  # queued before it: cancelled too
    harness.wait_status(third, "awaiting_approval")
    approve_all(harness, third)
    assert harness.wait(third).status == "completed"
    ends = [e.data for e in harness.events(thread) if e.type == "turn/end"]
    assert ends[0] == {"reason": "aborted", "cause": "user"}


def test_a_bad_if_busy_is_refused_and_records_nothing(harness: Harness) -> None:
    first, thread = parked(harness)
    before = counts(harness)
    with pytest.raises(InvalidRequestError, match="if_busy"):
        harness.start("gated", "two", thread_id=thread, run_id="bad-1", if_busy="later")
    assert counts(harness) == before
    approve_all(harness, first)
    assert harness.wait(first).status == "completed"


def test_a_next_turn_message_waits_behind_a_queued_run(harness: Harness) -> None:
    first, thread = parked(harness)
    harness.post(first, "after all that, order 7", target="next-turn")
    second = harness.start("gated", "two", thread_id=thread)
    approve_all(harness, first)
    assert harness.wait(first).status == "completed"
    harness.wait_status(second, "awaiting_approval")  # the queued run goes first
    approve_all(harness, second)
    assert harness.wait(second).status == "completed"
    [third] = [
        r.run_id
        for r in harness.store.list_runs(thread_id=thread)
        if r.run_id not in (first, second)
    ]
    assert harness.store.get_run(third).input == "after all that, order 7"
    harness.wait_status(third, "awaiting_approval")
    approve_all(harness, third)
    assert harness.wait(third).status == "completed"


def test_a_queued_run_cancelled_leaves_the_threads_inbox_to_the_running_turn(
    harness: Harness,
) -> None:
    first, thread = parked(harness)
    second = harness.start("gated", "two", thread_id=thread)
    harness.post(first, "and check order 7 too")  # steering for the turn that runs
    harness.cancel(second)
    assert harness.wait(second).status == "cancelled"
    with harness.store.connect() as conn:
        inbox = session.fold_inbox(session.thread_events(conn, thread))
    assert inbox.next_step == ["and check order 7 too"]
    assert "turn/end" not in [e.type for e in harness.events(thread) if e.run_id == second]
    approve_all(harness, first)
    assert harness.wait(first).status == "completed"
