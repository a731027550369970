"""MCP tools without a server: the definitions, the run's list in the loop's shape, the
answers given back to an elicitation, the kinds and roles the registry knows them by."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs import checkpoints as names
from agent_jobs.checkpoints import CallVerdict, McpToolInfo, McpToolList
from agent_jobs.errors import ConfigurationError, ToolError
from agent_jobs.loop import MCP_TOOLS, run_agent_loop
from agent_jobs.mcp import elicitation
from agent_jobs.messages import ModelResponse, ToolCall
from agent_jobs.runners.durable.reconcile import guarded
from agent_jobs.steps import InvokeTool, ListMcpTools, ModelTurn, PersistToolCall
from agent_jobs.store.journal import JournalRow
from tests.unit.test_loop import TURN, RecordingHooks
from tests.unit.test_loop import deps as loop_deps

APP = AgentApp(roles={"user-7": ["support"], "alice": ["lead"], "eve": []})
APP.mcp("files", command=["files-server"], approvers=["lead"], roles=["support"])
APP.mcp("safe", url="http://127.0.0.1:9/mcp", idempotent=True)
_MODEL = ScriptedModel([{"text": "x"}])
APP.agent("mixed", model=_MODEL, tools=["files.*", "safe.read", "nothing"])
APP.tool(kind="read", name="nothing")(lambda: None)


def info(name: str, kind: str) -> McpToolInfo:
    server, tool = name.split(".")
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return McpToolInfo(name=name, server=server, tool=tool, input_schema=schema, kind=kind)  # type: ignore[arg-type]


LISTED = McpToolList(tools=[info("files.read_file", "read"), info("files.write", "action")])


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"command": ["x"], "url": "http://a/mcp"}, "either command"),
        ({}, "either command"),
        ({"command": "x"}, "list of strings"),
        ({"url": "ftp://a"}, "http://"),
        ({"url": "http://a", "env": {"A": "1"}}, "env is for a stdio"),
        ({"command": ["x"], "headers": {"A": "1"}}, "headers are for an HTTP"),
        ({"command": ["x"], "kinds": {"t": "write"}}, "'read' or 'action'"),
        ({"command": ["x"], "timeout": 0}, "timeout"),
        ({"command": ["x"], "approval_timeout": 0}, "approval_timeout must be"),
        ({"command": ["x"], "on_timeout": "escalate"}, "need an approval_timeout"),
    ],
)
def test_a_bad_server_definition_says_what_to_fix(given: dict[str, Any], problem: str) -> None:
    app = AgentApp()
    with pytest.raises(ConfigurationError, match=problem):
        app.mcp("s", **given)
    assert app.mcp_servers == {}


def test_a_server_name_must_be_a_plain_prefix_and_defined_once() -> None:
    app = AgentApp()
    with pytest.raises(ConfigurationError, match="letters, digits"):
        app.mcp("a.b", command=["x"])
    app.mcp("a", command=["x"])
    with pytest.raises(ConfigurationError, match="already defined"):
        app.mcp("a", command=["y"])


def test_agents_name_mcp_tools_without_a_server_being_asked() -> None:
    APP.validate()  # "files.*" and "safe.read" are checked when a run lists them
    spec = APP.get_agent("mixed")
    assert APP.offered_tools(spec, "user-7", None) == ["nothing"]
    assert APP.offered_mcp(spec, "user-7", None) == ["files.*", "safe.read"]
    assert APP.offered_mcp(spec, "eve", None) == ["safe.read"]  # files needs `support`
    narrowed = APP.persona("narrow", "p", tools=["files.*"])
    assert APP.offered_mcp(spec, "user-7", narrowed) == ["files.*"]


def test_an_mcp_servers_approval_deadline_is_its_actions() -> None:
    app = AgentApp()
    app.mcp("plain", command=["x"])
    assert not app.registry.deadlined
    app.mcp("s", command=["x"], approval_timeout=5, on_timeout="escalate", escalate_to=["boss"])
    tool = app.registry.get("s.write")
    assert (tool.approval_timeout, tool.on_timeout, tool.escalate_to) == (
        5.0,
        "escalate",
        frozenset({"boss"}),
    )
    assert app.registry.deadlined


def test_the_registry_knows_a_servers_tools_by_their_prefix() -> None:
    assert "files.read_file" in APP.registry and "files.*" not in APP.registry
    assert "other.read_file" not in APP.registry
    tool = APP.registry.get("files.write")
    assert tool.approvers == frozenset({"lead"}) and tool.roles == frozenset({"support"})
    assert tool.kind == "action" and not tool.idempotent
    assert APP.registry.get("safe.write").idempotent


def test_a_run_lists_its_mcp_tools_once_before_its_first_model_step() -> None:
    replies = [
        ModelResponse(tool_calls=[ToolCall(id="c1", name="files.read_file", args={"path": "a"})]),
        ModelResponse(text="done"),
    ]
    hooks = RecordingHooks(
        {
            names.MCP_TOOLS: LISTED,
            "model_turn": lambda call: replies.pop(0),
            names.toolcall("c1"): CallVerdict(kind="read", status="auto_executed"),
        }
    )
    result = run_agent_loop(TURN, _deps("mixed"), hooks)
    assert result.output == "done"
    assert hooks.trail.index(names.patch(MCP_TOOLS)) < hooks.trail.index(names.MCP_TOOLS)
    assert hooks.trail.index(names.MCP_TOOLS) < hooks.trail.index(names.model(1))
    assert hooks.trail.count(names.MCP_TOOLS) == 1
    listing = hooks.intent(names.MCP_TOOLS, ListMcpTools)
    assert listing.wanted == ["files.*", "safe.read"]
    offered = [spec.name for spec in hooks.intent(names.model(1), ModelTurn).request.tools]
    assert offered == ["nothing", "files.read_file", "files.write"]
    recorded = hooks.intent(names.toolcall("c1"), PersistToolCall)
    assert recorded.mcp is not None and recorded.mcp.kind == "read"
    assert "files.read_file" in recorded.offered
    assert hooks.intent(names.tool("c1"), InvokeTool).kind == "read"


def test_a_run_that_began_before_its_agent_took_mcp_tools_lists_none() -> None:
    hooks = RecordingHooks({"model_turn": ModelResponse(text="ok")}, patches={MCP_TOOLS: False})
    run_agent_loop(TURN, _deps("mixed"), hooks)
    assert names.MCP_TOOLS not in hooks.trail
    assert [s.name for s in hooks.intent(names.model(1), ModelTurn).request.tools] == ["nothing"]


def test_an_mcp_call_made_again_carries_every_answer_so_far() -> None:
    calls = [ToolCall(id="c1", name="files.read_file", args={"path": "a"})]
    replies = [ModelResponse(tool_calls=calls), ModelResponse(text="done")]
    rounds = [
        {"ok": False, "questions": [{"id": "k1", "question": "one?"}]},
        {"ok": False, "questions": [{"id": "k2", "question": "two?"}]},
        {"ok": True, "result": "read"},
    ]
    hooks = RecordingHooks(
        {
            names.MCP_TOOLS: LISTED,
            "model_turn": lambda call: replies.pop(0),
            "invoke_tool": lambda call: rounds.pop(0),
            names.toolcall("c1"): CallVerdict(kind="read", status="auto_executed"),
        },
        answers={"c1:1": {"k1": "a"}, "c1:2": {"k2": "b"}},
    )
    run_agent_loop(TURN, _deps("mixed"), hooks)
    assert hooks.intent(names.tool("c1", 2), InvokeTool).answers == {"k1": "a"}
    assert hooks.intent(names.tool("c1", 3), InvokeTool).answers == {"k1": "a", "k2": "b"}


def _deps(agent: str) -> Any:
    made = loop_deps("support")
    spec = APP.get_agent(agent)
    return type(made)(
        app=APP,
        agent=spec,
        persona=None,
        system_prompt="",
        day=made.day,
        quota_limit=None,
    )


class _Params:
    def __init__(self, schema: dict[str, Any] | None, mode: str = "form") -> None:
        self.requested_schema = schema
        self.mode = mode
        self.message = "?"


ONE = _Params({"type": "object", "properties": {"account": {"type": "string"}}})
TWO = _Params({"type": "object", "properties": {"a": {}, "b": {}}})


@pytest.mark.parametrize(
    ("params", "answer", "action", "content"),
    [
        (ONE, "savings", "accept", {"account": "savings"}),
        (ONE, "decline", "decline", None),
        (ONE, "cancel", "cancel", None),
        (TWO, '{"a": 1, "b": "x"}', "accept", {"a": 1, "b": "x"}),
        (TWO, {"a": 1, "b": 2}, "accept", {"a": 1, "b": 2}),
        (TWO, '{"action": "decline"}', "decline", None),
        (TWO, {"action": "accept", "content": {"a": 1}}, "accept", {"a": 1}),
        (_Params(None, mode="url"), "ok", "accept", None),
    ],
)
def test_a_persons_answer_goes_back_as_the_elicitations_result(
    params: _Params, answer: Any, action: str, content: Any
) -> None:
    result = elicitation.answered(params, answer)
    assert (result.action, result.content) == (action, content)


def test_a_lone_value_cannot_fill_a_form_of_several_fields() -> None:
    with pytest.raises(ToolError, match="several fields"):
        elicitation.answered(TWO, "x")


def test_an_mcp_actions_kind_in_the_journal_decides_whether_its_call_is_guarded() -> None:
    def row(name: str, kind: str | None) -> JournalRow:
        call = {"id": "c1", "name": name, "args": {}}
        intent = {
            "type": "invoke_tool",
            "run_id": "r",
            "agent": "mixed",
            "actor": "user-7",
            "call": call,
            "offered": [name],
            "kind": kind,
        }
        fields = dict.fromkeys(JournalRow.__dataclass_fields__)
        fields |= {"run_id": "r", "step": "tool:c1", "seq": 1, "state": "scheduled"}
        return JournalRow(**(fields | {"intent": intent, "attempts": 0, "fence": 0}))

    assert guarded(APP, row("files.write", "action")) is not None
    assert guarded(APP, row("files.read_file", "read")) is None
    assert guarded(APP, row("safe.write", "action")) is None  # idempotent=True


def test_names_a_provider_refuses_are_sent_renamed_without_colliding() -> None:
    from agent_jobs.messages import Message, ModelRequest, ToolSpec
    from agent_jobs.models.wire_names import WireNames

    tools = [ToolSpec(name=n) for n in ("files.read", "files_read", "a.b/c", "plain")]
    request = ModelRequest(
        run_id="r", agent="a", step=0, system="", messages=[Message(role="user", content="x")]
    )
    names = WireNames.of(request.model_copy(update={"tools": tools}))
    assert names.to_wire == {"a.b/c": "a_b_c", "files.read": "files_read_2"}
    back = ModelResponse(tool_calls=[ToolCall(id="1", name="files_read_2", args={})])
    assert names.incoming(back).tool_calls[0].name == "files.read"
    assert WireNames.of(request).outgoing(request) is request  # nothing to rename


def test_a_server_without_the_sdk_installed_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else found(name, *a)
    )
    with pytest.raises(ConfigurationError, match=r"agent-jobs\[mcp\]"):
        AgentApp().mcp("s", command=["x"])
