"""Tools from MCP servers on the inline runner (the embedded default, SQLite): real MCP
servers written with the SDK, over stdio (a subprocess the pool starts) and streamable
HTTP (served by this process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent_jobs import InlineRunner
from agent_jobs.errors import NotAnApproverError
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from tests.mcp.conftest import ServerLog
from tests.support.apps.mcp import app
from tests.support.mcp_server import READ, HttpServer
from tests.support.waiting import eventually


@pytest.fixture
def runner(sqlite_url: str) -> Iterator[InlineRunner]:
    store = Store.from_url(sqlite_url)
    made = InlineRunner(app, store, settings=Settings(), poll_interval=0.05)
    yield made
    store.engine.dispose()


def journal(runner: InlineRunner, run_id: str) -> dict[str, dict[str, Any]]:
    return {row["step"]: row for row in runner.store.journal(run_id)}


def tool_messages(runner: InlineRunner, run_id: str) -> list[Any]:
    thread_id = runner.store.get_run(run_id).thread_id
    return [m for m in runner.store.thread_messages(thread_id) if m.role == "tool"]


def value(content: str) -> Any:
    """A tool message's content: JSON, or the tool's text as it was."""
    try:
        return json.loads(content)
    except ValueError:
        return content


def status(runner: InlineRunner, run_id: str, wanted: str) -> None:
    eventually(
        lambda: runner.store.get_run(run_id).status == wanted,
        what=f"{run_id} to be {wanted}",
        context=lambda: runner.store.journal(run_id),
    )


def test_reads_fan_out_with_a_plain_tool_on_pooled_connections(
    runner: InlineRunner, server_log: ServerLog
) -> None:
    known, calls = server_log.pids(), len(server_log.calls())
    first = runner.run("reader", "read", actor="user-7", timeout=60)
    assert first.status == "completed", first.error
    steps = journal(runner, first.run_id)
    listed = steps["mcp:tools"]["result"]
    assert {t["name"]: t["kind"] for t in listed["tools"]} == {
        "files.read_file": "read",
        "files.stat": "read",
        "files.write_file": "action",
        "files.refund": "action",
        "files.confirm": "action",
        "files.hang": "read",
    }
    order = [row["step"] for row in runner.store.journal(first.run_id)]
    assert order.index("mcp:tools") < order.index("model:1")
    results = [value(m.content) for m in tool_messages(runner, first.run_id)]
    assert results == [
        "contents of a.txt",
        {"path": "b.txt", "size": 5},
        {"order_id": "42", "status": "shipped"},
    ]
    for _ in range(3):  # more runs: the same server processes serve them
        assert runner.run("reader", "read", actor="user-7", timeout=60).status == "completed"
    assert len(server_log.calls()) - calls == 8
    # At most one server process per read that ran at once, never one per call or run.
    assert len(server_log.pids() - known) <= 2


def test_an_action_waits_for_its_approval_then_runs(
    runner: InlineRunner, server_log: ServerLog
) -> None:
    before = len(server_log.calls("write_file"))
    run_id = runner.start("writer", "write", actor="user-7")
    status(runner, run_id, "awaiting_approval")
    assert len(server_log.calls("write_file")) == before
    with pytest.raises(NotAnApproverError):
        runner.signal(run_id, "call_1", "approve", actor="user-7")
    assert runner.signal(run_id, "call_1", "approve", actor="alice")
    done = runner.wait(run_id, timeout=60)
    assert done.status == "completed", done.error
    [message] = tool_messages(runner, run_id)
    assert json.loads(message.content) == {"wrote": "w.txt", "bytes": 2}
    assert len(server_log.calls("write_file")) == before + 1


def test_an_elicitation_is_a_question_and_its_answer_goes_back(
    runner: InlineRunner, server_log: ServerLog
) -> None:
    run_id = runner.start("refunder", "refund 42", actor="user-7")
    status(runner, run_id, "awaiting_approval")
    assert runner.signal(run_id, "call_1", "approve", actor="alice")
    status(runner, run_id, "awaiting_answers")
    question = _question(runner, run_id)
    assert question["question"] == "From which account should the refund be paid?"
    assert question["schema"]["properties"]["account"]["type"] == "string"
    assert question["source"] == "mcp_elicitation"
    request_id = journal(runner, run_id)["tool:call_1"]["result"]["questions"][0]["id"]
    assert request_id == question["id"]
    answered = runner.answer(run_id, "call_1:1", {question["id"]: "savings"}, actor="user-7")
    assert answered
    done = runner.wait(run_id, timeout=60)
    assert done.status == "completed", done.error
    [message] = tool_messages(runner, run_id)
    assert json.loads(message.content) == {"refunded": "42", "from": "savings"}
    assert any(c[2] == {"order_id": "42", "account": "savings"} for c in server_log.calls("refund"))


def _question(runner: InlineRunner, run_id: str) -> dict[str, Any]:
    for frame in runner.frames(run_id):
        if frame["type"] == "question":
            [question] = frame["questions"]
            return dict(question)
    raise AssertionError("no question frame")


def test_a_server_that_is_down_is_a_tool_error_the_model_sees(runner: InlineRunner) -> None:
    done = runner.run("unreachable", "read", actor="user-7", timeout=60)
    assert done.status == "completed", done.error
    listed = journal(runner, done.run_id)["mcp:tools"]["result"]
    assert listed["tools"] == [] and "down" in listed["unavailable"]
    [message] = tool_messages(runner, done.run_id)
    assert message.is_error and "down.read_file" in message.content


def test_a_server_that_hangs_ends_the_call_at_its_time_limit(runner: InlineRunner) -> None:
    from agent_jobs.errors import ToolError

    def warm() -> bool:
        """A connection in the pool: its start (seconds, on a loaded machine) may take
        longer than the server's 2 s limit, which counts it as part of a call."""
        try:
            return bool(app.mcp_servers["slow"].listed())
        except ToolError:
            return False

    eventually(warm, what="a connection to the slow server")
    done = runner.run("hanger", "hang", actor="user-7", timeout=60)
    assert done.status == "completed", done.error
    [message] = tool_messages(runner, done.run_id)
    assert message.is_error and "did not answer within 2 s" in message.content


def test_a_run_keeps_its_list_and_a_new_run_sees_the_changed_one(
    runner: InlineRunner, web: HttpServer
) -> None:
    first = runner.start("web_changing", "go", actor="user-7")
    status(runner, first, "awaiting_approval")

    def added(path: str) -> dict[str, Any]:
        """A tool the server gained after the first run took its list."""
        return {"added": path}

    web.mcp.add_tool(added, name="added", annotations=READ)
    try:
        assert runner.signal(first, "call_1", "approve", actor="alice")
        done = runner.wait(first, timeout=60)
        assert done.status == "completed", done.error
        names = [t["name"] for t in journal(runner, first)["mcp:tools"]["result"]["tools"]]
        assert "web.added" not in names
        kept = tool_messages(runner, first)[-1]
        assert kept.is_error and "web.added" in kept.content

        second = runner.start("web_changing", "go", actor="user-7")
        status(runner, second, "awaiting_approval")
        assert runner.signal(second, "call_1", "approve", actor="alice")
        done = runner.wait(second, timeout=60)
        assert done.status == "completed", done.error
        names = [t["name"] for t in journal(runner, second)["mcp:tools"]["result"]["tools"]]
        assert "web.added" in names
        assert json.loads(tool_messages(runner, second)[-1].content) == {"added": "b"}
    finally:
        web.mcp.remove_tool("added")


def test_a_name_the_server_does_not_list_fails_the_run_with_what_it_offers(
    runner: InlineRunner,
) -> None:
    from agent_jobs import ScriptedModel

    if "misnamed" not in app.agents:
        app.agent("misnamed", model=ScriptedModel([{"text": "x"}]), tools=["files.nope"])
    done = runner.run("misnamed", "go", actor="user-7", timeout=60)
    assert done.status == "failed"
    assert "no tool named 'nope'" in (done.error or "") and "read_file" in (done.error or "")


def test_a_server_of_an_older_protocol_asks_mid_call_and_is_answered_on_the_next_call() -> None:
    """On the initialize handshake the server elicits in the middle of the call: the call
    is ended on the first unanswered question, then made again with every answer so far."""
    from dataclasses import replace

    from agent_jobs.mcp.servers import McpServer
    from agent_jobs.tools import QuestionsAsked

    legacy = replace(app.mcp_servers["files"], name="legacy", mode="legacy", timeout=20)
    with pytest.raises(QuestionsAsked) as first:
        legacy.call("confirm", {"order_id": "9"}, None)
    [asked] = first.value.questions
    assert asked["id"] == "elicitation_1" and asked["question"] == "Really close 9?"
    with pytest.raises(QuestionsAsked) as second:
        legacy.call("confirm", {"order_id": "9"}, {"elicitation_1": "yes"})
    assert second.value.questions[0]["id"] == "elicitation_2"
    answers = {"elicitation_1": "yes", "elicitation_2": "decline"}
    result = legacy.call("confirm", {"order_id": "9"}, answers)
    assert result == {"closed": "9", "actions": ["accept", "decline"], "said": ["yes", None]}
    assert isinstance(legacy, McpServer)


def test_a_soft_time_limit_raised_into_a_waiting_call_goes_through_as_it_is(
    server_log: ServerLog,
) -> None:
    """A step's soft time limit is raised into the worker's thread: the call waiting on
    the pool's loop lets it through (not as a tool error), and the connection is dropped."""
    import ctypes
    import threading

    class SoftLimit(Exception):
        pass

    hung = len(server_log.calls("hang"))
    waiting = threading.get_ident()

    def raise_once_it_hangs() -> None:
        eventually(lambda: len(server_log.calls("hang")) > hung, what="the call to hang")
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(waiting), ctypes.py_object(SoftLimit)
        )

    threading.Thread(target=raise_once_it_hangs, daemon=True).start()
    with pytest.raises(SoftLimit):
        app.mcp_servers["files"].call("hang", {}, None)


def test_an_mcp_action_nobody_approves_in_time_is_rejected(
    runner: InlineRunner, server_log: ServerLog
) -> None:
    before = len(server_log.calls("write_file"))
    done = runner.run("timed_writer", "write", actor="user-7", timeout=60)
    assert done.status == "completed", done.error
    [message] = tool_messages(runner, done.run_id)
    assert message.is_error and json.loads(message.content)["reason"] == "timeout"
    call = runner.store.tool_call(done.run_id, "call_1")
    assert call["status"] == "rejected" and call["approval_deadline"] is not None
    assert len(server_log.calls("write_file")) == before  # never called
