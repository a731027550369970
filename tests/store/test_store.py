"""Store queries on both databases: first writer wins, upserts, ordering."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agent_jobs.messages import Message, ToolCall
from agent_jobs.store import Store, holds, journal, runs, threads, toolcalls
from agent_jobs.store import usage as usage_rows
from agent_jobs.store.schema import runs as runs_table
from tests.support.builders import add_run
from tests.support.waiting import TIMEOUT

_run = add_run


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
        assert holds.mark_started(conn, "r", "tool:c1", attempt=2, started_at=started, lease=30)
        assert journal.complete(conn, "r", "tool:c1", state="done", result={"v": 1}, attempts=2)
        assert not journal.complete(conn, "r", "tool:c1", state="done", result={"v": 2})
        assert not holds.mark_started(conn, "r", "tool:c1", attempt=3, started_at=started, lease=30)
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
    import uuid

    from agent_jobs.leases import Holder, Leases, this_machine
    from tests.support.waiting import eventually

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
        eventually(theirs.gone, what=f"the killed process {child.pid} to be gone", every=0.01)
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
    failed: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(10):
                with store.begin() as conn:
                    usage_rows.bump_quota(conn, actor="u", day="2026-01-01", tokens=3)
        except BaseException as exc:  # the test reports it, not a lost thread
            failed.append(exc)

    workers = [threading.Thread(target=bump) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not failed, failed
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


def test_the_migrations_build_the_schema_the_code_declares(store: Store) -> None:
    """Every table, column and index of store/schema.py, as the migrations made them."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from agent_jobs.store.schema import SEARCH_INDEX, metadata

    def ours(name: str | None, kind: str, parent: object) -> bool:
        # Tables of others (Alembic's own, a test's side table) are no part of the schema,
        # nor is the search's index, made only where pg_trgm can be (tests/store/test_listing.py).
        if kind == "index" and name == SEARCH_INDEX:
            return False
        return kind != "table" or name in metadata.tables

    with store.engine.connect() as conn:
        options = {"compare_type": False, "include_name": ours}
        differences = compare_metadata(MigrationContext.configure(conn, opts=options), metadata)
    assert differences == []


# --- one insert-unless-exists on both dialects --------------------------------------------


def test_insert_unless_exists_keeps_the_first_row(store: Store) -> None:
    from sqlalchemy.exc import IntegrityError

    from agent_jobs.store.db import insert_unless_exists, utcnow
    from agent_jobs.store.schema import journal as journal_table
    from agent_jobs.store.schema import threads as threads_table

    now = utcnow()
    with store.begin() as conn:
        assert insert_unless_exists(
            conn,
            threads_table,
            {"id": "t9", "title": "first", "created_at": now, "updated_at": now},
        )
        assert not insert_unless_exists(
            conn,
            threads_table,
            {"id": "t9", "title": "second", "created_at": now, "updated_at": now},
        )
        threads.ensure_thread(conn, "t9")  # idempotent, and keeps the row as it was
        assert threads.thread_title(conn, "t9") == "first"
        row = {"run_id": "r", "seq": 1, "state": "scheduled", "attempts": 0, "created_at": now}
        assert insert_unless_exists(conn, journal_table, {**row, "step": "a"})
        # An explicit key: the same (run, step) is skipped…
        key = [journal_table.c.run_id, journal_table.c.step]
        assert not insert_unless_exists(conn, journal_table, {**row, "step": "a"}, conflict=key)
    # …but a clash on another unique index (run, seq) is not swallowed.
    with pytest.raises(IntegrityError), store.begin() as conn:
        insert_unless_exists(conn, journal_table, {**row, "step": "b"})
    assert [r["step"] for r in store.journal("r")] == ["a"]


def test_usage_recorded_reads_the_ledger(store: Store) -> None:
    from agent_jobs.messages import Usage

    _run(store)
    with store.begin() as conn:
        assert not usage_rows.usage_recorded(conn, "r1", "model:1")
        usage_rows.charge(
            conn,
            run_id="r1",
            thread_id="t1",
            actor="u",
            day="2026-01-01",
            step="model:1",
            kind="model",
            model=None,
            spent=Usage(input_tokens=1, output_tokens=2),
        )
        assert usage_rows.usage_recorded(conn, "r1", "model:1")
        assert not usage_rows.usage_recorded(conn, "r1", "model:2")
        assert not usage_rows.usage_recorded(conn, "r2", "model:1")


# --- run queries that used to live outside store/ ------------------------------------------


def _add_run(store: Store, run_id: str, status: str, **columns: object) -> None:
    """A run of thread t1 in `status`; `columns` overwrite the row's other columns."""
    from sqlalchemy import update

    from agent_jobs.store.schema import runs as runs_table

    with store.begin() as conn:
        threads.ensure_thread(conn, "t1")
        parent = columns.pop("parent_run_id", None)
        assert runs.insert_run(
            conn,
            run_id=run_id,
            thread_id="t1",
            agent="a",
            actor="u",
            persona=None,
            input="x",
            status="queued",
            runner="durable",
            day="2026-01-01",
            metadata={},
            parent_run_id=parent,  # type: ignore[arg-type]
        )
        conn.execute(
            update(runs_table).where(runs_table.c.id == run_id).values(status=status, **columns)
        )


def test_active_and_last_run_are_top_level_runs_of_the_thread(store: Store) -> None:
    from datetime import timedelta

    from agent_jobs import session
    from agent_jobs.store.db import utcnow

    t0 = utcnow() - timedelta(hours=1)
    with store.begin() as conn:
        assert runs.active_run(conn, "t1") is None and runs.last_run(conn, "t1") is None
    _add_run(store, "old", "running", created_at=t0)
    _add_run(store, "done", "completed", created_at=t0 + timedelta(minutes=1))
    _add_run(store, "child", "running", created_at=t0 + timedelta(minutes=2), parent_run_id="old")
    with store.begin() as conn:
        assert runs.active_run(conn, "t1").id == "old"  # type: ignore[union-attr]
        assert runs.last_run(conn, "t1").id == "done"  # type: ignore[union-attr]
        assert session.active_run(conn, "t1").id == "old"
        assert session.last_run(conn, "t1").id == "done"
        assert runs.finish_run(conn, "old", "failed")
        for terminal in runs.TERMINAL:
            assert runs.set_status(conn, "done", "running", only_if_not_terminal=False)
            assert runs.finish_run(conn, "done", terminal)  # type: ignore[arg-type]
            assert runs.active_run(conn, "t1") is None


def test_the_first_cancel_cause_wins_and_a_finished_run_takes_none(store: Store) -> None:
    _add_run(store, "r1", "awaiting_approval")
    _add_run(store, "r2", "completed")
    with store.begin() as conn:
        assert runs.record_cancel(conn, "r1", "user", keep_inbox=True) == "t1"
        assert runs.record_cancel(conn, "r1", "timeout", keep_inbox=False) is None
        assert runs.record_cancel(conn, "r2", "user", keep_inbox=False) is None
        assert runs.record_cancel(conn, "nope", "user", keep_inbox=False) is None
    view = store.get_run("r1")
    assert (view.cancel_cause, view.cancel_keep_inbox) == ("user", True)
    assert store.get_run("r2").cancel_cause is None


def test_the_sweep_picks_each_kind_of_stranded_run_and_no_other(store: Store) -> None:
    from datetime import timedelta

    from agent_jobs.store.db import utcnow

    now = utcnow()
    old, cutoff, fresh = now - timedelta(minutes=10), now - timedelta(minutes=5), now
    picked: set[str] = set()

    def add(run_id: str, status: str, *, pick: bool, **columns: object) -> None:
        _add_run(store, run_id, status, **columns)
        if pick:
            picked.add(run_id)

    def journal_row(run_id: str, step: str, state: str, finished_at: object) -> None:
        row = journal.row(run_id=run_id, step=step, seq=1, state="scheduled", intent={})
        row.update(state=state, finished_at=finished_at)
        with store.begin() as conn:
            journal.insert_many(conn, [row])

    # 1. Queued or running, no progress since the cutoff.
    add("stale-queued", "queued", pick=True, updated_at=old)
    add("stale-running", "running", pick=True, updated_at=old)
    add("fresh-running", "running", pick=False, updated_at=fresh)
    # 2. Parked, decided (approval/answers row done) after the run's last update.
    add("decided", "awaiting_approval", pick=True, updated_at=old)
    journal_row("decided", "approval:c1", "done", old + timedelta(minutes=1))
    add("answered", "awaiting_answers", pick=True, updated_at=old)
    journal_row("answered", "answers:q1", "done", old + timedelta(minutes=1))
    add("undecided", "awaiting_approval", pick=False, updated_at=old)
    journal_row("undecided", "approval:c1", "waiting", None)
    add("decided-before", "awaiting_approval", pick=False, updated_at=old)
    journal_row("decided-before", "approval:c1", "done", old - timedelta(minutes=1))
    add("other-step-done", "awaiting_answers", pick=False, updated_at=old)
    journal_row("other-step-done", "tool:c1", "done", old + timedelta(minutes=1))
    add("decided-fresh", "awaiting_approval", pick=False, updated_at=fresh)
    journal_row("decided-fresh", "approval:c1", "done", fresh + timedelta(seconds=1))
    # 3. A cancel asked for and never acted on.
    add("cancel-parked", "awaiting_approval", pick=True, updated_at=old, cancel_cause="user")
    add("cancel-fresh", "awaiting_approval", pick=False, updated_at=fresh, cancel_cause="user")
    add("cancel-done", "cancelled", pick=False, updated_at=old, cancel_cause="user")
    # 4. Overdue: past the deadline and unfinished, however fresh.
    add("overdue", "awaiting_answers", pick=True, updated_at=fresh, deadline=cutoff)
    add("due-later", "running", pick=False, updated_at=fresh, deadline=now + timedelta(hours=1))
    add("overdue-done", "completed", pick=False, updated_at=old, deadline=cutoff)
    # Finished runs are never picked.
    for status in sorted(runs.TERMINAL):
        add(f"finished-{status}", status, pick=False, updated_at=old)

    with store.connect() as conn:
        assert set(runs.stale_run_ids(conn, cutoff=cutoff, now=now)) == picked
        # `now` decides what is overdue: an hour on, the later deadline is past too.
        later = now + timedelta(hours=2)
        assert set(runs.stale_run_ids(conn, cutoff=cutoff, now=later)) == picked | {"due-later"}
    assert set(store.stale_run_ids(cutoff=cutoff)) == picked


def test_events_are_numbered_per_thread_in_one_go_and_need_their_thread(store: Store) -> None:
    from agent_jobs.store import events as event_rows
    from agent_jobs.store import threads as thread_rows

    with store.begin() as conn:
        thread_rows.ensure_thread(conn, "numbered")
        thread_rows.ensure_thread(conn, "other")
        event_rows.append(conn, [("numbered", None, "a", {"n": 1})])
        event_rows.append(
            conn,
            [
                ("numbered", "r1", "b", {"n": 2, "nested": {"x": [1, "two"]}}),
                ("other", None, "c", {}),
                ("numbered", None, "d", {"text": "é ✓"}),
            ],
        )
        rows = event_rows.for_thread(conn, "numbered")
        assert [(r.seq, r.run_id, r.type, r.data) for r in rows] == [
            (1, None, "a", {"n": 1}),
            (2, "r1", "b", {"n": 2, "nested": {"x": [1, "two"]}}),
            (3, None, "d", {"text": "é ✓"}),
        ]
        assert [r.seq for r in event_rows.for_thread(conn, "other")] == [1]
    # SQLite checks the count it took; on Postgres the write goes with the commit
    # (store/driver.py) and the database refuses it: the sequence it took is NULL.
    with pytest.raises((LookupError, IntegrityError)), store.begin() as conn:
        event_rows.append(conn, [("no-such-thread", None, "a", {})])
    with store.connect() as conn:
        assert event_rows.for_thread(conn, "no-such-thread") == []


def test_a_passs_journal_rows_and_events_are_written_as_given(store: Store) -> None:
    """One statement on Postgres (the rows as one JSON document, typed by the table):
    every value comes back as it went in, with the events numbered beside them."""
    from agent_jobs.store import events as event_rows

    _run(store, "odd")
    odd: dict[str, object] = {
        "quote": 'it\'s "quoted" \\ back',
        "markup": "<b>&amp;</b>",
        "unicode": "é ✓ 😀",
        "nested": {"list": [1, 2.5, None, True, {"x": []}]},
    }
    rows = [
        journal.row(run_id="odd", step="a", seq=1, state="done", intent=odd, result="a string"),
        journal.row(run_id="odd", step="b", seq=2, state="scheduled", intent={"n": 0}),
        journal.row(run_id="odd", step="c", seq=3, state="done", intent=None, result=[1, "x"]),
    ]
    holds.claim(rows[1], "me|1|2|token", 30)
    with store.begin() as conn:
        journal.insert_many(conn, rows, [("t1", "odd", "step/start", {"text": odd["unicode"]})])
        journal.insert_many(
            conn, [journal.row(run_id="odd", step="d", seq=4, state="done", intent={}, result=None)]
        )
        journal.insert_many(conn, [], [("t1", None, "later", {})])
        written = {r.step: r for r in journal.load(conn, "odd")}
        events = [(e.seq, e.run_id, e.type, e.data) for e in event_rows.for_thread(conn, "t1")]
    assert written["a"].intent == odd and written["a"].result == "a string"
    assert written["c"].intent is None and written["c"].result == [1, "x"]
    claimed = written["b"]
    assert (claimed.state, claimed.attempts, claimed.holder) == ("started", 1, "me|1|2|token")
    assert claimed.lease_until > claimed.started_at
    assert list(written) == ["a", "b", "c", "d"]
    assert events == [(1, "odd", "step/start", {"text": "é ✓ 😀"}), (2, None, "later", {})]
    # A row the replay should not have inserted again is a bug, loudly: nothing is written.
    with pytest.raises(IntegrityError), store.begin() as conn:
        journal.insert_many(conn, [rows[0]], [("t1", None, "lost", {})])
    with store.connect() as conn:
        assert [e.type for e in event_rows.for_thread(conn, "t1")] == ["step/start", "later"]


def test_a_calls_outcome_and_its_message_and_a_charge_are_written_as_given(store: Store) -> None:
    """One statement each on Postgres (an UPDATE or INSERT in a CTE ahead of the other)."""
    from agent_jobs.messages import Usage

    _run(store)
    result: dict[str, object] = {"text": '<b>it\'s</b> \\ "q" é 😀', "n": [1, None]}
    message = Message(role="tool", content="<i>out</i>", tool_call_id="c1", name="t")
    with store.begin() as conn:
        toolcalls.insert_call(
            conn,
            run_id="r1",
            call_id="c1",
            thread_id="t1",
            name="t",
            kind="read",
            args={},
            status="auto_executed",
        )
        toolcalls.finish_call(
            conn,
            "r1",
            "c1",
            status="executed",
            result=result,
            error=None,
            thread_id="t1",
            message=message,
        )
        call = toolcalls.get_call(conn, "r1", "c1")
        [stored] = [m for m in threads.thread_messages(conn, "t1") if m.tool_call_id == "c1"]
        for n in (1, 2):
            usage_rows.charge(
                conn,
                run_id="r1",
                thread_id="t1",
                actor="u",
                day="2026-01-01",
                step=f"model:{n}",
                kind="model",
                model="m",
                spent=Usage(input_tokens=n, output_tokens=10, cost=0.5),
            )
        used = usage_rows.tokens_used(conn, actor="u", day="2026-01-01")
        ledger = usage_rows.run_usage_rows(conn, "r1")
    assert call is not None
    assert (call.status, call.result, call.error) == ("executed", result, None)
    assert (stored.content, stored.name, stored.is_error) == ("<i>out</i>", "t", False)
    assert used == 11 + 12
    assert [(u["step"], u["input_tokens"], u["cost"]) for u in ledger] == [
        ("model:1", 1, 0.5),
        ("model:2", 2, 0.5),
    ]


def test_a_reader_holds_no_writer_up(store: Store) -> None:
    """A read (`Store.connect`) takes no write lock: a writer goes on while a reader's
    transaction is open (on SQLite a reader that took the write lock starved writers)."""
    _run(store)
    ended = threading.Event()
    failed: list[BaseException] = []

    def write() -> None:
        try:
            with store.begin() as conn:
                threads.ensure_thread(conn, "written-meanwhile")
        except BaseException as exc:  # the test reports it
            failed.append(exc)
        finally:
            ended.set()

    with store.connect() as reader:
        reader.execute(select(runs_table.c.id)).all()  # its transaction is open
        writer = threading.Thread(target=write)
        writer.start()
        # A writer held up by the reader would wait until the reader ends: it ends while
        # the reader is still open (TIMEOUT is only a guard against that hang).
        assert ended.wait(TIMEOUT), "the writer waited for the reader"
        assert not failed, failed
        writer.join()
    with store.connect() as conn:
        assert threads.thread_exists(conn, "written-meanwhile")
