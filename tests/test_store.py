"""Store queries on both databases: first writer wins, upserts, ordering."""

from __future__ import annotations

import threading

import pytest

from agent_jobs.messages import Message, ToolCall
from agent_jobs.store import Store, journal, runs, threads, toolcalls
from agent_jobs.store import usage as usage_rows


def _run(store: Store, run_id: str = "r1") -> None:
    with store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        runs.insert_run(
            conn,
            run_id=run_id,
            thread_id="t1",
            agent="a",
            actor="u",
            persona=None,
            input="x",
            status="running",
            runner="inline",
            day="2026-01-01",
            metadata={"k": [1, 2]},
        )


def test_run_rows_and_terminal_status_are_final(store: Store) -> None:
    _run(store)
    with store.begin() as conn:
        assert not runs.insert_run(
            conn,
            run_id="r1",
            thread_id="t1",
            agent="a",
            actor="u",
            persona=None,
            input="y",
            status="queued",
            runner="inline",
            day="2026-01-01",
            metadata={},
        )
        assert runs.finish_run(conn, "r1", "completed", output="out")
        assert not runs.finish_run(conn, "r1", "failed", error="late")
        assert not runs.set_status(conn, "r1", "running")
    view = store.get_run("r1")
    assert (view.status, view.output, view.error) == ("completed", "out", None)
    assert view.metadata == {"k": [1, 2]} and view.root_run_id == "r1"


def test_messages_keep_order_and_tool_calls(store: Store) -> None:
    _run(store)
    call = ToolCall(id="c1", name="t", args={"a": 1})
    with store.begin() as conn:
        threads.append_message(conn, "t1", "r1", Message(role="user", content="q"))
        threads.append_message(conn, "t1", "r1", Message(role="assistant", tool_calls=[call]))
        threads.append_message(
            conn, "t1", "r1", Message(role="tool", content="e", tool_call_id="c1", is_error=True)
        )
        assert threads.has_assistant_message(conn, "t1", before_run=None)
        assert not threads.has_assistant_message(conn, "t1", before_run="r1")
    loaded = store.thread_messages("t1")
    assert [m.role for m in loaded] == ["user", "assistant", "tool"]
    assert loaded[1].tool_calls == [call] and loaded[2].is_error


def test_the_first_decision_wins(store: Store) -> None:
    _run(store)
    with store.begin() as conn:
        toolcalls.insert_call(
            conn,
            run_id="r1",
            call_id="c1",
            thread_id="t1",
            name="refund",
            kind="action",
            args={},
            status="pending_approval",
        )
    with store.begin() as conn:
        assert toolcalls.decide(conn, "r1", "c1", decision="reject", actor="a", reason="no")
        assert not toolcalls.decide(conn, "r1", "c1", decision="approve", actor="b", reason=None)
    [call] = store.tool_calls("r1")
    assert (call["status"], call["decision"], call["decided_by"]) == ("rejected", "reject", "a")


def test_journal_first_writer_wins(store: Store) -> None:
    from agent_jobs.store.db import utcnow

    with store.begin() as conn:
        assert journal.insert_pending(
            conn, run_id="r", step="tool:c1", seq=1, intent={"x": 1}, state="scheduled"
        )
        assert not journal.insert_pending(
            conn, run_id="r", step="tool:c1", seq=1, intent={"x": 2}, state="scheduled"
        )
        started = utcnow()
        assert journal.mark_started(conn, "r", "tool:c1", attempt=2, started_at=started, lease=30)
        assert journal.complete(conn, "r", "tool:c1", state="done", result={"v": 1}, attempts=2)
        assert not journal.complete(conn, "r", "tool:c1", state="done", result={"v": 2})
        assert not journal.mark_started(
            conn, "r", "tool:c1", attempt=3, started_at=started, lease=30
        )
    [row] = store.journal("r")
    assert (row["state"], row["result"], row["attempts"], row["intent"]) == (
        "done",
        {"v": 1},
        2,
        {"x": 1},
    )


def test_leases_admit_one_delivery_and_count_attempts(redis_url: str) -> None:
    import uuid

    from agent_jobs.leases import Holder, Leases

    leases = Leases.from_url(redis_url)
    run = uuid.uuid4().hex
    first, second, third = Holder.me(), Holder.me(), Holder.me()
    assert leases.take(run, "tool:a", first, 30)
    assert leases.count_attempt(run, "tool:a") == 1
    assert not leases.take(run, "tool:a", second, 30)  # a duplicate: this process lives
    assert leases.held(run, ["tool:a", "tool:b"]) == {"tool:a"}
    assert not leases.refresh(run, "tool:a", second, 30)  # not its lease
    leases.release(run, "tool:a", second)
    assert leases.held(run, ["tool:a"]) == {"tool:a"}
    leases.release(run, "tool:a", first)
    assert leases.take(run, "tool:a", third, 30)
    assert leases.count_attempt(run, "tool:a") == 2  # a redelivery counts
    # Redis lost the lease (restarted empty): its holder takes it back while it runs.
    leases.client.delete(f"agent_jobs:lease:{run}:tool:a")
    assert leases.refresh(run, "tool:a", third, 30)
    assert not leases.take(run, "tool:a", first, 30)
    leases.client.close()


def test_a_lease_of_a_dead_process_is_taken_over_and_only_then(redis_url: str) -> None:
    import dataclasses
    import subprocess
    import sys
    import time
    import uuid

    from agent_jobs.leases import Holder, Leases, this_machine

    leases = Leases.from_url(redis_url)
    run = uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = Holder.me()
        theirs = dataclasses.replace(Holder.me(), pid=child.pid)
        from agent_jobs.leases import _start_time

        theirs = dataclasses.replace(theirs, started=_start_time(child.pid))
        assert leases.take(run, "tool:a", theirs, 30)
        assert not leases.take(run, "tool:a", me, 30)  # it still runs
        child.kill()  # a zombie until reaped: already gone
        deadline = time.monotonic() + 5
        while not theirs.gone():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert leases.held(run, ["tool:a"]) == set()
        assert leases.take(run, "tool:a", me, 30)
        assert not leases.refresh(run, "tool:a", theirs, 30)
    finally:
        child.kill()
        child.wait()
    # A holder on another machine is never taken over: it may be alive.
    elsewhere = dataclasses.replace(Holder.me(), machine="elsewhere:x:1", pid=child.pid)
    assert leases.take(run, "tool:b", elsewhere, 30)
    assert not leases.take(run, "tool:b", Holder.me(), 30)
    # A pid of this machine that now names another process (reused): gone.
    reused = dataclasses.replace(Holder.me(), started="1")
    assert leases.take(run, "tool:c", reused, 30)
    assert leases.take(run, "tool:c", Holder.me(), 30)
    # The parent of a dead process releases its leases, and no one else's.
    dead = dataclasses.replace(Holder.me(), pid=child.pid)
    assert leases.take(run, "tool:d", dead, 30)
    assert not leases.release_dead(run, "tool:d", this_machine(), child.pid + 1)
    assert leases.release_dead(run, "tool:d", this_machine(), child.pid)
    assert leases.held(run, ["tool:d"]) == set()
    leases.client.close()


def test_quota_upsert_adds_up_under_concurrency(store: Store) -> None:
    def bump() -> None:
        for _ in range(10):
            with store.begin() as conn:
                usage_rows.bump_quota(conn, actor="u", day="2026-01-01", tokens=3)

    workers = [threading.Thread(target=bump) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert store.tokens_used("u", "2026-01-01") == 120
    assert store.tokens_used("u", "2026-01-02") == 0


def test_unknown_run_is_a_typed_error(store: Store) -> None:
    from agent_jobs.errors import UnknownRunError

    with pytest.raises(UnknownRunError):
        store.get_run("nope")
    assert store.find_run("nope") is None


def test_the_head_constant_is_alembics_head() -> None:
    from agent_jobs.migrations import HEAD
    from agent_jobs.store.db import head_revision

    assert head_revision() == HEAD
