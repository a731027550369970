"""Sleeping runs: an agent offered the `wait` tool, whose model sleeps as the run's input
says (JSON: `{"seconds": 3}` or `{"until": "…"}`), then says how it woke."""

from __future__ import annotations

import json

from agent_jobs import ScriptedModel
from agent_jobs.messages import ModelRequest, ModelResponse, ToolCall, Usage
from agent_jobs.models.base import DeltaSink
from tests.support.apps.base import app

NAP = "nap"  # the id of the sleeper's `wait` call: its journal row is `timer:nap`


class SleepyModel:
    """First call: `wait` with the arguments the run's input gives. Then: the wait's result
    and the messages it was woken with, as its answer."""

    name = "sleepy"

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        usage = Usage(input_tokens=1, output_tokens=1)
        if request.step == 0:
            args = json.loads(request.messages[-1].content)
            call = ToolCall(id=NAP, name="wait", args=args)
            return ModelResponse(text="", tool_calls=[call], usage=usage, model=self.name)
        tool = next(m for m in reversed(request.messages) if m.role == "tool")
        after = request.messages[request.messages.index(tool) + 1 :]
        said = [m.content for m in after if m.role == "user"]
        text = json.dumps({"tool": json.loads(tool.content), "messages": said})
        sink.text(text)
        return ModelResponse(text=text, usage=usage, model=self.name)


app.agent("sleeper", model=SleepyModel(), timers=True, max_steps=4)


# Delegates to the sleeper, whose task (the sleeper's input) says how long it sleeps.
app.agent(
    "sleeper_boss",
    model=ScriptedModel(
        [
            {"tool_calls": [{"name": "sleeper", "args": {"task": '{"seconds": 3600}'}}]},
            {"text": "the sleeper answered"},
        ]
    ),
    tools=["sleeper"],
)
