"""The session runtime in both runners: the log, status, inbox, cancel, retry, selection."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text

from agent_jobs import AgentApp, ScriptedModel, session
from agent_jobs.runs import RunRequest, create_run, post_message, start_next_turn
from agent_jobs.session import Event, fold_consumed_work, fold_inbox
from agent_jobs.store import RunView, Store
from agent_jobs.store import events as event_rows
from agent_jobs.store import runs as run_rows
from tests.support import apps
from tests.support.apps import executed
from tests.support.builders import add_run, whole_request
from tests.support.harness import Harness
from tests.support.services import truncate_all, wait_for_a_lock
from tests.support.waiting import TIMEOUT, eventually


def journal(h: Harness, run_id: str) -> dict[str, dict[str, Any]]:
    return {row["step"]: row for row in h.store.journal(run_id)}


def request_texts(h: Harness, run_id: str, step: str) -> list[tuple[str, str]]:
    """(role, content) of the messages a model step was asked with."""
    request = whole_request(journal(h, run_id), step)
    return [(m["role"], m["content"]) for m in request["messages"]]


# --- the log and the status ---------------------------------------------------------------


def test_every_transition_is_an_event_in_order(harness: Harness) -> None:
    run = harness.run_approving("support", "Where is order 42?")
    assert run.status == "completed"
    assert harness.types(run.run_id) == [
        "turn/start",
        "agent/status",
        "step/start",
        "agent/request",
        "tool/call",
        "tool/call",
        "tool/result",
        "tool/result",
        "step/start",
        "agent/request",
        "tool/call",
        "tool/result",
        "step/start",
        "agent/request",
        "turn/end",
        "agent/status",
    ]
    log = harness.events(run.thread_id)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))  # per thread, no gaps
    statuses = [e.data["status"] for e in log if e.type == "agent/status"]
    assert statuses == ["running", "idle"]
    assert log[-2].data == {"reason": "completed"}
    assert harness.client.status(run.thread_id) == "idle"
    assert harness.client.when_idle(run.run_id, timeout=0)  # already idle: at once


def model_in_flight(harness: Harness, run_id: str) -> None:
    """Wait until the run's held model step has begun (it goes on once the gate opens)."""
    eventually(
        lambda: ("model", "model:1") in executed(run_id),
        what="the model step to begin",
        context=lambda: harness.store.get_run(run_id).status,
    )


def test_status_is_running_during_a_turn_and_wait_blocks_until_idle(harness: Harness) -> None:
    run_id = harness.start("heldtalk", "think")
    try:
        model_in_flight(harness, run_id)
        assert harness.client.status(run_id) == "running"
        assert not harness.client.when_idle(run_id, timeout=0.1)  # the model is held
    finally:
        apps.open_gate(run_id)
    assert harness.client.when_idle(run_id, timeout=TIMEOUT)
    assert harness.store.get_run(run_id).status == "completed"


# --- the inbox ----------------------------------------------------------------------------


def test_steering_reaches_the_very_next_model_call(harness: Harness) -> None:
    run_id = harness.start("steer", "check order 9")
    harness.wait_frame(run_id, "tool_call")  # the one-second tool is running now
    thread_id = harness.post(run_id, "also check the warranty")
    run = harness.wait(run_id)

    assert run.status == "completed" and run.output == "steered answer"
    assert journal(harness, run_id)["prepare:2"]["result"]["claimed"] == ["also check the warranty"]
    assert request_texts(harness, run_id, "model:2")[-1] == ("user", "also check the warranty")
    assert ("user", "also check the warranty") not in request_texts(harness, run_id, "model:1")
    spliced = [e for e in harness.events(thread_id) if e.type == "agent/inbox/spliced"]
    assert [(e.data["target"], e.data["outcome"], e.data["removed_count"]) for e in spliced] == [
        ("next-step", None, 0),
        ("next-step", "claimed", 1),
    ]
    messages = harness.store.thread_messages(thread_id)
    assert [m.content for m in messages if m.role == "user"] == [
        "check order 9",
        "also check the warranty",
    ]
    assert not fold_inbox(harness.events(thread_id)).has_pending


def test_a_next_turn_message_becomes_the_next_request(harness: Harness) -> None:
    first = harness.start("steer", "check order 9")
    harness.wait_frame(first, "tool_call")
    thread_id = harness.post(first, "and then order 7?", target="next-turn")
    assert harness.wait(first).status == "completed"
    runs = harness.store.list_runs(thread_id=thread_id)
    assert len(runs) == 2
    second = next(r for r in runs if r.run_id != first)
    assert second.input == "and then order 7?" and second.metadata == {"after_run": first}
    assert harness.wait(second.run_id).status == "completed"
    # The first turn never saw it; the second turn was started by it.
    assert all("order 7" not in text for _, text in request_texts(harness, first, "model:2"))

    # On an idle thread a next-turn message starts a turn at once.
    harness.post(thread_id, "one more: order 8", target="next-turn")

    def third_run() -> RunView | None:
        found = harness.store.list_runs(thread_id=thread_id)
        return found[0] if len(found) >= 3 else None

    third = eventually(third_run, what="a third run on the thread", every=0.05)
    assert third.input == "one more: order 8"
    assert harness.wait(third.run_id).status == "completed"


# --- cancellation ---------------------------------------------------------------------------


def test_cancel_discards_the_step_in_flight_and_clears_the_inbox(harness: Harness) -> None:
    run_id = harness.start("heldtalk", "think")
    try:
        model_in_flight(harness, run_id)
        harness.post(run_id, "queued for later", target="next-turn")
        assert harness.cancel(run_id) == [run_id]
    finally:
        apps.open_gate(run_id)  # the step in flight goes on, and ends late
    run = harness.wait(run_id)

    assert run.status == "cancelled" and run.error == "cancelled (user)"
    types = harness.types(run_id)
    assert "turn/stopping" in types
    end = [e for e in harness.events(run_id) if e.type == "turn/end"][-1]
    assert end.data == {"reason": "aborted", "cause": "user"}
    # The model step in flight finishes late (its journal row done, its usage charged):
    # its late result changes nothing.
    eventually(
        lambda: (
            journal(harness, run_id)["model:1"]["state"] == "done" and harness.store.usage(run_id)
        ),
        what="the model step in flight to finish",
        every=0.05,
        context=lambda: journal(harness, run_id),
    )
    assert [m.role for m in harness.store.thread_messages(run.thread_id)] == ["user"]
    # …but the provider was paid: the ledger and the quota account for its tokens.
    [spent] = harness.store.usage(run_id)
    assert (spent["step"], spent["kind"]) == ("model:1", "model")
    total = spent["input_tokens"] + spent["output_tokens"]
    assert harness.store.tokens_used("user-7", run.day) == total
    assert len(harness.store.list_runs(thread_id=run.thread_id)) == 1  # no next turn
    spliced = [e.data for e in harness.events(run_id) if e.type == "agent/inbox/spliced"]
    assert spliced[-1]["outcome"] == "canceled" and spliced[-1]["removed_count"] == 1
    assert harness.cancel(run_id) == []  # already over: nothing to do


def test_cancel_can_keep_the_inbox(harness: Harness) -> None:
    run_id = harness.start("heldtalk", "think")
    try:
        model_in_flight(harness, run_id)
        harness.post(run_id, "keep me", target="next-turn")
        harness.cancel(run_id, cause="superseded", keep_inbox=True)
    finally:
        apps.open_gate(run_id)
    run = harness.wait(run_id)
    assert run.status == "cancelled"
    end = [e for e in harness.events(run_id) if e.type == "turn/end"][-1]
    assert end.data == {"reason": "interrupted", "cause": "superseded"}
    assert fold_inbox(harness.events(run.thread_id)).next_turn == ["keep me"]


def test_a_deadline_cancels_the_run_with_cause_timeout(harness: Harness) -> None:
    # A one-second deadline against a read that runs until the test opens its gate.
    run_id = harness.start("timeboxed_gated", "go")
    tool = f"{run_id}:tool:call_1"
    try:
        eventually(lambda: ("until_opened:start", tool) in executed(run_id), what="the read")
        if harness.kind == "durable":  # woken at the deadline, not when the tool returns
            run = harness.wait(run_id)
            assert ("until_opened", tool) not in executed(run_id)  # the gate is still shut
        else:  # the inline run ends once the read returns after its deadline
            deadline = harness.store.get_run(run_id).deadline
            assert deadline is not None
            eventually(lambda: db_now(harness.store) > deadline, what="the deadline to pass")
    finally:
        apps.open_gate(run_id)
    run = harness.wait(run_id)
    assert run.status == "cancelled" and run.error == "cancelled (timeout)"
    end = [e for e in harness.events(run_id) if e.type == "turn/end"][-1]
    assert end.data == {"reason": "interrupted", "cause": "timeout"}
    # The read's late result is in (its step done) and no model step followed it.
    eventually(
        lambda: journal(harness, run_id).get("tool:call_1", {}).get("state") == "done",
        what="the read's late result",
        context=lambda: journal(harness, run_id),
    )
    assert executed(run_id).count(("model", "model:2")) == 0
    assert "model:2" not in journal(harness, run_id)


def db_now(store: Store) -> datetime:
    with store.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def test_cancelling_a_run_cancels_its_children(store: Store) -> None:
    with store.begin() as conn:
        request = RunRequest(agent="a", input="x", actor="u")
        create_run(conn, request, run_id="parent", runner="durable", status="running")
        create_run(
            conn,
            RunRequest(agent="a", input="y", actor="u", thread_id="child-thread"),
            run_id="child",
            runner="durable",
            status="running",
            parent_run_id="parent",
            root_run_id="parent",
            depth=1,
        )
        assert session.request_cancel(conn, "parent", "user") == ["parent", "child"]
    assert store.get_run("child").cancel_cause == "parent"
    assert store.get_run("parent").cancel_cause == "user"


# --- before each step ------------------------------------------------------------------------


def test_a_pre_step_listener_can_reject_a_step(harness: Harness) -> None:
    run = harness.wait(harness.start("gatekeeper", "go"))
    assert run.status == "failed" and run.error_type == "StepRejectedError"
    assert "step 2 is closed" in (run.error or "")
    end = [e for e in harness.events(run.run_id) if e.type == "turn/end"][-1]
    assert end.data["reason"] == "blocked"
    assert "model:2" not in journal(harness, run.run_id)


def test_a_pre_step_listener_can_carry_messages_in(harness: Harness) -> None:
    carried = harness.wait(harness.start("carrier", "hi"))
    assert carried.status == "completed"
    assert request_texts(harness, carried.run_id, "model:1") == [
        ("user", "hi"),
        ("user", "(policy: be brief)"),
    ]
    fresh = harness.wait(harness.start("series", "hi"))
    assert fresh.status == "completed"
    assert request_texts(harness, fresh.run_id, "model:2") == [("user", "start over from here")]


# --- when the provider fails -------------------------------------------------------------------


def test_a_rate_limit_retries_after_its_delay_then_succeeds(harness: Harness) -> None:
    run_id = harness.start("ratelimited", "go")
    frames = harness.frames(run_id)
    run = harness.wait(run_id)
    assert run.status == "completed" and run.output == "after the wait"
    attempts = [e for e in harness.events(run_id) if e.type == "agent/request"]
    assert [(e.data["attempt"], e.data["outcome"]) for e in attempts] == [(1, "error"), (2, "ok")]
    assert attempts[0].data["action"] == "retry" and attempts[0].data["delay"] >= 1.0
    assert attempts[0].data["kind"] == "rate_limit"
    assert (attempts[1].created_at - attempts[0].created_at).total_seconds() >= 0.95
    marker = [f for f in frames if f["type"] == "status" and f.get("status") == "retrying"]
    assert marker and marker[0]["attempt"] == 2 and marker[0]["step"] == "model:1"


def test_an_auth_error_ends_the_turn_at_once(harness: Harness) -> None:
    run = harness.wait(harness.start("unauthorized", "go"))
    assert run.status == "failed" and "auth is not retryable" in (run.error or "")
    attempts = [e.data for e in harness.events(run.run_id) if e.type == "agent/request"]
    assert [(a["attempt"], a["action"]) for a in attempts] == [(1, "abort")]
    end = [e for e in harness.events(run.run_id) if e.type == "turn/end"][-1]
    assert end.data["reason"] == "error"
    assert executed(run.run_id).count(("flaky", "model:1")) == 1


# --- the model for the next step -----------------------------------------------------------------


def test_a_model_switch_takes_effect_on_a_later_step(harness: Harness) -> None:
    run_id = harness.start("steer", "check order 9")
    harness.wait_frame(run_id, "tool_call")  # step 1's prompt is already assembled
    harness.select_model(run_id, model="m2")  # no effort: clears the inherited one
    assert harness.wait(run_id).status == "completed"
    first = journal(harness, run_id)["model:1"]["intent"]["request"]["settings"]
    second = journal(harness, run_id)["model:2"]["intent"]["request"]["settings"]
    assert (first["model"], first["reasoning_effort"]) == ("m1", "high")
    assert (second["model"], second["reasoning_effort"]) == ("m2", None)


# --- consumed work, folded ---------------------------------------------------------------------


def _event(seq: int, run: str | None, kind: str, **data: Any) -> Event:
    return Event(
        thread_id="t", seq=seq, run_id=run, type=kind, data=data, created_at=datetime.now(UTC)
    )


def test_fold_consumed_work() -> None:
    claim = session.splice("next-turn", 0, 1, [], "claimed")
    events = [
        _event(1, "a", "turn/start"),
        _event(2, "a", "step/start", step=1),
        _event(3, "a", "turn/end", reason="completed"),
        # b claimed input, never reached a step, and completed: it accounts for nothing.
        _event(4, "b", "agent/inbox/spliced", **claim),
        _event(5, "b", "turn/start"),
        _event(6, "b", "turn/end", reason="completed"),
    ]
    work = fold_consumed_work(events)
    assert work.end is not None and work.end.run_id == "a" and not work.dropped_unrun

    # c claimed input and was blocked before its first step: the input's ending too.
    events += [
        _event(7, "c", "agent/inbox/spliced", **claim),
        _event(8, "c", "turn/start"),
        _event(9, "c", "turn/end", reason="blocked"),
    ]
    assert fold_consumed_work(events).end.run_id == "c"  # type: ignore[union-attr]

    # Work queued and then cancelled away before a turn could take it.
    events += [
        _event(10, None, "agent/inbox/spliced", **session.splice("next-turn", -1, 0, ["x"], None)),
        _event(
            11, None, "agent/inbox/spliced", **session.splice("next-turn", 0, 1, [], "canceled")
        ),
    ]
    work = fold_consumed_work(events)
    assert work.end.run_id == "c" and work.dropped_unrun  # type: ignore[union-attr]
    assert fold_consumed_work([]) == session.ConsumedWork(end=None, dropped_unrun=False)


def test_a_switch_to_another_provider_uses_that_providers_adapter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent_jobs import AgentApp
    from agent_jobs.executor import _model_for
    from agent_jobs.messages import ModelSettings

    monkeypatch.setenv("AGENT_JOBS_OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("AGENT_JOBS_ANTHROPIC_API_KEY", "sk-ant-test")
    app = AgentApp()
    agent = app.agent("a", model="openai:gpt-4.1-mini")
    same = _model_for(agent, ModelSettings(provider="openai", model="gpt-4.1"))
    assert same is agent.model  # the same provider: its adapter sends the other model id
    other = _model_for(agent, ModelSettings(provider="anthropic", model="claude-haiku-4-5"))
    assert other.name == "anthropic:claude-haiku-4-5"
    assert _model_for(agent, ModelSettings()) is agent.model


def test_a_next_turn_message_posted_while_the_turn_ends_is_never_stranded(pg_url: str) -> None:
    """A turn's end and a `next-turn` post to its run race: the ending pass holds the
    thread's row (its events) while it looks for a queued message, and the post waits for
    that row. Whichever commits first, the message becomes a run. Before, the post looked
    at the run first (still running), only queued its message, and nothing ever took it."""
    store = Store.from_url(pg_url)
    truncate_all(store)
    app = AgentApp()
    app.agent("a", model=ScriptedModel([{"text": "ok"}]))
    add_run(store, "r1", runner="durable")
    started: list[str | None] = []
    backend: list[int] = []  # the post's session

    def post() -> None:
        with store.begin() as conn:
            backend.append(conn.connection.dbapi_connection.info.backend_pid)  # no statement
            _, next_run = post_message(
                conn, app, "r1", "and then?", target="next-turn", runner="durable"
            )
        started.append(next_run)

    try:
        with store.begin() as conn:  # the pass that ends the turn, as finish_turn does
            run_rows.finish_run(conn, "r1", "completed", output="ok")
            event_rows.append(conn, [("t1", "r1", "turn/end", {"reason": "completed"})])
            ended = RunView.from_row(run_rows.get_run(conn, "r1"))
            assert start_next_turn(conn, app, ended, runner="durable") is None
            poster = threading.Thread(target=post, daemon=True)
            poster.start()
            eventually(lambda: backend, what="the post's session")
            wait_for_a_lock(store, backend[0])  # the post now waits for the thread's row
        poster.join(TIMEOUT)
        assert not poster.is_alive()
        [next_run] = started
        assert next_run is not None, "the message was queued behind a turn that had ended"
        assert store.get_run(next_run).input == "and then?"
    finally:
        store.engine.dispose()
