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

    from agent_jobs.leases import Leases

    leases = Leases.from_url(redis_url)
    run = uuid.uuid4().hex
    assert leases.acquire(run, "tool:a", "t1", 30) == 1
    assert leases.acquire(run, "tool:a", "t2", 30) is None  # a duplicate delivery
    assert leases.held(run, ["tool:a", "tool:b"]) == {"tool:a"}
    assert not leases.refresh(run, "tool:a", "t2", 30)  # not its lease
    leases.release(run, "tool:a", "t2")
    assert leases.held(run, ["tool:a"]) == {"tool:a"}
    leases.release(run, "tool:a", "t1")
    assert leases.acquire(run, "tool:a", "t3", 30) == 2  # a redelivery counts
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
