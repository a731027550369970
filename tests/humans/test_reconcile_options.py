"""Outcome unknown without workers: the tool options, a person's decision as checked
before anything is read, the store's queries on both databases, the inline runner."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from agent_jobs import AgentApp, InlineRunner, ScriptedModel
from agent_jobs.approvals.reconcile import Reconciliation, may_reconcile
from agent_jobs.client import Client
from agent_jobs.errors import ConfigurationError, InvalidRequestError, ReconcileRefusedError
from agent_jobs.settings import Settings
from agent_jobs.store import Store, journal, outcomes, runs, toolcalls
from agent_jobs.store.db import utcnow
from agent_jobs.store.schema import runs as runs_table
from agent_jobs.tools import ReconcileContext, Tool, ToolContext
from tests.support.builders import add_run
from tests.support.waiting import TIMEOUT


def pay(order_id: str) -> dict[str, str]:
    return {"paid": order_id}


def found(ctx: ReconcileContext) -> dict[str, Any] | None:
    return {"key": ctx.idempotency_key, "order": ctx.args["order_id"]}


async def found_later(ctx: ReconcileContext) -> dict[str, Any] | None:
    await asyncio.sleep(0)
    return None


def context() -> ReconcileContext:
    return ReconcileContext(
        run_id="r1",
        step="tool:c1",
        call_id="c1",
        actor="u",
        idempotency_key="r1:tool:c1",
        tool="pay",
        args={"order_id": "A1"},
    )


def test_an_action_is_not_idempotent_unless_it_says_so_and_a_read_always_is() -> None:
    assert not Tool(pay, kind="action").idempotent
    assert Tool(pay, kind="action", idempotent=True).idempotent
    assert Tool(pay, kind="read").idempotent
    assert Tool(pay, kind="read", idempotent=True).idempotent
    app = AgentApp()
    app.tool(kind="action", reconcile=found)(pay)
    assert app.registry.get("pay").reconciler is found and not app.registry.get("pay").idempotent


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"kind": "read", "idempotent": False}, "a read is always run again"),
        ({"kind": "read", "reconcile": found}, "a read is always run again"),
        ({"kind": "action", "idempotent": True, "reconcile": found}, "reconcile must be"),
        ({"kind": "action", "reconcile": "find_it"}, "reconcile must be"),
        ({"kind": "action", "idempotent": "yes"}, "idempotent must be True or False"),
    ],
)
def test_options_that_make_no_sense_are_refused(options: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigurationError, match=said):
        Tool(pay, **options)


def test_a_tools_reconcile_gives_json_or_none_and_may_be_async() -> None:
    assert Tool(pay, kind="action", reconcile=found).reconciled(context()) == {
        "key": "r1:tool:c1",
        "order": "A1",
    }
    assert Tool(pay, kind="action", reconcile=found_later).reconciled(context()) is None
    assert Tool(pay, kind="action").reconciled(context()) is None
    assert isinstance(context(), ToolContext)  # what a handler's ctx has, and the call


@pytest.mark.parametrize(
    ("outcome", "result", "error"),
    [
        ("maybe", None, None),
        ("failed", None, None),
        ("failed", None, "   "),
        ("failed", None, "x" * 10_001),
        ("failed", {"a": 1}, "no"),
        ("retry", None, "why"),
        ("retry", [1], None),
        ("succeeded", {"nul": "a\x00b"}, None),
        ("succeeded", float("nan"), None),
        ("succeeded", {1, 2}, None),
    ],
)
def test_a_malformed_decision_is_refused_before_anything_is_read(
    outcome: Any, result: Any, error: str | None
) -> None:
    with pytest.raises(InvalidRequestError, match="invalid reconciliation"):
        Reconciliation(outcome, "alice", result, error)
    with pytest.raises(InvalidRequestError, match="an actor is needed"):
        Reconciliation("retry", " ")


def test_who_may_say_how_a_call_ended() -> None:
    app = AgentApp(roles={"alice": ["lead"], "api": ["service"], "bob": ["support"]})
    app.tool(kind="action", approvers=["lead"])(pay)
    assert may_reconcile(app, "pay", "alice") and may_reconcile(app, "pay", "api")
    assert not may_reconcile(app, "pay", "bob")
    assert may_reconcile(app, "gone", "bob")  # a tool no longer defined names no approvers


def _call(store: Store, run_id: str, call_id: str) -> None:
    with store.begin() as conn:
        toolcalls.insert_call(
            conn,
            run_id=run_id,
            call_id=call_id,
            thread_id="t1",
            name="pay",
            kind="action",
            args={},
            status="approved",
        )


def _row(store: Store, run_id: str, step: str, seq: int, state: str, **more: Any) -> None:
    row = journal.row(run_id=run_id, step=step, seq=seq, state="scheduled", intent={"q": 1})
    row.update(state=state, **more)
    with store.begin() as conn:
        journal.insert_many(conn, [row])


def test_the_handler_mark_and_the_waiting_step(store: Store) -> None:
    add_run(store, runner="durable")
    _call(store, "r1", "c1")
    _call(store, "r1", "c10")
    with store.begin() as conn:
        assert outcomes.begin_handler(conn, "r1", "c1")
        assert outcomes.handler_started(conn, "r1", "c1") is not None
        assert not outcomes.begin_handler(conn, "r1", "c1")  # began before: unknown
        assert outcomes.begin_handler(conn, "r1", "no-such-call")  # nothing to guard
        assert outcomes.handler_started(conn, "r1", "c10") is None
    with store.begin() as conn:
        outcomes.clear_handler(conn, "r1", "c1")
    with store.begin() as conn:
        assert outcomes.handler_started(conn, "r1", "c1") is None
        assert outcomes.begin_handler(conn, "r1", "c1")  # the next round may begin

    _row(store, "r1", "tool:c10", 1, "waiting")  # another call's, its id longer
    _row(store, "r1", "tool:c1", 2, "done")
    _row(store, "r1", "tool:c1:2", 3, "started", holder="h", attempts=2)
    with store.begin() as conn:
        assert outcomes.waiting_step(conn, "r1", "c1") is None
        assert outcomes.park(conn, "r1", "tool:c1:2")
        assert not outcomes.park(conn, "r1", "tool:c1:2")  # in flight no more
        assert outcomes.waiting_step(conn, "r1", "c1").step == "tool:c1:2"
        assert outcomes.waiting_step(conn, "r1", "c10").step == "tool:c10"
        assert outcomes.settle(conn, "r1", "tool:c1:2", {"ok": True})
        assert not outcomes.settle(conn, "r1", "tool:c1:2", {"ok": False})  # first wins
        assert not outcomes.reschedule(conn, "r1", "tool:c1:2")
        assert outcomes.reschedule(conn, "r1", "tool:c10")
    rows = {r["step"]: r for r in store.journal("r1")}
    assert (rows["tool:c1:2"]["state"], rows["tool:c1:2"]["result"]) == ("done", {"ok": True})
    assert rows["tool:c1:2"]["holder"] is None
    assert (rows["tool:c10"]["state"], rows["tool:c10"]["attempts"]) == ("scheduled", 0)


def test_the_sweep_wakes_a_run_whose_reconciliation_came_without_its_wake_up(
    store: Store,
) -> None:
    old = utcnow() - timedelta(minutes=10)
    cutoff = utcnow() - timedelta(minutes=5)
    for run_id, step, state in (
        ("decided", "tool:c1", "done"),  # a person settled it; the wake-up was lost
        ("retried", "tool:c1", "scheduled"),  # sent to run again; the send was lost
        ("waiting", "tool:c1", "waiting"),  # still waits for a person: left alone
    ):
        add_run(store, run_id, runner="durable")
        _row(store, run_id, step, 1, state)
        if run_id == "waiting":  # an approval the turn asked for at once waits too
            _row(store, run_id, "approval:c2", 2, "waiting")
        with store.begin() as conn:
            conn.execute(
                update(runs_table)
                .where(runs_table.c.id == run_id)
                .values(status="awaiting_reconcile", updated_at=old)
            )
    with store.connect() as conn:
        assert set(runs.stale_run_ids(conn, cutoff=cutoff)) == {"decided", "retried"}


def test_the_inline_runner_runs_an_action_once_and_has_nothing_to_reconcile(
    tmp_path: Path,
) -> None:
    """A process that dies takes its inline runs with it: nothing is run again there, and
    no call ever waits for its outcome."""
    runs_of_pay: list[str] = []
    app = AgentApp(roles={"alice": ["lead"]})

    @app.tool(kind="action", approvers=["lead"])
    def refund(order_id: str, ctx: ToolContext) -> dict[str, str]:
        runs_of_pay.append(ctx.idempotency_key)
        raise RuntimeError("the bank hung up")

    script = [{"tool_calls": [{"name": "refund", "args": {"order_id": "A1"}}]}, {"text": "ok"}]
    app.agent("a", model=ScriptedModel(script), tools=["refund"])
    store = Store.from_url(f"sqlite:///{tmp_path / 'inline.db'}")
    runner = InlineRunner(app, store, settings=Settings(), poll_interval=0.05)
    run_id = runner.start("a", "go", actor="u")
    for frame in runner.frames(run_id):
        if frame["type"] == "approval_request":
            runner.signal(run_id, frame["call_id"], "approve", actor="alice")
    assert runner.wait(run_id, timeout=TIMEOUT).status == "completed"
    assert runs_of_pay == [f"{run_id}:tool:call_1"]  # a failure is the model's, not a retry
    journal_before = store.journal(run_id)
    client = Client(store, app, Settings())
    with pytest.raises(ReconcileRefusedError, match="has ended"):
        client.reconcile(run_id, "call_1", "retry", actor="alice")
    assert store.journal(run_id) == journal_before
    store.engine.dispose()


def test_the_terminal_shows_an_unknown_outcome_and_how_to_settle_it() -> None:
    from agent_jobs.cli.frames import _line

    frame = {
        "type": "outcome_unknown",
        "run_id": "r1",
        "call_id": "c1",
        "tool": "pay[/x]\u202e",
        "args": {"order_id": "A1"},
        "idempotency_key": "r1:tool:c1",
    }
    shown = _line(frame)
    assert shown is not None
    assert shown.plain == (
        "? pay[/x]\\u202e: its worker died while it ran; how it ended is unknown: "
        "agent-jobs reconcile r1 c1 (--succeeded JSON | --failed MESSAGE | --retry)"
    )
