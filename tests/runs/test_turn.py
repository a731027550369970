"""The agent turn, step by step, on the inline runner (both databases)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent_jobs import AgentApp, InlineRunner, ScriptedModel, Store, startup
from agent_jobs.errors import DecisionRefusedError, UnknownAgentError, UnknownCallError
from agent_jobs.observability import diagnostics
from agent_jobs.settings import Settings
from agent_jobs.streams.base import Frame
from tests.support.builders import RecordingModel, support_app
from tests.support.waiting import TIMEOUT, eventually, wait_status


def make_runner(app: AgentApp, store: Store, **settings: Any) -> InlineRunner:
    return InlineRunner(app, store, settings=Settings(**settings), poll_interval=0.05)


def frames_until_end(runner: InlineRunner, run_id: str) -> list[Frame]:
    return list(runner.frames(run_id))


def approve_when_asked(
    runner: InlineRunner, run_id: str, decision: str = "approve", actor: str = "alice"
) -> threading.Thread:
    def follow() -> None:
        for frame in runner.frames(run_id):
            if frame["type"] == "approval_request":
                runner.signal(run_id, frame["call_id"], decision, actor=actor, reason="no")  # type: ignore[arg-type]

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


# 1. Quota ---------------------------------------------------------------------------------


def test_quota_exceeded_makes_no_model_call(store: Store) -> None:
    model = RecordingModel([{"text": "a fairly long answer that costs some tokens to produce"}])
    app = support_app(model, quota=20)
    runner = make_runner(app, store)
    first = runner.run(
        "support", "hello there, please answer at length", actor="user-7", timeout=TIMEOUT
    )
    assert first.status == "completed"
    assert store.tokens_used("user-7", first.day) >= 20
    calls_before = len(model.requests)

    second = runner.run("support", "again", actor="user-7", timeout=TIMEOUT)

    assert second.status == "failed"
    assert second.error_type == "QuotaExceededError"
    assert "user-7" in (second.error or "")
    assert len(model.requests) == calls_before  # no model call was made
    assert [j["step"] for j in store.journal(second.run_id)] == ["quota:check"]
    # Another actor still has budget.
    assert runner.run("support", "hi", actor="bob", timeout=TIMEOUT).status == "completed"


# 2. Persist and load ----------------------------------------------------------------------


def test_user_message_is_stamped_and_history_reaches_the_model(store: Store) -> None:
    model = RecordingModel([{"text": "an answer"}])  # each run starts the script afresh
    runner = make_runner(support_app(model), store)
    first = runner.run("support", "first question", actor="user-7", timeout=TIMEOUT)
    second = runner.run(
        "support", "second question", actor="user-7", thread_id=first.thread_id, timeout=TIMEOUT
    )
    assert second.status == "completed"

    rows = store.thread_messages(first.thread_id)
    assert [(m.role, m.content) for m in rows] == [
        ("user", "first question"),
        ("assistant", "an answer"),
        ("user", "second question"),
        ("assistant", "an answer"),
    ]
    from sqlalchemy import select

    from agent_jobs.store.schema import messages

    with store.connect() as conn:
        stamps = conn.execute(
            select(messages.c.role, messages.c.run_id)
            .where(messages.c.thread_id == first.thread_id)
            .order_by(messages.c.id)
        ).all()
    assert [s.run_id for s in stamps] == [first.run_id, first.run_id, second.run_id, second.run_id]
    # The second turn's model call saw the whole conversation as neutral messages.
    last = model.requests[-1]
    assert [(m.role, m.content) for m in last.messages] == [
        ("user", "first question"),
        ("assistant", "an answer"),
        ("user", "second question"),
    ]


# 3. Prompt and offered tools ----------------------------------------------------------------


def test_persona_wraps_prompt_and_roles_decide_offered_tools(store: Store) -> None:
    model = RecordingModel([{"text": "ok"}])
    app = support_app(model)
    app.persona("pirate", "Talk like a pirate.\n{system}\nArr.", tools=["lookup_order", "refund"])
    runner = make_runner(app, store)

    runner.run("support", "hi", actor="user-7", timeout=TIMEOUT)
    assert model.requests[-1].system == "You are support."
    assert [t.name for t in model.requests[-1].tools] == ["lookup_order", "slow_read", "refund"]
    assert model.requests[-1].tools[0].input_schema["required"] == ["order_id"]

    runner.run("support", "hi", actor="user-7", persona="pirate", timeout=TIMEOUT)
    assert model.requests[-1].system == "Talk like a pirate.\nYou are support.\nArr."
    assert [t.name for t in model.requests[-1].tools] == ["lookup_order", "refund"]

    runner.run("support", "hi", actor="eve", timeout=TIMEOUT)  # eve has no support role
    assert [t.name for t in model.requests[-1].tools] == ["lookup_order", "slow_read"]


# 4. and 5. Model turn, streaming, usage ----------------------------------------------------


def test_model_streams_deltas_and_usage_is_recorded(store: Store) -> None:
    model = ScriptedModel([{"text": "one two three four"}])
    runner = make_runner(support_app(model), store)
    run_id = runner.start("support", "count", actor="user-7")
    frames = frames_until_end(runner, run_id)
    view = runner.wait(run_id)

    deltas = [f["text"] for f in frames if f["type"] == "text_delta"]
    assert deltas == ["one ", "two ", "three ", "four"]
    assert frames[-1] == {"type": "done", "run_id": run_id, "output": "one two three four"}
    usage = store.usage(run_id)
    assert len(usage) == 1
    assert usage[0]["step"] == "model:1" and usage[0]["kind"] == "model"
    assert usage[0]["output_tokens"] == len("one two three four") // 4
    total = usage[0]["input_tokens"] + usage[0]["output_tokens"]
    assert store.tokens_used("user-7", view.day) == total
    assert store.totals(run_id)["model_calls"] == 1


# 6. Tools by kind --------------------------------------------------------------------------


def test_read_runs_at_once_and_action_waits_for_approval(store: Store) -> None:
    model = RecordingModel(
        [
            {"tool_calls": [{"name": "lookup_order", "args": {"order_id": "42"}}]},
            {"tool_calls": [{"name": "refund", "args": {"order_id": "42", "amount": 5}}]},
            {"text": "refunded"},
        ]
    )
    app = support_app(model)
    runner = make_runner(app, store)
    run_id = runner.start("support", "refund 42", actor="user-7")
    seen: list[Frame] = []
    for frame in runner.frames(run_id):
        seen.append(frame)
        if frame["type"] == "approval_request":
            assert store.get_run(run_id).status == "awaiting_approval"
            assert store.get_run(run_id).waiting_on == "awaiting_approval refund call_2"
            assert app.calls == [("lookup_order", "42")]  # the action has not run
            assert runner.signal(run_id, frame["call_id"], "approve", actor="alice")
    view = runner.wait(run_id, TIMEOUT)

    assert view.status == "completed" and view.output == "refunded"
    records = {c["call_id"]: c for c in store.tool_calls(run_id)}
    assert records["call_1"]["status"] == "executed" and records["call_1"]["kind"] == "read"
    assert records["call_2"]["decision"] == "approve" and records["call_2"]["decided_by"] == "alice"
    assert app.calls == [("lookup_order", "42"), ("refund", "42", 5.0)]
    verdicts = {j["step"]: j["result"] for j in store.journal(run_id)}
    assert verdicts["persist:toolcall:call_1"]["status"] == "auto_executed"
    assert verdicts["persist:toolcall:call_2"]["status"] == "pending_approval"
    assert [f["type"] for f in seen].count("approval_request") == 1


def test_rejection_is_recorded_and_reaches_the_model(store: Store) -> None:
    model = RecordingModel(
        [
            {"tool_calls": [{"name": "refund", "args": {"order_id": "9", "amount": 1}}]},
            {"text": "ok, not refunded"},
        ]
    )
    app = support_app(model)
    runner = make_runner(app, store)
    run_id = runner.start("support", "refund 9", actor="user-7")
    approve_when_asked(runner, run_id, "reject")
    view = runner.wait(run_id, TIMEOUT)

    assert view.status == "completed"
    assert app.calls == []  # the refund never ran
    record = store.tool_calls(run_id)[0]
    assert record["status"] == "rejected" and record["decided_by"] == "alice"
    tool_message = model.requests[-1].messages[-1]
    assert tool_message.role == "tool" and tool_message.tool_call_id == "call_1"
    assert tool_message.is_error and '"rejected":true' in tool_message.content


def test_actor_without_the_role_cannot_run_the_tool_even_when_asked(store: Store) -> None:
    model = RecordingModel(
        [
            {"tool_calls": [{"name": "refund", "args": {"order_id": "1", "amount": 2}}]},
            {"text": "could not"},
        ]
    )
    app = support_app(model)
    runner = make_runner(app, store)
    view = runner.run("support", "refund", actor="eve", timeout=TIMEOUT)  # eve lacks "support"

    assert view.status == "completed"
    assert app.calls == []
    record = store.tool_calls(view.run_id)[0]
    assert record["status"] == "failed" and "lacks a role" in record["error"]
    fed_back = model.requests[-1].messages[-1]
    assert fed_back.is_error and "lacks a role" in fed_back.content
    assert store.pending_calls(view.run_id) == []


def test_role_is_rechecked_at_invocation(store: Store) -> None:
    """Roles can change between the offer and the invocation; the invocation re-checks."""
    roles: dict[str, list[str]] = {"user-7": ["support"], "alice": ["lead"]}
    model = RecordingModel(
        [
            {"tool_calls": [{"name": "refund", "args": {"order_id": "1", "amount": 2}}]},
            {"text": "x"},
        ]
    )
    app = support_app(model)
    app.roles._roles = lambda actor: roles.get(actor, [])  # type: ignore[assignment]
    runner = make_runner(app, store)
    run_id = runner.start("support", "refund", actor="user-7")
    for frame in runner.frames(run_id):
        if frame["type"] == "approval_request":
            roles["user-7"] = []  # revoked while the call waited for approval
            runner.signal(run_id, frame["call_id"], "approve", actor="alice")
    view = runner.wait(run_id, TIMEOUT)
    assert view.status == "completed"
    assert app.calls == []
    record = store.tool_calls(run_id)[0]
    assert record["status"] == "failed" and "lacks a role" in record["error"]


def test_bad_arguments_and_unknown_tools_come_back_as_tool_errors(store: Store) -> None:
    model = RecordingModel(
        [
            {
                "tool_calls": [
                    {"name": "lookup_order", "args": {"order": 42}},
                    {"name": "drop_database", "args": {}},
                ]
            },
            {"text": "sorry"},
        ]
    )
    app = support_app(model)
    view = make_runner(app, store).run("support", "x", actor="user-7", timeout=TIMEOUT)

    assert view.status == "completed" and view.output == "sorry"
    assert app.calls == []
    results = [m for m in model.requests[-1].messages if m.role == "tool"]
    assert [m.tool_call_id for m in results] == ["call_1", "call_2"]
    assert "order_id" in results[0].content and "Field required" in results[0].content
    assert "no tool named 'drop_database'" in results[1].content
    assert all(m.is_error for m in results)


def test_a_failing_handler_is_a_tool_error_not_a_crash(store: Store) -> None:
    app = AgentApp()

    @app.tool
    def explode(reason: str) -> str:
        raise RuntimeError(reason)

    model = RecordingModel(
        [{"tool_calls": [{"name": "explode", "args": {"reason": "boom"}}]}, {"text": "recovered"}]
    )
    app.agent("a", model=model, tools=["explode"])
    view = make_runner(app, store).run("a", "go", timeout=TIMEOUT)
    assert view.status == "completed" and view.output == "recovered"
    assert model.requests[-1].messages[-1].content == '{"error":"RuntimeError: boom"}'


def test_handler_gets_context_with_idempotency_key(store: Store) -> None:
    app = AgentApp()
    seen: list[Any] = []

    @app.tool
    def remember(note: str, ctx: Any) -> str:
        seen.append(ctx)
        return note

    app.agent(
        "a",
        model=ScriptedModel(
            [{"tool_calls": [{"name": "remember", "args": {"note": "n"}}]}, {"text": "k"}]
        ),
        tools=["remember"],
    )
    schema = app.registry.get("remember").spec().input_schema
    assert "ctx" not in schema["properties"]
    view = make_runner(app, store).run("a", "go", actor="zed", timeout=TIMEOUT)
    assert seen[0].idempotency_key == f"{view.run_id}:tool:call_1"
    assert (seen[0].run_id, seen[0].step, seen[0].actor) == (view.run_id, "tool:call_1", "zed")


# 7. Reads overlap -------------------------------------------------------------------------


def test_two_reads_overlap_and_results_stay_in_call_order(store: Store) -> None:
    model = RecordingModel(
        [
            {
                "tool_calls": [
                    {"name": "paired_read", "args": {"n": 1}},
                    {"name": "paired_read", "args": {"n": 2}},
                ]
            },
            {"text": "done"},
        ]
    )
    app = AgentApp(roles={"user-7": ["support"]})
    both = threading.Barrier(2, timeout=TIMEOUT)

    @app.tool(kind="read")
    def paired_read(n: int) -> int:
        """A read that returns only once the other has started: one after the other, the
        first would wait for good (and fail with BrokenBarrierError)."""
        both.wait()
        return n * 10

    app.agent("support", model=model, tools=["paired_read"])
    runner = make_runner(app, store)
    run = runner.run("support", "x", actor="user-7", timeout=TIMEOUT)
    assert run.status == "completed", run.error
    results = [m for m in model.requests[-1].messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in results] == [("call_1", "10"), ("call_2", "20")]
    steps = [j["step"] for j in store.journal(run.run_id)]
    assert steps.index("persist:toolexec:call_1") < steps.index("persist:toolexec:call_2")
    assert steps.index("persist:toolcall:call_2") < steps.index("tool:call_1")


# 8. Loop, finish, title, max_steps ---------------------------------------------------------


def test_title_is_set_on_the_first_turn_only(store: Store) -> None:
    model = ScriptedModel([{"text": "hi"}])
    runner = make_runner(support_app(model), store)
    first = runner.run(
        "support", "Where is my parcel?\nIt is late.", actor="user-7", timeout=TIMEOUT
    )
    assert store.thread_title(first.thread_id) == "Where is my parcel?"
    second = runner.run(
        "support", "Another one", thread_id=first.thread_id, actor="user-7", timeout=TIMEOUT
    )
    assert store.thread_title(first.thread_id) == "Where is my parcel?"
    assert "persist:title" not in [j["step"] for j in store.journal(second.run_id)]


def test_max_steps_ends_with_a_clear_outcome(store: Store) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "lookup_order", "args": {"order_id": "1"}}]}])
    runner = make_runner(support_app(model, max_steps=3), store)
    run_id = runner.start("support", "loop forever", actor="user-7")
    frames = frames_until_end(runner, run_id)
    view = runner.wait(run_id)
    assert view.status == "failed"
    assert view.error_type == "MaxStepsExceededError"
    assert "3 passes" in (view.error or "")
    assert frames[-1]["type"] == "error" and "max_steps" in frames[-1]["error"]
    assert store.totals(run_id)["model_calls"] == 3


# 9. Diagnostics ----------------------------------------------------------------------------


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = diagnostics.subscribe(lambda name, payload: seen.append((name, payload)))
    yield seen
    unsubscribe()
    diagnostics.set_enabled(True)


def test_lifecycle_diagnostics_are_published(store: Store, events: list[Any]) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "lookup_order", "args": {"order_id": "1"}}]},
            {"tool_calls": [{"name": "refund", "args": {"order_id": "1", "amount": 1}}]},
            {"tool_calls": [{"name": "lookup_order", "args": {}}]},
            {"text": "bye"},
        ]
    )
    runner = make_runner(support_app(model), store)
    run_id = runner.start("support", "x", actor="user-7")
    approve_when_asked(runner, run_id, "reject")
    assert runner.wait(run_id, TIMEOUT).status == "completed"
    names = [name for name, payload in events if payload.get("run_id") == run_id]
    assert names == [
        "run.started",
        "assistant.message",
        "tool.executed",
        "assistant.message",
        "tool.rejected",
        "assistant.message",
        "tool.failed",
        "assistant.message",
        "run.finished",
    ]


def test_diagnostics_cost_nothing_without_listeners_and_can_be_turned_off(store: Store) -> None:
    built: list[str] = []

    def payload() -> dict[str, Any]:
        built.append("x")
        return {}

    diagnostics.publish("probe", payload)
    assert built == []  # nobody listens: the payload is never built

    seen: list[str] = []
    unsubscribe = diagnostics.subscribe(lambda name, _: seen.append(name))
    try:
        runner = make_runner(support_app(ScriptedModel([{"text": "x"}])), store, diagnostics=False)
        startup.start(store, runner.settings)  # the process's switch, as every entry sets it
        runner.run("support", "x", actor="user-7", timeout=TIMEOUT)
        diagnostics.publish("probe", payload)
        assert seen == [] and built == []
    finally:
        unsubscribe()
        diagnostics.set_enabled(True)


# The inline runner ------------------------------------------------------------------------


def test_the_inline_runner_keeps_nothing_of_the_runs_it_drove(store: Store) -> None:
    """A long-lived process (a server without a broker) drives run after run: once a turn
    has ended, no event or flag of it is kept, whether it completed or was cancelled."""
    refund = {"tool_calls": [{"name": "refund", "args": {"order_id": "1", "amount": 1}}]}
    runner = make_runner(support_app(ScriptedModel([refund, {"text": "k"}])), store)
    parked = runner.start("support", "a", actor="user-7")
    wait_status(store, parked, "awaiting_approval")
    assert runner.cancel(parked) == [parked]  # a stop event is made for it
    done = runner.start("support", "b", actor="user-7")
    wait_status(store, done, "awaiting_approval")
    [call] = store.pending_calls(done)
    assert runner.signal(done, call["call_id"], "approve", actor="alice")
    assert runner.wait(done, timeout=TIMEOUT).status == "completed"
    assert runner.wait(parked, timeout=TIMEOUT).status == "cancelled"
    ended = {parked, done}

    def nothing_kept() -> bool | None:
        return not (runner.turns.driving() | runner.signals.held()) & ended or None

    eventually(nothing_kept, what="the ended runs' events and flags to be let go of")


def test_start_returns_at_once_and_approvals_are_keyed_by_run(store: Store) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "refund", "args": {"order_id": "1", "amount": 1}}]},
            {"text": "k"},
        ]
    )
    app = support_app(model)
    # Each run's first model call waits until the test opens the gate: start returns
    # while it waits (a start that waited for the run would never return).
    gate = threading.Event()
    model.run_turn = gated(model.run_turn, gate)  # type: ignore[method-assign]
    runner = make_runner(app, store)
    a = runner.start("support", "a", actor="user-7")
    b = runner.start("support", "b", actor="user-7")
    assert {store.get_run(a).status, store.get_run(b).status} <= {"queued", "running"}
    gate.set()
    for run_id in (a, b):
        wait_status(store, run_id, "awaiting_approval")
    # Both runs wait on a call with the same id; approving one must not release the other.
    assert runner.signal(a, "call_1", "approve", actor="alice")
    assert runner.wait(a, TIMEOUT).status == "completed"
    assert store.get_run(b).status == "awaiting_approval"
    assert app.calls == [("refund", "1", 1.0)]
    assert not runner.signal(a, "call_1", "reject", actor="alice")  # first decision won
    with pytest.raises(UnknownCallError):
        runner.signal(b, "call_9", "approve", actor="alice")
    with pytest.raises(DecisionRefusedError):
        runner.signal(b, "call_1", "approve", actor="bob")  # bob is not a lead
    with pytest.raises(DecisionRefusedError):
        runner.signal(b, "call_1", "approve", actor="alice", args_sha256="0" * 64)
    assert store.get_run(b).status == "awaiting_approval"
    assert runner.signal(b, "call_1", "reject", actor="alice")
    assert runner.wait(b, TIMEOUT).status == "completed"
    # b ran to its end on its own decision: a's approval never ran b's refund.
    assert app.calls == [("refund", "1", 1.0)]


def gated(run_turn: Any, gate: threading.Event) -> Any:
    """`run_turn`, each call held until `gate` is set."""

    def held(request: Any, sink: Any) -> Any:
        assert gate.wait(TIMEOUT), "the test never opened the gate"
        return run_turn(request, sink)

    return held


def test_a_failed_run_puts_the_error_on_its_stream_and_closes_it(store: Store) -> None:
    class Broken:
        name = "broken"

        def run_turn(self, request: Any, sink: Any) -> Any:
            sink.text("partial ")
            raise ValueError("the provider sent garbage")

    app = AgentApp()
    app.agent("a", model=Broken())
    runner = make_runner(app, store)
    run_id = runner.start("a", "x")
    frames = frames_until_end(runner, run_id)  # returns: the stream was closed
    assert [f["type"] for f in frames] == ["status", "text_delta", "error"]
    assert frames[-1]["error"] == "the provider sent garbage"
    view = runner.wait(run_id)
    assert view.status == "failed" and view.error_type == "ValueError"


def test_unknown_agent_is_refused_before_anything_is_stored(store: Store) -> None:
    runner = make_runner(support_app(ScriptedModel([{"text": "x"}])), store)
    with pytest.raises(UnknownAgentError, match="defines: support"):
        runner.start("nobody", "x")
    assert store.list_runs() == []


def test_the_same_run_id_twice_starts_one_run(store: Store) -> None:
    model = RecordingModel([{"text": "once"}])
    runner = make_runner(support_app(model), store)
    assert runner.start("support", "x", run_id="order-42-refund") == "order-42-refund"
    assert runner.start("support", "x", run_id="order-42-refund") == "order-42-refund"
    assert runner.wait("order-42-refund", TIMEOUT).status == "completed"
    assert len(model.requests) == 1
    assert len(store.list_runs()) == 1


def test_a_malformed_model_reply_fails_the_run_clearly(store: Store) -> None:
    class Garbled:
        name = "garbled"

        def run_turn(self, request: Any, sink: Any) -> Any:
            return {"text": 42, "tool_calls": "not a list"}

    app = AgentApp()
    app.agent("a", model=Garbled())
    runner = make_runner(app, store)
    view = runner.run("a", "x", timeout=TIMEOUT)
    assert view.status == "failed" and view.error_type == "ModelError"
    assert "returned a malformed reply" in (view.error or "")
    assert [m.role for m in store.thread_messages(view.thread_id)] == ["user"]
