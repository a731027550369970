"""A tool's own broker queue: how it is named, and how a step is sent there."""

from __future__ import annotations

import pytest

from agent_jobs import AgentApp
from agent_jobs.dispatch import INVOKE_TOOL, own_queue
from agent_jobs.errors import ConfigurationError
from agent_jobs.runners.durable.replay import sent_as
from agent_jobs.steps import InvokeTool, ToolCall


@pytest.mark.parametrize("queue", ["", "a@b", "tab\there"])
def test_a_bad_queue_name_is_refused_when_the_tool_is_defined(queue: str) -> None:
    app = AgentApp()
    with pytest.raises(ConfigurationError, match="bad queue name"):

        @app.tool(kind="read", queue=queue)
        def crunch(n: int) -> int:
            return n


def test_a_step_with_a_queue_is_sent_as_task_at_queue() -> None:
    call = ToolCall(id="call_1", name="crunch", args={})
    plain = InvokeTool(run_id="r", agent="a", actor="u", call=call, offered=["crunch"])
    routed = plain.model_copy(update={"queue": "cpu"})
    assert sent_as(plain) == INVOKE_TOOL and own_queue(sent_as(plain)) == (INVOKE_TOOL, None)
    assert own_queue(sent_as(routed)) == (INVOKE_TOOL, "cpu")
