"""Approval deadlines and escalation, and every approval of a turn asked for at once: on
both runners (real workers for the durable one), and the races of a timeout with a person
decided deterministically in two transactions."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from agent_jobs.approvals import deadlines
from agent_jobs.approvals.record import record_decision
from agent_jobs.checkpoints import Decision
from agent_jobs.errors import ConfigurationError, DecisionRefusedError
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.store.schema import tool_calls
from tests.support import apps
from tests.support.apps import executed
from tests.support.builders import add_run
from tests.support.harness import Harness
from tests.support.services import truncate_all, waiting_on_a_lock
from tests.support.waiting import TIMEOUT, eventually

# How often beat's sweep runs: a decision sooner than this after a deadline was not its.
SWEEP_INTERVAL = Settings().sweep_interval


def executions_at(run_id: str) -> list[tuple[str, datetime]]:
    """(what, when) of every execution the test apps counted for the run, in order."""
    with apps.side_engine().connect() as conn:
        rows = conn.execute(
            select(apps.executions.c.what, apps.executions.c.at)
            .where(apps.executions.c.run_id == run_id)
            .order_by(apps.executions.c.id)
        ).all()
    return [(r.what, r.at) for r in rows]


def db_now(store: Store) -> datetime:
    with store.connect() as conn:
        now: datetime = conn.execute(select(func.now())).scalar_one()
    return now


def decision_of(h: Harness, run_id: str, call_id: str) -> dict[str, Any]:
    [call] = [c for c in h.store.tool_calls(run_id) if c["call_id"] == call_id]
    return call


def request_frames(h: Harness, run_id: str, n: int) -> list[dict[str, Any]]:
    """The run's first `n` approval requests, read from its live stream as they come
    (the stream's own read blocks for at most TIMEOUT)."""
    found: list[dict[str, Any]] = []
    for frame in h.frames_live(run_id):
        if frame["type"] == "approval_request":
            found.append(frame)
            if len(found) == n:
                return found
    raise AssertionError(f"the stream of {run_id} ended after {len(found)} approval requests")


def test_an_undecided_call_is_rejected_at_its_deadline(harness: Harness) -> None:
    run_id = harness.start("lapsing", "refund 42")
    asked = harness.wait_frame(run_id, "approval_request")
    deadline = datetime.fromisoformat(asked["deadline"])
    run = harness.wait(run_id)
    assert run.status == "completed" and run.output == "refund_or_lapse done"
    call = decision_of(harness, run_id, asked["call_id"])
    assert (call["decision"], call["decided_by"], call["decision_reason"]) == (
        "reject",
        deadlines.TIMEOUT_ACTOR,
        deadlines.TIMEOUT_REASON,
    )
    # Decided at its deadline (a delayed wake-up, or the inline runner's own look), not
    # before it, and not by a sweep: none runs beside these workers, and one would come
    # a sweep interval later.
    assert timedelta(0) <= call["decided_at"] - deadline < timedelta(seconds=SWEEP_INTERVAL)
    assert [w for w, _ in executed(run_id)] == ["model", "model"]  # the refund never ran
    journal = {row["step"]: row for row in harness.store.journal(run_id)}
    assert journal[f"approval:{asked['call_id']}"]["result"]["actor"] == deadlines.TIMEOUT_ACTOR
    assert journal[f"persist:toolexec:{asked['call_id']}"]["intent"]["status"] == "rejected"


def test_on_timeout_approve_runs_the_call(harness: Harness) -> None:
    run_id = harness.start("lenient", "refund 42")
    run = harness.wait(run_id)
    assert run.status == "completed"
    assert [w for w, _ in executed(run_id)] == ["model", "refund_unless_stopped", "model"]
    [call] = harness.store.tool_calls(run_id)
    assert (call["decision"], call["decided_by"]) == ("approve", deadlines.TIMEOUT_ACTOR)


def test_a_person_who_decides_in_time_beats_the_deadline(harness: Harness) -> None:
    run_id = harness.start("lapsing", "refund 42")
    asked = harness.wait_frame(run_id, "approval_request")
    assert harness.decide(run_id, asked["call_id"], "approve", "alice")
    run = harness.wait(run_id)
    assert run.status == "completed"
    # Past its deadline nothing changes: a run asked later lapses at its own deadline,
    # by the same means, after this one's came and went.
    later = harness.start("lapsing", "refund 42")
    assert harness.wait(later).status == "completed"
    [lapsed] = harness.store.tool_calls(later)
    assert (lapsed["decision"], lapsed["decided_by"]) == ("reject", deadlines.TIMEOUT_ACTOR)
    call = decision_of(harness, run_id, asked["call_id"])
    assert call["approval_deadline"] < lapsed["decided_at"]
    assert (call["decision"], call["decided_by"]) == ("approve", "alice")
    assert [w for w, _ in executed(run_id)] == ["model", "refund_or_lapse", "model"]


def test_escalation_hands_the_call_to_its_roles_and_a_second_timeout_rejects(
    harness: Harness,
) -> None:
    run_id = harness.start("escalating", "refund 42")
    first = harness.wait_frame(run_id, "approval_request")
    assert "escalated" not in first
    # At the deadline: a new request marked escalated, for the managers only.
    escalated = request_frames(harness, run_id, 2)[1]
    assert escalated["escalated"] is True and escalated["approvers"] == ["manager"]
    assert escalated["args_sha256"] == first["args_sha256"]
    assert datetime.fromisoformat(escalated["deadline"]) > datetime.fromisoformat(first["deadline"])
    assert decision_of(harness, run_id, first["call_id"])["escalated"]
    # The second deadline passes: rejected, though the tool's timeout would have escalated.
    run = harness.wait(run_id)
    assert run.status == "completed"
    call = decision_of(harness, run_id, first["call_id"])
    assert (call["decision"], call["decided_by"]) == ("reject", deadlines.TIMEOUT_ACTOR)
    assert [w for w, _ in executed(run_id)] == ["model", "model"]


def test_only_the_roles_it_was_escalated_to_may_decide_an_escalated_call(
    harness: Harness,
) -> None:
    run_id = harness.start("escalating", "refund 42")
    first = harness.wait_frame(run_id, "approval_request")
    eventually(
        lambda: decision_of(harness, run_id, first["call_id"])["escalated"],
        what="the call to be escalated",
    )
    with pytest.raises(DecisionRefusedError, match="manager"):
        harness.decide(run_id, first["call_id"], "approve", "alice")  # a lead: no longer
    assert harness.decide(run_id, first["call_id"], "approve", "mia")  # a manager
    run = harness.wait(run_id)
    assert run.status == "completed"
    assert [w for w, _ in executed(run_id)] == ["model", "refund_escalated", "model"]


def test_every_approval_of_a_turn_is_asked_at_once_and_decided_in_any_order(
    harness: Harness,
) -> None:
    run_id = harness.start("two_refunds", "refund both")
    first, second = request_frames(harness, run_id, 2)
    assert [first["args"]["order_id"], second["args"]["order_id"]] == ["42", "7"]
    # Before any decision both are pending, and nothing ran yet (not even the read after
    # the first refund).
    pending = {c["call_id"] for c in harness.store.pending_calls(run_id)}
    assert pending == {first["call_id"], second["call_id"]}
    assert [w for w, _ in executed(run_id)] == ["model"]
    # The second first: still nothing runs, the run waits on the first.
    assert harness.decide(run_id, second["call_id"], "approve", "alice")
    assert [w for w, _ in executed(run_id)] == ["model"]
    assert harness.store.get_run(run_id).status == "awaiting_approval"
    # The first, rejected: the model is told; the read and the second refund run, in order.
    assert harness.decide(run_id, first["call_id"], "reject", "alice")
    run = harness.wait(run_id)
    assert run.status == "completed"
    assert [w for w, _ in executed(run_id)] == ["model", "lookup", "refund", "model"]
    # And none of them ran before the first decision: the second alone moved nothing.
    first_decided = decision_of(harness, run_id, first["call_id"])["decided_at"]
    assert all(at >= first_decided for _, at in executions_at(run_id)[1:])
    [refunded] = [k for w, k in executed(run_id) if w == "refund"]
    assert refunded.endswith(second["call_id"])


def test_a_deadline_needs_an_action_and_escalation_its_roles() -> None:
    from agent_jobs import AgentApp

    app = AgentApp()

    def tool(**options: Any) -> None:
        app.tool(
            kind=options.pop("kind", "action"), name=f"t{len(app.registry.names())}", **options
        )(lambda order_id: None)

    with pytest.raises(ConfigurationError, match="only an action"):
        tool(kind="read", approval_timeout=5)
    with pytest.raises(ConfigurationError, match="escalate_to"):
        tool(approval_timeout=5, on_timeout="escalate")
    with pytest.raises(ConfigurationError, match="escalate_to"):
        tool(approval_timeout=5, escalate_to=["manager"])
    with pytest.raises(ConfigurationError, match="need an approval_timeout"):
        tool(on_timeout="approve")
    with pytest.raises(ConfigurationError, match="> 0"):
        tool(approval_timeout=0)
    with pytest.raises(ConfigurationError, match="on_timeout must be"):
        tool(approval_timeout=5, on_timeout="ignore")
    tool(approval_timeout=5, on_timeout="escalate", escalate_to=["manager"])


# --- the races, in two transactions (Postgres) --------------------------------------------


@pytest.fixture
def parked(pg_url: str) -> Any:
    """A run parked on a call of `refund_or_lapse` whose deadline has just passed."""
    store = Store.from_url(pg_url)
    truncate_all(store)
    add_run(store, "r1", runner="durable")
    now = datetime.now().astimezone()
    with store.begin() as conn:
        from agent_jobs.store import toolcalls

        toolcalls.insert_call(
            conn,
            run_id="r1",
            call_id="c1",
            thread_id="t1",
            name="refund_or_lapse",
            kind="action",
            args={"order_id": "42", "amount": 2},
            status="pending_approval",
        )
    with store.begin() as conn:
        conn.execute(
            update(tool_calls)
            .where(tool_calls.c.call_id == "c1")
            .values(requested_at=now - timedelta(seconds=5), approval_deadline=now)
        )
    yield store
    store.engine.dispose()


def _race(store: Store, first: Any, second: Any) -> Any:
    """`first(conn)` holds the run's lock while `second(conn)`, in another transaction,
    waits for it; returns what `second` returned."""
    outcome: list[Any] = []

    def other() -> None:
        with store.begin() as conn:
            outcome.append(second(conn))

    with store.begin() as conn:
        first(conn)
        waiting = threading.Thread(target=other, daemon=True)
        waiting.start()
        eventually(lambda: waiting_on_a_lock(store), what="the second to wait for the lock")
        assert waiting.is_alive(), "the second did not wait for the run's lock"
    waiting.join(TIMEOUT)
    return outcome[0]


def test_a_person_whose_decision_lands_first_beats_the_timeout(parked: Store) -> None:
    approve = Decision(decision="approve", actor="alice")

    def person(conn: Any) -> None:
        assert record_decision(conn, apps.app, "r1", "c1", approve) == "recorded"

    timed_out = _race(parked, person, lambda conn: deadlines.expire_run(conn, apps.app, "r1"))
    assert timed_out == []
    [call] = parked.tool_calls("r1")
    assert (call["decision"], call["decided_by"]) == ("approve", "alice")


def test_a_timeout_that_lands_first_beats_the_person(parked: Store) -> None:
    approve = Decision(decision="approve", actor="alice")

    def timeout(conn: Any) -> None:
        [found] = deadlines.expire_run(conn, apps.app, "r1")
        assert found.how == "decided" and found.decision is not None
        assert found.decision.decision == "reject"

    later = _race(
        parked, timeout, lambda conn: record_decision(conn, apps.app, "r1", "c1", approve)
    )
    assert later == "already_decided"
    [call] = parked.tool_calls("r1")
    assert (call["decision"], call["decided_by"]) == ("reject", deadlines.TIMEOUT_ACTOR)


def test_a_deadline_outlives_the_workers_and_a_broker_that_lost_everything(cluster: Any) -> None:
    """The deadline is in Postgres: with every worker killed and the broker flushed (the
    delayed wake-up gone with it), the sweep of a new worker and beat still decides it."""
    import redis

    worker = cluster.worker()
    run_id = cluster.client.enqueue_run("lapsing", "refund 42", actor="user-7")
    cluster.wait_step(run_id, "approval:call_1", "waiting")
    worker.kill()
    client = redis.Redis.from_url(cluster.broker)
    try:
        client.flushall()
    finally:
        client.close()
    # Past the deadline by Postgres's clock (the one the sweep judges by), with nothing
    # running.
    [call] = cluster.store.tool_calls(run_id)
    eventually(lambda: db_now(cluster.store) > call["approval_deadline"], what="the deadline")
    assert cluster.store.get_run(run_id).status == "awaiting_approval"
    cluster.worker()
    cluster.beat()
    run = cluster.wait(run_id)
    assert run.status == "completed"
    [call] = cluster.store.tool_calls(run_id)
    assert (call["decision"], call["decided_by"]) == ("reject", deadlines.TIMEOUT_ACTOR)
    assert [w for w, _ in executed(run_id)] == ["model", "model"]
